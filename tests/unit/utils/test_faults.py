"""Fault injection (`utils/faults.py`): IATTN_FAULT=POINT:N kills the process by SIGKILL at the N-th hit of
POINT, tearing the named temp file in half first; unset it does nothing; a malformed value names the form."""

import signal
import subprocess
import sys

import pytest

from iattention.errors import UserError
from iattention.utils.faults import POINTS, fault_point, fault_spec

HIT = """
import sys
from pathlib import Path
from iattention.utils.faults import fault_point
for i in range(5):
    print(i, flush=True)
    fault_point(sys.argv[1], Path(sys.argv[2]))
"""


@pytest.mark.parametrize("spec, hits", [("eval:3", 2), ("eval:1", 0), ("step", 0)])
def test_the_process_dies_by_sigkill_at_the_nth_hit_of_its_point(tmp_path, spec, hits):
    torn = tmp_path / "x.tmp"
    torn.write_bytes(b"0123456789")
    point = spec.split(":")[0]
    env = {"IATTN_FAULT": spec, "PATH": "/usr/bin:/bin"}
    res = subprocess.run([sys.executable, "-c", HIT, point, str(torn)], env=env, capture_output=True, text=True)
    assert res.returncode == -signal.SIGKILL
    assert res.stdout.split() == [str(i) for i in range(hits + 1)]
    assert torn.read_bytes() == b"01234"  # torn in half at the kill
    other = subprocess.run([sys.executable, "-c", HIT, "ckpt_write", str(torn)], env=env, capture_output=True)
    assert other.returncode == 0 and torn.read_bytes() == b"01234"  # another point: no effect


def test_unset_does_nothing(monkeypatch):
    monkeypatch.delenv("IATTN_FAULT", raising=False)
    assert fault_spec() is None
    for point in POINTS:
        fault_point(point)


@pytest.mark.parametrize("value", ["ckpt_write:abc", "evaluate:1", "eval:0", "eval:-1"])
def test_a_malformed_fault_names_the_form_and_the_points(monkeypatch, value):
    monkeypatch.setenv("IATTN_FAULT", value)
    with pytest.raises(UserError) as err:
        fault_spec()
    assert repr(value) in str(err.value) and all(p in str(err.value) for p in POINTS)
    assert "unset IATTN_FAULT" in str(err.value)
