"""Rotary position embeddings (`attention/rope.py`): each frequency pair turned by position x frequency as
one complex number, in either layout; the pass dims untouched; scores depend on relative position only;
Llama-3's frequency scaling keeps short wavelengths and divides long ones."""

import math

import pytest
import torch

from iattention.attention.rope import (
    RotaryEmbedding,
    apply_rope,
    default_inv_freq,
    llama3_inv_freq,
    pair_dims,
)


def _by_complex(x, positions, inv_freq, layout):
    """Pair k as the complex number x[first_k] + i x[second_k], times e^{i n theta_k}; the rest as it was."""
    rot = 2 * len(inv_freq)
    first, second = pair_dims(rot, layout)
    out = x.clone()
    for t, n in enumerate(positions.tolist()):
        z = torch.complex(x[t, first], x[t, second]) * torch.exp(1j * n * inv_freq.double())
        out[t, first], out[t, second] = z.real, z.imag
    return out


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("rot", [0, 4, 6])
def test_each_pair_is_turned_by_its_angle_and_the_pass_dims_are_left(layout, rot):
    r, T = 6, 5
    x = torch.randn(T, r, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    positions = torch.arange(3, 3 + T)
    inv = default_inv_freq(rot, 10000.0)
    cos, sin = RotaryEmbedding(inv)(positions, torch.float64)
    got = apply_rope(x, cos, sin, layout)
    if rot == 0:  # no rotary dims: the head as it was
        assert torch.equal(got, x)
        return
    assert torch.allclose(got, _by_complex(x, positions, inv, layout), atol=1e-6)
    assert torch.equal(got[:, rot:], x[:, rot:])
    assert torch.allclose(got.norm(dim=-1), x.norm(dim=-1))  # a rotation


def test_pairs_of_each_layout():
    assert [t.tolist() for t in pair_dims(6, "half")] == [[0, 1, 2], [3, 4, 5]]
    assert [t.tolist() for t in pair_dims(6, "interleaved")] == [[0, 2, 4], [1, 3, 5]]
    with pytest.raises(ValueError) as err:
        pair_dims(6, "spiral")
    assert "'spiral'" in str(err.value) and "half" in str(err.value) and "interleaved" in str(err.value)


def test_a_score_depends_on_the_distance_between_positions_only():
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 8, dtype=torch.float64, generator=g), torch.randn(1, 8, dtype=torch.float64, generator=g)
    rope = RotaryEmbedding(default_inv_freq(8, 500.0))

    def score(m, n):
        cq, sq = rope(torch.tensor([m]), torch.float64)
        ck, sk = rope(torch.tensor([n]), torch.float64)
        return (apply_rope(q, cq, sq, "half") * apply_rope(k, ck, sk, "half")).sum().item()

    assert score(7, 3) == pytest.approx(score(14, 10), rel=1e-5) == pytest.approx(score(4, 0), rel=1e-5)
    assert score(7, 3) != pytest.approx(score(7, 4), rel=1e-3)


def test_default_frequencies_and_llama3_scaling():
    inv = default_inv_freq(8, 10000.0)
    assert inv.tolist() == pytest.approx([10000.0 ** (-2 * k / 8) for k in range(4)])
    scaled = llama3_inv_freq(64, 500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                             original_max_position_embeddings=8192)
    base = default_inv_freq(64, 500000.0)
    wavelen = 2 * math.pi / base
    short, long_ = wavelen < 8192 / 4, wavelen > 8192 / 1
    assert torch.equal(scaled[short], base[short])  # short wavelengths kept
    assert torch.allclose(scaled[long_], base[long_] / 8)  # long ones divided by the factor
    mid = ~short & ~long_
    assert mid.any() and ((scaled[mid] <= base[mid]) & (scaled[mid] >= base[mid] / 8)).all()  # a blend between


@pytest.mark.parametrize("cast", ["to-bf16", "to-fp16", "half", "bfloat16", "double", "float", "to-device-dtype"])
def test_module_casts_keep_the_frequencies_exact_float32(cast):
    """A cast of the whole model must not round the frequencies: bf16 ones turn position 4,095 by up to 0.7 rad
    too far (transformers keeps them float32 in every dtype)."""
    inv = default_inv_freq(64, 10000.0)
    model = torch.nn.Sequential(RotaryEmbedding(inv))
    model = {"to-bf16": lambda m: m.to(torch.bfloat16), "to-fp16": lambda m: m.to(dtype=torch.float16),
             "half": lambda m: m.half(), "bfloat16": lambda m: m.bfloat16(), "double": lambda m: m.double(),
             "float": lambda m: m.bfloat16().float(),
             "to-device-dtype": lambda m: m.to("cpu", torch.bfloat16)}[cast](model)
    buf = model[0].inv_freq
    assert buf.dtype == torch.float32
    assert torch.equal(buf, inv)
    # and the angles the tables are made from are float32 ones, cast only at the end
    cos, _ = model[0](torch.arange(4096), torch.float64)
    assert torch.equal(cos, (torch.arange(4096).float()[:, None] * inv).cos().double())


def test_a_model_built_on_the_meta_device_gets_exact_frequencies_from_to_empty():
    """Build on meta, then to_empty (how large models are materialised): the frequencies are not loaded from any
    checkpoint (non-persistent), so they must come out exact, not uninitialised memory."""
    ref = llama3_inv_freq(64, 500000.0, 8.0, 1.0, 4.0, 8192)
    with torch.device("meta"):
        model = torch.nn.Sequential(RotaryEmbedding(llama3_inv_freq(64, 500000.0, 8.0, 1.0, 4.0, 8192)),
                                    torch.nn.Linear(4, 4))
    assert model[1].weight.is_meta
    model = model.to_empty(device="cpu").bfloat16()
    assert model[0].inv_freq.dtype == torch.float32 and torch.equal(model[0].inv_freq, ref)
