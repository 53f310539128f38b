"""End-to-end tests: researcher."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import tiny_overrides, write_corpus
from iattention.cli import main


def _wikitext_folder(root: Path, paths: dict, splits=("train", "valid", "test")) -> Path:
    """A data folder in the official layout, from the synthetic corpus."""
    (root / "wikitext-2-v1").mkdir(parents=True)
    for split in splits:
        shutil.copy(paths[split], root / "wikitext-2-v1" / f"wiki.{split}.tokens")
    return root


def _wikitext_run_overrides(cache, **extra) -> list[str]:
    return ["data.dataset=wikitext-2-v1", "data.train_tokens=0", f"data.cache_dir={cache}",
            *[f"{k}={v}" for k, v in extra.items()]]


# ------------------------------------------------------------------ §1: a kept tokenizer needs one split

@pytest.fixture
def bpe_run(tmp_path, monkeypatch):
    """A bpe:300 run trained on a wikitext-layout folder, and a second folder holding only the test split."""
    monkeypatch.delenv("IATTN_DATA_DIR", raising=False)
    paths = write_corpus(tmp_path)
    full = _wikitext_folder(tmp_path / "full", paths)
    only_test = _wikitext_folder(tmp_path / "only-test", paths, splits=("test",))
    run = tmp_path / "run"
    assert main(["train", "--preset", "tiny", "--out", str(run), "--quiet", "--data-dir", str(full),
                 *_wikitext_run_overrides(tmp_path / "cache", **{"data.tokenizer": "bpe:300", "train.epochs": 1})]) == 0
    return run, full, only_test, paths


# ------------------------------------------------------------------ §1: a remembered data folder

@pytest.mark.slow
def test_remembered_data_folder_is_read_after_the_flag_and_the_environment(tmp_path, monkeypatch, capsys):
    """`iattn data remember DIR` (what `make demo` runs) lets a new run find its data with no flag and no
    IATTN_DATA_DIR; --data-dir, then IATTN_DATA_DIR, come before it."""
    from iattention.data import DataConfig
    from iattention.data.sources import data_dir, read_split

    paths = write_corpus(tmp_path)
    remembered = _wikitext_folder(tmp_path / "remembered", paths)
    (tmp_path / "c2").mkdir()
    other = _wikitext_folder(tmp_path / "other", write_corpus(tmp_path / "c2", seed=1))
    monkeypatch.delenv("IATTN_DATA_DIR", raising=False)
    assert main(["data", "remember", str(remembered)]) == 0
    config = Path(os.environ["XDG_CONFIG_HOME"]) / "iattention" / "config.json"
    assert json.loads(config.read_text())["data_dir"] == str(remembered.resolve())
    cfg = DataConfig(dataset="wikitext-2-v1")
    assert data_dir(cfg) == remembered.resolve()
    assert read_split(cfg, "train") == Path(paths["train"]).read_text()
    monkeypatch.setenv("IATTN_DATA_DIR", str(other))  # the environment beats the remembered folder
    assert data_dir(cfg) == other
    assert data_dir(DataConfig(dataset="wikitext-2-v1", data_dir=str(remembered))) == remembered  # the flag beats both
    monkeypatch.delenv("IATTN_DATA_DIR")
    # a new run told nothing trains on the remembered folder and records it
    run = tmp_path / "run"
    assert main(["train", "--preset", "tiny", "--out", str(run), "--quiet", "train.epochs=1",
                 *_wikitext_run_overrides(tmp_path / "cache")]) == 0
    assert str(remembered.resolve()) in (run / "config.yaml").read_text()
    capsys.readouterr()
    assert main(["data", "where"]) == 0 and str(remembered.resolve()) in capsys.readouterr().out


@pytest.mark.slow
def test_no_data_anywhere_names_every_way_to_give_it(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("IATTN_DATA_DIR", raising=False)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no WikiText in a Hugging Face cache either
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-home" / "datasets"))
    code = main(["train", "--preset", "tiny", "--out", str(tmp_path / "run"), f"data.cache_dir={tmp_path / 'c'}"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    for needed in ("IATTN_DATA_DIR", "--data-dir", 'pip install "iattention[data]"'):
        assert needed in err, err


def test_data_remember_refuses_a_missing_folder(tmp_path, capsys):
    assert main(["data", "remember", str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (Path(os.environ["XDG_CONFIG_HOME"]) / "iattention" / "config.json").exists()


# ------------------------------------------------------------------ §1: finished runs need no data

@pytest.mark.slow
def test_compare_on_finished_runs_reads_no_data(tmp_path, capsys):
    """`iattn compare` again on finished bpe runs prints the table with the data gone (before: the bpe
    vocabulary was rebuilt from the train split to check the runs' configs)."""
    paths = write_corpus(tmp_path)
    ov = tiny_overrides(paths, tmp_path / "cache", **{"data.tokenizer": "bpe:300", "train.epochs": 1})
    out = tmp_path / "cmp"
    assert main(["compare", "--preset", "tiny", "--out", str(out), *ov]) == 0
    first = capsys.readouterr().out
    os.remove(paths["train"])
    shutil.rmtree(tmp_path / "cache")
    assert main(["compare", "--preset", "tiny", "--out", str(out), *ov]) == 0
    again = capsys.readouterr().out
    assert "standard" in again and "canonical" in again and "skipped (finished)" in again
    table = [line for line in first.splitlines() if line.startswith(("standard ", "canonical "))]
    assert table and all(line in again for line in table)


@pytest.mark.slow
def test_eval_with_only_the_test_split(bpe_run, tmp_path, capsys):
    run, full, only_test, _ = bpe_run
    capsys.readouterr()
    assert main(["eval", str(run), "--split", "test", "--data-dir", str(full), "--json"]) == 0
    want = json.loads(capsys.readouterr().out)
    shutil.rmtree(full)
    shutil.rmtree(tmp_path / "cache")
    assert main(["eval", str(run), "--split", "test", "--data-dir", str(only_test), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["tokens"] == want["tokens"] and abs(got["ppl"] - want["ppl"]) < 1e-9 * want["ppl"]


@pytest.mark.slow
def test_generate_from_an_hf_export_needs_no_data(bpe_run, tmp_path, capsys):
    run, full, _, _ = bpe_run
    hf = tmp_path / "hf"
    assert main(["convert", "--from", str(run), "--to", "hf", "--out", str(hf)]) == 0
    capsys.readouterr()
    assert main(["generate", str(run), "--prompt", "the cat", "--temperature", "0", "--max-new-tokens", "8"]) == 0
    ours = capsys.readouterr().out
    shutil.rmtree(full)
    shutil.rmtree(tmp_path / "cache")
    assert main(["generate", str(hf), "--prompt", "the cat", "--temperature", "0", "--max-new-tokens", "8"]) == 0
    assert capsys.readouterr().out == ours


# ------------------------------------------------------------------ §1: eval --text

@pytest.mark.slow
def test_eval_text_file_is_the_same_evaluation_as_a_split(tmp_path, capsys):
    """`eval RUN --text FILE` scores a file with the run's tokenizer through the split's evaluation: on the
    run's own test file it gives the test split's numbers exactly."""
    paths = write_corpus(tmp_path)
    run = tmp_path / "run"
    assert main(["train", "--preset", "tiny", "--out", str(run), "--quiet",
                 *tiny_overrides(paths, tmp_path / "cache", **{"train.epochs": 1})]) == 0
    capsys.readouterr()
    assert main(["eval", str(run), "--split", "test", "--json"]) == 0
    split = json.loads(capsys.readouterr().out)
    other = tmp_path / "notes.txt"
    shutil.copy(paths["test"], other)
    assert main(["eval", str(run), "--text", str(other), "--json"]) == 0
    text = json.loads(capsys.readouterr().out)
    assert text["split"] == "text" and text["text"] == str(other)
    assert text["tokens"] == split["tokens"] and text["ppl"] == split["ppl"]
    other.write_bytes(b"\xff\xfe not utf-8")
    assert main(["eval", str(run), "--text", str(other)]) == 2
    assert "not UTF-8" in capsys.readouterr().err


# ------------------------------------------------------------------ §1: convert checks --out first

@pytest.mark.slow
def test_convert_refuses_an_existing_out_before_reading_the_source(tmp_path, capsys):
    out = tmp_path / "exists"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    t0 = time.monotonic()
    assert main(["convert", "--from", str(tmp_path / "not-read-yet"), "--to", "hf", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and time.monotonic() - t0 < 2
    assert (out / "mine.txt").read_text() == "keep"


# ------------------------------------------------------------------ §2: exports real clients load

@pytest.mark.slow
@pytest.mark.parametrize("tokenizer", ["byte", "bpe:300"])
def test_export_loads_in_transformers_with_eos_max_length_class_and_card(tmp_path, tokenizer):
    """AutoTokenizer + AutoModelForCausalLM load the export offline: a class transformers 4.x knows, an
    end-of-text token whose logit is far below every real one (every other logit as ours), model_max_length =
    block size, and a model card naming the variant, counts, metrics and command."""
    from iattention import load_run

    paths = write_corpus(tmp_path)
    run, hf = tmp_path / "run", tmp_path / "hf"
    assert main(["train", "--preset", "tiny", "--out", str(run), "--quiet", *tiny_overrides(
        paths, tmp_path / "cache", **{"data.tokenizer": tokenizer, "train.epochs": 1,
                                      "model.attention": "canonical"})]) == 0
    assert main(["convert", "--from", str(run), "--to", "hf", "--out", str(hf)]) == 0
    config = json.loads((hf / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and "backend" not in config
    # BPE merges as "a b" strings: the tokenizers of transformers 4.40-4.44 (0.19) read no other form
    merges = json.loads((hf / "tokenizer.json").read_text())["model"].get("merges")
    assert tokenizer == "byte" or (merges and all(isinstance(m, str) and m.count(" ") == 1 for m in merges))
    model, ours_tok = load_run(run)
    V, T = model.config.vocab_size, model.config.block_size
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    code = f"""
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained({str(hf)!r})
m = AutoModelForCausalLM.from_pretrained({str(hf)!r}).eval()
ids = tok("the cat sat on a mat. a dog")["input_ids"]
long = tok("the cat sat " * 40, truncation=True)["input_ids"]
with torch.no_grad():
    logits = m(torch.tensor([ids])).logits[0]
print(json.dumps(dict(cls=type(tok).__name__, eos=tok.eos_token_id, bos=tok.bos_token_id, eos_tok=tok.eos_token,
                      max_len=tok.model_max_length, n_long=len(long), ids=ids, logits=logits.tolist(),
                      gen_eos=m.generation_config.eos_token_id, cfg_eos=m.config.eos_token_id)))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["eos_tok"] == "<|endoftext|>" and got["eos"] == got["bos"] == V  # added, past our vocabulary
    assert got["gen_eos"] == got["cfg_eos"] == V
    assert got["max_len"] == T and got["n_long"] == T
    assert got["ids"] == ours_tok.encode("the cat sat on a mat. a dog").tolist()
    theirs = torch.tensor(got["logits"], dtype=torch.float64)
    with torch.no_grad():
        mine = model(torch.tensor([got["ids"]]))[0][0].double()
    assert theirs.shape == (len(got["ids"]), V + 1)
    assert (theirs[:, :V] - mine).abs().max() < 1e-4
    assert torch.all(theirs[:, V] <= theirs[:, :V].min(-1).values - 1000)  # the added token takes no probability
    card = (hf / "README.md").read_text()
    summary = json.loads((run / "summary.json").read_text())
    for needed in ("canonical", f"{model.num_params():,}", f"{summary['best_val_ppl']:.3f}", "iattn convert",
                   tokenizer, "AutoModelForCausalLM", "TransformerBridge", "lm-evaluation-harness"):
        assert needed in card, needed


def test_gpt2_export_uses_its_own_end_of_text(tmp_path):
    from helpers import shared_data_dir
    from iattention.data.tokenizers import Tokenizer
    from iattention.interop.hf_tokenizer import save_hf_tokenizer

    if shared_data_dir() is None:
        pytest.skip("../shared/data not present")
    from iattention.data import DataConfig
    from iattention.data.tokenizers import load_tokenizer

    tok: Tokenizer = load_tokenizer(DataConfig(tokenizer="gpt2", data_dir=shared_data_dir()))
    assert save_hf_tokenizer(tok, tmp_path, model_max_length=1024) == 50256
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and config["model_max_length"] == 1024
    assert config["eos_token"] == config["bos_token"] == "<|endoftext|>"
