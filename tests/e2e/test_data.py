"""End-to-end tests: data folders and splits: the shared WikiText-2 under the GPT-2 tokenizer, where a run finds
its data (a flag, the environment, a remembered folder, no home folder), finished runs that need no data or one
split, splits too short to evaluate."""

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from helpers import edit_meta as _edit_meta
from helpers import one_line_error, shared_data_dir, tiny_overrides, write_corpus
from helpers import refused as _refused
from helpers import rewrite_safetensors as _rewrite
from helpers import train_argv as _train
from iattention.cli import main
from iattention.data import DataConfig, load_data, load_tokenizer


@pytest.mark.skipif(shared_data_dir() is None, reason="../shared/data not present")
def test_gpt2_tokenizer_round_trips_wikitext2_test(tmp_path):
    root = shared_data_dir()
    cfg = DataConfig(dataset="wikitext-2-v1", data_dir=root, tokenizer="gpt2", cache_dir=str(tmp_path))
    tok = load_tokenizer(cfg)
    assert tok.vocab_size == 50257
    assert list(tok.encode("Hello world")) == [15496, 995]
    for name in ("wikitext-2-v1/wiki.test.tokens", "wikitext-2-raw-v1/wiki.test.raw"):
        text = open(os.path.join(root, name), encoding="utf-8").read()
        assert tok.decode(tok.encode(text)) == text
    data = load_data(cfg, splits=("test",))
    assert data.splits["test"].dtype == np.uint16


# ------------------------------------------------------------------ where the data folder comes from
def _wikitext_folder(root: Path, paths: dict, splits=("train", "valid", "test")) -> Path:
    """A data folder in the official layout, from the synthetic corpus."""
    (root / "wikitext-2-v1").mkdir(parents=True)
    for split in splits:
        shutil.copy(paths[split], root / "wikitext-2-v1" / f"wiki.{split}.tokens")
    return root


def _wikitext_run_overrides(cache, **extra) -> list[str]:
    return ["data.dataset=wikitext-2-v1", "data.train_tokens=0", f"data.cache_dir={cache}",
            *[f"{k}={v}" for k, v in extra.items()]]


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


def test_data_remember_refuses_a_path_that_no_message_can_name(tmp_path, capsys, monkeypatch):
    """A folder with a newline in its name was remembered (and later printed over two lines); --out refuses it."""
    monkeypatch.delenv("IATTN_DATA_DIR", raising=False)  # `data where` would show it first (make test sets it)
    folder = tmp_path / "da\nta"
    folder.mkdir()
    with pytest.raises(SystemExit) as refused:
        main(["data", "remember", str(folder)])
    one_line_error(capsys, refused.value.code, "control characters")
    assert main(["data", "where"]) == 0 and "none" in capsys.readouterr().out


@pytest.fixture
def no_home(monkeypatch):
    """HOME unset and no passwd entry for the uid (`docker run --user 4242`): Path.home() raises RuntimeError."""
    import pwd

    def no_entry(uid):
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    for var in ("HOME", "XDG_CONFIG_HOME", "IATTN_CACHE_DIR", "IATTN_DATA_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    with pytest.raises(RuntimeError):
        from pathlib import Path

        Path.home()


def test_a_user_without_a_home_folder_is_told_what_to_set_or_goes_on_without_it(tmp_path, capsys, no_home):
    """`data where` and a run need no home (the remembered folder and the cache are optional: a run without one
    tokenizes without caching); `data remember` says in one line what to set; a path with ~ says the same."""
    assert main(["data", "where"]) == 0
    assert "none" in capsys.readouterr().out
    one_line_error(capsys, main(["data", "remember", str(tmp_path)]), "XDG_CONFIG_HOME", "HOME")
    paths = write_corpus(tmp_path)
    ov = [o for o in tiny_overrides(paths, "x", **{"train.epochs": 1}) if not o.startswith("data.cache_dir")]
    assert main(["train", "--preset", "tiny", "--quiet", *ov, "--out", str(tmp_path / "run")]) == 0
    assert main(["eval", str(tmp_path / "run"), "--text", paths["test"]]) == 0
    capsys.readouterr()
    one_line_error(capsys, main(["eval", str(tmp_path / "run"), "--text", "~/notes.txt"]), "~", "HOME")


# ------------------------------------------------------------------ finished runs need no data, or one split
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


# ------------------------------------------------------------------ splits too short to evaluate
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
