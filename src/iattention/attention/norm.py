"""RMSNorm, as transformers computes it: the statistic in float32 for any input dtype (float64 under `exact`, which
`model.gpt.exact_norms` switches on where two float64 models of ours are compared), times the gain.

Here, below the model, because the attention layer holds two of them where a family normalises its queries and keys
(GPTConfig.qk_norm: Qwen3's per-head q_norm / k_norm, OLMo 2's over the whole projection); the model's own norms
(ln_1, ln_2, ln_f) are the same class."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    exact = False  # set by model.gpt.exact_norms only

    def __init__(self, d: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def gain(self) -> torch.Tensor:
        """(d,) the gain the normalised input is multiplied by (a subclass may assemble it)."""
        return self.weight

    @torch.no_grad()
    def load_gain(self, gain: torch.Tensor) -> None:
        """Set the gain to `gain` (d,) (a subclass holding fewer numbers keeps its fixed entries)."""
        self.weight.copy_(gain.reshape(-1))

    def forward(self, x):
        # (..., d): x / rms(x) in float32 (transformers' arithmetic, for any input dtype; under exact in float64 for
        # float64 input), times the gain
        h = x.to(torch.float64 if self.exact and x.dtype == torch.float64 else torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.gain() * h.to(x.dtype)
