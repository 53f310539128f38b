"""Parameter counts: standard GPT-2's and a standard Llama-family model's in closed form, and what each variant
removes from them, as its class states (`removed_params`, `redundant_biases`); `redundancy`, `bias_redundancy`,
`param_count` and `fully_reduced_count` take a GPTConfig or a LlamaConfig (`registry.attention_class`).
`tests/unit/attention/test_registry.py` checks each statement against a count made from the built layer."""

from __future__ import annotations

from iattention.attention.registry import GROUPED_REGISTRY, attention_class, registry_for
from iattention.config.model import GPTConfig


def _grouped(config) -> bool:
    return registry_for(config) is GROUPED_REGISTRY


def redundancy(config) -> int:
    """Parameters the variant removes relative to standard (minimal_bias's dropped biases included): its
    class says how many."""
    return attention_class(config).removed_params(config)


def standard_param_count(config: GPTConfig) -> int:
    """GPT-2 parameter count in closed form (tied embeddings, true vocabulary)."""
    d, L, b, m = config.n_embd, config.n_layer, int(config.bias), config.d_mlp
    ln = d * (1 + b)
    per_layer = 2 * ln + (3 * d * d + 3 * d * b) + (d * d + d * b) + (d * m + m * b) + (m * d + d * b)
    return config.vocab_size * d + config.block_size * d + L * per_layer + ln


def bias_redundancy(config) -> int:
    """Learned biases that change no function, whole model: per layer, each bias the variant's class names in
    `redundant_biases(config)` (b_K, b_V; see GPTConfig.minimal_bias): d numbers in GPT, n_kv_head x d_head in
    the Llama family."""
    width = config.n_kv_head * config.d_head if _grouped(config) else config.n_embd
    return config.n_layer * width * len(attention_class(config).redundant_biases(config))


def param_count(config) -> int:
    """Learned parameters of a model of `config` (a GPTConfig or a LlamaConfig): its family's standard count
    minus what the variant removes."""
    standard = llama_standard_param_count(config) if _grouped(config) else standard_param_count(config)
    return standard - redundancy(config)


def fully_reduced_count(config) -> int:
    """Learned parameters once the redundant biases are reduced too (b_K dropped, b_V folded into b_O)."""
    return param_count(config) - bias_redundancy(config)


def iso_param_mlp_hidden(config: GPTConfig) -> int:
    """The MLP width at which `config` (a reduced attention) has the parameter count of standard attention
    with GPT-2's MLP (4 d): the saved parameters per layer spent on hidden units of 2 d (+1 with biases)
    parameters each, rounded to the nearest width."""
    base = config.replace(mlp_hidden=0)
    saved = standard_param_count(base) - param_count(base)
    per_unit = config.n_layer * (2 * config.n_embd + int(config.bias))
    return 4 * config.n_embd + round(saved / per_unit)


def llama_standard_param_count(config) -> int:
    """A Llama-family model's (LlamaConfig) parameter count in closed form: embeddings, per layer q/k/v/o
    (with Qwen2's q/k/v and the optional output bias), the SwiGLU MLP, two RMSNorm gains; the final norm; an
    untied head."""
    d, r, H, G = config.n_embd, config.d_head, config.n_head, config.n_kv_head
    attention = d * r * (2 * H + 2 * G) + config.qkv_bias * r * (H + 2 * G) + config.o_bias * d
    per_layer = attention + 3 * d * config.d_ff + 2 * d
    head = 0 if config.tie_embeddings else config.vocab_size * d
    return config.vocab_size * d + config.n_layer * per_layer + d + head


def llama_removed_split(config) -> dict[str, int]:
    """What canonical attention removes from a Llama-family model, whole model: per layer and KV group rot + (r -
    rot)^2 on the query/key side (a complex scalar per rotary pair, GL of the pass dims) and r^2 on the
    value/output side."""
    r, rot, LG = config.d_head, config.rot, config.n_layer * config.n_kv_head
    return {"query_key": LG * (rot + (r - rot) ** 2), "value_output": LG * r * r}


def kv_cache_values_per_token(config, kind: str = "full") -> int | None:
    """Numbers a decoding cache holds per token, all layers: keys and values (n_kv_head x d_head each) for
    "full"; the keys alone for "k-only", which exists only where the key map is square (n_kv_head x d_head =
    n_embd; None otherwise)."""
    per_layer = config.n_kv_head * config.d_head
    if kind == "k-only":
        return config.n_layer * per_layer if per_layer == config.n_embd else None
    return 2 * config.n_layer * per_layer
