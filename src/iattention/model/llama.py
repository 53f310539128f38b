"""Llama-family decoder (RoPE, RMSNorm, SwiGLU MLP, grouped-query attention): Llama, Qwen2, Mistral, SmolLM2.

Parameter names follow transformers' LlamaForCausalLM (`model.embed_tokens`, `model.layers.0.self_attn.q_proj`,
`model.layers.0.mlp.gate_proj`, `model.norm`, `lm_head`), so a standard model's state dict maps one to one.
RMSNorm computes its statistics in float32 and RoPE its angles in float32, exactly as transformers does, so a
float64 model reproduces transformers' float64 logits to rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from iattention.attention.cache import KOnlyCache, KVCache
from iattention.attention.registry import build_grouped_attention
from iattention.attention.rope import RotaryEmbedding, default_inv_freq, llama3_inv_freq
from iattention.config.llama import LlamaConfig
from iattention.errors import UserError
from iattention.model.generate import generate
from iattention.model.gpt import check_fits_in_memory

CACHES = ("full", "k-only")


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        # (B, T, d): x / rms(x) in float32 (transformers' arithmetic, for any input dtype), times the gain
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class SwiGLU(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.n_embd, config.d_ff, bias=False)
        self.up_proj = nn.Linear(config.n_embd, config.d_ff, bias=False)
        self.down_proj = nn.Linear(config.d_ff, config.n_embd, bias=False)

    def forward(self, x):
        # (B, T, d) -> silu(gate) * up (B, T, d_ff) -> down (B, T, d)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.n_embd, config.rms_eps)
        self.self_attn = build_grouped_attention(config)
        self.post_attention_layernorm = RMSNorm(config.n_embd, config.rms_eps)
        self.mlp = SwiGLU(config)

    def forward(self, x, rope, cache=None, layer: int = 0):
        x = x + self.self_attn(self.input_layernorm(x), cache, layer, rope=rope)  # (B, T, d)
        return x + self.mlp(self.post_attention_layernorm(x))  # (B, T, d)


def inv_freq_of(config: LlamaConfig) -> torch.Tensor:
    """(rot/2,) float32 inverse frequencies of the config's rope_type."""
    if config.rope_type == "llama3":
        s = config.rope_scaling
        return llama3_inv_freq(config.rot, config.rope_theta, s["factor"], s["low_freq_factor"],
                               s["high_freq_factor"], s["original_max_position_embeddings"])
    return default_inv_freq(config.rot, config.rope_theta)


class Llama(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        config.validate()
        check_fits_in_memory(config)
        self.config = config
        d = config.n_embd
        self.model = nn.ModuleDict(dict(
            embed_tokens=nn.Embedding(config.vocab_size, d),
            layers=nn.ModuleList([LlamaBlock(config) for _ in range(config.n_layer)]),
            norm=RMSNorm(d, config.rms_eps),
            rotary_emb=RotaryEmbedding(inv_freq_of(config)),
        ))
        self.lm_head = nn.Linear(d, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, 0.0, 0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    @property
    def attention_layers(self):
        return [block.self_attn for block in self.model.layers]

    def num_params(self) -> int:
        """Learned parameters (a tied head counted once)."""
        return sum(p.numel() for p in self.parameters())

    def make_cache(self, kind: str = "full"):
        """An empty cache for generate: "full" (keys and values) or "k-only" (pre-RoPE keys; needs a square
        invertible key map, n_kv_head x d_head = n_embd)."""
        c = self.config
        if kind == "full":
            return KVCache(c.n_layer)
        if kind != "k-only":
            raise UserError(f"unknown cache {kind!r}; choose one of {', '.join(CACHES)}")
        keys = c.n_kv_head * c.d_head
        if keys != c.n_embd:
            why = ("(grouped-query attention already caches fewer numbers than that)" if c.n_kv_head < c.n_head else
                   "(the keys do not determine the layer input)") if keys < c.n_embd else \
                "(the key map is not square, so the values are not rebuilt from the keys)"
            raise UserError(f"a K-only cache is exact only when the keys determine the layer input (n_kv_head x "
                            f"d_head = n_embd); this model has {c.n_kv_head} x {c.d_head} = {keys} "
                            f"{'<' if keys < c.n_embd else '>'} {c.n_embd} key dims per token {why}: use the full "
                            "cache")
        dtype = self.model.embed_tokens.weight.dtype
        device = self.model.embed_tokens.weight.device
        return KOnlyCache(c.n_layer, lambda n: self.model.rotary_emb(torch.arange(n, device=device), dtype))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, cache=None):
        """idx (B, T) token ids -> logits (B, T, vocab_size); mean cross-entropy if targets given. With a cache
        (make_cache), idx holds the positions after the cached ones."""
        B, T = idx.shape
        past = cache.length if cache is not None else 0
        if past + T > self.config.block_size:
            raise ValueError(f"sequence length {past + T} exceeds block_size {self.config.block_size}")
        x = self.model.embed_tokens(idx)  # (B, T, d)
        rope = self.model.rotary_emb(torch.arange(past, past + T, device=idx.device), x.dtype)  # (T, rot/2) x 2
        for layer, block in enumerate(self.model.layers):
            x = block(x, rope, cache, layer)  # (B, T, d)
        logits = self.lm_head(self.model.norm(x))  # (B, T, vocab_size)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))
        return logits, loss

    def generate(self, idx: torch.Tensor, max_new_tokens: int, **kwargs) -> torch.Tensor:
        """Append max_new_tokens sampled tokens to idx (B, T); cache="k-only" for the K-only cache (see
        model/generate.py for the other options)."""
        return generate(self, idx, max_new_tokens, **kwargs)
