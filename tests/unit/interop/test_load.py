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
