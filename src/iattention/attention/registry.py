"""Attention registry: variant name -> module class.

Two families: GPT's (`ATTENTION_REGISTRY`, layers built from a GPTConfig) and the Llama family's
(`GROUPED_REGISTRY`, RoPE + grouped-query layers built from a LlamaConfig, subclasses of
`grouped.GroupedAttention`); `attention_class(config)` picks the class for either config. Adding a variant
is one new file, two lines here (its import and its entry in its family's registry) and, for a GPT variant,
its name in the four documents that list the variants (docs/architecture.md, "Adding an attention
variant"). The registry imports the variants; the variants never import the registry, and the registry
imports no config module (they import it), so there is no import cycle. Everything generic asks the class
(see `CausalSelfAttention`): names, `full_class`, `removed_params`, `projection_flops`, `redundant_biases`,
`head_blocks`; tests/unit/attention/test_registry.py checks both families against the same contract.
"""

from __future__ import annotations

from iattention.attention.canonical import CanonicalAttention
from iattention.attention.identity_ko import IdentityKOAttention
from iattention.attention.identity_q import IdentityQAttention
from iattention.attention.llama_canonical import LlamaCanonicalAttention
from iattention.attention.llama_standard import LlamaStandardAttention
from iattention.attention.standard import StandardAttention

ATTENTION_REGISTRY: dict[str, type] = {
    "standard": StandardAttention,
    "canonical": CanonicalAttention,
    "identity_q": IdentityQAttention,
    "identity_ko": IdentityKOAttention,
}

# The Llama family (RoPE, grouped-query attention; model/llama.py): its own variants under the same names, since
# their layers take a LlamaConfig and a RoPE table (attention/grouped.py), not a GPTConfig.
GROUPED_REGISTRY: dict[str, type] = {
    "standard": LlamaStandardAttention,
    "canonical": LlamaCanonicalAttention,
}


def variant_names() -> tuple[str, ...]:
    """Every registered variant, in registry order (read at call time, so later registrations count)."""
    return tuple(ATTENTION_REGISTRY)


def full_class_variants() -> tuple[str, ...]:
    """The variants that can hold every standard head exactly (on an open dense set)."""
    return tuple(name for name, cls in ATTENTION_REGISTRY.items() if cls.full_class)


def registry_for(config) -> dict[str, type]:
    """The registry of `config`'s family: GROUPED_REGISTRY for a LlamaConfig (it has n_kv_head), else
    ATTENTION_REGISTRY (a GPTConfig). Read off the config's fields, so no config module is imported here."""
    return GROUPED_REGISTRY if hasattr(config, "n_kv_head") else ATTENTION_REGISTRY


def attention_class(config) -> type:
    """The attention class of a GPTConfig or a LlamaConfig (its `attention` in its family's registry)."""
    return registry_for(config)[config.attention]


def build_attention(config):
    return ATTENTION_REGISTRY[config.attention](config)


def build_grouped_attention(config):
    """A Llama-family layer (config: a LlamaConfig)."""
    return GROUPED_REGISTRY[config.attention](config)
