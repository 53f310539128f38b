"""Unit tests of iattention.interop.load."""

import pytest
import torch

from iattention.interop import load_model


@pytest.mark.parametrize("dtype", [torch.int64, torch.float16])
def test_checkpoint_with_weights_of_another_dtype_is_refused(tmp_path, dtype):
    """A checkpoint whose weights were cast (int64, or fp16 among fp32 tensors) must not load silently."""
    from safetensors.torch import load_file, save_file

    from helpers import make_model
    from iattention.checkpoint import state as ckpt
    from iattention.errors import UserError

    model = make_model(dtype=torch.float32)
    ckpt.save_checkpoint(tmp_path / "m.safetensors", model, {"config": {"model": model.config.to_dict()}})
    load_model(tmp_path / "m.safetensors")  # as saved: loads
    from safetensors import safe_open

    with safe_open(str(tmp_path / "m.safetensors"), "pt") as f:
        metadata = f.metadata()
    tensors = load_file(str(tmp_path / "m.safetensors"))
    key = next(k for k in tensors if k.endswith("mlp.c_fc.weight"))
    tensors[key] = tensors[key].to(dtype)
    save_file(tensors, str(tmp_path / "bad.safetensors"), metadata=metadata)
    with pytest.raises(UserError, match="holds .*mlp.c_fc.weight as"):
        load_model(tmp_path / "bad.safetensors")


def test_a_checkpoint_trained_with_a_forced_kernel_loads_and_runs_here(tmp_path):
    """model.attn_kernel=triton in a checkpoint's config (a run trained on a GPU) must not stop eval, convert or
    generate on a CPU: the kernel is where a run executed; the loaded model takes what runs here."""
    from helpers import make_model
    from iattention.checkpoint import state as ckpt

    model = make_model(dtype=torch.float32)
    config = {**model.config.to_dict(), "attn_kernel": "triton", "dropout": 0.0}
    ckpt.save_checkpoint(tmp_path / "m.safetensors", model, {"config": {"model": config}})
    loaded, _ = load_model(tmp_path / "m.safetensors")
    x = torch.randint(0, model.config.vocab_size, (1, 5))
    assert loaded.config.attn_kernel == "auto"
    torch.testing.assert_close(loaded(x)[0], model.eval()(x)[0], rtol=0, atol=0)


def test_load_run_names_its_keyword_where_the_cli_names_its_flag(tmp_path):
    """A checkpoint that does not say its tokenizer: from Python, load_run's error tells the keyword to pass
    (tokenizer=), never the command line's --tokenizer, and that keyword works; the CLI's path (eval, generate,
    convert: data_config_for's default) still names --tokenizer."""
    from helpers import make_model
    from iattention import load_run
    from iattention.checkpoint import state as ckpt
    from iattention.errors import UserError
    from iattention.interop.load import data_config_for

    model = make_model(dtype=torch.float32)
    ckpt.save_checkpoint(tmp_path / "m.safetensors", model, {"config": {"model": model.config.to_dict()}})
    with pytest.raises(UserError) as err:
        load_run(tmp_path / "m.safetensors")
    assert "load_run(..., tokenizer=SPEC)" in str(err.value) and "--tokenizer" not in str(err.value)
    loaded, tok = load_run(tmp_path / "m.safetensors", tokenizer="byte")
    assert list(tok.encode("ab")) == [97, 98] and loaded.config.n_embd == model.config.n_embd
    with pytest.raises(UserError, match="pass --tokenizer"):
        data_config_for(None, "m.safetensors")
