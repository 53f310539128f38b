"""Unit tests of iattention.data.tokenizers."""

import os

import pytest

from helpers import write_corpus
from iattention.data import DataConfig, load_tokenizer
from iattention.data.cache import cache_root


def _cfg(paths, cache, tokenizer="byte"):
    return DataConfig(dataset="text", train=paths["train"], valid=paths["valid"], test=paths["test"],
                      tokenizer=tokenizer, cache_dir=str(cache))


def test_bpe_is_deterministic_and_cached(tmp_path):
    paths = write_corpus(tmp_path)
    a = load_tokenizer(_cfg(paths, tmp_path / "a", "bpe:300"), open(paths["train"]).read())
    b = load_tokenizer(_cfg(paths, tmp_path / "b", "bpe:300"), open(paths["train"]).read())
    text = open(paths["valid"]).read()
    assert 256 < a.vocab_size <= 300  # the tiny corpus may run out of merges
    assert list(a.encode(text)) == list(b.encode(text))
    assert a.decode(a.encode(text)) == text
    assert len(os.listdir(cache_root(_cfg(paths, tmp_path / "a")) / "tokenizers")) == 1


# ------------------------------------------------------------------ BPE training on text without spaces
def test_bpe_training_on_text_without_spaces_is_not_quadratic(tmp_path, monkeypatch):
    """160 kB of letters without a space took ~18 s (quadratic in the "word" length: 2 MB ran past 240 s);
    long runs are now fed to the trainer in pieces. What makes it quadratic is checked, not the seconds it
    takes (which depend on the machine's load): no piece the trainer is fed is longer than _MAX_RUN, and the
    pieces are the text."""
    import random

    from iattention.data import tokenizers
    from iattention.data.config import DataConfig
    from iattention.data.tokenizers import load_tokenizer

    fed = []

    def pieces(text):
        for piece in real(text):
            fed.append(piece)
            yield piece

    real = tokenizers._training_pieces
    monkeypatch.setattr(tokenizers, "_training_pieces", pieces)
    rng = random.Random(0)
    text = "".join(rng.choice("abcdefghij") for _ in range(160_000))
    tok = load_tokenizer(DataConfig(tokenizer="bpe:300", cache_dir=str(tmp_path)), text)
    assert "".join(fed) == text and max(map(len, fed)) == tokenizers._MAX_RUN
    assert tok.decode(tok.encode(text[:5000])) == text[:5000]


# ------------------------------------------------------------------ what a tokenizer's identity covers
def test_the_identity_sees_the_merges_not_only_the_vocabulary(tmp_path):
    """Two tokenizers with the same vocabulary and other merges encode differently, so they must not pass as one
    another (a fingerprint of the vocabulary alone let a swapped tokenizer.json through)."""
    import json

    from iattention.data.tokenizers import save_tokenizer_file, tokenizer_from_file, tokenizer_identity

    paths = write_corpus(tmp_path)
    tok = load_tokenizer(_cfg(paths, tmp_path / "c", "bpe:300"), open(paths["train"]).read())
    save_tokenizer_file(tok, tmp_path / "own.json")
    data = json.loads((tmp_path / "own.json").read_text())
    merges = data["model"]["merges"]
    data["model"]["merges"] = merges[1:]  # the first merge dropped, its token left in the vocabulary
    (tmp_path / "other.json").write_text(json.dumps(data))
    own = tokenizer_from_file(tmp_path / "own.json", tok.name)
    other = tokenizer_from_file(tmp_path / "other.json", tok.name)
    text = open(paths["valid"]).read()
    assert sorted(json.loads(other._impl.to_str())["model"]["vocab"].items()) == \
        sorted(json.loads(own._impl.to_str())["model"]["vocab"].items())  # the same vocabulary ...
    assert list(own.encode(text)) != list(other.encode(text))  # ... encoding otherwise
    assert tokenizer_identity(own) == tokenizer_identity(tok)  # the file form does not matter
    assert tokenizer_identity(other) != tokenizer_identity(own)


def test_an_hf_spec_without_a_tokenizer_folder_is_one_line(tmp_path):
    import pytest

    from iattention.data.tokenizers import vocab_size_of
    from iattention.errors import UserError

    for spec in (f"hf:{tmp_path / 'none'}", "hf:"):
        with pytest.raises(UserError, match="holds no tokenizer.json; name the folder"):
            load_tokenizer(DataConfig(tokenizer=spec))
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(UserError, match="transformers cannot read the tokenizer in"):
        vocab_size_of(f"hf:{tmp_path}")


def test_an_hf_tokenizer_is_identified_by_its_files_wherever_they_are(tmp_path):
    """The same saved files in two folders: one identity (a run's record survives a move); other files, another;
    the cache key (fingerprint) names the transformers version that builds the pipeline."""
    import shutil

    import pytest

    pytest.importorskip("transformers")
    from fixtures import hf_folder
    from iattention.data.tokenizers import tokenizer_identity

    a = hf_folder(tmp_path / "a", "Qwen2")
    shutil.copytree(a, tmp_path / "b")
    c = hf_folder(tmp_path / "c", "Llama")
    ta, tb, tc = (load_tokenizer(DataConfig(tokenizer=f"hf:{f}")) for f in (a, tmp_path / "b", c))
    assert tokenizer_identity(ta) == tokenizer_identity(tb) != tokenizer_identity(tc)
    import transformers
    assert ta.fingerprint.endswith(transformers.__version__) and ta.bos is None and tc.bos == 1


def test_a_kept_copy_whose_chat_template_differs_from_the_source_s_is_noticed(tmp_path):
    """A run's hf-tokenizer copy is checked against FOLDER: a chat template that differs is noticed, as a file
    (hf_tokenizer_changes: a resume refuses it) and as what transformers reads (same_hf_tokenizer: the copy is
    not kept), here set in memory with every file unchanged, so that only the template tells them apart."""
    pytest.importorskip("transformers")
    from fixtures import hf_folder
    from iattention.data.config import DataConfig
    from iattention.data.tokenizers import (
        HF_KEPT,
        hf_tokenizer_changes,
        keep_hf_tokenizer,
        load_tokenizer,
        same_hf_tokenizer,
        tokenizer_identity,
    )

    folder = hf_folder(tmp_path / "src", "Qwen2")
    (folder / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    tok = load_tokenizer(DataConfig(tokenizer=f"hf:{folder}"))
    (tmp_path / "run").mkdir()
    assert keep_hf_tokenizer(tok, tmp_path / "run") is None
    kept = tmp_path / "run" / HF_KEPT
    assert hf_tokenizer_changes(kept, folder) == []
    (kept / "chat_template.jinja").write_text("{{ messages[-1]['content'] }}")
    assert hf_tokenizer_changes(kept, folder) == ["chat_template.jinja"]
    assert not same_hf_tokenizer(load_tokenizer(DataConfig(tokenizer=f"hf:{kept}")), tok)
    other = load_tokenizer(DataConfig(tokenizer=f"hf:{folder}"))
    assert same_hf_tokenizer(other, tok)
    other._impl.tok.chat_template = "{{ messages[-1]['content'] }}"
    assert tokenizer_identity(other) == tokenizer_identity(tok) and not same_hf_tokenizer(other, tok)
