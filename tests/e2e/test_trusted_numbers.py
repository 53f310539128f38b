"""End-to-end tests: trusted_numbers."""

import json
import math
import os
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from helpers import tiny_overrides, write_corpus
from iattention.cli import main

RUN = "standard-h2-s0"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A finished sweep run (with arm.json), a converted canonical model and an HF export of it."""
    root = tmp_path_factory.mktemp("trusted")
    paths = write_corpus(root)
    ov = tiny_overrides(paths, root / "cache", **{"train.epochs": 1})
    sweep = ["sweep", "--preset", "tiny", "--arms", "standard", "--heads", "2", "--seeds", "0", *ov]
    assert main([*sweep, "--out", str(root / "sw")]) == 0
    run = root / "sw" / RUN
    assert main(["convert", "--from", str(run), "--to", "canonical", "--out", str(root / "canonical")]) == 0
    assert main(["convert", "--from", str(run), "--to", "hf", "--out", str(root / "hf")]) == 0
    return dict(root=root, ov=ov, sweep=sweep, run=run, paths=paths)


def _run(argv) -> int:
    try:
        return main([str(a) for a in argv])
    except SystemExit as e:
        return e.code


def _refused(capsys, argv, *names) -> str:
    """argv exits 2 with one line `iattn: error: ...` naming each of `names`."""
    code = _run(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, f"{argv}: exit {code}, stderr {err[-3:]}"
    assert len(err) == 1 and err[0].startswith("iattn: error:"), err
    for name in names:
        assert str(name) in err[0], f"{name!r} not in {err[0]}"
    return err[0]


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _rewrite(path, change, metadata_change=None) -> None:
    """Rewrite a safetensors file in place with change(tensors) applied (and its metadata changed)."""
    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata() or {}
    tensors = load_file(str(path))
    change(tensors)
    if metadata_change:
        metadata = metadata_change(metadata)
    save_file(tensors, str(path), metadata=metadata)


def _edit_meta(edit):
    def change(metadata):
        meta = json.loads(metadata["iattention"])
        edit(meta)
        return {**metadata, "iattention": json.dumps(meta)}
    return change


# --------------------------------------------------------------------------- non-finite weights

def _plant(value, key):
    def change(tensors):
        tensors[key] = tensors[key].clone()
        tensors[key].view(-1)[3] = value
    return change


# --------------------------------------------------------------------------- too short a validation split

def _train(out, ov, *extra):
    return ["train", "--preset", "tiny", "--quiet", "--out", out, *ov, *extra]


# --------------------------------------------------------------------------- summary.json against metrics.jsonl

EDITS = {"best_val_ppl": 1.23, "best_epoch": 5, "epochs_run": 3, "test_ppl": -4.0}


# --------------------------------------------------------------------------- resume

def _extend(run, ov):
    return ["train", "--quiet", "--resume", "--out", run, *ov, "train.epochs=2"]


@pytest.mark.slow
@pytest.mark.parametrize("value", [math.nan, math.inf])
@pytest.mark.parametrize("command", ["eval", "convert", "generate", "inspect"])
def test_non_finite_weights_in_our_checkpoint_are_refused_naming_the_tensor(env, tmp_path, capsys, command, value):
    run = _copy(env["run"], tmp_path / "run")
    key = "transformer.h.0.mlp.c_fc.weight"
    _rewrite(run / "best.safetensors", _plant(value, f"model/{key}"))
    argv = {"eval": ["eval", run],
            "convert": ["convert", "--from", run, "--to", "standard", "--out", tmp_path / "out"],
            "generate": ["generate", run, "--prompt", "the cat", "--max-new-tokens", "5"],
            "inspect": ["inspect", run, "--prompt", "the cat", "--out", tmp_path / "insp"]}[command]
    _refused(capsys, argv, key, "non-finite")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("value", [math.nan, -math.inf])
def test_non_finite_weights_in_an_hf_folder_are_refused(env, tmp_path, capsys, value):
    hf = _copy(env["root"] / "hf", tmp_path / "hf")
    key = next(k for k in load_file(str(hf / "model.safetensors")) if k.endswith("h.0.attn.c_proj.weight"))
    _rewrite(hf / "model.safetensors", _plant(value, key))
    _refused(capsys, ["convert", "--from", hf, "--to", "canonical", "--out", tmp_path / "out"],
             "h.0.attn.c_proj.weight", "non-finite")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("to", ["standard", "hf"])
def test_an_all_zero_model_is_one_line_not_a_division_by_zero(env, tmp_path, capsys, to):
    run = _copy(env["run"], tmp_path / "run")

    def zero(tensors):
        for k in tensors:
            if k.startswith("model/"):
                tensors[k] = torch.zeros_like(tensors[k])
    _rewrite(run / "best.safetensors", zero)
    _refused(capsys, ["convert", "--from", run, "--to", to, "--out", tmp_path / "out"], "all zero")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_one_token_valid_split_is_refused(env, tmp_path, capsys):
    _refused(capsys, _train(tmp_path / "r", env["ov"], "data.valid_tokens=1"),
             "valid split has 1 token", "data.valid_tokens")
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_a_one_byte_valid_file_is_refused(env, tmp_path, capsys):
    (tmp_path / "v.txt").write_text("a")
    _refused(capsys, _train(tmp_path / "r", env["ov"], f"data.valid={tmp_path / 'v.txt'}"),
             "valid split has 1 token")


@pytest.mark.slow
def test_a_one_byte_wikitext_valid_file_is_refused(env, tmp_path, capsys):
    wiki = tmp_path / "data" / "wikitext-2-v1"
    wiki.mkdir(parents=True)
    for split in ("train", "valid", "test"):
        shutil.copy(env["paths"][split], wiki / f"wiki.{split}.tokens")
    (wiki / "wiki.valid.tokens").write_text("a")
    ov = [f"data.cache_dir={tmp_path / 'cache'}", "data.dataset=wikitext-2-v1", "data.tokenizer=byte",
          "data.train_tokens=0", "train.epochs=1"]
    _refused(capsys, _train(tmp_path / "r", ov, "--data-dir", tmp_path / "data"), "valid split has 1 token")


@pytest.mark.slow
def test_eval_of_a_split_shorter_than_a_window_is_refused(env, tmp_path, capsys):
    (tmp_path / "t.txt").write_text("ab")
    ck = tmp_path / "ck.safetensors"  # the run's weights, their data spec's test split a 2-byte file
    shutil.copy(env["run"] / "best.safetensors", ck)
    _rewrite(ck, lambda t: None, _edit_meta(lambda m: m["config"]["data"].update(test=str(tmp_path / "t.txt"))))
    _refused(capsys, ["eval", ck], "test split has 2 token")


@pytest.mark.slow
@pytest.mark.parametrize("key", [*EDITS, "best_val_ppl=nan"])
def test_report_refuses_a_summary_that_disagrees_with_its_metrics(env, tmp_path, capsys, key):
    sw = _copy(env["run"].parent, tmp_path / "sw")
    assert _run(["report", sw, "--out", tmp_path / "intact"]) == 0  # the run as trained is reported
    capsys.readouterr()
    summary = json.loads((sw / RUN / "summary.json").read_text())
    name, value = ("best_val_ppl", math.nan) if key.endswith("nan") else (key, EDITS[key])
    summary[name] = value
    (sw / RUN / "summary.json").write_text(json.dumps(summary))
    _refused(capsys, ["report", sw, "--out", tmp_path / "rep"], RUN, name)
    assert not (tmp_path / "rep" / "report.md").exists()


@pytest.mark.slow
def test_sweep_refuses_a_summary_that_disagrees_with_its_metrics(env, tmp_path, capsys):
    sw = _copy(env["run"].parent, tmp_path / "sw")
    summary = json.loads((sw / RUN / "summary.json").read_text())
    summary["best_val_ppl"] = 1.23
    (sw / RUN / "summary.json").write_text(json.dumps(summary))
    _refused(capsys, [*env["sweep"], "--out", sw], RUN, "best_val_ppl")


@pytest.mark.slow
def test_report_refuses_a_negative_perplexity_in_the_log(env, tmp_path, capsys):
    sw = _copy(env["run"].parent, tmp_path / "sw")
    lines = (sw / RUN / "metrics.jsonl").read_text().splitlines()
    recs = [json.loads(line) for line in lines]
    recs[-1]["val_ppl"] = -recs[-1]["val_ppl"]
    (sw / RUN / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    _refused(capsys, ["report", sw, "--out", tmp_path / "rep"], "metrics.jsonl", "val_ppl")


# --------------------------------------------------------------------------- report flags

@pytest.mark.slow
@pytest.mark.parametrize("margin", ["nan", "inf", "0", "-2"])
def test_report_refuses_a_margin_that_is_not_a_positive_number(env, tmp_path, capsys, margin):
    _refused(capsys, ["report", env["run"].parent, "--out", tmp_path / "rep", "--margin", margin], "--margin")
    assert not (tmp_path / "rep").exists()


@pytest.mark.slow
@pytest.mark.parametrize("family", ["nope", "standard"])
def test_report_refuses_a_family_without_compared_arms(env, tmp_path, capsys, family):
    _refused(capsys, ["report", env["run"].parent, "--out", tmp_path / "rep", "--family", family], "--family",
             family)
    assert not (tmp_path / "rep" / "report.md").exists()


@pytest.mark.slow
def test_resume_refuses_a_checkpoint_without_its_optimizer_tensors(env, tmp_path, capsys):
    run = _copy(env["run"], tmp_path / "run")

    def strip(tensors):
        for k in [k for k in tensors if k.startswith("optim/")]:
            del tensors[k]
    _rewrite(run / "last.safetensors", strip)
    _refused(capsys, _extend(run, env["ov"]), "last.safetensors", "optimizer")
    # one written before the names were recorded: refused all the same
    _rewrite(run / "last.safetensors", lambda t: None, _edit_meta(lambda m: m["optimizer"].pop("tensors")))
    _refused(capsys, _extend(run, env["ov"]), "last.safetensors", "optimizer")


@pytest.mark.slow
def test_resume_refuses_a_checkpoint_missing_some_optimizer_tensors(env, tmp_path, capsys):
    run = _copy(env["run"], tmp_path / "run")

    def strip(tensors):
        for k in [k for k in tensors if k.endswith("/exp_avg_sq")]:
            del tensors[k]
    _rewrite(run / "last.safetensors", strip)
    _refused(capsys, _extend(run, env["ov"]), "last.safetensors", "exp_avg_sq")


@pytest.mark.slow
def test_eval_refuses_a_checkpoint_copied_in_from_another_run(env, tmp_path, capsys):
    run = _copy(env["run"], tmp_path / "run")
    shutil.copy(env["root"] / "canonical" / "model.safetensors", run / "best.safetensors")
    _refused(capsys, ["eval", run], "best.safetensors", "not this run's")
    _refused(capsys, ["eval", run / "best.safetensors"], "not this run's")


@pytest.mark.slow
def test_resume_refuses_changed_training_data(env, tmp_path, capsys):
    run = _copy(env["run"], tmp_path / "run")
    train = env["paths"]["train"]
    original = open(train).read()
    try:
        with open(train, "w") as f:
            f.write(original.replace("cat", "cow"))
        _refused(capsys, _extend(run, env["ov"]), "last.safetensors", "train data")
        assert "tb" not in os.listdir(run) and json.loads((run / "summary.json").read_text())["epochs_run"] == 1
    finally:
        with open(train, "w") as f:
            f.write(original)


@pytest.mark.slow
def test_resume_of_a_checkpoint_without_a_fingerprint_is_accepted_silently(env, tmp_path, capsys):
    run = _copy(env["run"], tmp_path / "run")
    _rewrite(run / "last.safetensors", lambda t: None, _edit_meta(lambda m: m.pop("data_fingerprint", None)))
    assert _run(_extend(run, env["ov"])) == 0
    assert "fingerprint" not in capsys.readouterr().err
    assert json.loads((run / "summary.json").read_text())["epochs_run"] == 2


@pytest.mark.slow
def test_init_from_is_stored_resolved(env, tmp_path, monkeypatch):
    from iattention.config import load_config

    shutil.copytree(env["run"], tmp_path / "src")
    monkeypatch.chdir(tmp_path)
    assert load_config("tiny", None, ["train.init_from=src"]).train.init_from == str(tmp_path / "src")
    # a saved run's own value is kept as it was (resume compares it with the run's config)
    assert load_config(None, None, [], base={"train": {"init_from": "src"}}).train.init_from == "src"
    assert _run(_train("r", env["ov"], "--init-from", "src")) == 0
    import yaml

    saved = yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())
    assert saved["train"]["init_from"] == str(tmp_path / "src")
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["started_from"]["source"] == str(tmp_path / "src")


# --------------------------------------------------------------------------- HF folders

@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float16, torch.int64])
def test_an_hf_folder_with_a_tensor_of_another_dtype_is_refused(env, tmp_path, capsys, dtype):
    hf = _copy(env["root"] / "hf", tmp_path / "hf")
    key = next(k for k in load_file(str(hf / "model.safetensors")) if k.endswith("h.0.mlp.c_fc.weight"))

    def cast(tensors):
        tensors[key] = (tensors[key] * 1000).to(dtype)
    _rewrite(hf / "model.safetensors", cast)
    _refused(capsys, ["convert", "--from", hf, "--to", "standard", "--out", tmp_path / "out"],
             "h.0.mlp.c_fc.weight", str(dtype).replace("torch.", ""))


@pytest.mark.slow
def test_an_hf_index_pointing_outside_the_folder_is_refused(env, tmp_path, capsys):
    hf = _copy(env["root"] / "hf", tmp_path / "hf")
    (tmp_path / "outside").mkdir()
    shutil.move(hf / "model.safetensors", tmp_path / "outside" / "w.safetensors")
    keys = list(load_file(str(tmp_path / "outside" / "w.safetensors")))
    (hf / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: "../outside/w.safetensors" for k in keys}}))
    _refused(capsys, ["convert", "--from", hf, "--to", "standard", "--out", tmp_path / "out"],
             "model.safetensors.index.json", "../outside/w.safetensors")
