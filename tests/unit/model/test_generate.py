"""Unit tests of iattention.model.generate (moved from tests/test_generate.py)."""

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
    """next_token on (B, V) with B > 1: row b's draw depends on row b only (a survivor: the row maximum taken
    without keepdim broadcasts across rows when B == V, and agrees with the right answer when B == 1)."""
    from iattention.model.generate import next_token

    logits = torch.tensor([[0.0, -10.0], [-30.0, -20.0]])  # row 0 all but certain of 0, row 1 of 1
    for seed in range(5):
        draw = next_token(logits, 1.0, None, None, torch.Generator().manual_seed(seed))
        assert draw.tolist() == [[0], [1]]
