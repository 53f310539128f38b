"""Closed-form parameter counts and the redundancy removed by canonical attention."""

from __future__ import annotations

from iattention.config import GPTConfig


def redundancy(config: GPTConfig) -> int:
    """Parameters removed relative to standard: r^2 per head per canonical half, per layer."""
    if config.attention == "identity_q":
        return config.n_layer * (config.n_embd**2 + (config.n_embd if config.bias else 0))
    if config.attention == "identity_ko":
        return config.n_layer * 2 * config.n_embd**2
    if config.attention != "canonical":
        return 0
    halves = 2 if config.canonical == "both" else 1
    return halves * config.d_head**2 * config.n_head * config.n_layer


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
