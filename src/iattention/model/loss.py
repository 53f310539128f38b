"""The training loss without the whole (B T, V) fp32 logits (issue 52 §3): cross-entropy a chunk of rows at a
time, each chunk's logits recomputed in the backward.

At GPT-2 small's training shape (16 x 1024 tokens, V = 50257) the plain loss holds the bf16 logits, their fp32
copy for the softmax and its gradient: 16,384 x 50,257 x (2 + 4 + 4) bytes, about 8 GB. Here each chunk of
`rows` positions goes through the head and the loss under `torch.utils.checkpoint` (non-reentrant, so it
traces under torch.compile), which keeps only the chunk's input (rows x d) for the backward and rebuilds its
logits there: at most one chunk's logits live at a time, for one more head matmul in the backward. Written here
because no maintained PyTorch library offers it for an arbitrary head (Liger-Kernel's fused linear
cross-entropy is a Triton kernel for CUDA only; this path is plain torch and runs on every device).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

IGNORE_INDEX = -100  # F.cross_entropy's default: positions with this target are left out of the mean


def at_least_fp32(logits: torch.Tensor) -> torch.Tensor:
    """bf16 / fp16 logits widened to fp32 for the softmax; fp32 and fp64 kept (a float64 model's loss in float64)."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def _chunk_nll(head: torch.nn.Module, vocab_size: int, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = head(h)[..., :vocab_size]  # (rows, V): a padded vocabulary's extra columns dropped
    return F.cross_entropy(at_least_fp32(logits), targets, ignore_index=IGNORE_INDEX, reduction="sum")


def chunked_cross_entropy(h: torch.Tensor, head: torch.nn.Module, targets: torch.Tensor, vocab_size: int,
                          rows: int) -> torch.Tensor:
    """Mean cross-entropy of head(h)[..., :vocab_size] against targets, `rows` positions at a time: GPT.forward's
    whole loss up to the order of the sum (in fp32 for bf16 activations, as there; float64 for float64).
    h (B, T, d) the final norm's output, targets (B, T)."""
    h, targets = h.reshape(-1, h.size(-1)), targets.reshape(-1)  # (B T, d), (B T,)
    total = h.new_zeros((), dtype=torch.promote_types(h.dtype, torch.float32))
    for start in range(0, h.size(0), rows):
        end = start + rows
        total = total + checkpoint(_chunk_nll, head, vocab_size, h[start:end], targets[start:end],
                                   use_reentrant=False)
    return total / (targets != IGNORE_INDEX).sum()
