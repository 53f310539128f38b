"""End-to-end tests: experiments."""

import pytest

from helpers import armed_run
from iattention.experiments.report import write_report
from iattention.train import load_config


@pytest.fixture
def config():
    return load_config("tiny", None, []).to_dict()


@pytest.mark.slow
def test_committed_study_reports_name_only_committed_runs():
    """Every run a committed report under results/ lists must have its raw files in the repository
    (a .gitignore pattern once dropped a whole study's runs while its report stayed)."""
    import re
    import subprocess
    from pathlib import Path

    from iattention.experiments.results import RUN_FILES

    root = Path(__file__).resolve().parents[2]
    tracked = None
    if (root / ".git").exists():
        out = subprocess.run(["git", "ls-files", "results"], cwd=root, capture_output=True, text=True)
        tracked = set(out.stdout.splitlines()) if out.returncode == 0 else None
    reports = sorted((root / "results").rglob("report.md"))
    for report in reports:
        runs = re.findall(r"^- `([^`]+)`$", report.read_text().split("## Runs")[-1], flags=re.M) \
            if "## Runs" in report.read_text() else []
        for run in runs:
            for name in RUN_FILES:
                path = f"{run}/{name}"
                assert (root / path).is_file(), f"{report} names {run}, but {path} is missing"
                if tracked is not None:
                    assert path in tracked, f"{report} names {run}, but {path} is not committed"


@pytest.mark.slow
def test_compare_footer_names_tb_only_when_tensorboard_is_on(tmp_path, capsys):
    from helpers import tiny_overrides, write_corpus
    from iattention.cli import main

    paths = write_corpus(tmp_path)
    ov = tiny_overrides(paths, tmp_path / "cache", **{"train.epochs": 1})
    assert main(["compare", "--preset", "tiny", "--heads", "1", "--arms", "standard", "--out", str(tmp_path / "c"),
                 *ov]) == 0  # the tiny preset has tensorboard off
    out = capsys.readouterr().out
    assert "run folders:" in out and "tb/" not in out
    assert main(["compare", "--preset", "tiny", "--heads", "1", "--arms", "identity_ko", "--out",
                 str(tmp_path / "d"), *ov, "train.tensorboard=true"]) == 0
    assert "tb/" in capsys.readouterr().out


def test_report_refuses_a_missing_declared_plan(tmp_path, capsys):
    from iattention.cli import main
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "r"), "--declared", str(tmp_path / "PLAN.md")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("iattn: error: --declared") and "no such file" in err and "\n" not in err


def test_compare_of_runs_without_a_final_test_prints_its_table(tmp_path, capsys):
    """`iattn compare ... train.final_test=false`: the runs have no test perplexity, and the table said so with a
    traceback (a None formatted as a float)."""
    from helpers import tiny_overrides, write_corpus
    from iattention.cli import main

    paths = write_corpus(tmp_path)
    ov = tiny_overrides(paths, tmp_path / "cache", **{"train.max_steps": 2, "train.final_test": "false",
                                                      "train.eval_tokens": 2000})
    assert main(["compare", "--preset", "tiny", "--heads", "1", "--arms", "standard", "--out", str(tmp_path / "c"),
                 *ov]) == 0
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("standard ")]
    assert len(row) == 1 and "not run" in row[0]


def test_conditioning_of_a_checkpoint_alone_studies_it_on_its_own_test_split(tmp_path, capsys):
    """`iattn conditioning --checkpoint` on a real tiny checkpoint: one study, of that model on the test split
    its config names (no GPT-2-small reference: that takes minutes and needs --gpt2 here), as `study` makes it."""
    pytest.importorskip("transformers")
    import json

    import torch

    from helpers import make_model, write_corpus
    from iattention.checkpoint.state import save_checkpoint
    from iattention.cli import main
    from iattention.data import DataConfig, load_data
    from iattention.experiments.conditioning import study

    paths = write_corpus(tmp_path)
    data = dict(dataset="text", **paths, tokenizer="byte", train_tokens=0, cache_dir=str(tmp_path / "cache"))
    model = make_model(dtype=torch.float32, n_layer=2, n_head=2, n_embd=16, vocab_size=256, block_size=16)
    path = tmp_path / "m.safetensors"
    save_checkpoint(path, model, {"config": {"model": model.config.to_dict(), "data": data}})
    assert main(["conditioning", "--checkpoint", str(path), "--json", str(tmp_path / "c.json")]) == 0
    (got,) = json.loads((tmp_path / "c.json").read_text())
    tokens = load_data(DataConfig(**data), splits=("test",)).splits["test"]
    want = study(model, tokens, f"trained by iattention: {path}", 16)
    assert got["model"] == want["model"] and got["tokens"] == want["tokens"] == len(tokens) - 1 > 1000
    assert got["blocks"]["pivoted"]["key_max"] == pytest.approx(want["blocks"]["pivoted"]["key_max"], rel=1e-9)
    assert got["original_ppl"] == pytest.approx(want["original_ppl"], rel=1e-9)
    assert "GPT-2" not in capsys.readouterr().out


def test_report_arms_selects_arms_with_the_reference_and_refuses_an_unknown_one(tmp_path, config, capsys):
    """--arms keeps only the arms named (and the reference, always); an arm with no runs is one line, exit 2."""
    from iattention.cli import main

    for seed in range(2):
        for arm, curve in (("standard", [300, 200]), ("canonical", [300, 250]), ("identity_q", [300, 210])):
            armed_run(tmp_path, arm, [f"model.attention={arm}"], 2, seed, [v + seed for v in curve], config)
    report = write_report([tmp_path], tmp_path / "out", select=["identity_q"]).read_text()
    diff = report.split("## Each arm − `standard`")[1].split("##")[0]
    assert "| identity_q |" in diff and "| canonical |" not in diff and "canonical-h2-s0" not in report
    assert "canonical-h2-s0" in write_report([tmp_path], tmp_path / "all").read_text()
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "bad"), "--arms", "identity_q,nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("iattn: error: --arms: arm(s) 'nope' have no runs here"), err


def test_conditioning_studies_a_rotary_gqa_checkpoint_by_its_kv_groups(tmp_path, capsys):
    """A Llama-family checkpoint (4 query heads on 2 KV heads, RoPE on 4 of each head's 8 dims) is studied like
    GPT-2's (the one-family layout; it was refused before): the aligned blocks' condition numbers are those of the
    key's pass rows and of the output map's rows next to each group's own coordinates, read here straight off
    k_proj and o_proj, and the rotary pairs' smallest pivot ratio is given, better for pivoted blocks. A checkpoint
    without training data (a converted model) is one line."""
    pytest.importorskip("transformers")
    import json

    import numpy as np
    import torch

    from helpers import make_llama, one_line_error, write_corpus
    from iattention.checkpoint.state import save_checkpoint
    from iattention.cli import main

    data = dict(dataset="text", **write_corpus(tmp_path), tokenizer="byte", train_tokens=0,
                cache_dir=str(tmp_path / "cache"))
    model = make_llama(dtype=torch.float32, vocab_size=256, rot=4)
    path, bare = tmp_path / "llama.safetensors", tmp_path / "converted.safetensors"
    save_checkpoint(path, model, {"config": {"model": model.config.to_dict(), "data": data}})
    save_checkpoint(bare, model, {"config": {"model": model.config.to_dict()}})
    one_line_error(capsys, main(["conditioning", "--checkpoint", str(bare)]), "records no training data",
                   "RUN/best.safetensors")
    assert main(["conditioning", "--checkpoint", str(path), "--json", str(tmp_path / "c.json")]) == 0
    (got,) = json.loads((tmp_path / "c.json").read_text())
    d, r, rot, g = 32, 8, 4, 2  # n_embd, d_head, rotary dims, query heads per KV group
    keys, outs = [], []
    for attn in model.attention_layers:
        W_K, W_O = attn.k_proj.weight.detach().double(), attn.o_proj.weight.detach().double()
        for j in range(2):
            keys.append(torch.linalg.cond(W_K[j * r + rot: (j + 1) * r, (j * r + rot + torch.arange(r - rot)) % d]))
            outs.append(torch.linalg.cond(W_O[(j * g * r + torch.arange(r)) % d, j * g * r: (j * g + 1) * r].T))
    aligned, pivoted = got["blocks"]["aligned"], got["blocks"]["pivoted"]
    assert aligned["key_max"] == pytest.approx(max(keys).item(), rel=1e-6)
    assert aligned["output_max"] == pytest.approx(max(outs).item(), rel=1e-6)
    assert aligned["cond_median"] == pytest.approx(np.median(torch.stack(keys + outs).numpy()), rel=1e-6)
    assert 0 < aligned["rotary_pivot_min"] < pivoted["rotary_pivot_min"] <= 1
    assert abs(pivoted["ppl_change"]["float32"]) < 1e-3 * got["original_ppl"]["float32"]
    assert "rotary pivot min" in capsys.readouterr().out
