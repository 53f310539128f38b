"""Tokenizers and caches: a damaged token-cache entry or BPE tokenizer cache is rebuilt (to the same numbers);
a foreign, edited or hostile tokenizer.json is refused in one line."""

import json
import os

import pytest

from helpers import copy_tree as _copy_folder
from helpers import eval_ppl as _ppl
from helpers import one_line_error, tiny_overrides, write_corpus
from iattention.cli import main


# ------------------------------------------------------------------ token caches: damaged entries are rebuilt
@pytest.mark.slow
def test_a_token_cache_overwritten_with_other_ids_is_rebuilt_not_read(finished, capsys):
    """The token cache has no reader to refuse from: a damaged one is rebuilt with a notice, and the
    number is the intact cache's."""
    assert main(["eval", str(finished["run"]), "--json"]) == 0
    intact = json.loads(capsys.readouterr().out)["ppl"]
    caches = sorted((finished["root"] / "cache" / "tokens").glob("*.tok"))
    assert caches
    for path in caches:
        size = path.stat().st_size
        path.write_bytes(b"\xff" * size)  # same length, every id 65535: beyond a byte tokenizer
    assert main(["eval", str(finished["run"]), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["ppl"] == intact
    assert "rebuilding it" in captured.err


@pytest.mark.slow
def test_a_token_cache_whose_ids_change_under_an_intact_header_is_rebuilt_not_read(finished, capsys):
    """Ids the tokenizer has, the count and key as recorded: only the content hash in the header tells."""
    assert main(["eval", str(finished["run"]), "--json"]) == 0
    intact = json.loads(capsys.readouterr().out)["ppl"]
    for entry in (finished["root"] / "cache" / "tokens").glob("*.tok"):
        data = bytearray(entry.read_bytes())
        data[-4:] = b"a\0b\0"  # the last two ids: 'a', 'b' (valid bytes)
        entry.write_bytes(bytes(data))
    assert main(["eval", str(finished["run"]), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["ppl"] == intact and "rebuilding it" in captured.err


def test_a_cache_entry_linked_to_another_split_s_is_rebuilt_not_read(capsys, run_and_corpus):
    """The valid split's cache entry replaced by a link to the test split's (both splits of one size):
    `eval --split valid` reported the test perplexity. Each entry's header names its key and content hash."""
    from iattention.data.cache import cache_key
    from iattention.data.sources import read_text_file

    valid, test = (_ppl(capsys, run_and_corpus["run"], "--split", s) for s in ("valid", "test"))
    assert valid != test
    entries = run_and_corpus["root"] / "cache" / "tokens"
    entry = {s: next(p for p in entries.glob(
        f"{cache_key(read_text_file(run_and_corpus['paths'][s], s), 'byte')}.uint16.*")
                     if not p.name.endswith(".len")) for s in ("valid", "test")}
    entry["valid"].unlink()
    entry["valid"].symlink_to(entry["test"].name)
    try:
        assert main(["eval", str(run_and_corpus["run"]), "--split", "valid", "--json"]) == 0
        out, err = capsys.readouterr()
        assert json.loads(out)["ppl"] == valid and "rebuilding it" in err
        assert not entry["valid"].is_symlink() and _ppl(capsys, run_and_corpus["run"], "--split", "test") == test
    finally:
        if entry["valid"].is_symlink():
            entry["valid"].unlink()


# ------------------------------------------------------------------ the BPE tokenizer cache
@pytest.mark.slow
@pytest.mark.parametrize("damage", [b"", b'{"version": "1.0", "trunc', b"\xff\x00garbage"])
def test_damaged_bpe_tokenizer_cache_is_rebuilt(run, tmp_path, capsys, damage):
    """A cut-short or empty cache/tokenizers/bpe300-*.json used to break every later bpe:300 run."""
    ov = [o for o in run["ov"] if not o.startswith(("data.tokenizer=", "data.cache_dir="))]
    ov += ["data.tokenizer=bpe:300", f"data.cache_dir={tmp_path / 'cache'}"]
    assert main(["train", "--preset", "tiny", "--quiet", *ov, "--out", str(tmp_path / "a")]) == 0
    (cached,) = (tmp_path / "cache" / "tokenizers").glob("bpe300-*.json")
    good = cached.read_bytes()
    cached.write_bytes(damage)
    capsys.readouterr()
    assert main(["train", "--preset", "tiny", "--quiet", *ov, "--out", str(tmp_path / "b")]) == 0
    assert "rebuilding it" in capsys.readouterr().err
    assert cached.read_bytes() == good  # rebuilt to the very same tokenizer
    same = json.loads((tmp_path / "a" / "summary.json").read_text())["best_val_ppl"]
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["best_val_ppl"] == same


def test_bpe_on_wikitext_is_the_tokenizer_it_always_was(tmp_path):
    """Committed results depend on bpe:4096 on WikiText-2: the tokenizer trained the way it always was (its
    lines, whole) must equal ours, byte for byte (here on the first 100k characters)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    from helpers import shared_data_dir
    from iattention.data.config import DataConfig
    from iattention.data.tokenizers import load_tokenizer

    if shared_data_dir() is None:
        pytest.skip("no local WikiText-2 (set IATTN_DATA_DIR)")
    with open(os.path.join(shared_data_dir(), "wikitext-2-v1", "wiki.train.tokens"), encoding="utf-8") as f:
        text = f.read()[:100_000]
    old = HFTokenizer(models.BPE())
    old.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    old.decoder = decoders.ByteLevel()
    old.train_from_iterator(text.splitlines(keepends=True), trainer=trainers.BpeTrainer(
        vocab_size=4096, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    load_tokenizer(DataConfig(tokenizer="bpe:4096", cache_dir=str(tmp_path)), text)
    (cached,) = (tmp_path / "tokenizers").glob("bpe4096-*.json")
    assert cached.read_text(encoding="utf-8") == old.to_str()


# ------------------------------------------------------------------ foreign or edited tokenizers
@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory):
    """A finished 1-epoch bpe:300 run (it keeps its tokenizer.json) and its HF export."""
    root = tmp_path_factory.mktemp("bpe")
    ov = tiny_overrides(write_corpus(root), root / "cache", **{"train.epochs": 1, "data.tokenizer": "bpe:300"})
    assert main(["train", "--preset", "tiny", "--quiet", *ov, "--out", str(root / "run")]) == 0
    assert main(["convert", "--from", str(root / "run"), "--to", "hf", "--out", str(root / "hf")]) == 0
    return dict(root=root, run=root / "run", hf=root / "hf")


def _foreign_tokenizer(path, size=270) -> None:
    """A byte-level BPE trained on other text, smaller than the run's (so no vocabulary check catches it)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["other words entirely, quite unlike the corpus; " * 50], trainer=trainer)
    tok.save(str(path))


@pytest.mark.parametrize("command", ["eval", "generate", "convert"])
def test_a_tokenizer_swapped_into_a_run_is_refused(tmp_path, capsys, bpe_run, command):
    """`cp other-run/tokenizer.json run/`: the run was scored with it (71.45 instead of 38.31) whenever it was
    not larger than the model's vocabulary. The checkpoint records what its tokenizer maps text to."""
    run = _copy_folder(bpe_run["run"], tmp_path / "run")
    _foreign_tokenizer(run / "tokenizer.json")
    argv = {"eval": ["eval", str(run), "--split", "test"],
            "generate": ["generate", str(run), "--prompt", "the cat", "--max-new-tokens", "3"],
            "convert": ["convert", "--from", str(run), "--to", "hf", "--out", str(tmp_path / "hf")]}[command]
    one_line_error(capsys, main(argv), "tokenizer", "bpe:300")
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("edit", ["byte", "bpe:400", "foreign tokenizer.json"])
def test_an_export_with_an_edited_tokenizer_is_refused(tmp_path, capsys, bpe_run, edit):
    """An export's iattention-data.json edited to another tokenizer name labelled the right numbers with the
    wrong tokenizer (or scored with another one); its recorded fingerprint says which tokenizer it carries."""
    hf = _copy_folder(bpe_run["hf"], tmp_path / "hf")
    if edit == "foreign tokenizer.json":
        _foreign_tokenizer(hf / "tokenizer.json")
    else:
        spec = json.loads((hf / "iattention-data.json").read_text())
        (hf / "iattention-data.json").write_text(json.dumps({**spec, "tokenizer": edit}))
    one_line_error(capsys, main(["eval", str(hf), "--split", "test"]), "tokenizer")


def test_an_intact_run_and_export_score_with_their_own_tokenizer(capsys, bpe_run):
    """The record refuses only a swap: the run and its export evaluate, with the same perplexity."""
    assert abs(_ppl(capsys, bpe_run["hf"], "--split", "test") / _ppl(capsys, bpe_run["run"], "--split", "test") - 1) \
        < 1e-6


@pytest.mark.parametrize("pre_tokenizer", [
    {"type": "Split", "pattern": {"Regex": "(a+)+$"}, "behavior": "Isolated", "invert": False},
    {"type": "Sequence", "pretokenizers": [{"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                            "use_regex": True}]}])
def test_a_hostile_tokenizer_json_is_one_line_not_a_panic(tmp_path, capsys, bpe_run, pre_tokenizer):
    """A Split pre-tokenizer with a backtracking regex made the tokenizers library panic (PanicException, a
    BaseException) on `eval --text`. Only the byte-level BPE we write is read."""
    run = _copy_folder(bpe_run["run"], tmp_path / "run")
    data = json.loads((run / "tokenizer.json").read_text())
    (run / "tokenizer.json").write_text(json.dumps({**data, "pre_tokenizer": pre_tokenizer}))
    (tmp_path / "t.txt").write_text("a" * 5000 + "b\n")
    one_line_error(capsys, main(["eval", str(run), "--text", str(tmp_path / "t.txt")]), "tokenizer.json",
                   "pre_tokenizer")


def test_a_tokenizer_json_that_encodes_otherwise_is_refused_or_adds_nothing(tmp_path, capsys, bpe_run):
    """A run's tokenizer.json edited so that it encodes otherwise: BPE dropout (random splits) is refused by
    name; a post-processor that adds a special token adds none (encoding asks for no special tokens), so the
    perplexity is the run's own."""
    (tmp_path / "t.txt").write_text("the cat sat on the mat. " * 40)
    text = ["--text", str(tmp_path / "t.txt"), "--json"]
    assert main(["eval", str(bpe_run["run"]), *text]) == 0
    own = json.loads(capsys.readouterr().out)["ppl"]
    run = _copy_folder(bpe_run["run"], tmp_path / "run")
    data = json.loads((run / "tokenizer.json").read_text())
    (run / "tokenizer.json").write_text(json.dumps({**data, "model": {**data["model"], "dropout": 0.9}}))
    one_line_error(capsys, main(["eval", str(run), *text]), "tokenizer.json", "dropout")
    first = next(iter(data["model"]["vocab"]))
    template = {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": first, "type_id": 0}},
                                                         {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {first: {"id": first, "ids": [data["model"]["vocab"][first]], "tokens": [first]}}}
    (run / "tokenizer.json").write_text(json.dumps({**data, "post_processor": template}))
    assert main(["eval", str(run), *text]) == 0
    assert json.loads(capsys.readouterr().out)["ppl"] == own
