"""One decoder-only transformer for every family, as its GPTConfig says (litgpt's `GPT`): GPT-2 (learned
positions, LayerNorm, GELU MLP, tied embeddings), Llama / Qwen2 / Mistral (RoPE, RMSNorm, SwiGLU, grouped-query
attention, an untied head), and the structures later families add as config values (a parallel residual, norms
after the sublayers, a query/key norm, layers without RoPE).

Parameter names follow Hugging Face GPT-2 (`transformer.wte`, `transformer.h.0.attn.c_attn`, ...) for every
family; model/names.py maps them to each family's transformers names (`model.layers.0.self_attn.q_proj`, ...).
RMSNorm computes its statistics in float32 and RoPE its angles in float32, exactly as transformers does, so a
float64 model reproduces transformers' float64 logits to rounding (`exact_norms`: float64 statistics, where two models
of ours are compared).
"""

from __future__ import annotations

import math
import os
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from iattention.attention.cache import KOnlyCache, KVCache
from iattention.attention.norm import RMSNorm
from iattention.attention.registry import build_attention
from iattention.attention.rope import RotaryEmbedding, default_inv_freq, llama3_inv_freq
from iattention.config.model import GPTConfig
from iattention.errors import UserError
from iattention.model.generate import generate
from iattention.model.loss import at_least_fp32, chunked_cross_entropy
from iattention.symmetry.counts import standard_param_count
from iattention.symmetry.transforms import canonicalize_into, load_into
from iattention.utils.flags import switched_on

CACHES = ("full", "k-only")


class MLP(nn.Module):
    """GPT-2's: c_fc, GELU (tanh approximation; exact for mlp "gelu", GPT-NeoX's), c_proj."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, config.d_mlp, bias=config.bias)
        self.c_proj = nn.Linear(config.d_mlp, config.n_embd, bias=config.bias)
        self.c_proj.residual_scale = True
        self.dropout = nn.Dropout(config.dropout)
        self.approximate = "tanh" if config.mlp == "gelu_tanh" else "none"

    def matrix_blocks(self) -> dict[str, list[tuple]]:
        """Each matrix holds one map (SwiGLU.matrix_blocks)."""
        return {}

    def forward(self, x):
        # (B, T, d) -> c_fc (B, T, d_mlp) -> GELU -> c_proj (B, T, d)
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate=self.approximate)))


class SwiGLU(nn.Module):
    """The Llama family's: down(silu(gate(x)) * up(x)); with config.fused_gate_up the gate and up maps are one
    `gate_up_proj` whose outputs are [gate | up] (Phi-3's), the same function."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        d, m = config.n_embd, config.d_mlp
        self.fused = config.fused_gate_up
        if self.fused:
            self.gate_up_proj = nn.Linear(d, 2 * m, bias=config.bias)
        else:
            self.gate_proj = nn.Linear(d, m, bias=config.bias)
            self.up_proj = nn.Linear(d, m, bias=config.bias)
        self.down_proj = nn.Linear(m, d, bias=config.bias)
        self.down_proj.residual_scale = True
        self.dropout = nn.Dropout(config.dropout)

    def matrix_blocks(self) -> dict[str, list[tuple]]:
        """The 2-D blocks of a matrix that holds more than one map (for Muon, as attention's head_blocks): the fused
        gate_up_proj's gate and up rows."""
        if not self.fused:
            return {}
        m = self.down_proj.in_features
        return {"gate_up_proj.weight": [(slice(0, m),), (slice(m, 2 * m),)]}

    def forward(self, x):
        # (B, T, d) -> silu(gate) * up (B, T, d_mlp) -> down (B, T, d)
        if self.fused:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # (B, T, d_mlp) each
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.dropout(self.down_proj(F.silu(gate) * up))


@contextmanager
def exact_norms(model: nn.Module, on: bool = True):
    """RMSNorm statistics in float64 for float64 input inside the block (unless not `on`), so that two float64
    models of ours compare to float64 rounding (a conversion's check). Outside it they are computed in float32 as
    transformers does for any dtype, which rounds an attention output's last bits to float32: a difference of 1e-12
    then reads 0, and one that crosses a float32 rounding boundary reads about 1e-8 (over float64's 1e-9 tolerance)."""
    with switched_on((m for m in model.modules() if on and isinstance(m, RMSNorm)), "exact"):
        yield model


def norm(config: GPTConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return RMSNorm(config.n_embd, config.norm_eps)
    return nn.LayerNorm(config.n_embd, bias=config.bias, eps=config.norm_eps)


class Block(nn.Module):
    def __init__(self, config: GPTConfig, layer: int = 0):
        super().__init__()
        self.ln_1 = norm(config)
        self.attn = build_attention(config.layer(layer))  # this layer's own (rot 0 on a layer without RoPE)
        self.attn.window = config.window_of(layer)  # this layer's sliding window (0: none)
        self.ln_2 = norm(config)
        self.mlp = SwiGLU(config) if config.mlp == "swiglu" else MLP(config)
        self.parallel = config.parallel_residual
        self.post = config.norm_place == "post"  # OLMo 2: each norm on its sublayer's output, none on its input

    def forward(self, x, cache: KVCache | None = None, layer: int = 0, rope=None, key_mask=None):
        if self.post:
            x = x + self.ln_1(self.attn(x, cache, layer, rope=rope, key_mask=key_mask))  # (B, T, d)
            return x + self.ln_2(self.mlp(x))  # (B, T, d)
        a = self.attn(self.ln_1(x), cache, layer, rope=rope, key_mask=key_mask)  # (B, T, d)
        if self.parallel:  # GPT-NeoX: both read the block's input (its sum order)
            return self.mlp(self.ln_2(x)) + a + x  # (B, T, d)
        x = x + a
        return x + self.mlp(self.ln_2(x))  # (B, T, d)


def inv_freq_of(config: GPTConfig) -> torch.Tensor:
    """(rot/2,) float32 inverse frequencies of the config's rope_type."""
    if config.rope_type == "llama3":
        s = config.rope_scaling
        return llama3_inv_freq(config.rot, config.rope_theta, s["factor"], s["low_freq_factor"],
                               s["high_freq_factor"], s["original_max_position_embeddings"])
    return default_inv_freq(config.rot, config.rope_theta)


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


def memory_estimate(config: GPTConfig, batch_size: int = 0, cuda: bool = False) -> dict[str, int]:
    """Bytes a float32 model needs (an estimate): its weights with the padded vocabulary; when training
    (batch_size > 0) also the gradients, AdamW's two moments and the activations of one batch (per layer
    34 bytes per token and channel, as in Korthikanti et al. 2022 for half precision: a low estimate, so no
    run that fits is refused; the logits; on CPU one layer's attention scores)."""
    params = standard_param_count(config) + (config.padded_vocab_size - config.vocab_size) * config.n_embd
    need = {"weights": params * 4}
    if batch_size:
        B, T, d, H = batch_size, config.block_size, config.n_embd, config.n_head
        need["gradients"] = params * 4
        need["AdamW moments"] = params * 8
        need["activations"] = 2 * B * T * (config.n_layer * 34 * d + 3 * config.padded_vocab_size)
        if not cuda:  # one layer's attention scores, which the CPU kernels materialise (flash on CUDA does not)
            need["activations"] += 4 * B * H * T * T
    return need


def check_fits_in_memory(config: GPTConfig, batch_size: int = 0,
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
    _regions = None  # (block function, head function) once compile_regions has run

    def __init__(self, config: GPTConfig):
        super().__init__()
        config.validate()
        check_fits_in_memory(config)
        rng_at_entry = torch.random.get_rng_state()
        self.config = config
        d = config.n_embd
        parts = dict(wte=nn.Embedding(config.padded_vocab_size, d))
        if config.pos == "learned":
            parts["wpe"] = nn.Embedding(config.block_size, d)
        blocks = nn.ModuleList([Block(config, layer) for layer in range(config.n_layer)])
        parts.update(drop=nn.Dropout(config.dropout), h=blocks, ln_f=norm(config))
        if config.pos == "rope":
            parts["rotary_emb"] = RotaryEmbedding(inv_freq_of(config))
        self.transformer = nn.ModuleDict(parts)
        self.lm_head = nn.Linear(d, config.padded_vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.transformer.wte.weight
        self.apply(self._init_weights)
        if config.init == "matched" and config.attention != "standard":
            self._init_matched(rng_at_entry)

    @torch.no_grad()
    def _init_matched(self, rng_at_entry: torch.Tensor) -> None:
        """Start from the standard init that the same RNG state gives: canonicalized exactly (pivoted
        blocks) for `canonical`, loaded head by head (`load_heads`) for any other full-class variant.

        The standard model is drawn from the RNG state this constructor was entered with, and the
        RNG is left where building that standard model leaves it, so everything drawn afterwards
        (dropout masks, ...) matches a standard run with the same seed too.
        """
        torch.random.set_rng_state(rng_at_entry)
        standard = GPT(self.config.replace(attention="standard", canonical_halves="both",
                                           init=self.config.standard_init, minimal_bias=False))
        rng_after = torch.random.get_rng_state()
        if self.config.attention == "canonical":
            canonicalize_into(standard, self, block="pivoted")
        else:
            load_into(standard, self)
        torch.random.set_rng_state(rng_after)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            scaled = getattr(module, "residual_scale", False) and self.config.standard_init != "normal"
            nn.init.normal_(module.weight, 0.0, 0.02 / math.sqrt(2 * self.config.n_layer) if scaled else 0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, 0.0, 0.02)

    def compile_regions(self, mode: str | None = None) -> None:
        """Regional compilation (PyTorch's recipe for a stack of like blocks): `Block.forward` through
        torch.compile once, so one graph serves every block (their parameters are its inputs), and the final norm,
        head and loss as one more graph; the embeddings stay eager. The first step compiles one block instead of
        the whole stack (paper preset, 2 CPU cores, inductor's caches off: 19.6 s against 31.8 s; docs/training.md
        has the later steps' speed). In place, and only for forwards without a cache (training, evaluation):
        generation with a cache, and any forward while a block has hooks (`run_with_cache`), run the blocks
        eagerly. Parameter names and state_dict are unchanged; a copy or pickle of the model is not compiled.
        `torch.compiler.set_stance("force_eager")` runs the eager code (the trainer's exact float32 evaluation)."""
        self._regions = (torch.compile(Block.forward, fullgraph=True, mode=mode),
                         torch.compile(type(self)._head, fullgraph=True, mode=mode))

    def __getstate__(self):
        return {**super().__getstate__(), "_regions": None}  # compiled functions do not pickle

    @property
    def attention_layers(self):
        return [block.attn for block in self.transformer.h]

    def num_params(self, exclude_positions: bool = False) -> int:
        """Learned parameters, counting the true vocabulary (padding rows excluded; a tied head once)."""
        n = sum(p.numel() for p in self.parameters())
        n -= (self.config.padded_vocab_size - self.config.vocab_size) * self.config.n_embd
        if not self.config.tie_embeddings:
            n -= (self.config.padded_vocab_size - self.config.vocab_size) * self.config.n_embd
        if exclude_positions and "wpe" in self.transformer:
            n -= self.transformer.wpe.weight.numel()
        return n

    def make_cache(self, kind: str = "full"):
        """An empty cache for generate: "full" (keys and values) or "k-only" (the pre-RoPE keys only; the values
        are rebuilt from them, half the memory: exact where the key map is square, n_kv_head x d_head = n_embd,
        as GPT-2's always is)."""
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
        if c.pos != "rope":
            return KOnlyCache(c.n_layer)
        wte = self.transformer.wte.weight
        return KOnlyCache(c.n_layer, lambda n: self.transformer.rotary_emb(torch.arange(n, device=wte.device),
                                                                             wte.dtype))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, cache: KVCache | None = None,
                loss_chunk: int = 0, positions: torch.Tensor | None = None, key_mask: torch.Tensor | None = None,
                checkpoint=None):
        """idx (B, T) token ids -> logits (B, T, vocab_size); mean cross-entropy if targets given (-100: a
        position not scored). With a cache (make_cache), idx holds the positions after the cached ones (see
        model/generate.py). loss_chunk > 0 with targets: (None, loss), the loss computed that many positions at a
        time without ever holding all the logits (model/loss.py; train.loss_chunk).
        A left-padded batch (hf_model: transformers' attention_mask): positions (B, T), each row's own, and key_mask
        (B, past + T), False on padding. checkpoint(fn, *args): recompute each block in the backward instead of
        keeping its activations (torch.utils.checkpoint's signature; transformers' gradient checkpointing)."""
        B, T = idx.shape  # (B, T) token ids
        past = cache.length if cache is not None else 0
        if past + T > self.config.block_size:
            raise ValueError(f"sequence length {past + T} exceeds block_size {self.config.block_size}")
        pos = torch.arange(past, past + T, device=idx.device) if positions is None else positions  # (T,) or (B, T)
        x = self.transformer.wte(idx)  # (B, T, d)
        rope = None
        if "wpe" in self.transformer:
            x = x + self.transformer.wpe(pos)  # (B, T, d) + (T, d) or (B, T, d)
        if "rotary_emb" in self.transformer:
            rope = self.transformer.rotary_emb(pos, x.dtype)  # (T, rot/2) or (B, 1, T, rot/2), x 2
        x = self.transformer.drop(x)
        if loss_chunk < 0:
            raise ValueError(f"loss_chunk must be >= 0 (0: the whole loss at once), got {loss_chunk}")
        eager = self._regions is None or cache is not None or any(b._forward_hooks or b._forward_pre_hooks
                                                                  for b in self.transformer.h)
        block_fn, head_fn = (Block.__call__, type(self)._head) if eager else self._regions
        for layer, block in enumerate(self.transformer.h):
            if checkpoint is not None and cache is None:
                x = checkpoint(block_fn, block, x, None, layer, rope, key_mask)  # (B, T, d)
            else:
                x = block_fn(block, x, cache, layer, rope, key_mask)  # (B, T, d)
        return head_fn(self, x, targets, loss_chunk)

    def _head(self, x: torch.Tensor, targets: torch.Tensor | None, loss_chunk: int):
        """The last blocks' output (B, T, d) -> final norm, head and loss: forward's return value."""
        x = self.transformer.ln_f(x)  # (B, T, d)
        if targets is not None and loss_chunk:
            return None, chunked_cross_entropy(x, self.lm_head, targets, self.config.vocab_size, loss_chunk)
        logits = self.lm_head(x)  # (B, T, padded_vocab_size)
        if self.config.padded_vocab_size != self.config.vocab_size:
            logits = logits[..., : self.config.vocab_size]  # (B, T, vocab_size)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(at_least_fp32(logits.reshape(-1, logits.size(-1))), targets.reshape(-1))  # -> ()
        return logits, loss

    def generate(self, idx: torch.Tensor, max_new_tokens: int, **kwargs) -> torch.Tensor:
        """Append max_new_tokens sampled tokens to idx (B, T); cache_kind="k-only" for the K-only cache (see
        model/generate.py for the other options)."""
        return generate(self, idx, max_new_tokens, **kwargs)
