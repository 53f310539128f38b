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
        return self.length_of(0)

    def length_of(self, layer: int) -> int:
        """Positions cached in `layer` (the interface a cache of another library answers too: hf_model's)."""
        return 0 if self.keys[layer] is None else self.keys[layer].shape[2]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this step's (B, H, T, r) keys and values; return all cached ones."""
        if self.keys[layer] is not None:
            k = torch.cat([self.keys[layer], k], dim=2)
            v = torch.cat([self.values[layer], v], dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v

    def nbytes(self) -> int:
        """Bytes held by the cached tensors."""
        return sum(t.numel() * t.element_size() for t in self.keys + self.values if t is not None)


class KOnlyCache:
    """Keys only, for RoPE models whose key map is square and invertible (n_kv_head x d_head = n_embd, e.g.
    MHA Llama-2, SmolLM2-1.7B): each layer keeps the pre-RoPE keys k~ = x W_K + b_K, (B, G, T_past, r); the
    values are a fixed linear function of them (v = (k~ - b_K) W_K^{-1} W_V + b_V), so storing them too is
    redundant, and the keys are rotated when read. Half the memory of a KVCache, exactly the same outputs.
    `rope(n)` gives the (cos, sin) tables of positions 0..n-1 (the model's rotary embedding); None for GPT-2,
    whose multi-head key map is always square (n_head x d_head = d): its keys, (B, H, T_past, r), are kept as
    they are (at one canonical head, the layer input itself, permuted)."""

    def __init__(self, n_layer: int, rope=None):
        self.keys: list[torch.Tensor | None] = [None] * n_layer
        self.rope = rope

    @property
    def length(self) -> int:
        return self.length_of(0)

    def length_of(self, layer: int) -> int:
        return 0 if self.keys[layer] is None else self.keys[layer].shape[2]

    def update(self, layer: int, k: torch.Tensor) -> torch.Tensor:
        """Append this step's (B, G, T, r) pre-RoPE keys; return all cached ones."""
        if self.keys[layer] is not None:
            k = torch.cat([self.keys[layer], k], dim=2)
        self.keys[layer] = k
        return k

    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() for k in self.keys if k is not None)
