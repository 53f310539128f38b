"""Key/value cache for incremental decoding.

Each layer keeps the keys and values of every position seen so far, (B, H, T_past, r) each, in the
layer's own math form: k = x W_K + b_K and v = x W_V + b_V of the LayerNorm'd layer input x. For
`canonical` and `identity_ko` at one head, W_K is the identity (a permutation for pivoted blocks),
so the cached keys are the normalised layer inputs themselves, plus b_K.
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, n_layer: int):
        self.keys: list[torch.Tensor | None] = [None] * n_layer
        self.values: list[torch.Tensor | None] = [None] * n_layer

    @property
    def length(self) -> int:
        """Positions cached (the same in every layer once a forward pass has run)."""
        return 0 if self.keys[0] is None else self.keys[0].shape[2]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this step's (B, H, T, r) keys and values; return all cached ones."""
        if self.keys[layer] is not None:
            k = torch.cat([self.keys[layer], k], dim=2)
            v = torch.cat([self.values[layer], v], dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v
