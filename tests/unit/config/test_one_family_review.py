"""Cases a review of the one-family change found: each was wrong before its fix."""

import pytest
import torch

from iattention.config import load_config
from iattention.config.model import GPTConfig
from iattention.config.shapes import shape_preset
from iattention.errors import UserError
from iattention.interop.convert import check_exportable, save_converted
from iattention.model.gpt import GPT
from iattention.symmetry.transforms import expand


def test_one_canonical_head_narrower_than_the_model_is_not_an_index_copy():
    """n_head = 1 with d_head < n_embd: the keys are not a permutation of the input (was a shape error)."""
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=16, d_head=8, vocab_size=32, block_size=8,
                          attention="canonical")).double()
    x = torch.randint(0, 32, (2, 8))
    torch.testing.assert_close(model(x)[0], expand(model)(x)[0], rtol=0, atol=1e-12)


def test_an_old_arch_that_contradicts_the_family_is_refused():
    with pytest.raises(UserError, match="model.arch=gpt and model.family=llama disagree"):
        load_config("llama-cpu", None, ["model.arch=gpt"])
    assert load_config("tiny", None, ["model.arch=llama"]).model.family == "llama"


@pytest.mark.parametrize("value", ["[llama]", "{a: 1}", "3"])
def test_an_old_arch_of_another_type_is_one_line(value):
    """model.arch=[llama] ended in TypeError: unhashable type: 'list' (it was looked up in a dict before any
    check)."""
    with pytest.raises(UserError, match="unknown model.arch"):
        load_config("tiny", None, [f"model.arch={value}"])
    with pytest.raises(UserError, match="model.family"):
        load_config("tiny", None, [f"model.family={value}"])


def test_a_neox_shape_takes_other_head_counts():
    """GPT-NeoX has one key/value head per query head: its n_kv_head follows n_head (was refused)."""
    assert shape_preset("pythia-160m").replace(n_head=4).n_kv_head == 4
    assert GPTConfig(family="llama", n_head=4, n_kv_head=2, n_embd=64).replace(n_head=8).n_kv_head == 2


@pytest.mark.parametrize("kw,key", [(dict(n_kv_head=1), "n_kv_head"), (dict(mlp="swiglu"), "mlp"),
                                    (dict(tie_embeddings=False), "tie_embeddings"),
                                    (dict(parallel_residual=True), "parallel_residual")])
def test_a_structure_its_family_class_cannot_hold_is_refused_before_export(kw, key):
    """A gpt2 model with a Llama-like key exported to GPT2LMHeadModel: a traceback, or (untied head) a model with
    other logits; now one line naming the key."""
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=16, vocab_size=32, block_size=8, **kw)
    with pytest.raises(UserError, match=f"model.{key}="):
        check_exportable(cfg)
    check_exportable(GPTConfig(n_layer=1, n_head=2, n_embd=16, vocab_size=32, block_size=8))


def test_a_llama_folder_under_our_names_is_not_taken_for_a_streamed_one(tmp_path):
    """A Llama-family folder written by the whole-model conversion loads whole for --to hf; only the streaming
    converter's folders (their metadata holds its per-layer check) are streamed back."""
    from iattention.interop.convert import convert
    from iattention.interop.stream import is_streamed_source

    model = GPT(GPTConfig(family="llama", n_layer=1, n_head=4, n_kv_head=2, n_embd=32, mlp_hidden=48,
                          vocab_size=40, block_size=16))
    canon, rep = convert(model, "canonical", dtype="float32")
    save_converted(canon, tmp_path / "c", "canonical", rep, source="test")
    assert not is_streamed_source(tmp_path / "c")
