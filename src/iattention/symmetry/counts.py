"""Closed-form parameter counts and the redundancy removed by canonical attention."""

from __future__ import annotations

from iattention.attention.registry import ATTENTION_REGISTRY
from iattention.config.model import GPTConfig


def redundancy(config: GPTConfig) -> int:
    """Parameters the variant removes relative to standard (biases aside): its class says how many."""
    return ATTENTION_REGISTRY[config.attention].removed_params(config)


def standard_param_count(config: GPTConfig) -> int:
    """GPT-2 parameter count in closed form (tied embeddings, true vocabulary)."""
    d, L, b, m = config.n_embd, config.n_layer, int(config.bias), config.d_mlp
    ln = d * (1 + b)
    per_layer = 2 * ln + (3 * d * d + 3 * d * b) + (d * d + d * b) + (d * m + m * b) + (m * d + d * b)
    return config.vocab_size * d + config.block_size * d + L * per_layer + ln


def bias_redundancy(config: GPTConfig) -> int:
    """b_K and b_V per layer (2 d with biases): redundant in every variant (see GPTConfig.minimal_bias)."""
    return 2 * config.n_embd * config.n_layer if config.bias else 0


def param_count(config: GPTConfig) -> int:
    removed = bias_redundancy(config) if config.minimal_bias else 0
    return standard_param_count(config) - redundancy(config) - removed


def fully_reduced_count(config: GPTConfig) -> int:
    """Learned parameters once the biases are reduced too (b_K dropped, b_V folded into b_O)."""
    return standard_param_count(config) - redundancy(config) - bias_redundancy(config)


def iso_param_mlp_hidden(config: GPTConfig) -> int:
    """The MLP width at which `config` (a reduced attention) has the parameter count of standard attention
    with GPT-2's MLP (4 d): the saved parameters per layer spent on hidden units of 2 d (+1 with biases)
    parameters each, rounded to the nearest width."""
    base = config.replace(mlp_hidden=0)
    saved = standard_param_count(base) - param_count(base)
    per_unit = config.n_layer * (2 * config.n_embd + int(config.bias))
    return 4 * config.n_embd + round(saved / per_unit)
