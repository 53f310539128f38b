"""Unit tests of iattention.bench.generation (`iattn bench --generate`): the device and attention kernel asked
for are the ones it runs, or a one-line refusal before any work."""

import json

import pytest
import torch

from helpers import one_line_error

TINY = ["bench", "--generate", "2", "--preset", "tiny", "--heads", "2", "--attention", "standard", "--rounds", "1",
        "--no-reference"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_generate_on_cuda_without_a_gpu_is_refused_in_one_line(tmp_path, capsys):
    from iattention.cli import main

    rc = main([*TINY, "--device", "cuda", "--json", str(tmp_path / "g.json")])
    one_line_error(capsys, rc, "--device cuda", "no CUDA device")
    assert not (tmp_path / "g.json").exists()


def test_generate_with_a_kernel_that_cannot_run_here_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    from iattention.cli import main

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    rc = main([*TINY, "--attn-kernel", "triton", "--json", str(tmp_path / "g.json")])
    one_line_error(capsys, rc, "attn_kernel=triton")
    assert not (tmp_path / "g.json").exists()


def test_generate_with_compile_is_refused_in_one_line(tmp_path, capsys):
    from iattention.cli import main

    rc = main([*TINY, "--compile", "--json", str(tmp_path / "g.json")])
    one_line_error(capsys, rc, "--compile", "--generate")
    assert not (tmp_path / "g.json").exists()


def test_generate_records_the_device_and_kernel_it_ran(tmp_path, capsys):
    from iattention.cli import main

    assert main([*TINY, "--attn-kernel", "sdpa", "--json", str(tmp_path / "g.json")]) == 0
    result = json.loads((tmp_path / "g.json").read_text())
    assert result["device"] == "cpu" and result["attn_kernel_setting"] == "sdpa"
    assert {r["attn_kernel"] for r in result["rows"]} == {"sdpa"} and len(result["rows"]) == 3
