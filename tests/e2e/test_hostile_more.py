"""End-to-end tests: hostile_more (moved from tests/test_hostile_more.py)."""

import contextlib
import json
import os
import shutil
import subprocess
import uuid

import pytest
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from helpers import one_line_error, sparse_checkpoint, tiny_overrides, write_corpus
from iattention.cli import main


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished tiny run (its last.safetensors holds weights, optimizer state and RNG)."""
    root = tmp_path_factory.mktemp("more")
    ov = tiny_overrides(write_corpus(root), root / "cache", **{"train.epochs": 1})
    assert main(["train", "--preset", "tiny", "--quiet", *ov, "--out", str(root / "run")]) == 0
    return dict(root=root, ov=ov, run=root / "run")


# ------------------------------------------------------------------ crafted but parseable checkpoint metadata
def _craft(tensors: dict, meta: dict, case: str) -> None:
    if case == "model.dropout is a string":
        meta["config"]["model"]["dropout"] = "abc"
    elif case == "an extra state key":
        meta["state"]["bogus"] = 1
    elif case == "a state value of another type":
        meta["state"]["step"] = "23"
    elif case == "no optimizer entry":
        del meta["optimizer"]
    elif case == "param_groups not a list":
        meta["optimizer"]["param_groups"] = {"params": 3}
    elif case == "a tensor optim/notanint/...":
        tensors["optim/notanint/exp_avg"] = tensors.pop("optim/0/exp_avg")
    elif case == "an optimizer index beyond the parameters":
        tensors["optim/999/exp_avg"] = tensors.pop("optim/0/exp_avg")
    elif case == "rng/torch as float32":
        tensors["rng/torch"] = tensors["rng/torch"].float()
    elif case == "config a list":
        meta["config"] = [1, 2]
    elif case == "tokenizer not a string":
        meta["tokenizer"] = {"bpe": 300}
    else:
        raise AssertionError(case)


CRAFTED = ["model.dropout is a string", "an extra state key", "a state value of another type", "no optimizer entry",
           "param_groups not a list", "a tensor optim/notanint/...", "an optimizer index beyond the parameters",
           "rng/torch as float32", "config a list", "tokenizer not a string"]


# ------------------------------------------------------------------ a real full disk
@contextlib.contextmanager
def _small_disk(folder, free_bytes: int):
    """A 2 MB tmpfs mounted at `folder`, filled so that about `free_bytes` stay free; always unmounted."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(folder)], capture_output=True,
                           text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"cannot mount a tmpfs here ({e}); needs root (mount -t tmpfs)")
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()[:80]}); needs root (mount -t tmpfs)")
    try:
        st = os.statvfs(folder)
        with open(folder / "filler", "wb") as f:
            f.write(b"\0" * max(0, st.f_bavail * st.f_frsize - free_bytes))
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True, timeout=60)


def _leftovers(folder) -> list[str]:
    """Temp files or folders, or half-written outputs, under folder."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                  if p.name.endswith((".tmp", ".conv")) or p.name.startswith(".") and p.name != ".lock")


# ------------------------------------------------------------------ a header that declares more than the file
@pytest.mark.slow
@pytest.mark.parametrize("case", CRAFTED)
def test_crafted_checkpoint_metadata_is_one_line(run, tmp_path, capsys, case):
    """The fuzz test (test_hostile_files.py) damages bytes; these files parse, with a wrong schema or type."""
    dst = tmp_path / "run"
    shutil.copytree(run["run"], dst)
    path = dst / "last.safetensors"
    tensors = load_file(str(path))
    with safe_open(str(path), "pt") as f:
        meta = json.loads(f.metadata()["iattention"])
    _craft(tensors, meta, case)
    save_file(tensors, str(path), metadata={"iattention": json.dumps(meta)})
    capsys.readouterr()
    rc = main(["train", "--preset", "tiny", "--quiet", *run["ov"], "train.epochs=2", "--out", str(dst), "--resume"])
    one_line_error(capsys, rc, str(path))
    if case in ("model.dropout is a string", "config a list", "tokenizer not a string"):  # read by eval too
        rc = main(["eval", str(path)])
        one_line_error(capsys, rc, str(path))


@pytest.mark.slow
def test_a_real_full_disk_is_one_line(run, tmp_path, capsys):
    """safetensors raises SafetensorError (not OSError) on ENOSPC, numpy's tofile an OSError without errno:
    train (checkpoint, token cache) and convert --to canonical|hf each say "disk full", and leave no
    half-written file behind."""
    mnt = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    with _small_disk(mnt, free_bytes=64 * 1024):
        capsys.readouterr()
        # the checkpoint (weights + AdamW moments, ~260 kB) does not fit
        rc = main(["train", "--preset", "tiny", "--quiet", *run["ov"], "--out", str(mnt / "run")])
        one_line_error(capsys, rc, "disk full while writing", "free space and rerun")
        assert not list((mnt / "run").glob("*.safetensors")), _leftovers(mnt)
        # the token cache on the full disk (the train split is ~12 kB of uint16 ids)
        ov = [o if not o.startswith("data.cache_dir=") else f"data.cache_dir={mnt / 'cache'}" for o in run["ov"]]
        (mnt / "pad").write_bytes(b"\0" * (os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize - 4096))
        rc = main(["train", "--preset", "tiny", "--quiet", *ov, "--out", str(tmp_path / "run2")])
        one_line_error(capsys, rc, "disk full while writing", "free space and rerun")
        (mnt / "pad").unlink()
        for to in ("canonical", "hf"):
            rc = main(["convert", "--from", str(run["run"]), "--to", to, "--out", str(mnt / to)])
            one_line_error(capsys, rc, "disk full while writing", "free space and rerun")
            assert not (mnt / to).exists()
        assert _leftovers(mnt) == [], _leftovers(mnt)
        assert not list((mnt / "cache").rglob("*.bin")), "a half-written token cache was left"


# ------------------------------------------------------------------ an HF config.json of the wrong types
@pytest.mark.slow
@pytest.mark.parametrize("key,value", [("layer_norm_epsilon", "1e-5"), ("n_inner", "big"), ("resid_pdrop", [0.1]),
                                       ("scale_attn_weights", "yes")])
def test_hf_config_of_wrong_types_is_one_line(run, tmp_path, capsys, key, value):
    hf = tmp_path / "hf"
    assert main(["convert", "--from", str(run["run"]), "--to", "hf", "--out", str(hf)]) == 0
    cfg = json.loads((hf / "config.json").read_text())
    cfg[key] = value
    (hf / "config.json").write_text(json.dumps(cfg))
    capsys.readouterr()
    for argv in (["eval", str(hf)], ["convert", "--from", str(hf), "--to", "canonical", "--out", str(tmp_path / "c")]):
        one_line_error(capsys, main(argv), str(hf / "config.json"), repr(key))


# ------------------------------------------------------------------ a damaged tokenizer cache
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


# ------------------------------------------------------------------ absurd sizes
@pytest.mark.slow
@pytest.mark.parametrize("sizes", [["model.n_layer=200000"], ["model.n_embd=12288", "model.n_head=1"],
                                   ["model.block_size=100000"], ["model.vocab_pad_multiple=1000000000"]])
def test_absurd_sizes_are_refused_before_allocating(tmp_path, capsys, monkeypatch, sizes):
    """These reached MemoryError: the check counted float32 weights of the true vocabulary only. The estimate
    now holds the padded vocabulary, gradients, AdamW's moments and one batch's activations. The machine's
    memory is set here (16 GiB, on the CPU): on a 128 GB / 80 GB GPU machine two of these sizes fit."""
    monkeypatch.setattr("iattention.model.gpt.available_memory", lambda device=None: 16 * 2**30)
    paths = write_corpus(tmp_path)
    if "block_size" in sizes[0]:  # enough tokens for one batch of 8 windows of 100,000, and a window to evaluate
        for split in ("train", "valid", "test"):
            with open(paths[split], "w") as f:
                f.write("the cat sat on the mat. " * (40_000 if split == "train" else 5_000))
    ov = tiny_overrides(paths, tmp_path / "cache", **{"train.epochs": 1, "train.device": "cpu"})
    capsys.readouterr()
    rc = main(["train", "--preset", "tiny", "--quiet", *ov, *sizes, "--out", str(tmp_path / "run")])
    line = one_line_error(capsys, rc, "needs an estimated", "16.0 GiB available on this machine", "AdamW moments")
    assert "activations" in line


@pytest.mark.slow
def test_a_header_declaring_gigabytes_over_a_sparse_file_is_refused_unread(run, tmp_path, capsys):
    path = tmp_path / "huge.safetensors"
    sparse_checkpoint(run["run"], path)
    assert path.stat().st_size > 16 * 2**30 and path.stat().st_blocks * 512 < 2**20  # sparse
    capsys.readouterr()
    rc = main(["eval", str(path), "--data-dir", str(run["root"])])
    one_line_error(capsys, rc, "declares 16 GiB of tensors", "sparse or crafted")
