"""End-to-end tests: eval_metrics."""

import json
import math
import os
import re

import pytest
import torch
import torch.nn.functional as F

from fixtures import UNICODE, bpe_tokenizer, byte_tokenizer
from helpers import shared_data_dir, tiny_overrides, write_corpus
from iattention.data import DataConfig, load_tokenizer
from iattention.interop.load import load_model
from iattention.train import load_config, train


def _tokenizers(tmp_path):
    toks = {"byte": byte_tokenizer(), "bpe": bpe_tokenizer(tmp_path)}
    data = shared_data_dir()
    if data and os.path.isfile(os.path.join(data, "tokenizers", "r50k_base.tiktoken")):
        toks["gpt2"] = load_tokenizer(DataConfig(tokenizer="gpt2", data_dir=data))
    return toks


def _run(tmp_path, **extra):
    paths = write_corpus(tmp_path, n_eval=3000)
    cfg = load_config("tiny", None, tiny_overrides(paths, tmp_path / "cache", **{"train.epochs": 2, **extra}))
    return paths, train(cfg, tmp_path / "run", quiet=True)


def _eval(capsys, *argv) -> dict:
    from iattention.cli import main

    assert main(["eval", *map(str, argv), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_decode_bytes_is_exact_even_where_a_cut_splits_a_character(tmp_path):
    from tokenizers import pre_tokenizers

    from iattention.data.tokenizers import _byte_level_bytes

    assert set(_byte_level_bytes()) == set(pre_tokenizers.ByteLevel.alphabet())  # the alphabet bpe spells in
    for name, tok in _tokenizers(tmp_path).items():
        ids = tok.encode(UNICODE)
        assert tok.decode_bytes(ids) == UNICODE.encode(), name
        for k in range(len(ids) + 1):  # every cut: the two sides' bytes add up to the text's
            assert tok.decode_bytes(ids[:k]) + tok.decode_bytes(ids[k:]) == UNICODE.encode(), (name, k)


@pytest.mark.slow
def test_word_perplexity_is_token_perplexity_to_the_tokens_per_word(tmp_path, capsys):
    """The identity word_ppl = ppl ** (tokens scored / words) in summary.json, metrics.jsonl and
    `iattn eval RUN --split valid --json` (the run's best checkpoint), with counts from the raw text."""
    paths, s = _run(tmp_path)
    raw = {split: open(paths[split]).read() for split in ("valid", "test")}
    for short, split in (("val", "valid"), ("test", "test")):  # byte tokenizer: the text less its first byte
        assert s[f"{short}_tokens_scored"] == s[f"{short}_bytes"] == len(raw[split].encode()) - 1
        assert s[f"{short}_words"] == len(re.split(r"\s+", raw[split][1:]))
    for prefix, short in (("best_val", "val"), ("test", "test")):
        p = s["best_val_ppl" if prefix == "best_val" else "test_ppl"]
        ratio = s[f"{short}_tokens_scored"] / s[f"{short}_words"]
        assert s[f"{prefix}_word_ppl"] == pytest.approx(p ** ratio, rel=1e-9)
        assert s[f"{prefix}_byte_ppl"] == pytest.approx(p, rel=1e-12)  # bytes are the tokens here
        assert s[f"{prefix}_bits_per_byte"] == pytest.approx(math.log2(p), rel=1e-12)
    best = [r for r in map(json.loads, open(tmp_path / "run" / "metrics.jsonl")) if r["epoch"] == s["best_epoch"]]
    assert best[-1]["val_word_ppl"] == pytest.approx(s["best_val_word_ppl"], rel=1e-12)

    out = _eval(capsys, tmp_path / "run", "--split", "valid")
    assert (out["tokens"], out["words"], out["bytes"]) == (s["val_tokens_scored"], s["val_words"], s["val_bytes"])
    assert out["word_perplexity"] == pytest.approx(out["ppl"] ** (out["tokens"] / out["words"]), rel=1e-9)
    assert out["word_perplexity"] == pytest.approx(s["best_val_word_ppl"], rel=1e-5)  # the best checkpoint
    assert out["bits_per_byte"] == pytest.approx(out["loss"] * out["tokens"] / out["bytes"] / math.log(2), rel=1e-12)


@pytest.mark.slow
def test_eval_word_perplexity_matches_cross_entropy_on_the_models_logits(tmp_path, capsys):
    """One window (33 validation tokens: 32 predictions, the block size): the NLL is F.cross_entropy on the
    model's logits of the whole prefix, and the words are counted on the raw file's bytes 1..32."""
    paths, s = _run(tmp_path, **{"data.valid_tokens": 33})
    model, _ = load_model(tmp_path / "run")
    ids = torch.tensor(list(open(paths["valid"], "rb").read()[:33]))
    with torch.no_grad():
        logits, _ = model(ids[None, :-1])
    nll = F.cross_entropy(logits[0].double(), ids[1:], reduction="sum").item()
    words = len(re.split(r"\s+", open(paths["valid"], "rb").read()[1:33].decode()))
    out = _eval(capsys, tmp_path / "run", "--split", "valid")
    assert (out["tokens"], out["words"], out["bytes"]) == (32, words, 32)
    assert out["word_perplexity"] == pytest.approx(math.exp(nll / words), rel=1e-5)
    assert out["bits_per_byte"] == pytest.approx(nll / 32 / math.log(2), rel=1e-5)
    assert s["best_val_word_ppl"] == pytest.approx(math.exp(nll / words), rel=1e-5)


@pytest.mark.slow
def test_strided_eval_gives_word_figures_only_when_every_token_is_scored(tmp_path, capsys):
    _run(tmp_path)
    overlap = _eval(capsys, tmp_path / "run", "--stride", "16")  # every token after the first scored
    assert overlap["word_perplexity"] == pytest.approx(overlap["ppl"] ** (overlap["tokens"] / overlap["words"]),
                                                       rel=1e-9)
    gaps = _eval(capsys, tmp_path / "run", "--stride", "32")  # each window's first token is context only
    assert gaps["tokens"] < overlap["tokens"]
    assert gaps["word_perplexity"] is gaps["words"] is gaps["bits_per_byte"] is None


def test_every_evaluation_of_a_training_and_of_iattn_eval_says_it_is_running(tmp_path, capsys):
    """Not on a terminal, each evaluation is one line of windows scored: training's step-0, epoch-end and
    test passes, and `iattn eval` with and without --stride (on a terminal the same passes draw a bar:
    tests/unit/train/test_evaluate.py)."""
    from iattention.cli import main

    paths = write_corpus(tmp_path, n_eval=3000)
    cfg = load_config("tiny", None, tiny_overrides(paths, tmp_path / "cache", **{"train.epochs": 2}))
    train(cfg, tmp_path / "run", quiet=False)
    lines = [x.split(":")[0] for x in capsys.readouterr().err.splitlines() if " windows in " in x]
    assert lines == ["eval valid (start)", "eval valid (end of epoch 1)", "eval valid (end of epoch 2)",
                     "eval test (best weights)"], lines
    assert main(["eval", str(tmp_path / "run"), "--split", "valid"]) == 0
    assert main(["eval", str(tmp_path / "run"), "--stride", "16", "--json"]) == 0
    out = capsys.readouterr()
    err = [x for x in out.err.splitlines() if " windows in " in x]
    assert len(err) == 2 and err[0].startswith("eval valid: ") and err[1].startswith("eval test (stride 16): ")
    assert json.loads(out.out.splitlines()[-1])["stride"] == 16  # --json's stdout stays one JSON object
    train(cfg, tmp_path / "quiet", quiet=True)
    assert " windows in " not in capsys.readouterr().err
