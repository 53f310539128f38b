"""Loading an iattention checkpoint (any of ours: run checkpoints or converted models)."""

from __future__ import annotations

from pathlib import Path

from iattention.config import GPTConfig
from iattention.errors import UserError
from iattention.model.gpt import GPT
from iattention.train import checkpoint as ckpt


def load_model(path: str | Path) -> tuple[GPT, dict]:
    """(model in eval mode, metadata) from an iattention .safetensors file; never unpickles."""
    path = Path(path)
    if path.is_dir():
        for name in ("best.safetensors", "model.safetensors", "last.safetensors"):
            if (path / name).is_file():
                path = path / name
                break
        else:
            raise UserError(f"{path} holds no iattention checkpoint (best/model/last.safetensors)")
    meta = ckpt.read_meta(path)
    model_cfg = (meta.get("config") or {}).get("model")
    if not isinstance(model_cfg, dict):
        raise UserError(f"checkpoint {path} has no model config; it was not written by iattention")
    model = GPT(GPTConfig.from_dict(model_cfg))
    ckpt.load_model_state(model, ckpt.load_tensors(path), path)
    return model.eval(), meta
