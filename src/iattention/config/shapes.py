"""Shape-only presets of published models (the Llama layout's families, GPT-NeoX), for `iattn params` only.

They hold the shapes of the published configs (hidden size, layers, heads, KV heads, head width, SwiGLU width,
vocabulary, tied embeddings, q/k/v bias), nothing to train with: they live here, apart from the run presets of
presets/*.yaml, so `iattn train --preset` cannot pick one up (its preset lookup never reads this table).
Totals (`symmetry.counts.standard_param_count`) equal the published parameter counts exactly;
`tests/unit/symmetry/test_llama_counts.py` checks them from arithmetic and from a meta-device model.
"""

from __future__ import annotations

from iattention.config.model import GPTConfig
from iattention.errors import UserError

# name -> (GPTConfig keys (family llama unless said), the published parameter count or None)
SHAPES: dict[str, tuple[dict, int | None]] = {
    # meta-llama/Meta-Llama-3-8B config.json
    "llama-3-8b": (dict(n_layer=32, n_head=32, n_kv_head=8, n_embd=4096, mlp_hidden=14336, vocab_size=128256,
                        block_size=8192, rope_theta=500000.0, norm_eps=1e-5), 8_030_261_248),
    # HuggingFaceTB/SmolLM2-135M config.json
    "smollm2-135m": (dict(n_layer=30, n_head=9, n_kv_head=3, n_embd=576, mlp_hidden=1536, vocab_size=49152,
                          block_size=8192, rope_theta=100000.0, norm_eps=1e-5, tie_embeddings=True), 134_515_008),
    # Qwen/Qwen2.5-0.5B config.json
    "qwen2.5-0.5b": (dict(n_layer=24, n_head=14, n_kv_head=2, n_embd=896, mlp_hidden=4864, vocab_size=151936,
                          block_size=32768, rope_theta=1000000.0, qkv_bias=True, tie_embeddings=True,
                          family="qwen2"), 494_032_768),
    # EleutherAI/pythia-160m config.json: GPT-NeoX, rotary_pct 0.25 of d_head 64
    "pythia-160m": (dict(family="gpt_neox", n_layer=12, n_head=12, n_embd=768, mlp_hidden=3072, vocab_size=50304,
                         block_size=2048, rot=16), 162_322_944),
    # mistralai/Mistral-7B-v0.1 config.json (its 4096-token sliding window changes no count)
    "mistral-7b": (dict(family="mistral", n_layer=32, n_head=32, n_kv_head=8, n_embd=4096, mlp_hidden=14336,
                        vocab_size=32000, block_size=32768, norm_eps=1e-5), 7_241_732_096),
    # HuggingFaceTB/SmolLM3-3B config.json: no RoPE on every 4th layer (its total is not checked against a
    # published count: `iattn params --from` of its config.json equals transformers' count, tests/unit/interop)
    "smollm3-3b": (dict(family="smollm3", n_layer=36, n_head=16, n_kv_head=4, n_embd=2048, mlp_hidden=11008,
                        vocab_size=128256, block_size=65536, rope_theta=5000000.0, tie_embeddings=True, nope_every=4),
                   None),
    # microsoft/Phi-3-mini-4k-instruct config.json: fused qkv_proj and gate_up_proj, 32 KV heads (a K-only cache
    # applies); its 2047-token sliding window changes no count (the total, 3,821,079,552, is arithmetic and
    # transformers' count of its config on the meta device: tests/unit/interop/test_hf_phi3.py)
    "phi-3-mini-4k": (dict(family="phi3", n_layer=32, n_head=32, n_kv_head=32, n_embd=3072, mlp_hidden=8192,
                           vocab_size=32064, block_size=4096, norm_eps=1e-5, sliding_window=2047), None),
    # Qwen/Qwen3-0.6B config.json: head_dim 128 (16 query heads of 128 = 2048 > hidden 1024), q_norm / k_norm (its
    # total, 596,049,920, is transformers' num_parameters of this shape on the meta device: tests/unit/interop)
    "qwen3-0.6b": (dict(family="qwen3", n_layer=28, n_head=16, n_kv_head=8, n_embd=1024, d_head=128, mlp_hidden=3072,
                        vocab_size=151936, block_size=40960, rope_theta=1000000.0, tie_embeddings=True), None),
    # allenai/OLMo-2-0425-1B config.json (as remembered: not checked against the hub here), multi-head, an untied head
    # (its total, 1,484,916,736, is transformers' num_parameters of this shape on the meta device: tests/unit/interop)
    "olmo-2-0425-1b": (dict(family="olmo2", n_layer=16, n_head=16, n_kv_head=16, n_embd=2048, mlp_hidden=8192,
                            vocab_size=100352, block_size=4096, rope_theta=500000.0), None),
    # HuggingFaceTB/SmolLM2-1.7B config.json: multi-head (32 KV heads), where a K-only cache applies
    "smollm2-1.7b": (dict(n_layer=24, n_head=32, n_kv_head=32, n_embd=2048, mlp_hidden=8192, vocab_size=49152,
                          block_size=8192, rope_theta=130000.0, norm_eps=1e-5, tie_embeddings=True), None),
}


def shape_names() -> tuple[str, ...]:
    return tuple(SHAPES)


def shape_preset(name: str) -> GPTConfig:
    """The GPTConfig of a shape-only preset (one-line refusal for an unknown name)."""
    if name not in SHAPES:
        raise UserError(f"unknown shape preset {name!r}; choose one of {', '.join(SHAPES)}")
    return GPTConfig.from_dict({"family": "llama", **SHAPES[name][0]})


def published_count(name: str) -> int | None:
    return SHAPES[name][1]
