"""What a folder iattention writes carries beside its weights for other tools: a config.json that says it is
iattention's (`config_beside`), and the shim its `auto_map` names, through which transformers
(`AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`) imports `iattention.hf_model`'s classes;
and the reading of a folder `IAttentionForCausalLM.save_pretrained` wrote (transformers' files, our names)."""

from __future__ import annotations

import json
from pathlib import Path

from iattention.checkpoint import state as ckpt
from iattention.checkpoint.run_folder import read_json_object

# The model_type a converted folder's config.json carries, so that transformers' refusal names what the folder is
# (before, it said only "Should have a model_type key"); with a note for whoever opens the file.
OURS_MODEL_TYPE = "iattention"
OURS_NOTE = ("an iattention checkpoint (model.safetensors); read it with iattention (iattn eval, load_any), with "
             "transformers (AutoModelForCausalLM.from_pretrained(THIS_FOLDER, trust_remote_code=True), iattention "
             "installed), or make a standard transformers folder of it: iattn convert --from THIS_FOLDER --to hf")
# The shim beside it that config.json's auto_map names: transformers (trust_remote_code=True) imports the classes
# through it from iattention (hf_model), or says in one line that iattention is not installed.
SHIM = "iattention_hf.py"
AUTO_MAP = {"AutoConfig": "iattention_hf.IAttentionConfig",
            "AutoModelForCausalLM": "iattention_hf.IAttentionForCausalLM"}
SHIM_TEXT = '''"""Written by iattention: transformers loads this folder through it (trust_remote_code=True)."""
try:
    from iattention.hf_model import IAttentionConfig, IAttentionForCausalLM  # noqa: F401
except ModuleNotFoundError as e:
    if e.name not in ("iattention", "iattention.hf_model"):
        raise
    raise ImportError("this folder holds an iattention model, and iattention (0.1 with hf_model, or later) is "
                      "not installed: pip install iattention; or load its standard export (iattn convert --to hf)") \\
        from None
'''


def config_beside(model_config: dict) -> dict:
    """The config.json written beside a converted checkpoint: the model config, said to be iattention's."""
    return {"model_type": OURS_MODEL_TYPE, "note": OURS_NOTE, "auto_map": AUTO_MAP, **model_config}


def write_beside(folder: Path, model_config: dict) -> None:
    """config.json (config_beside) and the shim its auto_map names, beside a converted checkpoint."""
    (folder / "config.json").write_text(json.dumps(config_beside(model_config), indent=2) + "\n")
    (folder / SHIM).write_text(SHIM_TEXT)


def saved_by_transformers(path: Path) -> tuple[dict, dict] | None:
    """(metadata, tensors under our "model/" names) of a file IAttentionForCausalLM.save_pretrained wrote (no metadata
    of ours; its config.json holds the model config under "iattention", hf_model/config.py), else None."""
    beside = path.parent / "config.json"
    if not beside.is_file() or "iattention" in ckpt.read_metadata(path):
        return None
    obj = read_json_object(beside, "a model config", "re-save the model (save_pretrained or iattn convert)")
    if obj.get("model_type") != OURS_MODEL_TYPE or not isinstance(obj.get("iattention"), dict):
        return None
    return {"config": {"model": obj["iattention"]}}, {f"model/{k}": v for k, v in ckpt.load_tensors(path).items()}
