"""Attention kernels beyond torch's SDPA, and the one point every attention layer calls (`attend`).

`wide_attention.py`: a Triton fused causal attention for wide heads (its docstring says why: SDPA has no
flash kernel past head dim 256 on CUDA), registered as the torch op `iattention::wide_attention` so that
torch.compile traces it. `math_path.py`: the same attention as two matrix products and a masked softmax in
plain torch ops, which torch.compile fuses. `auto.py` and `auto_table.json`: what `auto` picks from
measurements. This package imports triton only when that kernel may run (chosen, or `auto` on CUDA).

model.attn_kernel:
  auto   -- on a device the table lists (`auto.py`), the path measured fastest for the pass's head dim and
            H T^2, the math path only within its memory guard; elsewhere (no table rows, head dims outside
            the measured range) the rule without a table: the Triton kernel on CUDA when the head dim is
            past SDPA's fused limit (> 256) and triton is installed, otherwise SDPA; on CPU always SDPA (so
            no CPU number changes);
  sdpa   -- always F.scaled_dot_product_attention;
  math   -- always the math path (any device, dropout included);
  triton -- always the Triton kernel: on CUDA, or on CPU under Triton's interpreter (TRITON_INTERPRET=1:
            slow, for tests); anywhere else a one-line error.
Cached generation (a KV cache) always runs SDPA, and so does dropout in training except under `math`: the
kernel is for full-sequence causal passes without dropout or a sliding window (config validation refuses
attn_kernel=triton with either; auto runs SDPA with the window's mask where it would have picked it). Every
family's layers call `attend` from one place (attention/base.py).
"""

from __future__ import annotations

import importlib.util
import os

import torch
import torch.nn.functional as F

from iattention.errors import UserError
from iattention.kernels.auto import Device, device_entry, load_table, pick
from iattention.kernels.math_path import causal_mask, math_causal_attention

ATTN_KERNELS = ("auto", "sdpa", "math", "triton")
SDPA_FUSED_MAX_HEAD_DIM = 256  # FlashAttention-2 (SDPA's flash path) and cuDNN stop here on CUDA
TRITON_INSTALLED = importlib.util.find_spec("triton") is not None
_MODULES: dict = {}  # "wide" -> kernels/wide_attention.py once loaded
DEVICES: dict[str, Device] = {}  # device type -> what auto's table says of it (know_device, before compiling)


def interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def know_device(device_type: str) -> Device | None:
    """Read auto's table for the current device of this type (CUDA only: elsewhere auto keeps its rule).
    prepare() calls it; call it before torch.compile traces a model, so the trace reads a filled table."""
    if device_type == "cuda" and device_type not in DEVICES and torch.cuda.is_available():
        index = torch.cuda.current_device()
        DEVICES["cuda"] = device_entry(load_table(), torch.cuda.get_device_name(index),
                                       torch.cuda.get_device_properties(index).total_memory)
    return DEVICES.get(device_type)


def kernel_for(mode: str, device_type: str, head_dim: int, dropout: float = 0.0,
               shape: tuple[int, int, int] | None = None) -> str:
    """'sdpa', 'math' or 'triton': what a full-sequence causal pass of `shape` (B, H, T) runs (see the module
    docstring; without a shape, auto keeps its rule without a table). Forced triton where it cannot run is a
    UserError."""
    if mode in ("sdpa", "math"):
        return mode
    if mode == "auto":
        device = DEVICES.get(device_type)
        choice = pick(device, head_dim, *shape, dropout, TRITON_INSTALLED) if device and shape else None
        if choice:
            return choice
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


def prepare(mode: str, device_type: str, head_dim: int, dropout: float = 0.0,
            shape: tuple[int, int, int] | None = None) -> str:
    """kernel_for, checked, with auto's table read (know_device) and the kernel loaded if it may run, once
    before a run (so errors are one line at the start, and torch.compile finds the module imported and the
    table read). Returns the kernel a pass of `shape` (B, H, T) runs."""
    if mode == "auto":
        know_device(device_type)
    kernel = kernel_for(mode, device_type, head_dim, dropout, shape)
    if kernel == "triton" or (mode == "auto" and TRITON_INSTALLED and device_type == "cuda"):
        load_kernel()
    return kernel


def triton_causal_attention(q, k, v):
    """Causal attention through the Triton kernel, q, k, v (B, H, T, d)."""
    module = _MODULES.get("wide")
    return (module or load_kernel()).wide_attention(q, k, v)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mode: str = "auto", dropout: float = 0.0,
           past: int | None = None, window: int = 0, key_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention, the one dispatch point of both model families: q (B, H, T, r), k and v (B, G, S, r)
    with G dividing H (grouped-query attention). past=None: a full-sequence pass (S = T), which runs the kernel
    `mode` picks (kernel_for). past=n: a cached pass, the new T positions after n cached ones (S = n + T), which
    runs SDPA. dropout: on the attention probabilities (pass 0 outside training). window W > 0 (a sliding window,
    Mistral's): query i sees keys i - W < j <= i only; a mask is built only where it binds (some query would see
    more than W keys), so a pass without a window, or shorter than it, runs exactly as a plain causal one.
    key_mask (B, S) bool: False on the padding positions of a padded batch (transformers' attention_mask), which
    runs SDPA with the causal mask and this one; a query still sees itself, so a padding row has no empty softmax
    (no NaN to spread) and no real query sees a padding key. Returns (B, H, T, r)."""
    B, H, T, r = q.shape
    G = k.shape[1]
    S = k.shape[2]
    window = window if 0 < window < S else 0  # a window as long as the keys changes nothing
    if key_mask is not None:
        own = torch.arange(S, device=q.device) == torch.arange(S - T, S, device=q.device)[:, None]  # (T, S)
        mask = causal_mask(T, S, q.device, window) & (key_mask[:, None, None, :].bool() | own)  # (B, 1, T, S)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, enable_gqa=G != H)
    if past is None:
        kernel = kernel_for(mode, q.device.type, r, dropout, (B, H, T))
        if kernel == "math":
            return math_causal_attention(q, k, v, dropout, window)
        if kernel == "triton" and window and mode == "triton":  # config validation refuses it before
            raise UserError(f"model.attn_kernel=triton has no sliding-window mask (window {window}); use "
                            "model.attn_kernel=auto, sdpa or math")
        if kernel == "triton" and not window:  # auto's pick with a window binding runs SDPA (with the mask)
            if G != H:  # the kernel reads one key/value head per query head
                k, v = (t.repeat_interleave(H // G, dim=1) for t in (k, v))
            return triton_causal_attention(q, k, v)
    mask = None
    if window or (past and T > 1):  # new position i sees every cached position and new ones up to itself
        mask = causal_mask(T, S, q.device, window)  # (T, S)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout,
                                          is_causal=mask is None and not past, enable_gqa=G != H)
