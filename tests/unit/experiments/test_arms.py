"""Unit tests of iattention.experiments.arms."""

import pytest

from iattention.errors import UserError


def test_arms_resolve_and_collisions_are_refused(tmp_path):
    from iattention.experiments.arms import check_overrides, resolve_arms

    f = tmp_path / "arms.yaml"
    f.write_text("fast: [model.attention=canonical, optim.lr=3e-3]\nbad: [model.n_head=2]\n")
    arms = resolve_arms(["standard", "canonical-matched", "fast"], str(f))
    assert [a.name for a in arms] == ["standard", "canonical-matched", "fast"]
    assert arms[2].keys() == {"model.attention", "optim.lr"}
    with pytest.raises(UserError, match="axis of the grid; use --heads"):
        resolve_arms(["bad"], str(f))
    with pytest.raises(UserError, match="unknown arm 'nope'"):
        resolve_arms(["nope"], str(f))
    with pytest.raises(UserError, match="collides with arm 'fast'"):
        check_overrides(["optim.lr=1e-3"], arms)
    with pytest.raises(UserError, match="axis of the grid; use --seeds"):
        check_overrides(["train.seed=3"], arms)
    check_overrides(["optim.weight_decay=0.0"], arms)  # a key no arm sets is fine
