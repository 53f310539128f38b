"""Hostile inputs, third round (issue 41), one section per class: values that cross a process boundary,
foreign tokenizers, untied heads, token caches (concurrent fills, swapped files), exports, signals during
start-up, launchers, a missing home folder, repeated grid values."""

import json
import os

import pytest
import yaml

from helpers import one_line_error, tiny_overrides, write_corpus
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


# ------------------------------------------------------------------ exports score as their run
@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished 1-epoch tiny run (byte tokenizer) and the corpus it read."""
    root = tmp_path_factory.mktemp("round3")
    paths = write_corpus(root)
    ov = tiny_overrides(paths, root / "cache", **{"train.epochs": 1, "train.threads": 1})
    assert main(["train", "--preset", "tiny", "--quiet", *ov, "--out", str(root / "run")]) == 0
    return dict(root=root, ov=ov, run=root / "run", paths=paths)


def _ppl(capsys, *argv) -> float:
    assert main(["eval", *map(str, argv), "--json"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["ppl"]


@pytest.mark.parametrize("tokenizer", ["byte", "bpe:300"])
def test_an_export_scores_every_text_exactly_as_its_run(tmp_path, capsys, tokenizer):
    """The export adds an end-of-text token (lm-eval needs one); its zero row had logit 0 and took probability
    from every real token: the export's perplexity was 0.43% above the run's. Now its logit is far below every
    real one: the export, and the export imported back, score as the run does (1e-6 relative, float32); the
    token is still bos and eos."""
    paths = write_corpus(tmp_path)
    run = tmp_path / "run"
    ov = tiny_overrides(paths, tmp_path / "cache", **{"train.epochs": 1, "data.tokenizer": tokenizer})
    assert main(["train", "--preset", "tiny", "--quiet", *ov, "--out", str(run)]) == 0
    assert main(["convert", "--from", str(run), "--to", "hf", "--out", str(tmp_path / "hf")]) == 0
    assert main(["convert", "--from", str(tmp_path / "hf"), "--to", "standard", "--out", str(tmp_path / "back")]) == 0
    capsys.readouterr()
    ours = _ppl(capsys, run, "--split", "test")
    for exported in (tmp_path / "hf", tmp_path / "back"):
        assert abs(_ppl(capsys, exported, "--split", "test") / ours - 1) < 1e-6, exported
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["eos_token_id"] == config["bos_token_id"] == config["vocab_size"] - 1


def test_an_export_without_biases_says_its_end_of_text_token_takes_probability(tmp_path, capsys):
    """No final LayerNorm bias: no row can have a constant logit, so the token keeps logit 0, and convert
    says so in one warning (never a silently different number)."""
    paths = write_corpus(tmp_path)
    ov = tiny_overrides(paths, tmp_path / "cache", **{"train.epochs": 1, "model.bias": "false"})
    assert main(["train", "--preset", "tiny", "--quiet", *ov, "--out", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    assert main(["convert", "--from", str(tmp_path / "run"), "--to", "hf", "--out", str(tmp_path / "hf")]) == 0
    assert "end-of-text token 256" in capsys.readouterr().err


def test_an_export_gets_the_umask_s_modes(tmp_path, run):
    """transformers writes model.safetensors 0600; every file of the export is 0666 & ~umask."""
    old = os.umask(0o022)
    try:
        assert main(["convert", "--from", str(run["run"]), "--to", "hf", "--out", str(tmp_path / "hf")]) == 0
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "hf").iterdir()}
    assert modes["model.safetensors"] == 0o644 and set(modes.values()) == {0o644}, modes
