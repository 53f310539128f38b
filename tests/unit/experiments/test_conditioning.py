"""`iattn conditioning`: which models it studies (the GPT-2-small reference takes minutes on a CPU, so it
runs with --gpt2 or when no checkpoint is given)."""

from __future__ import annotations

import argparse
import types

import pytest

from iattention.errors import UserError
from iattention.experiments import conditioning

pytest.importorskip("transformers")


@pytest.fixture
def studied(monkeypatch):
    """Runs `conditioning.run` with the studies and the data replaced by recorders; returns the labels."""
    labels: list[str] = []

    def fake_study(model, tokens, label, block_size):
        labels.append(label)
        return {"model": label, "tokens": 0, "original_ppl": {"float32": 1.0, "bfloat16": 1.0}, "blocks": {}}

    tiny = types.SimpleNamespace(config=types.SimpleNamespace(block_size=8, pos="learned"))
    monkeypatch.setattr(conditioning, "study", fake_study)
    monkeypatch.setattr(conditioning, "load_data", lambda cfg, splits: types.SimpleNamespace(splits={"test": [0] * 9}))
    monkeypatch.setattr(conditioning, "load_model", lambda path: (tiny, {"config": {"data": {}}}))
    monkeypatch.setattr(conditioning, "from_hf", lambda hf: tiny)
    monkeypatch.setattr("transformers.GPT2LMHeadModel", lambda cfg: None)

    def run(*argv):
        p = argparse.ArgumentParser()
        conditioning.add_arguments(p)
        conditioning.run(p.parse_args(list(argv)))
        return labels

    return run


def test_a_checkpoint_alone_skips_the_gpt2_reference(studied):
    assert [lab.split(":")[0] for lab in studied("--checkpoint", "RUN/best.safetensors")] == ["trained by iattention"]


def test_gpt2_reference_with_the_flag_or_without_a_checkpoint(studied):
    assert [lab[:12] for lab in studied("--checkpoint", "x.safetensors", "--gpt2")] == ["GPT-2 small ", "trained by i"]


def test_gpt2_reference_without_a_checkpoint(studied):
    assert [lab[:12] for lab in studied()] == ["GPT-2 small "]


def test_a_rotary_checkpoint_is_refused_before_the_gpt2_reference(studied, monkeypatch):
    rotary = types.SimpleNamespace(config=types.SimpleNamespace(block_size=8, pos="rope", family="llama", rot=16))
    monkeypatch.setattr(conditioning, "load_model", lambda path: (rotary, {"config": {"data": {}}}))
    with pytest.raises(UserError, match=r"llama\) has 16 per head; iattn convert --from it --to canonical"):
        studied("--checkpoint", "RUN/best.safetensors", "--gpt2")
