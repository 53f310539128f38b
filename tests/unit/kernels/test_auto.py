"""model.attn_kernel=auto's table (kernels/auto.py): the fastest measured path for the nearest measured head dim
and H T^2, the math path's memory guard, triton only where it can run, no answer outside the measured head dims;
kernel_for following it on a listed device and keeping its rule elsewhere; the committed table's form."""

from __future__ import annotations

import pytest
import torch

import iattention.kernels as kernels
from iattention import GPT, GPTConfig
from iattention.kernels.auto import MATH_BYTES_PER_SCORE, TABLE_PATH, Device, device_entry, load_table, pick

GIB = 2 ** 30
ROWS = (  # made-up timings: math wins at short T, triton at long T, sdpa at d = 256
    dict(d=256, H=1, T=1024, B=16, ms=dict(sdpa=1.0, math=2.0, triton=3.0)),
    dict(d=768, H=1, T=1024, B=16, ms=dict(sdpa=5.0, math=1.0, triton=2.0)),
    dict(d=768, H=1, T=4096, B=16, ms=dict(sdpa=50.0, math=20.0, triton=10.0)),
    dict(d=768, H=3, T=1024, B=16, ms=dict(sdpa=15.0, math=3.0, triton=None)),  # triton failed here
)
H100 = Device("NVIDIA H100 80GB HBM3", 80 * GIB, ROWS, math_memory_fraction=1 / 32)


@pytest.mark.parametrize("d, B, H, T, expected", [
    (768, 16, 1, 1024, "math"),
    (768, 16, 1, 1200, "math"),  # nearest H T^2: the T = 1024 row
    (768, 1, 1, 4096, "triton"),  # the T = 4096 row: triton measured fastest
    (768, 1, 1, 3000, "triton"),  # log(3000^2) is nearer log(4096^2) than log(1024^2)
    (768, 16, 3, 1024, "math"),  # H T^2 = 3 M: the H = 3 row (triton failed there: not a candidate)
    (700, 16, 1, 1024, "math"),  # nearest measured head dim 768
    (384, 16, 1, 1024, "sdpa"),  # nearest 256
    (512, 16, 1, 1024, "math"),  # equidistant from 256 and 768: the wider one
])
def test_picks_the_fastest_path_of_the_nearest_row(d, B, H, T, expected):
    assert pick(H100, d, B, H, T) == expected


def test_no_answer_outside_the_measured_head_dims_or_without_rows():
    assert pick(H100, 128, 16, 1, 1024) is None
    assert pick(H100, 1024, 16, 1, 1024) is None
    assert pick(Device("other", 80 * GIB, ()), 768, 16, 1, 1024) is None


def test_the_memory_guard_takes_the_next_fastest_path_when_the_scores_do_not_fit():
    """The math path holds B H T^2 * MATH_BYTES_PER_SCORE bytes per layer; past the table's share of the
    device's memory the next fastest measured path runs."""
    budget = H100.math_memory_fraction * H100.memory  # 2.5 GiB
    fits = int(budget // (MATH_BYTES_PER_SCORE * 1024 * 1024))  # the largest batch of T = 1024 that fits
    assert pick(H100, 768, fits, 1, 1024) == "math"
    assert pick(H100, 768, fits + 1, 1, 1024) == "triton"
    assert pick(H100, 768, fits + 1, 3, 1024) == "sdpa"  # triton not measured there
    small = Device("small", 8 * GIB, ROWS)
    assert pick(small, 768, 16, 1, 1024) == "math"  # 16 x 1024^2 x 10 B = 160 MiB <= 8 GiB / 32 = 256 MiB
    assert pick(small, 768, 32, 1, 1024) == "triton"  # 320 MiB > 256 MiB


def test_triton_only_where_it_runs():
    assert pick(H100, 768, 1, 1, 4096, dropout=0.1) == "math"
    assert pick(H100, 768, 1, 1, 4096, triton_ok=False) == "math"


def test_kernel_for_follows_the_table_on_a_listed_device_and_its_rule_elsewhere(monkeypatch):
    monkeypatch.setattr(kernels, "TRITON_INSTALLED", True)
    monkeypatch.setitem(kernels.DEVICES, "cuda", H100)
    assert kernels.kernel_for("auto", "cuda", 768, 0.0, (16, 1, 1024)) == "math"
    assert kernels.kernel_for("auto", "cuda", 768, 0.0, (1, 1, 4096)) == "triton"
    assert kernels.kernel_for("auto", "cuda", 1024, 0.0, (16, 1, 1024)) == "triton"  # outside: the rule
    assert kernels.kernel_for("auto", "cuda", 64, 0.0, (16, 1, 1024)) == "sdpa"
    assert kernels.kernel_for("auto", "cuda", 768) == "triton"  # no shape: the rule
    assert kernels.kernel_for("sdpa", "cuda", 768, 0.0, (16, 1, 1024)) == "sdpa"  # forced modes ignore it
    monkeypatch.setitem(kernels.DEVICES, "cuda", device_entry({"devices": {}}, "unlisted", 80 * GIB))
    assert kernels.kernel_for("auto", "cuda", 768, 0.0, (16, 1, 1024)) == "triton"


def test_the_committed_table_is_well_formed():
    """Every row names a measured head dim, shape and a time (or null) for known paths only; with no device
    measured auto keeps its rule (and on CPU nothing changes)."""
    table = load_table(TABLE_PATH)
    assert 0 < table["math_memory_fraction"] <= 1
    for name, rows in table["devices"].items():
        for row in rows:
            assert {"d", "H", "T", "B", "ms"} <= set(row), (name, row)
            assert set(row["ms"]) <= {"sdpa", "math", "triton"}, (name, row)
    entry = device_entry(table, "cpu", 1)
    assert entry.rows == tuple(table["devices"].get("cpu", ()))


@pytest.mark.slow
def test_a_compiled_model_follows_the_table_with_fullgraph(monkeypatch):
    """auto reads the table inside the forward: torch.compile(fullgraph=True) traces it (here a CPU row that
    makes the math path fastest) and the compiled loss equals SDPA's."""
    calls = []
    real = kernels.math_causal_attention
    monkeypatch.setattr(kernels, "math_causal_attention", lambda *a: calls.append(1) or real(*a))
    rows = (dict(d=32, H=2, T=16, B=2, ms=dict(sdpa=2.0, math=1.0)),)
    monkeypatch.setitem(kernels.DEVICES, "cpu", Device("cpu", 64 * GIB, rows))
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=64, vocab_size=32, block_size=16)
    torch.manual_seed(0)
    model = GPT(cfg)
    x = torch.randint(0, 32, (2, 16), generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    loss = torch.compile(model, fullgraph=True)(x, x)[1]
    assert len(calls) == 2  # traced once per layer
    reference = GPT(cfg.replace(attn_kernel="sdpa"))
    reference.load_state_dict(model.state_dict())
    assert abs(loss.item() - reference(x, x)[1].item()) <= 1e-5
