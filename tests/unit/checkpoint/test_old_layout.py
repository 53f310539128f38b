"""Checkpoints written by the two-family layout (tests/fixtures_data/old_layout, made at 6cd6bb0: GPT-2 and
Llama-family models of every variant) load with today's loader and give the logits they gave then."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from iattention.interop.load import load_model

OLD = Path(__file__).resolve().parents[2] / "fixtures_data" / "old_layout"
NAMES = ["gpt2-standard", "gpt2-canonical", "gpt2-canonical-vo-minimal", "gpt2-identity_q", "gpt2-identity_ko",
         "llama-standard", "llama-canonical", "qwen2-tied-standard"]


@pytest.mark.parametrize("name", NAMES)
def test_a_checkpoint_of_the_two_family_layout_loads_with_its_logits(name):
    expected = load_file(str(OLD / "logits.safetensors"))
    model, _ = load_model(OLD / f"{name}.safetensors")
    assert model.transformer.wte.weight.dtype == torch.float64
    with torch.no_grad():
        got = model(expected["tokens"])[0]
    torch.testing.assert_close(got, expected[name], rtol=0, atol=1e-12)


def test_the_old_llama_names_are_renamed_not_dropped():
    """Every tensor of an old Llama-family canonical checkpoint lands in today's model (a strict load)."""
    model, meta = load_model(OLD / "llama-canonical.safetensors")
    assert meta["config"]["model"]["family"] == "llama"
    assert model.config.attention == "canonical" and model.config.n_kv_head == 2 and model.config.rot == 4
    names = dict(model.named_parameters())
    assert "transformer.h.1.attn.W_K_free" in names and "transformer.h.1.attn.W_K_rot_free" in names
