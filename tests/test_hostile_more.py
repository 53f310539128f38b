"""Hostile inputs of issue 31 §3 that used to end in a traceback, a hang or a memory blow-up: a real full
disk, absurd sizes, a safetensors header that declares more than the file or the machine holds, a damaged
tokenizer cache, crafted but parseable checkpoint metadata, an HF config.json of the wrong types, and BPE
training on text without spaces. Each must be one line `iattn: error: ...` (exit 2), or just work."""

import contextlib
import json
import os
import shutil
import subprocess
import uuid

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from helpers import tiny_overrides, write_corpus
from iattention.cli import main


def _one_line_error(capsys, rc, *must):
    err = capsys.readouterr().err
    lines = [x for x in err.strip().splitlines() if x.startswith("iattn: error:")]
    assert rc == 2, err
    assert "Traceback" not in err, err
    assert len(lines) == 1, err
    for m in must:
        assert m in lines[0], err
    return lines[0]


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
    else:
        raise AssertionError(case)


CRAFTED = ["model.dropout is a string", "an extra state key", "a state value of another type", "no optimizer entry",
           "param_groups not a list", "a tensor optim/notanint/...", "an optimizer index beyond the parameters",
           "rng/torch as float32", "config a list"]


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
    _one_line_error(capsys, rc, str(path))
    if case in ("model.dropout is a string", "config a list"):  # read by eval too
        rc = main(["eval", str(path)])
        _one_line_error(capsys, rc, str(path))
