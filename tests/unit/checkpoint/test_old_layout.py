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


STREAMED = Path(__file__).resolve().parents[2] / "fixtures_data" / "streamed_layout"


@pytest.mark.parametrize("name", ["qwen2-canonical", "gpt_neox-standard"])
def test_a_folder_the_streaming_converter_wrote_under_transformers_names_loads_with_its_logits(name):
    """The second layout of before issue 64 (a streamed conversion kept its source's names), read whole."""
    expected = load_file(str(STREAMED / "logits.safetensors"))
    model, meta = load_model(STREAMED / name)
    assert meta["conversion"]["to"] == name.split("-")[1]
    with torch.no_grad():
        got = model.double()(expected["tokens"])[0]
    torch.testing.assert_close(got, expected[name], rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["qwen2-canonical", "gpt_neox-standard"])
def test_a_folder_of_the_streamed_layout_streams_back_to_a_folder_transformers_loads(name, tmp_path):
    """--to hf reads it a layer at a time, its names read under today's (checkpoint/state.py upgrade_key)."""
    tf = pytest.importorskip("transformers")
    if int(tf.__version__.split(".")[0]) < 5:
        pytest.skip("streamed conversion needs transformers 5")
    from iattention.interop.stream import is_streamed_source, ours_to_hf

    assert is_streamed_source(STREAMED / name)
    ours_to_hf(STREAMED / name, tmp_path / "hf", say=lambda *_: None)
    expected = load_file(str(STREAMED / "logits.safetensors"))
    hf = tf.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float64).eval()
    with torch.no_grad():
        got = hf(expected["tokens"]).logits
    assert ((got - expected[name]).abs().max() / expected[name].abs().max()).item() < 1e-6
