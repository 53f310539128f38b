"""Issue 33 §5, names: `model.canonical` is now `model.canonical_halves`, and what was saved or typed under the
old name still works (saved runs silently, a user's override or YAML with one note line)."""

from __future__ import annotations

import json

import pytest
import yaml
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from helpers import tiny_overrides, write_corpus
from iattention.cli import main


def _age(run):
    """Rewrite a run folder as a run saved before the rename: `canonical:` in config.yaml, summary.json and the
    checkpoints' metadata (what the run folders under results/ hold)."""
    def old(model: dict) -> dict:
        return {("canonical" if k == "canonical_halves" else k): v for k, v in model.items()}

    cfg = yaml.safe_load((run / "config.yaml").read_text())
    (run / "config.yaml").write_text(yaml.safe_dump({**cfg, "model": old(cfg["model"])}, sort_keys=False))
    summary = json.loads((run / "summary.json").read_text())
    summary["config"]["model"] = old(summary["config"]["model"])
    (run / "summary.json").write_text(json.dumps(summary))
    for ck in sorted(run.glob("*.safetensors")):
        with safe_open(str(ck), framework="pt") as f:
            meta = json.loads(f.metadata()["iattention"])
        meta["config"]["model"] = old(meta["config"]["model"])
        save_file(load_file(str(ck)), str(ck), metadata={"iattention": json.dumps(meta)})
    text = (run / "config.yaml").read_text()
    assert "canonical: qk" in text and "canonical_halves" not in text


def _eval_ppl(capsys, *argv) -> str:
    assert main(["eval", *argv]) == 0
    out = capsys.readouterr()
    return out.out


@pytest.fixture
def old_run(tmp_path, capsys):
    ov = tiny_overrides(write_corpus(tmp_path), tmp_path / "cache", **{"train.epochs": 1})
    run = tmp_path / "run"
    assert main(["train", "--preset", "tiny", "--out", str(run), *ov, "model.attention=canonical",
                 "model.canonical_halves=qk"]) == 0
    assert "canonical_halves: qk" in (run / "config.yaml").read_text()
    capsys.readouterr()
    before = _eval_ppl(capsys, str(run))
    _age(run)
    return run, ov, before


@pytest.mark.slow
def test_a_run_saved_with_the_old_key_evaluates_resumes_and_reports_silently(old_run, capsys, tmp_path):
    run, ov, before = old_run
    # eval: the same numbers, and no note (a saved run is read silently)
    assert main(["eval", str(run)]) == 0
    out = capsys.readouterr()
    assert out.out == before and "canonical" not in out.err
    assert main(["eval", str(run / "last.safetensors")]) == 0
    assert "note" not in capsys.readouterr().err
    # report: reads its summary.json (the config grouped like runs saved under the new name)
    assert main(["report", str(run), "--reference", "canonical", "--out", str(tmp_path / "rep")]) == 0
    assert "note" not in capsys.readouterr().err
    # resume to more epochs: the saved run is the same run as the one asked for
    assert main(["train", "--preset", "tiny", "--out", str(run), "--resume", *ov[:-1], "train.epochs=2",
                 "model.attention=canonical", "model.canonical_halves=qk"]) == 0
    err = capsys.readouterr().err
    assert "note" not in err and json.loads((run / "summary.json").read_text())["epochs_run"] == 2


@pytest.mark.slow
def test_old_key_in_a_resume_of_the_old_run_needs_no_new_name(old_run, capsys):
    """The resume names the old key on the command line: accepted, one note, same run."""
    run, ov, _ = old_run
    assert main(["train", "--preset", "tiny", "--out", str(run), "--resume", *ov[:-1], "train.epochs=2",
                 "model.attention=canonical", "model.canonical=qk"]) == 0
    err = capsys.readouterr().err
    assert err.count("model.canonical is now model.canonical_halves") == 1 and "Traceback" not in err


@pytest.mark.slow
def test_the_old_key_typed_by_a_user_is_accepted_with_one_note(tmp_path, capsys):
    ov = tiny_overrides(write_corpus(tmp_path), tmp_path / "cache", **{"train.epochs": 1})
    assert main(["train", "--preset", "tiny", "--out", str(tmp_path / "a"), *ov, "model.attention=canonical",
                 "model.canonical=qk"]) == 0
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if "canonical_halves" in line]
    assert notes == ["iattn: note: model.canonical is now model.canonical_halves; read as model.canonical_halves"]
    assert yaml.safe_load((tmp_path / "a" / "config.yaml").read_text())["model"]["canonical_halves"] == "qk"
    # ... and in the user's own YAML
    (tmp_path / "mine.yaml").write_text("model:\n  attention: canonical\n  canonical: vo\n")
    assert main(["train", "--preset", "tiny", "--config", str(tmp_path / "mine.yaml"), "--out", str(tmp_path / "b"),
                 *ov]) == 0
    assert "model.canonical is now model.canonical_halves" in capsys.readouterr().err
    saved = yaml.safe_load((tmp_path / "b" / "config.yaml").read_text())["model"]
    assert saved["canonical_halves"] == "vo" and "canonical" not in saved


def test_both_names_at_once_is_one_line(tmp_path, capsys):
    (tmp_path / "both.yaml").write_text("model:\n  attention: canonical\n  canonical: vo\n  canonical_halves: qk\n")
    assert main(["train", "--preset", "tiny", "--config", str(tmp_path / "both.yaml"),
                 "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("iattn: error: model.canonical and model.canonical_halves are both set") and "\n" == err[-1]
    assert not (tmp_path / "b").exists()


def test_python_api_reads_the_old_name_of_a_saved_model_section():
    from iattention import GPTConfig

    assert GPTConfig.from_dict({"attention": "canonical", "canonical": "vo"}).canonical_halves == "vo"
    assert not hasattr(GPTConfig(), "canonical")


def test_conditioning_is_an_iattn_command(capsys):
    """`python -m iattention.experiments.conditioning` is now `iattn conditioning` (the old form still parses)."""
    from iattention.experiments import conditioning

    with pytest.raises(SystemExit) as e:
        main(["conditioning", "--help"])
    assert e.value.code == 0
    assert "usage: iattn conditioning" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "conditioning" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["conditioning", "--gpt2-tokens", "0"])
    assert e.value.code == 2
    assert "expected an integer >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        conditioning.main(["--help"])
    assert e.value.code == 0 and "--gpt2-tokens" in capsys.readouterr().out


def test_renamed_modules_and_functions():
    """The old names are gone (one name per thing) and the new ones are what the code uses."""
    import importlib

    from iattention.attention.canonical import CanonicalAttention
    from iattention.bench import runner
    from iattention.train import evaluate

    for gone in ("iattention.model.inspect", "iattention.lab.inspect", "iattention.lab.copy", "iattention.cli.model",
                 "iattention.model.llama", "iattention.config.llama", "iattention.attention.grouped",
                 "iattention.attention.llama_standard", "iattention.attention.llama_canonical",
                 "iattention.symmetry.grouped", "iattention.config.llama_shapes"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(gone)
    for module in ("iattention.model.activations", "iattention.lab.trained_attention", "iattention.lab.copy_task",
                   "iattention.cli.eval", "iattention.cli.generate"):
        importlib.import_module(module)
    assert not hasattr(CanonicalAttention, "_halves") and hasattr(CanonicalAttention, "memoized")
    assert not hasattr(runner, "ours") and hasattr(runner, "iattention_model")
    assert not hasattr(evaluate, "ppl") and evaluate.exp_loss(2.0) == evaluate.perplexity(4.0, 2)
