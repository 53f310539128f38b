"""Unit tests of iattention.attention.identity_ko."""

import pytest
import torch

from helpers import make_model


def _identity_ko_and_canonical(heads: int):
    """An identity_ko model and a canonical model (aligned blocks, learned free rows zero) holding
    the same W_Q, W_V, biases and non-attention weights."""
    ko = make_model(attention="identity_ko", n_head=heads)
    can = make_model(attention="canonical", n_head=heads)
    state = {k: v for k, v in ko.state_dict().items() if ".attn." not in k}
    can.load_state_dict(state, strict=False)
    with torch.no_grad():
        for a, b in zip(ko.attention_layers, can.attention_layers):
            a.b_K.normal_()
            a.b_O.normal_()
            hw = a.to_heads()
            b.W_Q.copy_(hw.W_Q)
            b.W_V.copy_(hw.W_V)
            for name in ("b_Q", "b_K", "b_V", "b_O"):
                getattr(b, name).copy_(getattr(hw, name))
    return ko, can


def test_identity_ko_equals_canonical_at_one_head():
    """At one head (r = d) the aligned canonical block is the whole W_K and W_O: the same model."""
    ko, can = _identity_ko_and_canonical(1)
    x = torch.randint(0, 97, (2, 16))
    assert torch.allclose(ko(x)[0], can(x)[0], atol=1e-12)
    assert ko.num_params() == can.num_params()


@pytest.mark.parametrize("heads", [2, 3])
def test_identity_ko_differs_from_canonical_with_more_heads(heads):
    """With H > 1, canonical also learns the d - r free rows of each head's W_K and W_O; identity_ko
    has them at zero. Zero free rows give the same function; nonzero ones (any canonical training)
    give another, which identity_ko cannot represent."""
    ko, can = _identity_ko_and_canonical(heads)
    x = torch.randint(0, 97, (2, 16))
    with torch.no_grad():
        for b in can.attention_layers:
            b.W_K_free.zero_()
            b.W_O_free.zero_()
    assert torch.allclose(ko(x)[0], can(x)[0], atol=1e-12)
    with torch.no_grad():
        for b in can.attention_layers:
            b.W_K_free.normal_(0, 0.3)
            b.W_O_free.normal_(0, 0.3)
    assert not torch.allclose(ko(x)[0], can(x)[0], atol=1e-3)
    assert ko.num_params() < can.num_params()


@pytest.mark.parametrize("heads", [1, 3])
def test_identity_ko_has_no_key_or_output_gemm(heads):
    model = make_model(attention="identity_ko", n_head=heads)
    attn = model.attention_layers[0]
    assert [n for n, p in attn.named_parameters() if p.dim() >= 2] == ["c_qv.weight"]
    x = torch.randn(2, 7, 48, dtype=torch.float64)
    hw = attn.to_heads()
    k = attn.qkv(x)[1].reshape(2, 7, heads, -1)
    for h in range(heads):  # head h's keys: coordinates [h r, (h+1) r) plus b_K
        assert torch.allclose(k[:, :, h], x @ hw.W_K[h] + hw.b_K[h], atol=1e-12)
