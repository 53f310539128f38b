"""Model FLOPs per token.

`executed_flops_per_token` counts the matmul FLOPs the implementation really runs (2 per multiply-add),
forward pass, per token of a length-T sequence:
  attention projections per layer: the variant's class says (`projection_flops`, whose docstring
    gives its formula), e.g. standard 2*d*3d + 2*d*d = 8 d^2;
  attention scores and weighted sum: 2*T*d + 2*T*d (full T x T, as SDPA's FLOP counters report it);
  MLP: 4 d d_mlp (16 d^2 at GPT-2's width);  LM head: 2 d V_padded.
Training = 3x forward (backward ~ 2x forward). `nanogpt_flops_per_token` is nanoGPT's MFU formula,
6 N + 12 L H Q T with N = parameters without position embeddings, used for MFU comparisons.
"""

from __future__ import annotations

from iattention.attention.registry import attention_class
from iattention.config.model import GPTConfig
from iattention.symmetry.counts import param_count


def attention_projection_flops(cfg) -> int:
    """One layer's projection FLOPs per token, forward (any family's GPTConfig): its attention class says."""
    return attention_class(cfg).projection_flops(cfg)


def executed_flops_per_token(cfg: GPTConfig, seq_len: int | None = None, training: bool = True) -> int:
    T = seq_len or cfg.block_size
    d = cfg.n_embd
    per_layer = attention_projection_flops(cfg) + 4 * T * d + 4 * d * cfg.d_mlp
    fwd = cfg.n_layer * per_layer + 2 * d * cfg.padded_vocab_size
    return 3 * fwd if training else fwd


def nanogpt_flops_per_token(cfg: GPTConfig, seq_len: int | None = None) -> int:
    T = seq_len or cfg.block_size
    N = param_count(cfg) - cfg.block_size * cfg.n_embd
    return 6 * N + 12 * cfg.n_layer * cfg.n_head * cfg.d_head * T


PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}


def device_peak_tflops(name: str) -> float | None:
    for key, peak in PEAK_BF16_TFLOPS.items():
        if key in name:
            return peak
    return None
