"""Unit tests of iattention.interop.hf."""

import pytest
import torch

from fixtures import HF_SHAPES, hf_gpt2, hf_tokens
from helpers import max_rel
from iattention.errors import SingularBlockError
from iattention.interop import from_hf, to_hf
from iattention.symmetry import canonicalize

tf = pytest.importorskip("transformers")


@pytest.mark.slow
@pytest.mark.parametrize("shape", HF_SHAPES)
@pytest.mark.parametrize("block", ["aligned", "pivoted"])
def test_round_trips_float64(shape, block):
    hf = hf_gpt2(**shape)
    ref = hf(hf_tokens()).logits
    ours = from_hf(hf)
    assert (ours(hf_tokens())[0] - ref).abs().max().item() <= 1e-9
    assert (to_hf(ours)(hf_tokens()).logits - ref).abs().max().item() <= 1e-9
    canon = canonicalize(ours, block=block)
    assert canon.num_params() < ours.num_params()
    assert (canon(hf_tokens())[0] - ref).abs().max().item() <= 1e-9
    assert (to_hf(canon)(hf_tokens()).logits - ref).abs().max().item() <= 1e-9


@pytest.mark.slow
@pytest.mark.parametrize("shape", HF_SHAPES)
def test_round_trips_float32(shape):
    hf = hf_gpt2(dtype=torch.float32, **shape)
    ref = hf(hf_tokens()).logits
    canon = canonicalize(from_hf(hf), block="pivoted")
    assert canon.transformer.wte.weight.dtype == torch.float32
    assert max_rel(to_hf(canon)(hf_tokens()).logits, ref) <= 1e-4


def test_singular_block_from_hf_is_reported_and_pivoted_handles_it():
    hf = hf_gpt2(**HF_SHAPES[0])
    with torch.no_grad():  # zero the aligned key block of layer 0, head 1 (input rows 32..63, key cols 32..63)
        hf.transformer.h[0].attn.c_attn.weight[32:64, 96 + 32: 96 + 64] = 0.0
    ours = from_hf(hf)
    with pytest.raises(SingularBlockError, match="layer 0 head 1"):
        canonicalize(ours, block="aligned")
    canon = canonicalize(ours, block="pivoted")
    assert (canon(hf_tokens())[0] - hf(hf_tokens()).logits).abs().max().item() <= 1e-9


def test_hf_folder_missing_a_tensor_is_refused_naming_it(tmp_path):
    """transformers would fill a missing tensor with a random init (a silently different model)."""
    from safetensors.torch import load_file, save_file

    from iattention.errors import UserError

    hf = hf_gpt2(dtype=torch.float32, **HF_SHAPES[0])
    hf.save_pretrained(str(tmp_path / "ok"), safe_serialization=True)
    from_hf(tmp_path / "ok")  # intact: loads
    tensors = load_file(str(tmp_path / "ok" / "model.safetensors"))
    del tensors["transformer.h.1.mlp.c_fc.weight"]
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "config.json").write_bytes((tmp_path / "ok" / "config.json").read_bytes())
    save_file(tensors, str(tmp_path / "cut" / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UserError, match=r"missing tensor\(s\) .*h\.1\.mlp\.c_fc\.weight"):
        from_hf(tmp_path / "cut")
