"""Rotary position embeddings (RoPE): frequencies, cos/sin tables, and applying them to heads.

A head of width r rotates its first `rot` dims (rot even, <= r) and leaves the other r - rot ("pass") dims
alone. The rotary dims form rot/2 frequency pairs; pair k is rotated by the angle n theta_k at position n.
Which dims pair up is the layout:
    "half"         (Hugging Face's rotate_half: Llama, Qwen2, Mistral): dim k pairs with dim k + rot/2;
    "interleaved"  (GPT-J, GLM): dim 2k pairs with dim 2k + 1.
Seen as one complex number per pair, z_k = x[first_k] + i x[second_k], RoPE multiplies z_k by e^{i n theta_k}.

Angles are computed in float32 from float32 inverse frequencies and then cast to the heads' dtype, as
transformers does, so a float64 model gives transformers' float64 logits to the last bits.
"""

from __future__ import annotations

import math

import torch
from torch import nn

LAYOUTS = ("half", "interleaved")


def default_inv_freq(rot: int, theta: float) -> torch.Tensor:
    """theta_k = theta^(-2k / rot), k < rot/2, float32 (transformers' "default" rope_type), on the CPU even inside a
    `torch.device("meta")` context: a model built there keeps real frequencies (they are never loaded)."""
    return 1.0 / (theta ** (torch.arange(0, rot, 2, dtype=torch.float, device="cpu") / rot))


def llama3_inv_freq(rot: int, theta: float, factor: float, low_freq_factor: float, high_freq_factor: float,
                    original_max_position_embeddings: int) -> torch.Tensor:
    """Llama-3.1's frequency scaling: long wavelengths divided by `factor`, short ones kept, a smooth blend
    between (transformers' "llama3" rope_type)."""
    inv_freq = default_inv_freq(rot, theta)
    low_wavelen = original_max_position_embeddings / low_freq_factor
    high_wavelen = original_max_position_embeddings / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (original_max_position_embeddings / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, blended, scaled)


def pair_dims(rot: int, layout: str, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(first, second): the two dims of each frequency pair, (rot/2,) each (on `device`: the default one unless
    given)."""
    if layout == "half":
        return torch.arange(rot // 2, device=device), torch.arange(rot // 2, device=device) + rot // 2
    if layout == "interleaved":
        return torch.arange(0, rot, 2, device=device), torch.arange(1, rot, 2, device=device)
    raise ValueError(f"unknown rope layout {layout!r}; choose one of {', '.join(LAYOUTS)}")


class RotaryEmbedding(nn.Module):
    """Holds the inverse frequencies (a buffer, not saved: they follow from the config) and makes the
    cos/sin tables of given positions.

    The frequencies stay float32 whatever the model's dtype: `.to(dtype)`, `.half()`, `.bfloat16()` and
    `.double()` move the buffer to the new device but keep its exact float32 values. A bf16 copy would turn
    position n by n x (rounding error of theta_k), up to 0.7 rad at position 4,095 for theta = 10^4: the bug
    transformers #25681 / #29496 and gpt-neox #1003 fixed the same way."""

    def __init__(self, inv_freq: torch.Tensor):
        super().__init__()
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)  # (rot/2,)
        self._exact = inv_freq.detach().float().clone()  # not a buffer: no module cast reaches it

    def _apply(self, fn, recurse=True):
        # nn.Module.to / half / bfloat16 / double / cuda / to_empty all go through _apply: let them move the
        # buffer, then restore the exact float32 values on its (new) device.
        super()._apply(fn, recurse)
        if not self._exact.is_meta:  # frequencies given as meta tensors have no values to keep
            self.inv_freq = self._exact.to(self.inv_freq.device)
        return self

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions (T,) -> cos, sin, each (T, rot/2) in `dtype`; positions (B, T) (a left-padded batch: each row
        its own) -> each (B, 1, T, rot/2), broadcast over the heads."""
        angles = positions.float()[..., None] * self.inv_freq.float()  # (..., T, rot/2), float32 as in transformers
        if positions.dim() == 2:
            angles = angles[:, None]  # (B, 1, T, rot/2)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    """x (..., T, r); cos, sin (T, rot/2), or (B, 1, T, rot/2) for x (B, H, T, r). Rotates each pair of x's first rot
    dims; the rest pass through."""
    rot = 2 * cos.shape[-1]
    if rot == 0:
        return x
    rotary, rest = x[..., :rot], x[..., rot:]
    if layout == "half":
        a, b = rotary[..., : rot // 2], rotary[..., rot // 2:]  # (..., T, rot/2) each
        turned = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
    elif layout == "interleaved":
        a, b = rotary[..., 0::2], rotary[..., 1::2]
        turned = torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)
    else:
        raise ValueError(f"unknown rope layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
    return torch.cat([turned, rest], dim=-1) if rest.shape[-1] else turned
