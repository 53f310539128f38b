"""IAttentionConfig reads both forms a folder of ours holds (a converted folder's flat config.json, save_pretrained's
nested one) as the same GPTConfig, and derives the names transformers' generic code reads."""

import json

import pytest

pytest.importorskip("transformers")

from iattention.checkpoint.beside import AUTO_MAP, config_beside  # noqa: E402
from iattention.config.model import GPTConfig  # noqa: E402
from iattention.hf_model import IAttentionConfig  # noqa: E402

GPT = GPTConfig(family="llama", n_layer=3, n_head=4, n_kv_head=2, n_embd=32, vocab_size=77, block_size=40,
                attention="canonical", sliding_window=0)


def test_the_flat_and_the_nested_forms_give_the_same_model_config(tmp_path):
    flat = IAttentionConfig(**{k: v for k, v in config_beside(GPT.to_dict()).items() if k != "model_type"})
    assert flat.gpt_config() == GPT
    flat.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["iattention"] == GPT.to_dict() and saved["auto_map"] == AUTO_MAP
    assert IAttentionConfig.from_pretrained(tmp_path).gpt_config() == GPT


def test_transformers_names_are_derived_and_no_model_key_leaks_to_the_top_level():
    c = IAttentionConfig(iattention=GPT.to_dict())
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
            c.vocab_size, c.max_position_embeddings, c.tie_word_embeddings) == (3, 32, 4, 2, 8, 77, 40, False)
    assert not hasattr(c, "sliding_window")  # DynamicCache would keep only a window of keys
    stale = IAttentionConfig(iattention=GPT.to_dict(), num_hidden_layers=99, hidden_size=1)  # derived, never read
    assert stale.num_hidden_layers == 3 and stale.gpt_config() == GPT
