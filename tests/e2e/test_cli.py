"""End-to-end tests: cli."""

from pathlib import Path

import pytest

from helpers import tiny_overrides, write_corpus
from iattention.cli import main

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_python_api_block_runs_and_says_what_its_comments_say(capsys):
    """The README's block runs as written, and its comments hold: random_gauge keeps the function,
    canonicalize is an exact I-Attention model with 2 r^2 H L fewer parameters (what it prints), expand
    goes back to the same function."""
    import torch

    block = README.read_text().split("## Python API")[1].split("```python")[1].split("```")[0]
    ns: dict = {}
    torch.manual_seed(0)
    exec(compile(block, "README.md", "exec"), ns)
    printed = capsys.readouterr().out.splitlines()
    model, canon, back = ns["model"], ns["canon"], ns["back"]
    c = model.config
    assert printed[0] == str(2 * c.d_head**2 * c.n_head * c.n_layer)
    assert model.num_params() - canon.num_params() == int(printed[0])
    assert canon.config.attention == "canonical" and back.config.attention == "standard"
    x = torch.randint(0, c.vocab_size, (2, 16))
    with torch.no_grad():
        torch.manual_seed(0)
        fresh = type(model)(c).double().eval()  # the function random_gauge started from (same seed)
        ref = fresh(x)[0]
        for m in (model, canon, back):
            assert torch.allclose(m.eval()(x)[0], ref, rtol=1e-8, atol=1e-8)


@pytest.mark.slow
def test_usage_errors_of_subcommands_have_the_documented_prefix(capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", "some/model", "--prompt", "x", "--temperature", "abc"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("iattn: error: argument --temperature")


@pytest.mark.slow
def test_generate_help_shows_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    out = capsys.readouterr().out
    assert "tokens to generate (default: 100)" in out and "sampling seed (default: 0)" in out


def test_scales_measures_the_presets_own_head_count(tmp_path, capsys):
    ov = tiny_overrides(write_corpus(tmp_path), tmp_path / "cache")
    assert main(["scales", "--preset", "tiny", "--arms", "standard", "--steps", "1", *ov]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("standard")]
    assert lines and all("h=2 " in x for x in lines)  # tiny has n_head 2 (not the old fixed 1 and 8)


@pytest.mark.slow
def test_sweep_ends_with_the_table_compare_prints(tmp_path, capsys):
    ov = tiny_overrides(write_corpus(tmp_path), tmp_path / "cache", **{"train.epochs": 1})
    out = str(tmp_path / "sw")
    assert main(["sweep", "--preset", "tiny", "--arms", "standard", "--heads", "1", "--seeds", "0", "--out", out,
                 *ov]) == 0
    text = capsys.readouterr().out
    header = next(x for x in text.splitlines() if x.startswith("arm "))
    assert "best val ppl" in header and "epoch of best" in header
    assert any(x.startswith("standard ") and " 1    0 " in x for x in text.splitlines())
    assert f"iattn report {out} --out {out}/report" in text
    # progress: the plan, a line when a run starts, the count done with each result
    assert f"sweep tiny: 1 runs, 0 already finished, 1 to train (1 at a time) -> {out}" in text
    assert any(x.startswith("standard-h1-s0") and x.rstrip().endswith("started") for x in text.splitlines())
    assert "[1/1 done]" in text
    assert main(["sweep", "--preset", "tiny", "--arms", "standard", "--heads", "1,2", "--seeds", "0", "--out", out,
                 *ov]) == 0
    text = capsys.readouterr().out
    assert "2 runs, 1 already finished, 1 to train" in text and "started" not in text.split("standard-h2-s0")[0]
    assert "[1/2 done" in text and "[2/2 done]" in text


def test_scales_json_lands_beside_the_table(corpus, tmp_path, monkeypatch, capsys):
    """Before: `rsplit(".", 1)` on the whole path: `results.v2/table` wrote `results.json` beside the folder,
    `./table` wrote `./.json`."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results.v2").mkdir()
    (tmp_path / "results.json").write_text("user's\n")
    args = ["scales", "--preset", "tiny", "--arms", "standard", "--steps", "1", *corpus["ov"]]
    assert main([*args, "--out", "results.v2/table"]) == 0
    assert (tmp_path / "results.json").read_text() == "user's\n"
    assert (tmp_path / "results.v2" / "table").exists() and (tmp_path / "results.v2" / "table.json").exists()
    assert main([*args, "--out", "./table"]) == 0
    assert (tmp_path / "table.json").exists() and not (tmp_path / ".json").exists()

    from iattention.cli.experiments import json_beside
    assert json_beside("t.md") == Path("t.json")
    assert json_beside("t.json") == Path("t.json.json")  # never the table itself
