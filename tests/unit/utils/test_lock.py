"""The run lock (`utils/lock.py`): one process per run folder; the holder named in the refusal; a lock left
by a killed process taken over; lock files that are links, folders or pipes never opened."""

import os
import subprocess
import sys

import pytest

from helpers import wait_until
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


HOLD = """
import sys
from iattention.utils.lock import RunLock
lock = RunLock(sys.argv[1]).acquire()
open(sys.argv[2], "w").close()  # the lock is held
sys.stdin.read()  # held until the test is done with it (and kills it)
"""


def test_a_held_lock_refuses_another_process_naming_the_holder_and_a_killed_holder_s_lock_is_taken(tmp_path):
    from iattention.utils.lock import RunLock, holder

    run, ready = tmp_path / "run", tmp_path / "ready"
    child = subprocess.Popen([sys.executable, "-c", HOLD, str(run), str(ready)], stdin=subprocess.PIPE)
    try:
        wait_until(ready.exists, child, "the holder took the lock")  # the file it writes once it holds the lock
        assert holder(run) == str(child.pid)
        with pytest.raises(UserError) as err:
            RunLock(run).acquire()
        assert str(run) in str(err.value) and f"pid {child.pid}" in str(err.value) and "--out" in str(err.value)
        assert holder(run) == str(child.pid)  # the refused acquire left the holder's lock as it was
    finally:
        child.kill()
        child.wait()
    assert holder(run) is None  # the kernel released it with the process
    lock = RunLock(run).acquire()
    try:
        assert holder(run) == str(os.getpid())
    finally:
        lock.release()
    assert holder(run) is None


def test_one_process_holds_a_folder_once_until_it_releases_it(tmp_path):
    from iattention.utils.lock import RunLock

    first = RunLock(tmp_path / "run").acquire()
    with pytest.raises(UserError, match="in use"):
        RunLock(tmp_path / "run").acquire()
    first.release()
    again = RunLock(tmp_path / "run").acquire()
    again.release()
    assert (tmp_path / "run").is_dir()  # a refused acquire never removes a folder it did not make
