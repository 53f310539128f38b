"""AdamW with weight decay on weight matrices only (GPT-2 / nanoGPT convention), plus two study knobs.

- `decay_attention=False`: the attention matrices get no weight decay. AdamW's decay is an L2
  pull on the *stored* matrices, so it regularises different functions of the weights in each
  parameterization: standard decays ||W_Q||^2 + ||W_K||^2, canonical at one head decays the score
  matrix W_Q W_K^T = W_Q itself. Turning it off on attention removes that difference.
- `attn_lr_by_init_rms=True`: each attention matrix gets lr * RMS(matrix at step 0) / 0.02. Adam
  moves every entry by about lr per step whatever its scale, so after an exact canonicalization
  (W_Q -> W_Q B^T, free rows of W_K -> W_K B^{-1}: RMS from ~0.002 to ~0.3) the relative step of
  each group changes by orders of magnitude; this gives each group the relative step size that a
  GPT-2-initialised (RMS 0.02) matrix gets.
"""

from __future__ import annotations

import torch

from iattention.config import OptimConfig

GPT2_INIT_STD = 0.02


def is_matrix(name: str, p: torch.Tensor) -> bool:
    """A weight matrix (decayed), as opposed to a bias or a LayerNorm gain. Canonical attention keeps
    its per-head biases b_Q, b_K, b_V as (H, r) tensors, so the number of dimensions alone would
    wrongly decay them (standard's fused biases are 1-d)."""
    leaf = name.rsplit(".", 1)[-1]
    return p.dim() >= 2 and leaf != "bias" and not leaf.startswith("b_")


def param_groups(model: torch.nn.Module, cfg: OptimConfig) -> list[dict]:
    """Groups keyed by (weight decay, lr scale); the trainer multiplies the scheduled lr by `lr_scale`."""
    groups: dict[tuple[float, float], list] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        matrix = is_matrix(name, p)
        attention_matrix = matrix and ".attn." in name
        decay = matrix and (cfg.decay_attention or not attention_matrix)
        scale = 1.0
        if cfg.attn_lr_by_init_rms and attention_matrix and p.numel():
            scale = float(p.detach().float().pow(2).mean().sqrt()) / GPT2_INIT_STD
        groups.setdefault((cfg.weight_decay if decay else 0.0, scale), []).append(p)
    return [{"params": ps, "weight_decay": wd, "lr_scale": scale} for (wd, scale), ps in groups.items()]


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig, device_type: str) -> torch.optim.AdamW:
    extra = {"fused": True} if device_type == "cuda" else {}
    return torch.optim.AdamW(param_groups(model, cfg), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), **extra)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """The scheduled rate on every group, times the group's `lr_scale`."""
    for g in optimizer.param_groups:
        g["lr"] = lr * g.get("lr_scale", 1.0)


def apply_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, grad_clip: float) -> None:
    """Clip the gradient norm (grad_clip 0: off), step, drop the gradients: the one training-step tail."""
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
