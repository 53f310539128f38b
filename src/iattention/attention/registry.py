"""Attention registry: variant name -> module class, one for every model family (GPT-2, Llama, Qwen2, Mistral:
a layer is built from a GPTConfig, whose n_kv_head, rot and projection say the family's shape).

Adding a variant is one new file, two lines here (its import and its entry) and its name in the four documents
that list the variants (docs/architecture.md, "Adding an attention variant"). The registry imports the variants;
the variants never import the registry, and the registry imports no config module (they import it), so there is
no import cycle. Everything generic asks the class (see `CausalSelfAttention`): names, `full_class`,
`unsupported`, `removed_params`, `projection_flops`, `redundant_biases`, `head_blocks`;
tests/unit/attention/test_registry.py checks every variant on every family against the same contract.
"""

from __future__ import annotations

from iattention.attention.canonical import CanonicalAttention
from iattention.attention.identity_ko import IdentityKOAttention
from iattention.attention.identity_q import IdentityQAttention
from iattention.attention.standard import StandardAttention

ATTENTION_REGISTRY: dict[str, type] = {
    "standard": StandardAttention,
    "canonical": CanonicalAttention,
    "identity_q": IdentityQAttention,
    "identity_ko": IdentityKOAttention,
}

def variant_names() -> tuple[str, ...]:
    """Every registered variant, in registry order (read at call time, so later registrations count)."""
    return tuple(ATTENTION_REGISTRY)


def full_class_variants() -> tuple[str, ...]:
    """The variants that can hold every standard head exactly (on an open dense set)."""
    return tuple(name for name, cls in ATTENTION_REGISTRY.items() if cls.full_class)


def attention_class(config) -> type:
    """The attention class of a GPTConfig (its `attention`)."""
    return ATTENTION_REGISTRY[config.attention]


def build_attention(config):
    return ATTENTION_REGISTRY[config.attention](config)
