"""Single-query softmax attention, c = sum_i alpha_i v_i with alpha = softmax(K q), in float64."""

from __future__ import annotations

import dataclasses

import torch

DTYPE = torch.float64


def attend(K: torch.Tensor, q: torch.Tensor, V: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """K (..., n, d), q (..., d), V (..., n, dv) -> (alpha (..., n), c (..., dv))."""
    alpha = torch.softmax((K @ q.unsqueeze(-1)).squeeze(-1), dim=-1)
    return alpha, (alpha.unsqueeze(-2) @ V).squeeze(-2)


def orthonormal(d: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """d x k matrix with orthonormal columns (QR of a Gaussian matrix)."""
    return torch.linalg.qr(torch.randn(d, k, generator=gen, dtype=DTYPE))[0]


def to_jsonable(obj):
    if dataclasses.is_dataclass(obj):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    return obj
