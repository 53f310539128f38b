"""Unit tests of iattention.train.schedule (moved from tests/test_optim.py)."""

import pytest

from iattention.config import OptimConfig


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
