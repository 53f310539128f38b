"""GPT-2 decoder (learned positions, pre-LayerNorm, GELU MLP, tied embeddings).

Parameter names follow Hugging Face GPT-2 (`transformer.wte`, `transformer.h.0.attn.c_attn`, ...)
wherever the attention variant allows, so standard checkpoints map one-to-one.
"""

from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F
from torch import nn

from iattention.attention.cache import KOnlyCache, KVCache
from iattention.attention.registry import build_attention
from iattention.config.llama import LlamaConfig
from iattention.config.model import GPTConfig
from iattention.errors import UserError
from iattention.model.generate import generate
from iattention.symmetry.counts import llama_standard_param_count, standard_param_count
from iattention.symmetry.transforms import canonicalize_into, load_into


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, config.d_mlp, bias=config.bias)
        self.c_proj = nn.Linear(config.d_mlp, config.n_embd, bias=config.bias)
        self.c_proj.residual_scale = True
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        # (B, T, d) -> c_fc (B, T, d_mlp) -> GELU -> c_proj (B, T, d)
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias, eps=1e-5)
        self.attn = build_attention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias, eps=1e-5)
        self.mlp = MLP(config)

    def forward(self, x, cache: KVCache | None = None, layer: int = 0):
        x = x + self.attn(self.ln_1(x), cache, layer)  # (B, T, d)
        return x + self.mlp(self.ln_2(x))  # (B, T, d)


def available_memory(device: torch.device | None = None) -> int | None:
    """Bytes this process can still allocate: the GPU's free memory, else MemAvailable (Linux), else the
    machine's physical memory; None where the system does not say."""
    if device is not None and device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def memory_estimate(config: GPTConfig | LlamaConfig, batch_size: int = 0, cuda: bool = False) -> dict[str, int]:
    """Bytes a float32 model needs (an estimate): its weights with the padded vocabulary; when training
    (batch_size > 0) also the gradients, AdamW's two moments and the activations of one batch (per layer
    34 bytes per token and channel, as in Korthikanti et al. 2022 for half precision: a low estimate, so no
    run that fits is refused; the logits; on CPU one layer's attention scores)."""

    llama = hasattr(config, "n_kv_head")  # a LlamaConfig (model/llama.py): the same estimate, its own count
    params = (llama_standard_param_count(config) if llama else standard_param_count(config)) \
        + (config.padded_vocab_size - config.vocab_size) * config.n_embd
    need = {"weights": params * 4}
    if batch_size:
        B, T, d, H = batch_size, config.block_size, config.n_embd, config.n_head
        need["gradients"] = params * 4
        need["AdamW moments"] = params * 8
        need["activations"] = 2 * B * T * (config.n_layer * 34 * d + 3 * config.padded_vocab_size)
        if not cuda:  # one layer's attention scores, which the CPU kernels materialise (flash on CUDA does not)
            need["activations"] += 4 * B * H * T * T
    return need


def check_fits_in_memory(config: GPTConfig | LlamaConfig, batch_size: int = 0,
                         device: torch.device | None = None) -> None:
    """Refuse, in one line and before allocating anything, a model (and, with batch_size, its training)
    whose estimated memory exceeds what this machine has available: an absurd size would otherwise die in
    the allocator with a MemoryError or be killed."""
    if torch.empty(0).device.type == "meta":  # built under `with torch.device("meta")`: shapes only, no memory
        return
    have = available_memory(device)
    if have is None:  # the system does not say: let the allocator decide
        return
    need = memory_estimate(config, batch_size, cuda=device is not None and device.type == "cuda")
    total = sum(need.values())
    if total > have:
        parts = ", ".join(f"{k} {v / 2**30:.1f}" for k, v in need.items())
        what = f"training it with batch {batch_size}" if batch_size else "the model"
        raise UserError(f"{what} (vocab_size={config.vocab_size} padded to {config.padded_vocab_size}, n_embd="
                        f"{config.n_embd}, n_layer={config.n_layer}, n_head={config.n_head}, block_size="
                        f"{config.block_size}) needs an estimated {total / 2**30:.1f} GiB ({parts} GiB), more than "
                        f"the {have / 2**30:.1f} GiB available on this machine; lower those sizes")


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        config.validate()
        check_fits_in_memory(config)
        rng_at_entry = torch.random.get_rng_state()
        self.config = config
        d = config.n_embd
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.padded_vocab_size, d),
            wpe=nn.Embedding(config.block_size, d),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(d, bias=config.bias, eps=1e-5),
        ))
        self.lm_head = nn.Linear(d, config.padded_vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied
        self.apply(self._init_weights)
        if config.init == "matched" and config.attention != "standard":
            self._init_matched(rng_at_entry)

    @torch.no_grad()
    def _init_matched(self, rng_at_entry: torch.Tensor) -> None:
        """Start from the standard GPT-2 init that the same RNG state gives: canonicalized exactly (pivoted
        blocks) for `canonical`, loaded head by head (`load_heads`) for any other full-class variant.

        The standard model is drawn from the RNG state this constructor was entered with, and the
        RNG is left where building that standard model leaves it, so everything drawn afterwards
        (dropout masks, ...) matches a standard run with the same seed too.
        """
        torch.random.set_rng_state(rng_at_entry)
        standard = GPT(self.config.replace(attention="standard", canonical_halves="both", init="gpt2",
                                           minimal_bias=False))
        rng_after = torch.random.get_rng_state()
        if self.config.attention == "canonical":
            canonicalize_into(standard, self, block="pivoted")
        else:
            load_into(standard, self)
        torch.random.set_rng_state(rng_after)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            std = 0.02 / math.sqrt(2 * self.config.n_layer) if getattr(module, "residual_scale", False) else 0.02
            nn.init.normal_(module.weight, 0.0, std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, 0.0, 0.02)

    @property
    def attention_layers(self):
        return [block.attn for block in self.transformer.h]

    def num_params(self, exclude_positions: bool = False) -> int:
        """Learned parameters, counting the true vocabulary (padding rows excluded)."""
        n = sum(p.numel() for p in self.parameters())
        n -= (self.config.padded_vocab_size - self.config.vocab_size) * self.config.n_embd
        if exclude_positions:
            n -= self.transformer.wpe.weight.numel()
        return n

    def make_cache(self, kind: str = "full"):
        """An empty cache for generate: "full" (keys and values) or "k-only" (keys only: GPT-2's key map, d x
        n_head d_head, is always square, so the values are rebuilt from the keys; half the memory)."""
        if kind == "full":
            return KVCache(self.config.n_layer)
        if kind != "k-only":
            raise UserError(f"unknown cache {kind!r}; choose one of full, k-only")
        return KOnlyCache(self.config.n_layer)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, cache: KVCache | None = None):
        """idx (B, T) token ids -> logits (B, T, vocab_size); mean cross-entropy if targets given.
        With a KVCache, idx holds the positions after the cached ones (see model/generate.py)."""
        B, T = idx.shape  # (B, T) token ids
        past = cache.length if cache is not None else 0
        if past + T > self.config.block_size:
            raise ValueError(f"sequence length {past + T} exceeds block_size {self.config.block_size}")
        pos = torch.arange(past, past + T, device=idx.device)  # (T,)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))  # (B, T, d) + (T, d)
        for layer, block in enumerate(self.transformer.h):
            x = block(x, cache, layer)  # (B, T, d)
        logits = self.lm_head(self.transformer.ln_f(x))  # (B, T, padded_vocab_size)
        if self.config.padded_vocab_size != self.config.vocab_size:
            logits = logits[..., : self.config.vocab_size]  # (B, T, vocab_size)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))  # (B*T, V) -> ()
        return logits, loss

    def generate(self, idx: torch.Tensor, max_new_tokens: int, **kwargs) -> torch.Tensor:
        """Append max_new_tokens sampled tokens to idx (B, T); see model/generate.py for the options."""

        return generate(self, idx, max_new_tokens, **kwargs)
