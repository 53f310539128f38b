"""Unit tests of iattention.attention.identity_q."""

import pytest
import torch

from helpers import make_model, tells
from iattention.errors import UserError


def test_load_heads_refuses_a_query_map_or_a_query_bias_it_cannot_hold():
    """identity_q has no query projection and no query bias: heads with W_Q != I (b_Q = 0), or with W_Q = I
    and b_Q != 0, are each refused whole; W_Q = I with b_Q = 0 loads."""
    layer = make_model(attention="identity_q", n_head=3).attention_layers[0]
    std = make_model(attention="standard", n_head=3).attention_layers[0]
    with torch.no_grad():
        std.c_attn.bias.normal_()
    good = layer.to_heads()
    hw = std.to_heads()
    hw.W_Q, hw.b_Q = good.W_Q.clone(), torch.zeros_like(good.b_Q)
    layer.load_heads(hw)  # W_Q = I, b_Q = 0: accepted, and held exactly
    assert torch.equal(layer.to_heads().W_K, hw.W_K) and torch.equal(layer.to_heads().b_V, hw.b_V)
    before = {n: p.clone() for n, p in layer.state_dict().items()}
    for field, value in (("W_Q", std.to_heads().W_Q), ("b_Q", std.to_heads().b_Q)):
        bad = layer.to_heads()
        setattr(bad, field, value)
        with pytest.raises(UserError) as err:
            layer.load_heads(bad)
        tells(err, "identity_q", "W_Q is the identity", "b_Q = 0")  # what it can hold
        assert all(torch.equal(p, before[n]) for n, p in layer.state_dict().items()), field
