"""Attention registry: variant name -> module class. Adding a variant is one new file."""

from __future__ import annotations

ATTENTION_REGISTRY: dict[str, type] = {}


def register(name: str):
    def deco(cls):
        ATTENTION_REGISTRY[name] = cls
        cls.variant = name
        return cls

    return deco


def build_attention(config):
    from iattention.attention import canonical, identity_q, standard  # noqa: F401  (fill the registry)

    return ATTENTION_REGISTRY[config.attention](config)
