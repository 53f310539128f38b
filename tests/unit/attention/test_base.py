"""Unit tests of iattention.attention.base."""

import pytest
import torch

from helpers import make_model, tells
from iattention import GPT, GPTConfig
from iattention.attention.registry import variant_names
from iattention.symmetry import expand

VARIANTS = variant_names()


@pytest.mark.parametrize("attention", VARIANTS)
@pytest.mark.parametrize("heads", [1, 3])
def test_causality(attention, heads):
    model = make_model(attention=attention, n_head=heads)
    x = torch.randint(0, 97, (2, 16))
    y = x.clone()
    y[:, 10:] = (y[:, 10:] + 1) % 97
    a, b = model(x)[0], model(y)[0]
    assert torch.allclose(a[:, :10], b[:, :10], atol=1e-12)
    assert not torch.allclose(a[:, 10:], b[:, 10:])


@pytest.mark.slow
@pytest.mark.parametrize("attention", VARIANTS)
def test_each_variant_learns_a_synthetic_task(attention):
    """Copy task: predict the token seen 4 positions back. Loss must fall well below its start."""
    torch.manual_seed(1)
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=16, block_size=32, attention=attention)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(150):
        x = torch.randint(0, 16, (16, 4)).repeat(1, 5)
        loss = model(x[:, :-1], x[:, 1:])[1]
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_odd_shapes_forward_backward():
    for cfg in [GPTConfig(n_layer=1, n_head=3, n_embd=30, vocab_size=11, block_size=8, bias=False,
                          attention="canonical"),
                GPTConfig(n_layer=1, n_head=5, n_embd=50, vocab_size=11, block_size=8, attention="identity_q")]:
        torch.manual_seed(0)
        model = GPT(cfg).double()
        with torch.no_grad():  # weights large enough that attention shapes the logits
            for p in model.parameters():
                p.normal_(0.0, 0.3)
        x = torch.randint(0, 11, (2, 8))
        logits, loss = model(x, x)
        loss.backward()
        assert logits.shape == (2, 8, 11)
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
        # the odd shape computes the function of its exact standard form (expand), not just some tensor
        with torch.no_grad():
            ref, _ = expand(model).eval()(x)
            assert torch.allclose(model.eval()(x)[0], ref, rtol=1e-9, atol=1e-9)


def test_default_head_blocks_split_only_n_head_by_a_by_b_tensors():
    """The base class's head_blocks takes a 3-D (n_head, a, b) parameter head by head and refuses any other
    learned matrix, a 2-D one whose first axis happens to be n_head too."""
    from iattention.attention.base import CausalSelfAttention

    class Toy(CausalSelfAttention):
        def __init__(self, config, shape):
            super().__init__(config)
            self.W = torch.nn.Parameter(torch.zeros(shape))
            self.b_Q = torch.nn.Parameter(torch.zeros(config.n_embd))

    cfg = GPTConfig(n_layer=1, n_head=4, n_embd=16, vocab_size=50, block_size=8)
    assert Toy(cfg, (4, 16, 4)).head_blocks() == {"W": [(0,), (1,), (2,), (3,)]}
    for shape in ((4, 16), (2, 16, 4)):
        with pytest.raises(NotImplementedError, match=rf"^Toy learns matrices that are not \(n_head, a, b\) tensors "
                                                      rf"\(W \({shape[0]}, 16"):
            Toy(cfg, shape).head_blocks()


def _toy_layer(**params):
    """A layer of the base class holding the given parameters (name -> shape; a dotted name goes into a
    submodule), registered in the order given."""
    from iattention.attention.base import CausalSelfAttention

    class Toy(CausalSelfAttention):
        pass

    layer = Toy(GPTConfig(n_layer=1, n_head=4, n_embd=16, vocab_size=50, block_size=8))
    for name, shape in params.items():
        owner = layer
        *path, leaf = name.split(".")
        for part in path:
            if not hasattr(owner, part):
                owner.add_module(part, torch.nn.Module())
            owner = getattr(owner, part)
        owner.register_parameter(leaf, torch.nn.Parameter(torch.zeros(shape)))
    return layer


def test_default_head_blocks_skip_biases_of_any_shape_and_every_vector():
    """Biases are not matrices Muon splits: a 1-D vector of any name, a parameter named `bias` and a `b_*`
    one are skipped whatever their shape (a per-head (n_head, r) bias is 2-D), also inside a submodule,
    and also when registered before the matrices."""
    heads = [(0,), (1,), (2,), (3,)]
    for params in (dict(b_Q=(4, 4), W=(4, 16, 4)),  # a bias first: the matrices after it still count
                   dict(W=(4, 16, 4), bias=(4, 4)),
                   dict(W=(4, 16, 4), gain=(16,)),
                   dict(W=(4, 16, 4), **{"sub.b_K": (4, 4), "sub.bias": (4, 4)})):
        assert _toy_layer(**params).head_blocks() == {"W": heads}, params


def test_default_head_blocks_name_every_other_matrix_in_its_refusal():
    with pytest.raises(NotImplementedError) as err:
        _toy_layer(W=(4, 16, 4), A=(16, 16), B=(2, 16, 4)).head_blocks()
    tells(err, "Toy", "(n_head, a, b)", "A (16, 16), B (2, 16, 4)", "override head_blocks")
