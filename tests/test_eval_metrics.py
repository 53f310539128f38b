"""Tokenizer-free metrics (issue 30 §1): word perplexity, byte perplexity and bits per byte, as
lm-evaluation-harness defines them, over the text an evaluation predicts (every token after the first)."""

import json
import math
import os
import re

import pytest
import torch
import torch.nn.functional as F

from helpers import shared_data_dir, tiny_overrides, write_corpus
from iattention import GPT, GPTConfig
from iattention.data import DataConfig, load_tokenizer
from iattention.data.dataset import count_words, scored_text
from iattention.experiments.report import write_report
from iattention.interop.load import load_model
from iattention.train import load_config, train
from iattention.train.distributed import DistContext
from iattention.train.evaluate import per_unit, split_nll

UNICODE = "Ünïcödé ∑ — naïve café\n = Heading = \n 日本語 text  with   spaces\t\n"


def _byte_tokenizer():
    return load_tokenizer(DataConfig(tokenizer="byte"))


def test_words_are_counted_as_lm_eval_counts_them():
    # lm-eval's wikitext task: len(re.split(r"\s+", doc)); leading/trailing whitespace adds an empty word
    assert count_words("ab cd") == 2
    assert count_words(" ab  cd\n") == 4  # '', 'ab', 'cd', ''
    assert count_words("\u3000ab") == 2  # unicode whitespace too (a str pattern)


def test_scored_text_is_the_tokens_after_the_first_by_hand():
    tok = _byte_tokenizer()
    ids = tok.encode("ab cd\n")
    text = scored_text(tok, ids)  # predicted: "b cd\n" -> 'b', 'cd', ''
    assert (text.tokens, text.words, text.bytes) == (5, 3, 5)
    assert scored_text(tok, ids[:1]) == scored_text(tok, ids[:0]) == type(text)(0, 0, 0)
    assert per_unit(1.0, type(text)(0, 0, 0)) is None


def test_a_uniform_model_gives_eight_bits_per_byte_and_a_hand_computed_word_perplexity():
    """All weights zero: logits are 0, every byte costs ln 256 nats, so bits per byte = 8, byte perplexity
    = 256, and word perplexity = 256 ** (bytes / words), counted by hand on the literal text."""
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, vocab_size=256, block_size=8)).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    tok = _byte_tokenizer()
    source = "the cat sat on the mat .\n a dog ran\n"  # 36 bytes; 35 predicted: "he cat ... ran\n"
    ids = tok.encode(source)
    nll, n = split_nll(model, ids, 8, 4, DistContext())  # 5 windows, the last one partial (float32 NLL)
    assert n == 35 and nll == pytest.approx(35 * math.log(256), rel=1e-6)
    m = per_unit(nll, scored_text(tok, ids), scored=n)
    words = 11  # 'he' 'cat' 'sat' 'on' 'the' 'mat' '.' 'a' 'dog' 'ran' ''
    assert m["bits_per_byte"] == pytest.approx(8.0, rel=1e-6)
    assert m["byte_ppl"] == pytest.approx(256.0, rel=1e-5)
    assert m["word_ppl"] == pytest.approx(256.0 ** (35 / words), rel=1e-5)
    assert per_unit(nll, scored_text(tok, ids), scored=n - 1) is None  # not every token scored: no figures


def _bpe_tokenizer(tmp_path):
    paths = write_corpus(tmp_path)
    train_text = open(paths["train"]).read() + UNICODE * 20
    return load_tokenizer(DataConfig(tokenizer="bpe:300", cache_dir=str(tmp_path / "c")), train_text)


def _tokenizers(tmp_path):
    toks = {"byte": _byte_tokenizer(), "bpe": _bpe_tokenizer(tmp_path)}
    data = shared_data_dir()
    if data and os.path.isfile(os.path.join(data, "tokenizers", "r50k_base.tiktoken")):
        toks["gpt2"] = load_tokenizer(DataConfig(tokenizer="gpt2", data_dir=data))
    return toks


def test_decode_bytes_is_exact_even_where_a_cut_splits_a_character(tmp_path):
    from tokenizers import pre_tokenizers

    from iattention.data.tokenizers import _byte_level_bytes

    assert set(_byte_level_bytes()) == set(pre_tokenizers.ByteLevel.alphabet())  # the alphabet bpe spells in
    for name, tok in _tokenizers(tmp_path).items():
        ids = tok.encode(UNICODE)
        assert tok.decode_bytes(ids) == UNICODE.encode(), name
        for k in range(len(ids) + 1):  # every cut: the two sides' bytes add up to the text's
            assert tok.decode_bytes(ids[:k]) + tok.decode_bytes(ids[k:]) == UNICODE.encode(), (name, k)


def test_scored_text_of_a_whole_text_is_it_less_its_first_token(tmp_path):
    """Oracle independent of decode_bytes: the bpe tokenizer's own character offsets of the first token
    (which must hold whole characters for offsets to say where it ends: an ASCII start)."""
    tok, source = _bpe_tokenizer(tmp_path), " The" + UNICODE
    enc = tok._impl.encode(source)
    rest = source[enc.offsets[0][1]:]
    text = scored_text(tok, tok.encode(source))
    assert (text.tokens, text.words, text.bytes) == (len(enc.ids) - 1, len(re.split(r"\s+", rest)),
                                                      len(rest.encode()))


def _run(tmp_path, **extra):
    paths = write_corpus(tmp_path, n_eval=3000)
    cfg = load_config("tiny", None, tiny_overrides(paths, tmp_path / "cache", **{"train.epochs": 2, **extra}))
    return paths, train(cfg, tmp_path / "run", quiet=True)


def _eval(capsys, *argv) -> dict:
    from iattention.cli import main

    assert main(["eval", *map(str, argv), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


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


def test_strided_eval_gives_word_figures_only_when_every_token_is_scored(tmp_path, capsys):
    _run(tmp_path)
    overlap = _eval(capsys, tmp_path / "run", "--stride", "16")  # every token after the first scored
    assert overlap["word_perplexity"] == pytest.approx(overlap["ppl"] ** (overlap["tokens"] / overlap["words"]),
                                                       rel=1e-9)
    gaps = _eval(capsys, tmp_path / "run", "--stride", "32")  # each window's first token is context only
    assert gaps["tokens"] < overlap["tokens"]
    assert gaps["word_perplexity"] is gaps["words"] is gaps["bits_per_byte"] is None


def _write_run(folder, arm, heads, seed, best, config, word_ppl=None):
    folder.mkdir(parents=True)
    with open(folder / "metrics.jsonl", "w") as f:
        for e, v in enumerate((best + 10, best), 1):
            f.write(json.dumps(dict(kind="epoch", epoch=e, step=10 * e, train_ppl=v, val_ppl=v)) + "\n")
    summary = dict(config=config, attention=arm, n_head=heads, seed=seed, params=1000, best_val_ppl=best,
                   best_epoch=2, test_ppl=best + 1, epochs_run=2, train_tokens_per_s=1.0)
    if word_ppl is not None:
        summary["best_val_word_ppl"] = word_ppl
    (folder / "summary.json").write_text(json.dumps(summary))


def test_report_has_a_per_word_column_blank_for_runs_without_it(tmp_path):
    config = load_config("tiny", None, []).to_dict()
    for seed, word in ((0, 900.0), (1, 1100.0)):  # new runs: the column is their mean ± std
        _write_run(tmp_path / f"standard-h2-s{seed}", "standard", 2, seed, 50.0 + seed, config, word)
    for seed in (0, 1):  # runs from before the metric: "–"
        _write_run(tmp_path / f"canonical-h2-s{seed}", "canonical", 2, seed, 60.0 + seed, config)
    for seed, word in ((0, 700.0), (1, None)):  # a mix: the mean of those that have it, and how many
        _write_run(tmp_path / f"identity_q-h2-s{seed}", "identity_q", 2, seed, 40.0 + seed, config, word)
    report = write_report([tmp_path], tmp_path / "out").read_text()
    table = report.split("## Results (ours)")[1].split("\n## ")[0]
    assert "| test ppl | best val ppl per word |" in table
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    assert f"| 51.50 ± 0.71 | {1000:.2f} ± {math.sqrt(20000):.2f} |" in rows["standard"]
    assert "| 61.50 ± 0.71 | – |" in rows["canonical"]
    assert "| 41.50 ± 0.71 | 700.00 (1 of 2) |" in rows["identity_q"]
