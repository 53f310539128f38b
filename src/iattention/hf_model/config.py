"""`IAttentionConfig`: the one model's GPTConfig as a transformers config (model_type "iattention").

The GPTConfig keys are kept together under one key, `iattention` (GPTConfig.to_dict), so that none of them is read by
transformers' generic code as one of its own (`sliding_window` would make DynamicCache drop keys our attention still
masks; `rope_scaling` is rewritten by the config's RoPE mixin); the names generic code reads (num_hidden_layers,
hidden_size, num_attention_heads, num_key_value_heads, head_dim, vocab_size, max_position_embeddings,
tie_word_embeddings) are derived from them and never read back. A converted folder's config.json (interop/load.py
config_beside) holds the same keys flat beside model_type; both forms are read.
"""

from __future__ import annotations

from dataclasses import fields

from transformers import PretrainedConfig

from iattention.checkpoint.beside import AUTO_MAP, OURS_MODEL_TYPE
from iattention.config.model import GPTConfig, upgrade_model_keys

GPT_KEYS = frozenset(f.name for f in fields(GPTConfig)) | {"canonical", "d_ff", "rms_eps", "arch"}  # old names too
# transformers' names, each from the GPTConfig key that says it (tie_word_embeddings: from tie_embeddings)
NAMES = {"vocab_size": "vocab_size", "hidden_size": "n_embd", "num_hidden_layers": "n_layer",
         "num_attention_heads": "n_head", "num_key_value_heads": "n_kv_head", "head_dim": "d_head",
         "max_position_embeddings": "block_size"}
DERIVED = (*NAMES, "tie_word_embeddings")


class IAttentionConfig(PretrainedConfig):
    """iattention's model (every family, every variant) as transformers sees it: `iattention` holds the GPTConfig
    (`gpt_config()` builds it); IAttentionConfig(**GPTConfig keys) or IAttentionConfig(iattention={...})."""

    model_type = OURS_MODEL_TYPE

    def __init__(self, iattention: dict | None = None, **kwargs):
        flat = {k: kwargs.pop(k) for k in list(kwargs) if k in GPT_KEYS and k not in DERIVED}
        if "vocab_size" in kwargs and not (iattention or {}).get("vocab_size"):  # a flat config.json's, or a caller's
            flat["vocab_size"] = kwargs["vocab_size"]
        for key in (*DERIVED, "note"):  # derived from the GPTConfig below, never read back
            kwargs.pop(key, None)
        kwargs.pop("auto_map", None)
        gpt = GPTConfig.from_dict({**upgrade_model_keys(iattention or {}), **upgrade_model_keys(flat)})
        super().__init__(tie_word_embeddings=gpt.tie_embeddings, **kwargs)
        self.iattention = gpt.to_dict()
        self.auto_map = dict(AUTO_MAP)
        for name, key in NAMES.items():
            setattr(self, name, getattr(gpt, key))

    def gpt_config(self) -> GPTConfig:
        """The model config the `iattention` key holds."""
        return GPTConfig.from_dict(self.iattention)

    @classmethod
    def register_for_auto_class(cls, auto_class="AutoConfig"):
        """Nothing to register: every folder's auto_map names the shim iattention writes beside it (interop/load.py
        SHIM), never a copy of this module, which transformers would otherwise write into a saved folder."""
