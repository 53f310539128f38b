"""benchmarks/wide_paths.py --table: auto's table from several GPU windows' whole runs (one head dim a window)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "wide_paths.py"


@pytest.fixture
def wide_paths(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("wide_paths_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    table = tmp_path / "auto_table.json"
    table.write_text(json.dumps({"source": [], "devices": {"Old GPU": [{"d": 1}]}}))
    monkeypatch.setattr(module, "TABLE_PATH", table)
    return module, table


def result(tmp_path, name, d, device="NVIDIA H100 80GB HBM3", complete=True, fast="math"):
    rows = [dict(d=d, H=H, T=T, B=16 * 1024 // T, sdpa_backend="EFFICIENT_ATTENTION",
                 ms={"sdpa": 3.0, "math": 1.0 if fast == "math" else 2.0, "triton": 1.0 if fast == "triton" else 2.0})
            for H in (1, 2) for T in (1024, 2048)]
    path = tmp_path / name
    path.write_text(json.dumps(dict(device=device, device_type="cuda", dry=False, complete=complete,
                                    rows_planned=4, rows=rows if complete else rows[:3])))
    return str(path)


def test_whole_runs_of_one_device_merge_into_its_rows_and_other_devices_are_kept(wide_paths, tmp_path):
    module, table = wide_paths
    first, second = result(tmp_path, "a.json", 768), result(tmp_path, "b.json", 512)
    again = result(tmp_path, "c.json", 768, fast="triton")  # a later window's row replaces the earlier one's
    module.write_table([first, second, again])
    written = json.loads(table.read_text())
    rows = written["devices"]["NVIDIA H100 80GB HBM3"]
    assert [(r["d"], r["H"], r["T"]) for r in rows] == sorted((d, H, T) for d in (512, 768) for H in (1, 2)
                                                             for T in (1024, 2048))
    assert all(r["ms"]["triton"] == (1.0 if r["d"] == 768 else 2.0) for r in rows)
    assert written["devices"]["Old GPU"] == [{"d": 1}]
    assert written["source"] == sorted([first, second, again])


def test_one_head_dim_a_window_adds_to_the_device_s_rows_and_replaces_only_the_same_shapes(wide_paths, tmp_path):
    """The GPU check's `paths` part measures one head dim per window: two separate --table calls keep both."""
    module, table = wide_paths
    module.write_table([result(tmp_path, "d768.json", 768)])
    module.write_table([result(tmp_path, "d512.json", 512)])
    module.write_table([result(tmp_path, "d768-again.json", 768, fast="triton")])
    rows = json.loads(table.read_text())["devices"]["NVIDIA H100 80GB HBM3"]
    assert sorted({r["d"] for r in rows}) == [512, 768] and len(rows) == 8
    assert all(r["ms"]["triton"] == (1.0 if r["d"] == 768 else 2.0) for r in rows)


@pytest.mark.parametrize("case", ["cut", "two devices", "dry"])
def test_a_cut_run_a_second_device_or_a_dry_run_is_refused_and_the_table_kept(wide_paths, tmp_path, case):
    module, table = wide_paths
    before = table.read_text()
    second = {"cut": dict(complete=False), "two devices": dict(device="NVIDIA A100"), "dry": {}}[case]
    files = [result(tmp_path, "a.json", 768), result(tmp_path, "b.json", 512, **second)]
    if case == "dry":
        data = json.loads(Path(files[0]).read_text())
        Path(files[0]).write_text(json.dumps(data | {"dry": True}))
    with pytest.raises(SystemExit, match={"cut": "was cut after 3 of its 4 rows", "two devices": "from 2 devices",
                                          "dry": "not a CUDA measurement"}[case]):
        module.write_table(files)
    assert table.read_text() == before
