"""Unit tests of iattention.utils.lock."""

import os

import pytest

from iattention.errors import UserError


def test_a_symlink_lock_in_a_sweep_run_is_refused_by_the_lock_itself(tmp_path):
    """`iattn sweep` reached the same open through `<sweep>/<run>/.lock`; the lock refuses it for every caller."""
    from iattention.utils.lock import RunLock, holder

    victim = tmp_path / "v"
    victim.write_text("precious\n")
    run = tmp_path / "sweep" / "standard-h2-s0"
    run.mkdir(parents=True)
    (run / ".lock").symlink_to(victim)
    assert holder(run) is None  # the sweep's look does not open it either
    with pytest.raises(UserError, match="symbolic link"):
        RunLock(run).acquire()
    assert victim.read_text() == "precious\n"
    (run / ".lock").unlink()
    os.mkfifo(run / ".lock")
    with pytest.raises(UserError, match="not a regular file"):
        RunLock(run).acquire()
