"""Hostile inputs, third round (issue 41), one section per class: values that cross a process boundary,
foreign tokenizers, untied heads, token caches (concurrent fills, swapped files), exports, signals during
start-up, launchers, a missing home folder, repeated grid values."""

import json
import os

import pytest
import yaml

from helpers import one_line_error, write_corpus
from iattention.cli import main
from iattention.config import override, parse_override

# ------------------------------------------------------------------ values that cross a process boundary
HOSTILE_VALUES = ["/d/D #2", "/d/a: b", "!tag", "[x", "{y", "trailing ", " leading", "naïve—ü", "a\nb", "it's \"q\"",
                  "\\back", "#", "", "-", "~", "null", "yes", "1e3", "0x10", "\udcff"]


@pytest.mark.parametrize("value", HOSTILE_VALUES)
def test_an_override_made_from_a_value_reads_back_as_that_value(value):
    """Every override the tool builds for a child process (a sweep's `iattn train`) is read back by the child
    as exactly the value given: never as a YAML comment, mapping, tag, list, another type or a stripped string."""
    key, text = override("data.data_dir", value).split("=", 1)
    assert key == "data.data_dir"
    assert parse_override(f"{key}={text}") == {"data": {"data_dir": value}}


@pytest.mark.slow
def test_a_sweep_trains_on_the_data_folder_named_not_a_prefix_of_it(tmp_path):
    """`--data-dir "D #2: [x] {y} ü "` reached the sweep's children as a YAML override, where ' #' began a
    comment: they trained on D. Each child must record (and read) the folder exactly as given."""
    hostile = tmp_path / "D #2: [x] {y} ü "
    for folder, seed in ((hostile, 0), (tmp_path / "D", 1)):  # D: a decoy holding other text
        (folder / "wikitext-2-v1").mkdir(parents=True)
        paths = write_corpus(folder, seed=seed)
        for split, p in paths.items():
            os.replace(p, folder / "wikitext-2-v1" / f"wiki.{split}.tokens")
    out = tmp_path / "sw"
    rc = main(["sweep", "--preset", "tiny", "--arms", "standard", "--heads", "2", "--seeds", "0", "--out", str(out),
               "--data-dir", str(hostile), "train.epochs=1", "train.threads=1", f"data.cache_dir={tmp_path / 'cache'}"])
    assert rc == 0
    config = yaml.safe_load((out / "standard-h2-s0" / "config.yaml").read_text())
    assert config["data"]["data_dir"] == str(hostile)


# ------------------------------------------------------------------ untied output heads
def _hf_folder(folder, tie: bool, same_head: bool = False) -> None:
    """A small HF GPT-2 folder (byte tokenizer spec beside it) saved by transformers itself."""
    import torch
    import transformers

    cfg = transformers.GPT2Config(vocab_size=256, n_positions=32, n_embd=32, n_layer=1, n_head=2,
                                  tie_word_embeddings=tie, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg)
    if same_head:
        with torch.no_grad():
            model.lm_head.weight.copy_(model.transformer.wte.weight)
    model.save_pretrained(folder)
    (folder / "iattention-data.json").write_text(json.dumps({"dataset": "text", "tokenizer": "byte"}))


@pytest.mark.parametrize("command", ["eval", "convert"])
def test_an_untied_hf_head_is_refused_not_evaluated_as_tied(tmp_path, capsys, command):
    """`tie_word_embeddings: false` with its own lm_head.weight: our GPT ties the head to the embedding, so one
    of the two tensors was silently used for both (perplexity 4,957,763 where transformers gives 1,064.5)."""
    _hf_folder(tmp_path / "hf", tie=False)
    (tmp_path / "t.txt").write_text("the cat sat on the mat. " * 20)
    argv = (["eval", str(tmp_path / "hf"), "--text", str(tmp_path / "t.txt")] if command == "eval" else
            ["convert", "--from", str(tmp_path / "hf"), "--to", "canonical", "--out", str(tmp_path / "c")])
    one_line_error(capsys, main(argv), "tie_word_embeddings", "lm_head.weight")
    assert "perplexity" not in capsys.readouterr().out and not (tmp_path / "c").exists()


def test_an_untied_hf_folder_whose_head_equals_its_embedding_scores_as_transformers_does(tmp_path, capsys):
    """Untied in name only (the two tensors are equal): the same function, so it loads, and our logits are
    transformers' own."""
    import torch
    import transformers

    from iattention.interop.hf import from_hf

    _hf_folder(tmp_path / "hf", tie=False, same_head=True)
    ours = from_hf(tmp_path / "hf")
    theirs = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "hf")).eval()
    x = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        assert torch.allclose(ours(x)[0][..., :256], theirs(x).logits, atol=1e-5)
