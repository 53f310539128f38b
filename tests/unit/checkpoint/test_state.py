"""Unit tests of iattention.checkpoint.state (moved from tests/test_checkpoint.py)."""

import json

import pytest
import torch

from helpers import make_model
from iattention.checkpoint import state as ckpt
from iattention.errors import UserError


def test_checkpoint_metadata_that_is_not_ours_is_refused(tmp_path):
    from safetensors.torch import save_file

    model = make_model(dtype=torch.float32)
    path = tmp_path / "x.safetensors"
    for meta in ("not json", "[1]", json.dumps({"format": "other"})):
        save_file(ckpt.model_tensors(model), str(path), metadata={"iattention": meta})
        with pytest.raises(UserError, match="x.safetensors"):
            ckpt.read_meta(path)
    path.write_bytes(b"\x80\x04pickle behind a safetensors name")
    with pytest.raises(UserError, match="corrupt or truncated"):
        ckpt.read_meta(path)
