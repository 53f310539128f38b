"""Unit tests of iattention.config.model."""

import pytest

from iattention.config import GPTConfig, model_preset, resolve_vocab
from iattention.errors import UserError


def test_variants_come_from_the_registry(monkeypatch):
    from iattention.attention.registry import ATTENTION_REGISTRY, full_class_variants, variant_names

    with pytest.raises(UserError, match="unknown attention 'toy'"):
        GPTConfig(attention="toy")
    # the shipped variants' classes, stated so that a further registered variant does not break this test
    assert {"standard", "canonical"} <= set(full_class_variants())
    assert not {"identity_q", "identity_ko"} & set(full_class_variants())
    monkeypatch.setitem(ATTENTION_REGISTRY, "toy", ATTENTION_REGISTRY["standard"])
    assert "toy" in variant_names()
    GPTConfig(attention="toy", init="matched")  # registered, and the class says it spans the full class


def test_resolve_vocab_is_the_one_place_vocab_zero_becomes_a_size():
    auto = GPTConfig(vocab_size=0)
    assert resolve_vocab(auto, "byte").vocab_size == 256
    assert resolve_vocab(auto, "bpe:4096").vocab_size == 4096  # nominal, without the built tokenizer
    assert resolve_vocab(auto, "bpe:4096", vocab=3900).vocab_size == 3900  # as built
    assert auto.vocab_size == 0  # the caller's config is left as it was
    assert resolve_vocab(GPTConfig(vocab_size=512), "byte", vocab=256).vocab_size == 512
    with pytest.raises(UserError, match="has 256 tokens but model.vocab_size is 100"):
        resolve_vocab(GPTConfig(vocab_size=100), "byte", vocab=256)
    assert model_preset("cpu-study").vocab_size == 4096


@pytest.mark.parametrize("kw, fix", [
    (dict(attention="standard"), "set model.attention=canonical"),
    (dict(attention="canonical", bias=False), "lacks the query/key/value or the output biases"),
    (dict(attention="canonical", family="llama"), "lacks the query/key/value or the output biases")])
def test_minimal_bias_refusal_names_what_this_model_lacks(kw, fix):
    """model.minimal_bias on a model it cannot apply to: the fix fits the case (a canonical GPT-NeoX model was told
    to set model.attention=canonical, which it had). A rotary one with both biases takes it (b_K's rotary dims
    stay)."""
    shape = dict(n_layer=1, n_head=2, n_embd=16, vocab_size=32, block_size=8)
    with pytest.raises(UserError) as err:
        GPTConfig(**{**shape, **kw}, minimal_bias=True)
    assert fix in str(err.value) and "\n" not in str(err.value)
    if kw["attention"] == "canonical":
        assert "set model.attention=canonical" not in str(err.value)
    assert GPTConfig(**shape, attention="canonical", family="gpt_neox", rot=4, minimal_bias=True).minimal_bias
