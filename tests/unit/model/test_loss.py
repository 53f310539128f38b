"""Unit tests of iattention.model.loss: the training loss a chunk of positions at a time."""

from __future__ import annotations

import pytest
import torch

from iattention import GPT, GPTConfig
from iattention.model.loss import IGNORE_INDEX

FAMILIES = {"gpt2": {}, "llama": dict(family="llama", n_kv_head=1)}


def model_and_batch(family: str, dtype=torch.float64, vocab_size=50):
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=16, vocab_size=vocab_size, block_size=16, **FAMILIES[family])
    model = GPT(cfg).to(dtype)
    x = torch.randint(0, vocab_size, (3, 13), generator=torch.Generator().manual_seed(1))
    return model, x[:, :-1], x[:, 1:].clone()


def loss_and_grads(model, x, y, **kwargs):
    model.zero_grad(set_to_none=True)
    logits, loss = model(x, y, **kwargs)
    loss.backward()
    return logits, loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("rows", [1, 7, 36, 100])  # 36 positions: 7 leaves a short last chunk, 100 one chunk
def test_the_chunked_loss_and_its_gradients_equal_the_whole_one_in_float64(family, rows):
    model, x, y = model_and_batch(family)
    y[0, :4] = IGNORE_INDEX  # left out of the mean, as F.cross_entropy leaves them
    _, whole, g_whole = loss_and_grads(model, x, y)
    logits, chunked, g_chunked = loss_and_grads(model, x, y, loss_chunk=rows)
    assert logits is None  # never built whole
    assert abs(chunked.item() - whole.item()) <= 1e-13 * abs(whole.item())
    for name, g in g_whole.items():
        assert (g_chunked[name] - g).abs().max().item() <= 1e-12 * max(g.abs().max().item(), 1e-30), name


def test_a_padded_vocabulary_s_extra_columns_stay_out_of_the_chunked_loss():
    model, x, y = model_and_batch("gpt2", vocab_size=50)
    model.config = model.config.replace(vocab_size=45)  # the head keeps 50 columns: 5 padded ones
    y = y.clamp(max=44)
    _, whole, _ = loss_and_grads(model, x, y)
    _, chunked, _ = loss_and_grads(model, x, y, loss_chunk=5)
    assert abs(chunked.item() - whole.item()) <= 1e-13 * whole.item()


def test_the_forward_saves_no_logits_for_the_backward():
    """What autograd saves in the forward for the backward: the whole loss saves the (positions, V) logits (and
    more); the chunked one saves at least that many elements fewer, and no tensor as large as one chunk's logits
    (each chunk's are rebuilt in the backward)."""
    model, x, y = model_and_batch("gpt2", dtype=torch.float32, vocab_size=400)
    positions, rows = y.numel(), 6

    def saved(**kwargs) -> tuple[int, int]:
        sizes = {}

        def pack(t):
            sizes[(t.data_ptr(), t.numel())] = t.numel()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model(x, y, **kwargs)[1]
        loss.backward()
        return sum(sizes.values()), max(sizes.values())

    (whole, whole_max), (chunked, chunked_max) = saved(), saved(loss_chunk=rows)
    assert whole_max >= positions * 400
    assert chunked <= whole - positions * 400
    assert chunked_max < rows * 400


def test_the_chunked_loss_compiles_with_fullgraph_and_matches_eager():
    torch._dynamo.reset()
    model, x, y = model_and_batch("gpt2", dtype=torch.float32)
    eager = model(x, y, loss_chunk=8)[1]
    compiled = torch.compile(model, fullgraph=True)(x, y, loss_chunk=8)[1]
    assert torch.allclose(eager, compiled, rtol=1e-5, atol=1e-6)


def test_a_negative_chunk_is_refused_not_a_zero_loss():
    model, x, y = model_and_batch("gpt2")
    with pytest.raises(ValueError, match="loss_chunk must be >= 0"):
        model(x, y, loss_chunk=-1)
