"""The math path: causal attention as two matrix products and a masked softmax, in plain torch ops
(`model.attn_kernel=math`).

Why. At one wide head (d = 768) and T = 1024 the T x T scores of a sequence (1M entries) are fewer than its
T x d activations, so materialising them costs little, and the two products are plain batched GEMMs (cuBLAS on
CUDA) at any head dim, where SDPA's fused kernels stop at 256 (issue 52). Under torch.compile inductor fuses the
scale, mask, upcast, softmax, dropout and downcast between the two products into one kernel. Memory: the
probabilities, B x H x T x T in the input dtype, are kept for the backward (kernels/auto.py's memory guard).

Precision, as SDPA's math backend: the first product in the input dtype (fp32 accumulation inside the GEMM),
the softmax in fp32 for bf16/fp16 inputs (in the input dtype for fp32 and fp64), the probabilities rounded
to the input dtype before the second product.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

HALF = (torch.bfloat16, torch.float16)


def attention_dtype(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.dtype:
    """The dtype a fused attention computes in, as SDPA: autocast's when autocast is on for q's device,
    otherwise the promoted dtype of q, k, v (canonical at one head passes the float32 residual stream as keys
    beside bf16 queries and values)."""
    if torch.is_autocast_enabled(q.device.type):
        return torch.get_autocast_dtype(q.device.type)
    return torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)


def causal_mask(T: int, S: int, device, window: int = 0) -> torch.Tensor:
    """(T, S) bool, True where the query sees the key: the T queries are the last T of S positions, query i sees key
    j <= i, and with a sliding window W only i - W < j (transformers' sliding_window_causal_mask_function: W keys,
    itself included)."""
    mask = torch.ones(T, S, dtype=torch.bool, device=device).tril(diagonal=S - T)
    return mask.triu(diagonal=S - T - window + 1) if window else mask


def math_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float = 0.0,
                          window: int = 0) -> torch.Tensor:
    """softmax(q k^T / sqrt(r) + causal mask) v, with dropout on the probabilities (as SDPA's dropout_p): q
    (B, H, T, r), k and v (B, G, T, r) with G dividing H (grouped-query attention: query head h reads key/value
    head h // (H / G), by broadcasting, no copy); window W > 0: query i sees keys i - W < j <= i only (causal_mask).
    Returns (B, H, T, r) in attention_dtype(q, k, v)."""
    B, H, T, r = q.shape
    G = k.shape[1]
    dtype = attention_dtype(q, k, v)
    q, k, v = (t.to(dtype) for t in (q, k, v))
    if G != H:  # (B, G, H/G, T, r) queries against (B, G, 1, T, r) keys and values
        q = q.reshape(B, G, H // G, T, r)
        k, v = k[:, :, None], v[:, :, None]
    s = q @ k.transpose(-1, -2)  # (..., T, T) in the input dtype
    s = s.to(torch.float32 if dtype in HALF else dtype) * r**-0.5
    causal = causal_mask(T, T, q.device, window)
    p = s.masked_fill(~causal, float("-inf")).softmax(-1)
    if dropout:
        p = F.dropout(p, dropout)
    y = p.to(dtype) @ v  # (..., T, r)
    return y.reshape(B, H, T, r)
