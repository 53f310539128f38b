"""A look inside a model: every layer's residual stream and attention pattern for an input, in one
forward pass (like TransformerLens' `run_with_cache`), built on the model directly with forward hooks.

Names follow TransformerLens: `blocks.{l}.hook_resid_pre` (B, T, d), `blocks.{l}.attn.hook_pattern`
(B, H, T_query, T_key: softmax of the scores, causal), `blocks.{l}.hook_attn_out` (B, T, d),
`blocks.{l}.hook_resid_post` (B, T, d), and `ln_final.hook_normalized`. The pattern is recomputed from
the layer's own q and k (SDPA does not return it), so it is exactly what the layer attends with. Every family:
with RoPE the pattern is the rotated scores of each query head against its group's key head, and `ln_final` is
the family's final norm.

A canonical model's own parameterization (what external tools never see: they get the expanded standard
model) comes by name from `canonical_view(model)`, or in the cache with `run_with_cache(..., canonical=True)`:
`blocks.{l}.attn.canonical.{name}`, the names of `CanonicalAttention.canonical_view` (W_Q, W_V, k_rows,
W_K_fixed, W_K_learned, o_cols, W_O_fixed, W_O_learned, W_QK; W at one head).
"""

from __future__ import annotations

import math

import torch

from iattention.kernels.math_path import causal_mask


def _parts(model):
    """(blocks, their attention layers, the final norm)."""
    return model.transformer.h, [block.attn for block in model.transformer.h], model.transformer.ln_f


@torch.no_grad()
def attention_pattern(attn, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """(B, H, T, T) causal attention weights of layer `attn` on its input x (B, T, d), within its sliding window. A
    Llama-family layer (grouped-query, RoPE) also takes the layer's rope = (cos, sin), each (T, rot/2): query head h
    scores the rotated keys of its key/value head h // (H / G); queries and keys through the layer's query/key norm
    where it has one."""
    B, T, _ = x.shape
    H, r = attn.n_head, attn.d_head
    q, k, _ = attn.qkv(x)  # (B, T, H r), (B, T, G r)
    G = k.shape[-1] // r
    q, k = q.reshape(B, T, H, r).transpose(1, 2), k.reshape(B, T, G, r).transpose(1, 2)  # (B, H|G, T, r)
    if getattr(attn, "qk_norm", ""):  # a query/key norm before RoPE (Qwen3, OLMo 2)
        q, k = attn.qk_normed(q, attn.q_norm), attn.qk_normed(k, attn.k_norm)
    if rope is not None and attn.rot:  # not on a layer without RoPE (SmolLM3's), whose block passes it anyway
        from iattention.attention.rope import apply_rope

        q, k = (apply_rope(t, *rope, attn.rope_layout) for t in (q, k))
    k = k.repeat_interleave(H // G, dim=1)  # (B, H, T, r): each query head's key head
    scores = q.double() @ k.double().transpose(-1, -2) / math.sqrt(r)
    mask = causal_mask(T, T, x.device, getattr(attn, "window", 0))  # (T, T): with the layer's sliding window
    return scores.masked_fill(~mask, float("-inf")).softmax(-1).to(x.dtype)


def canonical_view(model) -> dict[str, torch.Tensor]:
    """{`blocks.{l}.attn.canonical.{name}`: tensor} for every layer of a canonical model (names and shapes:
    `CanonicalAttention.canonical_view`); a UserError for a model with other attention."""
    from iattention.attention.canonical import CanonicalAttention
    from iattention.errors import UserError

    layers = model.attention_layers
    if not all(isinstance(attn, CanonicalAttention) for attn in layers):
        variant = getattr(model.config, "attention", type(layers[0]).__name__)
        raise UserError(f"a {variant}-attention model has no canonical view (only canonical models do); "
                        "make one with iattn convert --to canonical")
    return {f"blocks.{layer}.attn.canonical.{name}": t
            for layer, attn in enumerate(layers) for name, t in attn.canonical_view().items()}


@torch.no_grad()
def run_with_cache(model, idx: torch.Tensor, canonical: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(logits, cache) for token ids idx (B, T), the model in eval mode (no dropout); `canonical`: the cache
    also holds the model's canonical view (`canonical_view`; a UserError for a model that is not canonical)."""
    cache: dict[str, torch.Tensor] = canonical_view(model) if canonical else {}
    handles = []
    blocks, layers, final_norm = _parts(model)
    for layer, (block, attn) in enumerate(zip(blocks, layers)):
        def pre(_, args, layer=layer):
            cache[f"blocks.{layer}.hook_resid_pre"] = args[0].detach()

        def post(_, args, out, layer=layer):
            cache[f"blocks.{layer}.hook_resid_post"] = out.detach()

        def attn_in(module, args, kwargs, layer=layer):  # rope= from its block (None without RoPE)
            cache[f"blocks.{layer}.attn.hook_pattern"] = attention_pattern(module, args[0], kwargs.get("rope"))

        def attn_out(_, args, out, layer=layer):
            cache[f"blocks.{layer}.hook_attn_out"] = out.detach()

        handles += [block.register_forward_pre_hook(pre), block.register_forward_hook(post),
                    attn.register_forward_pre_hook(attn_in, with_kwargs=True), attn.register_forward_hook(attn_out)]
    handles.append(final_norm.register_forward_hook(
        lambda _, args, out: cache.__setitem__("ln_final.hook_normalized", out.detach())))
    was_training = model.training
    model.eval()
    try:
        logits, _ = model(idx)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return logits, cache
