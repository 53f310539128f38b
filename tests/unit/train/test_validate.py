"""A training run's evaluation passes (`train/validate.py`): a split's mean loss and perplexity, and the
per-word and per-byte figures of a mean loss over the text that split scores."""

import math

import pytest
import torch

from helpers import make_model
from iattention.config.run import LoopConfig
from iattention.data import DataConfig, load_tokenizer
from iattention.data.dataset import ScoredText, scored_text
from iattention.train.runtime import Runtime
from iattention.train.validate import Validator

TEXT = {"valid": "the cat sat on the mat .\n a dog ran\n", "test": "x"}  # test: one token, nothing scored


@pytest.fixture
def validator():
    tok = load_tokenizer(DataConfig(tokenizer="byte"))
    splits = {k: tok.encode(v) for k, v in TEXT.items()}
    return Validator(splits, {k: scored_text(tok, v) for k, v in splits.items()}, 8, 3,
                     Runtime(LoopConfig(device="cpu"))), splits


def _nll_by_hand(model, tokens, block):
    """Every token after the first, predicted from the tokens before it in its window of `block`."""
    total = 0.0
    for s in range(0, len(tokens) - 1, block):
        x = torch.tensor(tokens[s: s + block + 1], dtype=torch.long)
        logits, _ = model(x[None, :-1])
        total -= torch.log_softmax(logits[0].double(), -1).gather(1, x[1:, None]).sum().item()
    return total, len(tokens) - 1


def test_loss_is_the_mean_nll_of_every_scored_token_and_perplexity_its_exp(validator):
    v, splits = validator
    model = make_model(vocab_size=256)
    loss, ppl = v.loss(model, "valid")
    nll, n = _nll_by_hand(model, splits["valid"], 8)
    assert loss == pytest.approx(nll / n, rel=1e-5) and ppl == pytest.approx(math.exp(nll / n), rel=1e-5)


def test_per_unit_divides_the_split_s_nll_by_its_words_and_bytes(validator):
    v, _ = validator
    v.scored["valid"] = ScoredText(tokens=20, words=5, bytes=50)  # a tokenizer of 2.5 bytes a token
    m = v.per_unit("valid", 2.0)  # 2 nats a token: 40 nats
    assert m["word_ppl"] == pytest.approx(math.exp(40 / 5))
    assert m["byte_ppl"] == pytest.approx(math.exp(40 / 50))
    assert m["bits_per_byte"] == pytest.approx(40 / 50 / math.log(2))


def test_units_name_each_figure_by_split_and_a_split_without_words_gives_none(validator):
    v, _ = validator
    u = v.units(best_val_loss=2.0, test_loss=3.0)
    assert u["best_val_word_ppl"] == pytest.approx(math.exp(2.0 * 35 / 11))
    assert (u["val_tokens_scored"], u["val_words"], u["val_bytes"]) == (35, 11, 35)
    assert (u["test_word_ppl"], u["test_byte_ppl"], u["test_bits_per_byte"]) == (None, None, None)
    assert (u["test_tokens_scored"], u["test_words"], u["test_bytes"]) == (0, 0, 0)
