"""Attention registry: variant name -> module class.

Adding a variant is one new file, two lines here (its import and its entry) and its name in the four
documents that list the variants (docs/architecture.md, "Adding an attention variant"). The registry
imports the variants; the variants never import the registry, so there is no import cycle. Everything
generic asks the class (see `CausalSelfAttention`): names, `full_class`, `removed_params`,
`projection_flops`, `redundant_biases`, `head_blocks`.
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


def build_attention(config):
    return ATTENTION_REGISTRY[config.attention](config)


def build_grouped_attention(config):
    """A Llama-family layer (config: a LlamaConfig)."""
    return GROUPED_REGISTRY[config.attention](config)
