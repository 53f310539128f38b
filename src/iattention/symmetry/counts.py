"""Parameter counts: standard GPT-2's in closed form, and what each variant removes from it, as its class
states (`removed_params`, `redundant_biases`); `tests/unit/attention/test_registry.py` checks each statement against
a count made from the built layer."""

from __future__ import annotations

from iattention.attention.registry import ATTENTION_REGISTRY
from iattention.config.model import GPTConfig


def redundancy(config: GPTConfig) -> int:
    """Parameters the variant removes relative to standard (minimal_bias's dropped biases included): its
    class says how many."""
    return ATTENTION_REGISTRY[config.attention].removed_params(config)


def standard_param_count(config: GPTConfig) -> int:
    """GPT-2 parameter count in closed form (tied embeddings, true vocabulary)."""
    d, L, b, m = config.n_embd, config.n_layer, int(config.bias), config.d_mlp
    ln = d * (1 + b)
    per_layer = 2 * ln + (3 * d * d + 3 * d * b) + (d * d + d * b) + (d * m + m * b) + (m * d + d * b)
    return config.vocab_size * d + config.block_size * d + L * per_layer + ln


def bias_redundancy(config: GPTConfig) -> int:
    """Learned biases that change no function, whole model: d per layer for each bias the variant's class
    names in `redundant_biases(config)` (b_K, b_V; see GPTConfig.minimal_bias)."""
    return config.n_layer * config.n_embd * len(ATTENTION_REGISTRY[config.attention].redundant_biases(config))


def param_count(config: GPTConfig) -> int:
    return standard_param_count(config) - redundancy(config)


def fully_reduced_count(config: GPTConfig) -> int:
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
