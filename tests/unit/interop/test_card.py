"""The model card of an exported Hugging Face folder (`interop/card.py`): what the model is, its source and
numbers, and its tokenizer, each as the export really is."""

from pathlib import Path

from iattention.interop.card import model_card

BASE = dict(source="runs/x", config={"attention": "canonical", "n_layer": 2, "n_head": 3, "n_embd": 48,
                                      "block_size": 16},
            params_ours=12345, params_exported=23456, command="iattn convert --from runs/x --to hf --out y",
            max_abs_logit_diff=3.2e-6)


def _card(**kw):
    return model_card(**{**BASE, "data": None, "tokenizer": None, "eos_id": None, "summary": None, **kw})


def _row(card, label):
    return next(line for line in card.splitlines() if line.startswith(f"| {label}"))


def test_the_card_says_what_was_trained_and_how_it_was_exported():
    card = _card()
    assert "**canonical**" in card and "expanded exactly to standard" in card
    assert "12,345" in _row(card, "learned parameters, ours (canonical)")
    assert "23,456" in _row(card, "parameters as exported")
    assert "3.20e-06" in _row(card, "max abs logit difference")
    assert "runs/x" in _row(card, "source") and BASE["command"] in card
    assert "expanded" not in _card(config={**BASE["config"], "attention": "standard"})
    assert "Trained as **canonical** attention" in card
    converted = _card(trained=False)
    assert "Converted to **canonical** attention by `iattn convert`" in converted and "Trained" not in converted


def test_the_tokenizer_row_says_what_a_client_gets():
    assert "--data-dir" in _row(_card(), "tokenizer")  # none exported: how to include it
    assert "50256" in _row(_card(tokenizer="gpt2"), "tokenizer")
    byte = _card(tokenizer="byte", eos_id=256)
    assert "256" in _row(byte, "tokenizer") and "takes no probability" in _row(byte, "tokenizer")
    assert "end-of-text row" in _row(byte, "parameters as exported")
    loud = _card(tokenizer="byte", eos_id=256, eos_silent=False)
    assert "logit is 0" in _row(loud, "tokenizer")
    own = _card(tokenizer="hf:/models/qwen", eos_id=None)  # a folder's own tokenizer: saved as it is, nothing added
    assert "saved as it is" in _row(own, "tokenizer") and "None" not in _row(own, "tokenizer")
    assert "end-of-text row" not in _row(own, "parameters as exported")


def test_the_run_s_numbers_and_data_appear_as_the_summary_has_them():
    card = _card(summary={"best_val_ppl": 12.34567, "best_epoch": 3, "test_ppl": None, "tokens_seen": 1234567},
                 data={"dataset": "wikitext-2-v1", "train_tokens": 6000})
    assert "12.346" in _row(card, "best validation perplexity") and "| 3 |" in _row(card, "epoch of best")
    assert "1,234,567" in _row(card, "training tokens seen")
    assert "test perplexity" not in card  # no value: no row
    assert "wikitext-2-v1" in _row(card, "data") and "6,000" in _row(card, "data")


def test_the_card_gives_each_client_its_install_line_as_the_doc_does():
    card, doc = _card(), (Path(__file__).parents[3] / "docs" / "interop.md").read_text()
    for line in ('pip install "lm-eval[hf]"', 'pip install "transformer-lens<3"', 'pip install "transformer-lens>=4"'):
        assert line in card and line in doc, line
    assert "convert_gpt2_weights" in card and "HookedTransformer.from_pretrained" not in card


def test_a_llama_family_card_names_its_family_s_class_and_its_key_value_heads():
    """The card of a rotary family says its transformers class and its grouped heads, from today's config (where
    n_kv_head and d_head are left out when the shape gives them) and from a two-family layout's `arch: llama` one."""
    shape = dict(n_layer=2, n_head=4, n_embd=32, block_size=16)
    for config in ({**shape, "family": "qwen2", "n_kv_head": 2},
                   {**shape, "arch": "llama", "family": "qwen2", "n_kv_head": 2, "d_head": 8, "d_ff": 48}):
        card = _card(config=config)
        assert "`Qwen2ForCausalLM`" in card and "tags: [qwen2, iattention]" in card, card
        assert "4 query heads sharing 2 key/value heads of 8 dims, RoPE" in card
    mha = _card(config={**shape, "family": "llama"})
    assert "`LlamaForCausalLM`" in mha and "4 query heads sharing 4 key/value heads of 8 dims" in mha
    assert "`GPTNeoXForCausalLM`" in _card(config={**shape, "family": "gpt_neox"})
    gpt2 = _card(config=shape)
    assert "`GPT2LMHeadModel`" in gpt2 and "2 layers, 4 heads," in gpt2 and "tags: [gpt2, iattention]" in gpt2
