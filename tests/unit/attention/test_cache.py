"""Unit tests of iattention.attention.cache."""

import pytest
import torch

from helpers import make_model
from iattention.attention.cache import KVCache
from iattention.attention.registry import variant_names

CASES = [(attention, heads) for attention in variant_names() for heads in (1, 3)]


@pytest.mark.parametrize("attention,heads", CASES)
def test_cached_steps_equal_the_full_forward(attention, heads):
    """Prompt of 5, then 1 and 3 tokens at a time: the logits equal one forward over the whole sequence."""
    model = make_model(attention=attention, n_head=heads)
    x = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(0))
    full = model(x)[0]
    cache = KVCache(model.config.n_layer)
    parts = [model(x[:, :5], cache=cache)[0], model(x[:, 5:6], cache=cache)[0], model(x[:, 6:9], cache=cache)[0],
             model(x[:, 9:], cache=cache)[0]]
    assert cache.length == 12
    assert torch.allclose(torch.cat(parts, dim=1), full, atol=1e-10)


@pytest.mark.parametrize("attention", variant_names())
def test_two_new_tokens_at_a_time_are_masked_too(attention):
    """The causal mask over new tokens applies from two of them on (a mask dropped for exactly two new
    tokens passes chunks of 1 and 3)."""
    model = make_model(attention=attention, n_head=3)
    x = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(0))
    cache = KVCache(model.config.n_layer)
    parts = [model(x[:, :5], cache=cache)[0], model(x[:, 5:7], cache=cache)[0], model(x[:, 7:], cache=cache)[0]]
    assert torch.allclose(torch.cat(parts, dim=1), model(x)[0], atol=1e-10)
