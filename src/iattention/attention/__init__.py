"""Attention parameterizations: `standard`, `canonical` (I-Attention) and `identity_q`."""

from iattention.attention.canonical import CanonicalAttention
from iattention.attention.heads import HeadWeights
from iattention.attention.identity_q import IdentityQAttention
from iattention.attention.registry import ATTENTION_REGISTRY, build_attention, register
from iattention.attention.standard import StandardAttention

__all__ = [
    "ATTENTION_REGISTRY", "CanonicalAttention", "HeadWeights", "IdentityQAttention",
    "StandardAttention", "build_attention", "register",
]
