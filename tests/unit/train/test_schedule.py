"""The learning-rate schedule (`train/schedule.py`): warmup, cosine and linear decay, the floor, and the
extended-run recomputation the README promises. Oracles are written here from the definitions (GPT-2 /
nanoGPT warmup + cosine; Hugging Face's linear decay), not copied from the implementation."""

import json
import math

import pytest

from helpers import tiny_overrides, write_corpus
from iattention.config import OptimConfig
from iattention.train import load_config, train
from iattention.train.schedule import lr_at


def test_schedule_warmup_then_cosine_linear_or_flat():
    """The three schedules of results/paper-regime: cosine to the floor, linear to the floor, flat."""
    from iattention.train.schedule import lr_at
    T, lr = 960, 1e-3
    # warmup: linear from lr/warmup to lr
    assert lr_at(0, T, lr, 100, 0.1) == pytest.approx(lr / 100)
    assert lr_at(99, T, lr, 100, 0.1) == pytest.approx(lr)
    # cosine: half-way through the decay it is the mean of peak and floor, at the end the floor
    mid = 100 + (T - 100) // 2
    assert lr_at(mid, T, lr, 100, 0.1) == pytest.approx(0.55 * lr)
    assert lr_at(T, T, lr, 100, 0.1) == pytest.approx(0.1 * lr)
    assert lr_at(100 + (T - 100) // 4, T, lr, 100, 0.1) > 0.55 * lr + 0.2 * lr  # concave start, not linear
    # linear (Hugging Face Trainer's default: no warmup, to 0)
    assert lr_at(0, T, lr, 0, 0.0, "linear") == pytest.approx(lr)
    assert lr_at(T // 4, T, lr, 0, 0.0, "linear") == pytest.approx(0.75 * lr)
    assert lr_at(T - 1, T, lr, 0, 0.0, "linear") == pytest.approx(lr / T)
    # flat after warmup (min_lr_ratio 1: nanoGPT's defaults at a short run)
    assert {lr_at(s, T, lr, 649, 1.0) for s in range(649, T)} == {lr}
    with pytest.raises(ValueError):
        lr_at(0, T, lr, 0, 0.0, "step")


def test_an_unknown_schedule_is_a_one_line_error():
    from iattention.errors import UserError
    with pytest.raises(UserError, match="optim.schedule must be one of cosine, linear"):
        OptimConfig(schedule="step")


PEAK, WARMUP, TOTAL = 6e-4, 10, 110  # 100 decay steps: progress of step s is (s - 10) / 100


def _cosine(step, total, lr, warmup, ratio):
    """nanoGPT's get_lr: decay_ratio in [0, 1], coeff = 0.5 (1 + cos(pi decay_ratio)) in [1, 0]."""
    if step < warmup:
        return lr * (step + 1) / warmup
    floor = ratio * lr
    decay_ratio = min((step - warmup) / (total - warmup), 1.0)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return floor + coeff * (lr - floor)


def _linear(step, total, lr, warmup, ratio):
    """Straight line from lr at the end of warmup to ratio * lr at `total`, flat after."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = min((step - warmup) / (total - warmup), 1.0)
    return (1 - t) * lr + t * ratio * lr


def test_warmup_rises_linearly_to_the_peak():
    got = [lr_at(s, TOTAL, PEAK, WARMUP, 0.1) for s in range(WARMUP)]
    assert got == pytest.approx([PEAK * k / 10 for k in range(1, 11)], rel=1e-12)
    assert got[-1] == pytest.approx(PEAK)  # the last warmup step reaches the peak
    # the same for the linear schedule: warmup does not depend on the decay shape
    assert [lr_at(s, TOTAL, PEAK, WARMUP, 0.1, "linear") for s in range(WARMUP)] == pytest.approx(got, rel=1e-12)


@pytest.mark.parametrize("ratio", [0.0, 0.1, 0.5])
def test_cosine_decay_values(ratio):
    floor = ratio * PEAK
    # landmarks written by hand: cos(0) = 1, cos(pi/2) = 0, cos(pi) = -1, cos(pi/4) = sqrt(2)/2
    assert lr_at(WARMUP, TOTAL, PEAK, WARMUP, ratio) == pytest.approx(PEAK, rel=1e-12)
    assert lr_at(WARMUP + 50, TOTAL, PEAK, WARMUP, ratio) == pytest.approx((PEAK + floor) / 2, rel=1e-12)
    assert lr_at(WARMUP + 25, TOTAL, PEAK, WARMUP, ratio) == pytest.approx(
        floor + (PEAK - floor) * (1 + math.sqrt(2) / 2) / 2, rel=1e-12)
    assert lr_at(TOTAL, TOTAL, PEAK, WARMUP, ratio) == pytest.approx(floor, abs=1e-18)
    for s in range(WARMUP, TOTAL + 20):
        assert lr_at(s, TOTAL, PEAK, WARMUP, ratio) == pytest.approx(_cosine(s, TOTAL, PEAK, WARMUP, ratio),
                                                                     rel=1e-12, abs=1e-18), s


def test_cosine_decays_strictly_after_warmup_and_stays_at_the_floor():
    lrs = [lr_at(s, TOTAL, PEAK, WARMUP, 0.1) for s in range(WARMUP, TOTAL + 1)]
    assert all(a > b for a, b in zip(lrs, lrs[1:]))
    assert lr_at(TOTAL - 1, TOTAL, PEAK, WARMUP, 0.1) < 0.11 * PEAK
    # past the end it stays at min_lr_ratio * lr
    assert [lr_at(s, TOTAL, PEAK, WARMUP, 0.1) for s in (TOTAL, TOTAL + 1, 10 * TOTAL)] == pytest.approx(
        [0.1 * PEAK] * 3, rel=1e-12)


@pytest.mark.parametrize("ratio", [0.0, 0.1, 0.5])
def test_linear_decay_values(ratio):
    floor = ratio * PEAK
    assert lr_at(WARMUP, TOTAL, PEAK, WARMUP, ratio, "linear") == pytest.approx(PEAK, rel=1e-12)
    assert lr_at(WARMUP + 50, TOTAL, PEAK, WARMUP, ratio, "linear") == pytest.approx((PEAK + floor) / 2, rel=1e-12)
    assert lr_at(WARMUP + 25, TOTAL, PEAK, WARMUP, ratio, "linear") == pytest.approx(
        0.75 * PEAK + 0.25 * floor, rel=1e-12)
    assert lr_at(TOTAL + 7, TOTAL, PEAK, WARMUP, ratio, "linear") == pytest.approx(floor, abs=1e-18)
    for s in range(WARMUP, TOTAL + 20):
        assert lr_at(s, TOTAL, PEAK, WARMUP, ratio, "linear") == pytest.approx(
            _linear(s, TOTAL, PEAK, WARMUP, ratio), rel=1e-12, abs=1e-18), s
    # linear and cosine differ in between (the schedule name is honoured)
    assert lr_at(WARMUP + 25, TOTAL, PEAK, WARMUP, 0.1, "linear") != pytest.approx(
        lr_at(WARMUP + 25, TOTAL, PEAK, WARMUP, 0.1, "cosine"), rel=1e-6)


def test_min_lr_ratio_one_is_flat_after_warmup():
    for schedule in ("cosine", "linear"):
        assert [lr_at(s, TOTAL, PEAK, WARMUP, 1.0, schedule) for s in range(WARMUP, 3 * TOTAL, 7)] == pytest.approx(
            [PEAK] * len(range(WARMUP, 3 * TOTAL, 7)), rel=1e-12)


def test_no_warmup_starts_at_the_peak():
    assert lr_at(0, 100, 1.0, 0, 0.0) == pytest.approx(1.0)
    assert lr_at(50, 100, 1.0, 0, 0.0) == pytest.approx(0.5)
    assert lr_at(1, 100, 1.0, 0, 0.0) == pytest.approx(0.5 * (1 + math.cos(math.pi / 100)))


def test_a_run_no_longer_than_its_warmup_stays_at_the_peak_after_it():
    # total_steps <= warmup: nothing to decay over; after warmup the rate is the peak (no division by zero)
    assert lr_at(5, 5, 1.0, 5, 0.1) == 1.0
    assert lr_at(6, 5, 1.0, 5, 0.1) == 1.0
    assert lr_at(9, 3, 1.0, 5, 0.1) == 1.0
    assert lr_at(2, 3, 1.0, 5, 0.1) == pytest.approx(3 / 5)
    # one decay step: the step after warmup is the peak, the next the floor
    assert lr_at(5, 6, 1.0, 5, 0.1) == pytest.approx(1.0)
    assert lr_at(6, 6, 1.0, 5, 0.1) == pytest.approx(0.1)


def test_unknown_schedule_is_refused():
    with pytest.raises(ValueError, match="unknown schedule 'step'"):
        lr_at(0, 10, 1.0, 2, 0.1, "step")
    with pytest.raises(ValueError, match="unknown schedule"):
        lr_at(50, 100, 1.0, 2, 0.1, "Cosine")


@pytest.mark.slow
def test_extended_run_recomputes_the_schedule_over_the_new_total(tmp_path):
    """README: `--resume` with a larger train.epochs extends a finished run and the cosine schedule is
    recomputed over the new total, so the rate rises to where the longer schedule would be. Checked on
    the rates the run logs (steps.jsonl) and the one optimizer group rate they come from."""
    paths = write_corpus(tmp_path, n_train=1500, n_eval=400)  # 45 windows of 33: 5 steps per epoch

    def cfg(epochs):
        return load_config("tiny", None, tiny_overrides(paths, tmp_path / "cache", **{
            "train.epochs": epochs, "optim.warmup_steps": 2}))

    short = train(cfg(1), tmp_path / "run", quiet=True)
    spe = short["steps"]
    assert spe > 2  # past the 2 warmup steps: some decay steps exist
    o = cfg(1).optim
    first = [json.loads(x)["lr"] for x in open(tmp_path / "run" / "steps.jsonl")]
    assert first == pytest.approx([_cosine(s, spe, o.lr, o.warmup_steps, o.min_lr_ratio) for s in range(spe)],
                                  rel=1e-9)
    assert first[-1] < 0.5 * o.lr  # the one-epoch run decayed (cosine to min_lr_ratio * lr)

    ext = train(cfg(3), tmp_path / "run", resume=True, quiet=True)
    assert ext["steps"] == 3 * spe
    lrs = [json.loads(x)["lr"] for x in open(tmp_path / "run" / "steps.jsonl")]
    assert lrs[:spe] == pytest.approx(first, rel=1e-12)  # the history is kept as it was
    want = [_cosine(s, 3 * spe, o.lr, o.warmup_steps, o.min_lr_ratio) for s in range(spe, 3 * spe)]
    assert lrs[spe:] == pytest.approx(want, rel=1e-9)
    assert lrs[spe] > 2 * first[-1]  # the rate rose at the resume point
    metrics = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
    assert [m["lr"] for m in metrics if m["kind"] == "epoch"] == pytest.approx(
        [lrs[spe - 1], lrs[2 * spe - 1], lrs[3 * spe - 1]], rel=1e-12)


def test_a_budget_sets_the_steps_a_run_makes():
    """train.max_steps is the step count; train.max_tokens the whole steps of batch x block tokens within it;
    neither: epochs x steps per epoch. Fewer tokens than one step, or both budgets, are one-line errors."""
    from iattention.config import LoopConfig
    from iattention.errors import UserError
    from iattention.train.schedule import budget_steps

    assert budget_steps(LoopConfig(epochs=3, batch_size=8), 10, 32) == 30
    assert budget_steps(LoopConfig(epochs=3, batch_size=8, max_steps=7), 10, 32) == 7
    assert budget_steps(LoopConfig(epochs=3, batch_size=8, max_tokens=8 * 32 * 5 + 255), 10, 32) == 5
    with pytest.raises(UserError, match=r"train.max_tokens=255 is less than one step \(8 x 32 = 256 tokens\)"):
        budget_steps(LoopConfig(batch_size=8, max_tokens=255), 10, 32)
    with pytest.raises(UserError, match="are two budgets; give one"):
        LoopConfig(max_steps=3, max_tokens=1000)
    with pytest.raises(UserError, match=r"train.max_steps must be >= 0"):
        LoopConfig(max_steps=-1)
