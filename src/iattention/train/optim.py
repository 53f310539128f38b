"""AdamW with weight decay on matrices only (GPT-2 / nanoGPT convention)."""

from __future__ import annotations

import torch

from iattention.train.config import OptimConfig


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig, device_type: str) -> torch.optim.AdamW:
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    extra = {"fused": True} if device_type == "cuda" else {}
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), **extra)
