"""Attention kernels beyond torch's SDPA, and the choice between them (`model.attn_kernel`).

`wide_attention.py`: a Triton fused causal attention for wide heads (its docstring says why: SDPA has no
flash kernel past head dim 256 on CUDA). This package never imports triton unless that kernel is chosen.

model.attn_kernel:
  auto   -- the Triton kernel on CUDA when the head dim is past SDPA's fused limit (> 256) and triton is
            installed, otherwise SDPA; on CPU always SDPA (so no CPU number changes);
  sdpa   -- always F.scaled_dot_product_attention;
  triton -- always the Triton kernel: on CUDA, or on CPU under Triton's interpreter (TRITON_INTERPRET=1:
            slow, for tests); anywhere else a one-line error.
Cached generation (a KV cache) and dropout in training always run SDPA: the kernel is for full-sequence
causal passes without dropout (config validation refuses attn_kernel=triton with dropout).
"""

from __future__ import annotations

import importlib.util
import os

from iattention.errors import UserError

ATTN_KERNELS = ("auto", "sdpa", "triton")
SDPA_FUSED_MAX_HEAD_DIM = 256  # FlashAttention-2 (SDPA's flash path) and cuDNN stop here on CUDA
TRITON_INSTALLED = importlib.util.find_spec("triton") is not None
_MODULES: dict = {}  # "wide" -> kernels/wide_attention.py once loaded


def interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def kernel_for(mode: str, device_type: str, head_dim: int, dropout: float = 0.0) -> str:
    """'sdpa' or 'triton': what a full-sequence causal pass runs (see the module docstring). Forced
    triton where it cannot run is a UserError."""
    if mode == "sdpa":
        return "sdpa"
    if mode == "auto":
        use = device_type == "cuda" and head_dim > SDPA_FUSED_MAX_HEAD_DIM and TRITON_INSTALLED and not dropout
        return "triton" if use else "sdpa"
    if mode != "triton":
        raise UserError(f"unknown model.attn_kernel {mode!r}; choose one of {', '.join(ATTN_KERNELS)}")
    if not TRITON_INSTALLED:
        raise UserError("model.attn_kernel=triton but triton is not installed; pip install 'iattention[kernel]' "
                        "(Linux x86-64) or use model.attn_kernel=auto")
    if device_type != "cuda" and not interpreter_on():
        raise UserError(f"model.attn_kernel=triton runs on CUDA (or on CPU under TRITON_INTERPRET=1, slowly), not on "
                        f"{device_type}; use model.attn_kernel=auto or sdpa")
    if dropout:
        raise UserError("model.attn_kernel=triton has no dropout; set model.dropout=0 or model.attn_kernel=auto")
    return "triton"


def load_kernel():
    """The kernel module (importing triton). Under TRITON_INTERPRET=1 its functions run in Triton's CPU
    interpreter; that variable must be set before triton is first imported in the process (triton's own
    library functions are built at its import), so set it when starting Python, never half-way. Call
    before torch.compile traces a model."""
    module = _MODULES.get("wide")
    if module is None:
        from iattention.kernels import wide_attention as module
        _MODULES["wide"] = module
    return module


def prepare(mode: str, device_type: str, head_dim: int, dropout: float = 0.0) -> str:
    """kernel_for, checked and with the kernel loaded, once before a run (so errors are one line at the
    start, and torch.compile finds the module already imported). Returns the kernel's name."""
    kernel = kernel_for(mode, device_type, head_dim, dropout)
    if kernel == "triton":
        load_kernel()
    return kernel


def triton_causal_attention(q, k, v):
    """Causal attention through the Triton kernel, q, k, v (B, H, T, d)."""
    module = _MODULES.get("wide")
    return (module or load_kernel()).wide_attention(q, k, v)
