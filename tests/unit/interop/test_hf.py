"""Unit tests of iattention.interop.hf."""

import pytest
import torch

from helpers import max_rel
from iattention.errors import SingularBlockError
from iattention.interop import from_hf, to_hf
from iattention.symmetry import canonicalize

tf = pytest.importorskip("transformers")


SHAPES = [dict(n_layer=2, n_embd=96, n_head=3), dict(n_layer=4, n_embd=64, n_head=1),
          dict(n_layer=1, n_embd=40, n_head=4), dict(n_layer=1, n_embd=32, n_head=2, n_inner=100)]


def _hf(dtype=torch.float64, **shape):
    torch.manual_seed(0)
    cfg = tf.GPT2Config(vocab_size=211, n_positions=24, bos_token_id=None, eos_token_id=None, **shape)
    hf = tf.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # non-zero biases and LayerNorm affine, so every parameter matters
        for name, p in hf.named_parameters():
            if p.dim() == 1:
                p.normal_(0.0 if name.endswith("bias") else 1.0, 0.1)
    return hf.to(dtype)


def _x():
    return torch.randint(0, 211, (3, 24), generator=torch.Generator().manual_seed(1))


@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("block", ["aligned", "pivoted"])
def test_round_trips_float64(shape, block):
    hf = _hf(**shape)
    ref = hf(_x()).logits
    ours = from_hf(hf)
    assert (ours(_x())[0] - ref).abs().max().item() <= 1e-9
    assert (to_hf(ours)(_x()).logits - ref).abs().max().item() <= 1e-9
    canon = canonicalize(ours, block=block)
    assert canon.num_params() < ours.num_params()
    assert (canon(_x())[0] - ref).abs().max().item() <= 1e-9
    assert (to_hf(canon)(_x()).logits - ref).abs().max().item() <= 1e-9


@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES)
def test_round_trips_float32(shape):
    hf = _hf(dtype=torch.float32, **shape)
    ref = hf(_x()).logits
    canon = canonicalize(from_hf(hf), block="pivoted")
    assert canon.transformer.wte.weight.dtype == torch.float32
    assert max_rel(to_hf(canon)(_x()).logits, ref) <= 1e-4


def test_singular_block_from_hf_is_reported_and_pivoted_handles_it():
    hf = _hf(**SHAPES[0])
    with torch.no_grad():  # zero the aligned key block of layer 0, head 1 (input rows 32..63, key cols 32..63)
        hf.transformer.h[0].attn.c_attn.weight[32:64, 96 + 32: 96 + 64] = 0.0
    ours = from_hf(hf)
    with pytest.raises(SingularBlockError, match="layer 0 head 1"):
        canonicalize(ours, block="aligned")
    canon = canonicalize(ours, block="pivoted")
    assert (canon(_x())[0] - hf(_x()).logits).abs().max().item() <= 1e-9


def test_hf_folder_missing_a_tensor_is_refused_naming_it(tmp_path):
    """transformers would fill a missing tensor with a random init (a silently different model)."""
    from safetensors.torch import load_file, save_file

    from iattention.errors import UserError

    hf = _hf(dtype=torch.float32, **SHAPES[0])
    hf.save_pretrained(str(tmp_path / "ok"), safe_serialization=True)
    from_hf(tmp_path / "ok")  # intact: loads
    tensors = load_file(str(tmp_path / "ok" / "model.safetensors"))
    del tensors["transformer.h.1.mlp.c_fc.weight"]
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "config.json").write_bytes((tmp_path / "ok" / "config.json").read_bytes())
    save_file(tensors, str(tmp_path / "cut" / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UserError, match=r"missing tensor\(s\) .*h\.1\.mlp\.c_fc\.weight"):
        from_hf(tmp_path / "cut")
