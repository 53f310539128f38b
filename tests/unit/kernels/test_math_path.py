"""The math path (kernels/math_path.py) against F.scaled_dot_product_attention: forward and the gradients of
q, k, v in float64 and float32, at T = 1, T not a power of two, several heads and grouped-query attention;
dropout with SDPA's own random stream; bf16 within its rounding; autocast and mixed dtypes; and under
torch.compile(fullgraph=True)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from iattention.kernels.math_path import math_causal_attention

TOL = {torch.float64: 1e-12, torch.float32: 2e-6}


def qkv(B, H, T, r, dtype=torch.float32, G=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = ((B, H, T, r), (B, G or H, T, r), (B, G or H, T, r))
    return [torch.randn(s, generator=g, dtype=torch.float64).to(dtype).requires_grad_() for s in shapes]


def fwd_bwd(fn, q, k, v, seed=1, rounded_to=None):
    """Output and the gradients of q, k, v for a random output gradient (first rounded to `rounded_to`)."""
    out = fn(q, k, v)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    grad = grad.to(rounded_to or out.dtype).to(out.dtype)
    return (out, *torch.autograd.grad(out, (q, k, v), grad))


def sdpa(q, k, v, dropout=0.0):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout,
                                          enable_gqa=k.shape[1] != q.shape[1])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("B, H, G, T, r", [(2, 3, 3, 7, 16), (1, 1, 1, 1, 32), (2, 4, 2, 13, 8), (1, 4, 1, 9, 24),
                                           (1, 1, 1, 37, 96)])
def test_forward_and_gradients_equal_sdpa(dtype, B, H, G, T, r):
    """G < H: grouped-query attention (query head h reads key/value head h // (H / G), as SDPA's enable_gqa)."""
    q, k, v = qkv(B, H, T, r, dtype, G)
    ours, ref = fwd_bwd(math_causal_attention, q, k, v), fwd_bwd(sdpa, q, k, v)
    for name, a, b in zip(("out", "dq", "dk", "dv"), ours, ref):
        assert a.dtype == dtype and a.shape == b.shape, name
        assert (a - b).abs().max().item() <= TOL[dtype] * max(1.0, b.abs().max().item()), name


def test_dropout_draws_sdpas_mask_from_the_same_seed():
    """On CPU SDPA's dropout and F.dropout on the probabilities consume the generator alike: the same seed
    gives the same output (so a run switched between sdpa and math keeps its dropout stream)."""
    q, k, v = qkv(2, 3, 40, 16)
    torch.manual_seed(5)
    ours = fwd_bwd(lambda *a: math_causal_attention(*a, dropout=0.3), q, k, v)
    torch.manual_seed(5)
    ref = fwd_bwd(lambda *a: sdpa(*a, dropout=0.3), q, k, v)
    undropped = math_causal_attention(q, k, v)
    assert (ours[0] - undropped).abs().max() > 0.1  # dropout applied
    for a, b in zip(ours, ref):
        assert (a - b).abs().max().item() <= 2e-6 * max(1.0, b.abs().max().item())


def test_bf16_is_within_its_rounding_of_float64():
    """bf16 products, fp32 softmax: relative (Frobenius) error within a few bf16 unit roundoffs (2^-8) of the
    float64 result on the same rounded inputs, for the output and every gradient."""
    q, k, v = qkv(2, 2, 33, 64, torch.bfloat16)
    ours = fwd_bwd(math_causal_attention, q, k, v)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = fwd_bwd(math_causal_attention, q64, k64, v64, rounded_to=torch.bfloat16)
    for name, a, b in zip(("out", "dq", "dk", "dv"), ours, ref):
        assert a.dtype == torch.bfloat16, name
        assert ((a.double() - b).norm() / b.norm()).item() <= 4 * 2.0 ** -8, name


def test_mixed_dtypes_are_promoted_and_autocast_casts():
    """canonical at one head passes the float32 residual stream as keys beside bf16 queries and values."""
    q, k, v = (t.detach() for t in qkv(1, 1, 6, 32))
    promoted = math_causal_attention(q.bfloat16(), k, v.bfloat16())
    assert promoted.dtype == torch.float32
    ref = sdpa(q.bfloat16().float(), k, v.bfloat16().float())
    assert (promoted - ref).abs().max() <= 2e-6
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = math_causal_attention(q, k, v)
    assert cast.dtype == torch.bfloat16
    ref = sdpa(q.double(), k.double(), v.double())
    assert ((cast.double() - ref).norm() / ref.norm()).item() <= 4 * 2.0 ** -8


@pytest.mark.slow
def test_compiled_with_fullgraph_equals_eager():
    """torch.compile(fullgraph=True) traces it whole (no graph break), forward and backward, GQA included."""
    torch._dynamo.reset()
    fn = torch.compile(math_causal_attention, fullgraph=True)
    for G in (2, 1):
        q, k, v = qkv(2, 2, 19, 16, G=G)
        for a, b in zip(fwd_bwd(fn, q, k, v), fwd_bwd(sdpa, q, k, v)):
            assert (a - b).abs().max().item() <= 2e-6 * max(1.0, b.abs().max().item())


def window_reference(q, k, v, window):
    """SDPA with the sliding-window mask written from its definition (transformers' masking_utils: key j is seen
    by query i when i - W < j <= i)."""
    T = q.shape[2]
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=(j <= i) & (j > i - window),
                                          enable_gqa=k.shape[1] != q.shape[1])


@pytest.mark.parametrize("window", [1, 2, 5, 12, 13, 40])
@pytest.mark.parametrize("B, H, G, T, r", [(2, 3, 3, 13, 16), (2, 4, 2, 13, 8)])
def test_a_sliding_window_equals_sdpa_with_the_window_mask(window, B, H, G, T, r):
    """Forward and gradients of the math path and of `attend` (the SDPA path, and the math path by name) with a
    window W, against SDPA with the mask from its definition; W >= T is the plain causal pass."""
    from iattention.kernels import attend
    q, k, v = qkv(B, H, T, r, torch.float64, G)
    want = fwd_bwd(lambda *a: window_reference(*a, window), q, k, v)
    for fn in (lambda *a: math_causal_attention(*a, window=window), lambda *a: attend(*a, "sdpa", window=window),
               lambda *a: attend(*a, "math", window=window)):
        for got, ref in zip(fwd_bwd(fn, q, k, v), want):
            assert (got - ref).abs().max().item() <= 1e-12
