"""The Triton wide-head attention (kernels/wide_attention.py) against the math path (float64 softmax(q k^T /
sqrt(d) + causal mask) v), under Triton's interpreter on CPU: forward output and dQ, dK, dV, at T not a
multiple of the tile, T = 1, batch 1, head dims 64 to 1024. The kernel runs in a worker process with the
interpreter on (conftest.py, interpreted.py); these tests hold the assertions."""

from __future__ import annotations

import pytest

# Small tiles make a head dim of 64 run several chunks of every loop (scores: 4, output: 4, gradients: 2).
SMALL = dict(BM=16, BN=16, BK=16, BDV=16, bwd_BM=16, bwd_BN=16, BDC=32)

FP32_CASES = [  # B, H, T, D, blocks
    pytest.param(2, 3, 5, 64, None, id="B2-H3-T5-d64"),
    pytest.param(1, 1, 1, 64, None, id="T1-d64"),
    pytest.param(1, 1, 70, 64, SMALL, id="T70-d64-small-tiles", marks=pytest.mark.slow),  # 2-5 s each under the
    pytest.param(2, 1, 37, 96, SMALL, id="T37-d96-not-a-power-of-two", marks=pytest.mark.slow),  # interpreter
    pytest.param(1, 2, 33, 256, None, id="T33-d256"),
    pytest.param(1, 1, 33, 768, None, id="T33-d768"),
    pytest.param(1, 1, 1, 768, None, id="T1-d768"),
    pytest.param(1, 1, 17, 1024, None, id="T17-d1024"),
    pytest.param(2, 1, 70, 768, None, id="B2-T70-d768", marks=pytest.mark.slow),
    pytest.param(1, 1, 70, 1024, None, id="T70-d1024", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("B, H, T, D, blocks", FP32_CASES)
def test_fp32_matches_the_math_path_to_1e_5(interpreted, B, H, T, D, blocks):
    result = interpreted("attention", B=B, H=H, T=T, D=D, dtype="float32", blocks=blocks)
    for name in ("out", "dq", "dk", "dv"):
        e = result[name]
        assert e["dtype"] == "float32" and e["shape"] == e["ref_shape"] == [B, H, T, D]
        assert e["max_abs"] <= 1e-5 * max(1.0, e["ref_max"]), f"{name}: {e}"


BF16_CASES = [
    pytest.param(1, 2, 33, 96, None, "bfloat16", id="T33-d96-bf16"),
    pytest.param(1, 1, 70, 64, SMALL, "bfloat16", id="T70-d64-small-tiles-bf16", marks=pytest.mark.slow),  # 5 s
    pytest.param(1, 1, 33, 768, None, "bfloat16", id="T33-d768-bf16", marks=pytest.mark.slow),  # 3.6 s
    pytest.param(1, 2, 33, 96, None, "float16", id="T33-d96-fp16"),
    pytest.param(1, 1, 70, 1024, None, "bfloat16", id="T70-d1024-bf16", marks=pytest.mark.slow),
]
EPS = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}  # unit roundoff


@pytest.mark.parametrize("B, H, T, D, blocks, dtype", BF16_CASES)
def test_half_precision_is_within_its_rounding_of_the_math_path(interpreted, B, H, T, D, blocks, dtype):
    """bf16 (fp16) inputs with fp32 accumulation: relative (Frobenius) error within a few unit roundoffs of
    the float64 math path on the same rounded inputs. A wrong mask or a missed rescale is off by O(1)."""
    result = interpreted("attention", B=B, H=H, T=T, D=D, dtype=dtype, blocks=blocks)
    for name in ("out", "dq", "dk", "dv"):
        e = result[name]
        assert e["dtype"] == dtype and e["shape"] == [B, H, T, D]
        assert e["rel_norm"] <= 4 * EPS[dtype], f"{name}: {e}"


def test_output_keeps_the_models_memory_order(interpreted):
    """The output's memory is (B, T, H, d), so the model's transpose back to (B, T, H d) is free; plain
    contiguous (B, H, T, d) inputs work too."""
    for layout in (True, False):
        result = interpreted("attention", B=2, H=3, T=9, D=32, dtype="float32", model_layout=layout)
        assert result["out_memory_is_BTHD"]
        assert result["out"]["max_abs"] <= 1e-5 and result["dk"]["max_abs"] <= 1e-5


def test_mixed_dtypes_are_promoted_and_autocast_casts(interpreted):
    """canonical at one head passes the residual stream itself as keys (float32 under bf16 autocast): as SDPA,
    the kernel casts to autocast's dtype; without autocast the dtypes are promoted."""
    promoted = interpreted("mixed", autocast=False)
    assert promoted["dtype"] == "float32" and promoted["max_abs"] <= 1e-5
    cast = interpreted("mixed", autocast=True)
    assert cast["dtype"] == "bfloat16" and cast["rel_norm"] <= 4 * EPS["bfloat16"]


def test_refuses_what_it_cannot_compute(interpreted):
    assert "one shape" in interpreted("refuse", kind="shape")["error"]
    assert "float32, bfloat16 or float16" in interpreted("refuse", kind="dtype")["error"]


def test_the_op_passes_opcheck_and_compiles_with_fullgraph(interpreted):
    """The kernel as a torch op: opcheck (schema, fake tensors, register_autograd, AOT dispatch) with autotuned
    (here: default) and fixed tiles, and torch.compile(fullgraph=True) equal to eager, forward and backward."""
    r = interpreted("registered_op")
    assert r["max_abs"] <= 1e-6 * max(1.0, r["grad_scale"]), r
