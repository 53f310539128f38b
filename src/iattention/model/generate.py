"""Autoregressive sampling with a key/value cache (greedy, temperature, top-k, nucleus top-p).

With the cache, the prompt is run once and every later step feeds one token. Positions are learned
and absolute, so once the text outgrows block_size the cached keys (computed at other positions)
no longer apply: from then on every step reruns the last block_size tokens, as without a cache.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from iattention.attention.base import frozen_weights
from iattention.attention.cache import KVCache
from iattention.errors import UserError


def filter_logits(logits: torch.Tensor, top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """Keep the top_k largest logits and the smallest set whose probability reaches top_p; -inf elsewhere."""
    logits = logits.clone()
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[..., -1:]
        logits[logits < kth] = -float("inf")
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        drop = probs.cumsum(-1) - probs >= top_p  # mass before this token already reaches top_p
        drop[..., 0] = False  # the most likely token always stays (a tiny top_p, 1e-300, would drop them all)
        sorted_logits[drop] = -float("inf")
        logits = torch.full_like(logits, -float("inf")).scatter(-1, order, sorted_logits)
    return logits


def next_token(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None,
               generator: torch.Generator | None) -> torch.Tensor:
    """(B, V) last-position logits -> (B, 1) token ids; temperature 0 is greedy (argmax)."""
    if temperature == 0:
        return logits.argmax(-1, keepdim=True)
    # In float64 and from the maximum down: a tiny temperature (1e-300) then tends to argmax instead of
    # dividing by a float32 zero into inf - inf = nan.
    logits = logits.double()
    scaled = (logits - logits.max(-1, keepdim=True).values) / temperature
    probs = torch.softmax(filter_logits(scaled, top_k, top_p), dim=-1)
    return torch.multinomial(probs, 1, generator=generator)


@torch.no_grad()
def generate(model, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
             top_p: float | None = None, generator: torch.Generator | None = None, use_cache: bool = True,
             on_token: Callable[[torch.Tensor], None] | None = None, cache_kind: str = "full") -> torch.Tensor:
    """idx (B, T) prompt ids -> (B, T + max_new_tokens). on_token(ids (B, 1)) is called per new token.
    cache_kind: "full" (keys and values) or "k-only" (keys alone, where they determine the layer input; the
    model's `make_cache` refuses it otherwise)."""
    if cache_kind != "full" and not hasattr(model, "make_cache"):
        raise UserError(f"cache {cache_kind!r} needs a model with make_cache (iattention's GPT); use the full cache")

    def new_cache():
        return model.make_cache(cache_kind) if hasattr(model, "make_cache") else KVCache(model.config.n_layer)

    if use_cache:
        new_cache()  # a refused cache kind is refused before any work

    was_training = model.training
    model.eval()
    with frozen_weights(model):  # weights cannot change while decoding: build derived ones once
        block = model.config.block_size
        cache = new_cache() if use_cache else None
        feed = idx[:, -block:]
        for _ in range(max_new_tokens):
            if cache is not None and cache.length + feed.shape[1] > block:  # window full: start over
                cache, feed = new_cache(), idx[:, -block:]
            logits, _ = model(feed, cache=cache) if cache is not None else model(idx[:, -block:])
            tok = next_token(logits[:, -1, :], temperature, top_k, top_p, generator)
            idx = torch.cat([idx, tok], dim=1)
            feed = tok
            if on_token:
                on_token(tok)
    model.train(was_training)
    return idx
