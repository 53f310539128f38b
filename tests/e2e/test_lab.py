"""End-to-end tests: lab."""

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_cli_lab_all_json(tmp_path):
    res = subprocess.run([sys.executable, "-m", "iattention", "lab", "all", "--json", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert set(data) == {"copy", "subspace", "average", "single-head", "multi-head"}
    for name in data:
        assert (tmp_path / f"{name}.png").stat().st_size > 10_000
        assert json.loads((tmp_path / f"{name}.json").read_text())["experiment"] == name
