"""Unit tests of iattention.train.evaluate."""

import math

import numpy as np
import pytest
import torch

from fixtures import byte_tokenizer
from helpers import make_model
from iattention import GPT, GPTConfig
from iattention.data.dataset import scored_text
from iattention.train.distributed import DistContext
from iattention.train.evaluate import per_unit, split_nll, strided_nll


def test_a_uniform_model_gives_eight_bits_per_byte_and_a_hand_computed_word_perplexity():
    """All weights zero: logits are 0, every byte costs ln 256 nats, so bits per byte = 8, byte perplexity
    = 256, and word perplexity = 256 ** (bytes / words), counted by hand on the literal text."""
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, vocab_size=256, block_size=8)).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    tok = byte_tokenizer()
    source = "the cat sat on the mat .\n a dog ran\n"  # 36 bytes; 35 predicted: "he cat ... ran\n"
    ids = tok.encode(source)
    nll, n = split_nll(model, ids, 8, 4, DistContext())  # 5 windows, the last one partial (float32 NLL)
    assert n == 35 and nll == pytest.approx(35 * math.log(256), rel=1e-6)
    m = per_unit(nll, scored_text(tok, ids), scored=n)
    words = 11  # 'he' 'cat' 'sat' 'on' 'the' 'mat' '.' 'a' 'dog' 'ran' ''
    assert m["bits_per_byte"] == pytest.approx(8.0, rel=1e-6)
    assert m["byte_ppl"] == pytest.approx(256.0, rel=1e-5)
    assert m["word_ppl"] == pytest.approx(256.0 ** (35 / words), rel=1e-5)
    assert per_unit(nll, scored_text(tok, ids), scored=n - 1) is None  # not every token scored: no figures


def _by_hand(model, tokens, block, stride):
    """Sliding-window NLL one token at a time: token j (j >= 1) is scored once, by the first window (windows
    start at 0, stride, 2 * stride, ... and hold block tokens) that reaches past it, with that window's
    tokens before it as context; a token that is its window's first has no context there and is unscored."""
    total, count = 0.0, 0
    for j in range(1, len(tokens)):
        begin = 0
        while begin + block <= j:
            begin += stride
        if begin == j:
            continue
        ctx = torch.tensor(tokens[begin:j], dtype=torch.long)[None]
        logits, _ = model(ctx)
        total -= torch.log_softmax(logits[0, -1].double(), -1)[int(tokens[j])].item()
        count += 1
    return total, count


@pytest.mark.parametrize("n, block, stride", [(23, 8, 3), (23, 8, 8), (17, 6, 4), (9, 16, 5), (25, 8, 1)])
def test_strided_nll_is_the_sum_over_tokens_each_scored_once(n, block, stride):
    model = make_model(dtype=torch.float64, block_size=16)
    tokens = np.random.default_rng(n + stride).integers(0, 97, n)
    want, want_count = _by_hand(model, tokens, block, stride)
    got, count = strided_nll(model, tokens, block, stride, batch_size=2)
    assert count == want_count
    if stride < block:
        assert count == n - 1  # every token after the first, once
    assert got == pytest.approx(want, rel=1e-5)  # float32 cross-entropy inside strided_nll
