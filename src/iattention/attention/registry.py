"""Attention registry: variant name -> module class.

Adding a variant is one new file and one line here. The registry imports the variants; the
variants never import the registry, so there is no import cycle.
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


def build_attention(config):
    return ATTENTION_REGISTRY[config.attention](config)
