"""Module-scoped runs that several e2e topic files start from (each module that asks trains its own)."""

import pytest

from helpers import SWEEP_RUN as RUN
from helpers import tiny_overrides, write_corpus
from iattention.cli import main


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished sweep run (with arm.json), a converted canonical model and an HF export of it."""
    root = tmp_path_factory.mktemp("hostile")
    ov = tiny_overrides(write_corpus(root), root / "cache", **{"train.epochs": 1})
    sweep = ["sweep", "--preset", "tiny", "--arms", "standard", "--heads", "2", "--seeds", "0", *ov]
    assert main([*sweep, "--out", str(root / "sw")]) == 0
    run = root / "sw" / RUN
    assert main(["convert", "--from", str(run), "--to", "canonical", "--out", str(root / "canonical")]) == 0
    assert main(["convert", "--from", str(run), "--to", "hf", "--out", str(root / "hf")]) == 0
    return dict(root=root, ov=ov, sweep=sweep, run=run)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A finished sweep run (with arm.json), a converted canonical model and an HF export of it."""
    root = tmp_path_factory.mktemp("trusted")
    paths = write_corpus(root)
    ov = tiny_overrides(paths, root / "cache", **{"train.epochs": 1})
    sweep = ["sweep", "--preset", "tiny", "--arms", "standard", "--heads", "2", "--seeds", "0", *ov]
    assert main([*sweep, "--out", str(root / "sw")]) == 0
    run = root / "sw" / RUN
    assert main(["convert", "--from", str(run), "--to", "canonical", "--out", str(root / "canonical")]) == 0
    assert main(["convert", "--from", str(run), "--to", "hf", "--out", str(root / "hf")]) == 0
    return dict(root=root, ov=ov, sweep=sweep, run=run, paths=paths)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished tiny run (its last.safetensors holds weights, optimizer state and RNG)."""
    root = tmp_path_factory.mktemp("more")
    ov = tiny_overrides(write_corpus(root), root / "cache", **{"train.epochs": 1})
    assert main(["train", "--preset", "tiny", "--quiet", *ov, "--out", str(root / "run")]) == 0
    return dict(root=root, ov=ov, run=root / "run")


@pytest.fixture(scope="module")
def run_and_corpus(tmp_path_factory):
    """A finished 1-epoch tiny run (byte tokenizer) and the corpus it read."""
    root = tmp_path_factory.mktemp("round3")
    paths = write_corpus(root)
    ov = tiny_overrides(paths, root / "cache", **{"train.epochs": 1, "train.threads": 1})
    assert main(["train", "--preset", "tiny", "--quiet", *ov, "--out", str(root / "run")]) == 0
    return dict(root=root, ov=ov, run=root / "run", paths=paths)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("notours")
    paths = write_corpus(root)
    return dict(root=root, ov=tiny_overrides(paths, root / "cache", **{"train.epochs": 1}))
