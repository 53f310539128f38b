"""End-to-end tests: bench."""

import json

import pytest
import torch

from helpers import one_line_error
from iattention.cli import main


@pytest.mark.slow
def test_bench_tiny_writes_json(tmp_path, capsys):
    out = tmp_path / "b.json"
    md = tmp_path / "B.md"
    code = main(["bench", "--preset", "tiny", "--heads", "1,2", "--windows", "1", "--steps", "1", "--rounds", "1",
                 "--json", str(out), "--markdown", str(md)])
    assert code == 0
    data = json.loads(out.read_text())
    rows = data["rows"]
    # the plan comes first (configurations x rounds), so a user knows what the minutes go to
    plan = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("plan:"))
    assert f"plan: {len(rows)} configurations × 1 rounds = {len(rows)} timings" in plan
    assert {(r["model"], r["attention"], r["n_head"]) for r in rows} >= {
        ("iattention", "standard", 1), ("iattention", "canonical", 1), ("iattention", "identity_q", 2),
        ("hf-gpt2", "standard", 2)}
    for r in rows:
        assert r["train_tokens_per_s"] > 0 and r["forward_tokens_per_s"] > 0
        assert r["attn_kernel"] == "sdpa"  # which kernel each row ran: on CPU, auto is always SDPA
        assert "train_tokens_per_s_vs_standard" in r and "train_tokens_per_s_vs_hf" in r
    assert "| iattention | canonical | 1 |" in md.read_text()
    assert len(data["loadavg_before"]) == 3 and len(data["loadavg_after"]) == 3  # the machine's load, recorded
    from iattention.utils.hardware import device_name

    assert data["device_name"] == device_name(torch.device("cpu"))  # not "hf", the last comparison's name
    assert f"on {data['device_name']} (cpu" in md.read_text()
    gflops = [line.split("|")[10].strip() for line in md.read_text().splitlines() if line.startswith("| iattention")]
    assert len(set(gflops)) > 1, gflops  # significant digits: tiny variants' FLOPs are told apart
    main(["bench", "--preset", "tiny", "--heads", "2", "--windows", "1", "--steps", "1", "--rounds", "1",
          "--json", str(out), "--markdown", str(md), "--no-reference"])
    assert md.read_text().count("<!-- bench:cpu:tiny:eager -->") == 1  # the section is replaced, not added


@pytest.mark.slow
def test_generation_bench_writes_rows_for_cache_no_cache_and_hf(tmp_path, capsys):
    out, md = tmp_path / "g.json", tmp_path / "B.md"
    assert main(["bench", "--generate", "4", "--preset", "tiny", "--heads", "2", "--attention", "canonical",
                 "--rounds", "1", "--json", str(out), "--markdown", str(md)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert {(r["model"], r["attention"], r["kv_cache"]) for r in rows} == {
        ("iattention", "standard", True), ("iattention", "standard", False), ("hf-gpt2", "standard", True),
        ("iattention", "canonical", True), ("iattention", "canonical", False)}
    assert sorted((r["model"], r["attention"], r["cache"]) for r in rows) == sorted(
        [("iattention", a, c) for a in ("standard", "canonical") for c in ("full", "k-only", "none")]
        + [("hf-gpt2", "standard", "full")])
    assert all(r["tokens_per_s"] > 0 and r["new_tokens"] == 4 for r in rows)
    text = md.read_text()
    assert "<!-- bench:generate:tiny -->" in text
    assert all(f"| iattention | canonical | 2 | {c} |" in text for c in ("full", "k-only", "none"))


@pytest.mark.slow
def test_bench_without_json_writes_beside_the_runs_not_into_the_tracked_results(tmp_path, monkeypatch, capsys):
    """The Commands-table line run in a clone must not dirty it: the default result goes to runs/bench/."""
    monkeypatch.chdir(tmp_path)
    assert main(["bench", "--preset", "tiny", "--heads", "2", "--attention", "standard", "--windows", "1",
                 "--steps", "1", "--rounds", "1", "--no-reference"]) == 0
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.json"))
    assert len(written) == 1 and written[0].startswith("runs/bench/cpu-tiny-"), written
    assert f"wrote {written[0]}" in capsys.readouterr().out


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


@pytest.mark.slow
@pytest.mark.parametrize("scope", ["model", "blocks"])
def test_compiled_bench_of_more_than_four_configurations_runs_and_says_how_it_compiled(tmp_path, scope,
                                                                                    monkeypatch):
    """Every model of one code adds its training and its no_grad graph to that code's one dynamo cache (limit 8):
    the fifth compiled configuration failed with a traceback before (FailOnRecompileLimitHit). --compile-scope
    blocks compiles each of our models' regions (and transformers' model whole)."""
    from iattention.model.gpt import GPT
    regional = []
    real = GPT.compile_regions
    monkeypatch.setattr(GPT, "compile_regions", lambda self, mode=None: (regional.append(mode), real(self, mode)))
    out = tmp_path / "b.json"
    code = main(["bench", "--preset", "tiny", "--heads", "1,2", "--windows", "1", "--steps", "1", "--rounds", "1",
                 "--no-reference", "--compile", "--compile-scope", scope, "--json", str(out)])
    data = json.loads(out.read_text())
    assert code == 0 and len(data["rows"]) >= 5 and (data["compile_scope"], data["compile_mode"]) == (scope, "default")
    assert all(r["train_tokens_per_s"] > 0 and r["first_step_s"] > 0 for r in data["rows"])
    assert all(r["compile_scope"] == scope for r in data["rows"])
    assert regional == (["default"] * len(data["rows"]) if scope == "blocks" else [])


def test_compile_scope_or_mode_without_compile_is_refused_in_one_line(tmp_path, capsys):
    rc = main(["bench", "--preset", "tiny", "--heads", "1", "--compile-scope", "blocks", "--json",
               str(tmp_path / "b.json")])
    one_line_error(capsys, rc, "--compile-scope", "--compile")
    assert not (tmp_path / "b.json").exists()


@pytest.mark.slow
def test_bench_of_a_preset_with_its_own_kv_heads_defaults_to_head_counts_they_divide(tmp_path, capsys):
    """llama-cpu (2 key/value heads): the default --heads 1,4,8 keeps 4 and 8, as compare and sweep do (1 was
    refused, so the preset could not be benched without --heads); a count they do not divide is one line."""
    out = tmp_path / "b.json"
    assert main(["bench", "--preset", "llama-cpu", "--attention", "standard", "--windows", "1", "--steps", "1",
                 "--rounds", "1", "--no-reference", "--json", str(out)]) == 0
    assert [r["n_head"] for r in json.loads(out.read_text())["rows"]] == [4, 8]
    rc = main(["bench", "--preset", "llama-cpu", "--heads", "3", "--json", str(tmp_path / "c.json")])
    one_line_error(capsys, rc, "--heads 3", "multiples of 2")
    assert not (tmp_path / "c.json").exists()


@pytest.mark.parametrize("argv", [["bench", "--preset", "tiny", "--json", "{d}"],
                                  ["bench", "--preset", "tiny", "--json", "{d}/b.json", "--markdown", "{d}"],
                                  ["conditioning", "--json", "{d}"],
                                  ["scales", "--preset", "tiny", "--out", "{d}"]])
def test_a_result_file_that_is_a_folder_is_refused_before_the_work(tmp_path, capsys, argv):
    """--json / --markdown / scales' --out naming a folder: one line before the benchmark or study (bench's and
    conditioning's came after it, and bench with --markdown wrote the JSON first), by the one argparse type."""
    with pytest.raises(SystemExit) as refused:  # argparse's refusal (cli.args.Parser): one line, exit 2
        main([a.format(d=tmp_path) for a in argv])
    one_line_error(capsys, refused.value.code, f"{tmp_path} is a folder", "give a file path")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_bench_takes_config_overrides_so_any_family_can_be_benched(tmp_path):
    """KEY=VALUE overrides of the preset's model, as iattn train takes them: tiny as GPT-NeoX (partial RoPE)
    benches our GPT-NeoX against transformers' GPTNeoXForCausalLM with the same parameter count (bench had no
    way to name another family than its presets')."""
    from iattention.config import load_config
    from iattention.model.gpt import GPT

    out, md = tmp_path / "b.json", tmp_path / "B.md"
    md.write_text("<!-- bench:cpu:tiny:eager -->\n## tiny, the plain preset's section\n")
    ov = ["model.family=gpt_neox", "model.rot=4", "model.init=normal"]
    assert main(["bench", "--preset", "tiny", "--heads", "2", "--attention", "standard", "--windows", "1",
                 "--steps", "1", "--rounds", "1", "--json", str(out), "--markdown", str(md), *ov]) == 0
    data = json.loads(out.read_text())
    assert data["overrides"] == ov and data["shape"]["model"]["rot"] == 4
    assert data["shape"]["model"]["init"] == "normal"  # every key reaches the benched models, not the shape's only
    text = md.read_text()  # its own section, named by the overrides; the plain preset's is left as it was
    assert "the plain preset's section" in text and f"<!-- bench:cpu:tiny {' '.join(ov)}:eager -->" in text
    rows = {r["model"]: r for r in data["rows"]}
    cfg = load_config("tiny", None, ["model.family=gpt_neox", "model.rot=4", "model.n_head=2",
                                     "model.vocab_size=256"]).model
    assert rows["iattention"]["params"] == rows["hf-gpt_neox"]["params"] == GPT(cfg).num_params()
