"""Attention parameterizations: one file per variant, all listed in `registry.py` (`variant_names()`)."""

from iattention.attention.canonical import CanonicalAttention
from iattention.attention.heads import HeadWeights
from iattention.attention.identity_ko import IdentityKOAttention
from iattention.attention.identity_q import IdentityQAttention
from iattention.attention.registry import ATTENTION_REGISTRY, build_attention, full_class_variants, variant_names
from iattention.attention.standard import StandardAttention

__all__ = [
    "ATTENTION_REGISTRY", "CanonicalAttention", "HeadWeights", "IdentityKOAttention", "IdentityQAttention",
    "StandardAttention", "build_attention", "full_class_variants", "variant_names",
]
