"""Unit tests of iattention.model.generate."""

import math

import pytest
import torch

from helpers import make_model
from iattention.attention.registry import variant_names
from iattention.model.generate import filter_logits

CASES = [(attention, heads) for attention in variant_names() for heads in (1, 3)]


@pytest.mark.parametrize("attention,heads", CASES)
def test_greedy_generation_with_cache_equals_without(attention, heads):
    """Also past block_size (16), where the cache starts over from the last block_size tokens."""
    model = make_model(attention=attention, n_head=heads)
    prompt = torch.randint(0, 97, (2, 5), generator=torch.Generator().manual_seed(1))
    with_cache = model.generate(prompt, 20, temperature=0, use_cache=True)
    without = model.generate(prompt, 20, temperature=0, use_cache=False)
    assert with_cache.shape == (2, 25)
    assert torch.equal(with_cache, without)
    assert len(set(with_cache[0, 5:].tolist())) > 1  # not a degenerate constant sequence


def _k_only_cases():
    from helpers import make_llama
    from iattention.symmetry.transforms import canonicalize

    return {"gpt2-one-canonical-head": lambda: canonicalize(make_model(n_head=1), block="pivoted"),
            "gpt2-three-heads": lambda: make_model(n_head=3),
            "llama-gqa-wide-heads": lambda: make_llama(n_head=4, n_kv_head=2, d_head=16),
            "llama-gqa-canonical": lambda: canonicalize(make_llama(n_head=4, n_kv_head=2, d_head=16), block="pivoted")}


@pytest.mark.parametrize("case", list(_k_only_cases()))
def test_k_only_generation_past_the_block_gives_the_full_caches_tokens(case):
    """The K-only cache on a canonical one-head GPT-2, on grouped-query Llama models (standard and canonical), and
    past block_size (where each cache starts over from the last block_size tokens): the same sampled tokens as the
    full cache and as no cache, from one seed."""
    model = _k_only_cases()[case]()
    prompt = torch.randint(0, 40, (2, 5), generator=torch.Generator().manual_seed(1))
    n = model.config.block_size + 7
    runs = [model.generate(prompt, n, temperature=1.0, generator=torch.Generator().manual_seed(5), **kw)
            for kw in (dict(cache_kind="k-only"), dict(cache_kind="full"), dict(use_cache=False))]
    assert runs[0].shape == (2, 5 + n)
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[1], runs[2])
    assert len(set(runs[0][0, 5:].tolist())) > 3  # sampled, not one token repeated


def test_seeded_sampling_is_reproducible_and_seeds_differ():
    model = make_model(attention="canonical", n_head=3)
    prompt = torch.zeros(1, 3, dtype=torch.long)

    def sample(seed):
        return model.generate(prompt, 20, temperature=1.0, top_k=20, top_p=0.9,
                              generator=torch.Generator().manual_seed(seed))

    assert torch.equal(sample(3), sample(3))
    assert not torch.equal(sample(3), sample(4))


def test_filter_logits_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(filter_logits(logits, top_k=2)).tolist() == [[False, False, True, True]]
    # top_p=0.8: 0.5 + 0.3 reaches it, so the two smallest go
    assert torch.isinf(filter_logits(logits, top_p=0.8)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_logits(logits, top_p=0.81)).tolist() == [[False, False, False, True]]
    assert not torch.isinf(filter_logits(logits, top_p=0.01)[0, 0])  # the most likely token always stays


@pytest.mark.parametrize("setting", [dict(temperature=1e-300), dict(top_p=1e-300), dict(temperature=1e-300, top_k=3)])
def test_a_vanishing_temperature_or_top_p_is_greedy_not_nan(setting):
    """Issue 23: --temperature 1e-300 divided float32 logits by zero and --top-p 1e-300 dropped every token,
    both a 'probability tensor contains nan' traceback. Their limit is greedy decoding, and so is the result."""
    from iattention.model.generate import generate

    model = make_model(dtype=torch.float32)
    prompt = torch.tensor([[1, 2, 3]])
    greedy = generate(model, prompt, 8, temperature=0)
    sampled = generate(model, prompt, 8, generator=torch.Generator().manual_seed(0), **setting)
    assert torch.equal(sampled, greedy)


def test_filter_logits_works_on_the_last_axis_of_any_shape():
    """Its docstring's promise: (..., V) logits, e.g. a (B, T, V) block; every row filtered on its own."""
    rows = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.05, 0.15, 0.3, 0.5], [0.25, 0.25, 0.25, 0.25]]))
    block = rows.reshape(1, 3, 4).expand(2, 3, 4)
    for kw in (dict(top_k=2), dict(top_p=0.8), dict(top_k=3, top_p=0.7)):
        want = torch.stack([filter_logits(r.unsqueeze(0), **kw)[0] for r in rows])
        assert torch.equal(filter_logits(block, **kw), want.expand(2, 3, 4)), kw


def test_each_row_of_a_batch_samples_from_its_own_distribution():
    """next_token on (B, V) with B > 1: row b's draw depends on row b only (a row maximum taken without
    keepdim broadcasts across rows when B == V, and agrees with the right answer when B == 1)."""
    from iattention.model.generate import next_token

    logits = torch.tensor([[0.0, -10.0], [-30.0, -20.0]])  # row 0 all but certain of 0, row 1 of 1
    for seed in range(5):
        draw = next_token(logits, 1.0, None, None, torch.Generator().manual_seed(seed))
        assert draw.tolist() == [[0], [1]]


def test_top_k_of_the_whole_vocabulary_keeps_every_logit_of_a_block():
    """top_k is capped at the vocabulary (the last axis), not at another axis: on a (B, T, V) block with
    T < top_k <= V nothing is dropped."""
    rows = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.05, 0.15, 0.3, 0.5], [0.4, 0.3, 0.2, 0.1]]))
    block = rows.reshape(1, 3, 4).expand(2, 3, 4)
    for top_k in (4, 10):
        assert torch.equal(filter_logits(block, top_k=top_k), block), top_k


def test_top_p_of_one_keeps_every_token_even_a_vanishing_one():
    """top_p = 1 asks for the whole distribution: a token of probability 4e-18 stays, although the mass
    before it rounds to exactly 1.0 (so a nucleus cut at 1.0 would drop it)."""
    for dtype in (torch.float32, torch.float64):
        logits = torch.tensor([[0.0, -40.0, -40.0]], dtype=dtype)
        probs = torch.softmax(logits, dim=-1)
        assert (probs.cumsum(-1) - probs)[0, 1] == 1.0  # the premise: the mass before token 1 is 1.0
        assert torch.equal(filter_logits(logits, top_p=1.0), logits), dtype


def test_top_p_reached_exactly_by_the_tokens_before_drops_the_rest():
    """The nucleus is the smallest set whose probability reaches top_p: with probabilities 1/2, 1/4, 1/4
    (exact in binary) and top_p = 1/2 the first token alone reaches it; with top_p = 3/4 the first two."""
    logits = torch.tensor([[0.0, -math.log(2), -math.log(2)]], dtype=torch.float64)
    assert torch.softmax(logits, dim=-1).tolist() == [[0.5, 0.25, 0.25]]  # the premise: exact probabilities
    assert torch.isinf(filter_logits(logits, top_p=0.5)).tolist() == [[False, True, True]]
    assert torch.isinf(filter_logits(logits, top_p=0.75)).tolist() == [[False, False, True]]


def test_the_smallest_positive_temperature_is_greedy_not_nan():
    """Sampling divides logits minus their row maximum by the temperature: at 5e-324 (the smallest float64)
    the maximum gives 0 and every other logit -inf, i.e. argmax, for logits of either sign."""
    from iattention.model.generate import next_token

    logits = torch.tensor([[2.0, 1.0, -3.0, 0.5], [-7.0, -1.0, -2.0, -9.0]])
    for temperature in (1e-300, 1e-307, 5e-324):
        draw = next_token(logits, temperature, None, None, torch.Generator().manual_seed(0))
        assert draw.tolist() == [[0], [1]], temperature


def test_sampling_keeps_only_the_top_k_tokens():
    """next_token applies top_k: with top_k = 1 every draw is the argmax, with top_k = 2 one of the two
    largest, over near-uniform logits where unfiltered sampling draws every token."""
    from iattention.model.generate import next_token

    logits = torch.tensor([[0.0, 0.1, -0.1, 0.05]])
    draws = {k: {next_token(logits, 1.0, k, None, torch.Generator().manual_seed(s)).item() for s in range(40)}
             for k in (None, 1, 2)}
    assert draws == {None: {0, 1, 2, 3}, 1: {1}, 2: {1, 3}}
