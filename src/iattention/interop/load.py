"""Loading any model this toolkit reads: our checkpoints, run folders, converted folders, and
Hugging Face model folders, each with the data/tokenizer spec it was trained with."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from iattention.checkpoint import state as ckpt
from iattention.checkpoint.beside import OURS_MODEL_TYPE, saved_by_transformers
from iattention.checkpoint.run_folder import RunFolder, read_json_object
from iattention.config import GPTConfig
from iattention.config.model import normal_form
from iattention.data import DataConfig
from iattention.data.dataset import tokenizer_of
from iattention.data.sources import data_dir_told
from iattention.data.tokenizers import (
    GPT2_VOCAB,
    HF_SPEC,
    Tokenizer,
    kept_copy,
    load_tokenizer,
    tokenizer_from_file,
    tokenizer_identities,
    tokenizer_identity,
)
from iattention.errors import UserError
from iattention.interop.folder import DATA_SPEC_FILE, INDEX, HFFolder, _weight_files, hf_folder
from iattention.interop.hf import from_hf_folder
from iattention.model.gpt import GPT

# In an export's DATA_SPEC_FILE: the tokenizer_identity of the tokenizer it was exported with (a checkpoint
# keeps it in its metadata, under "tokenizer").
TOKENIZER_ID = "tokenizer_fingerprint"
HF_DATA_SPEC = {"dataset": "wikitext-2-v1", "tokenizer": "gpt2"}  # GPT-2's own BPE


def load_model(path: str | Path) -> tuple[GPT, dict]:
    """(model in eval mode, metadata) from an iattention .safetensors file; never unpickles."""
    path = Path(path)
    shards = None
    if path.is_dir():
        found = RunFolder(path).weights()
        if found is None and (path / INDEX).is_file():  # a sharded converted folder (iattn convert --shard-size)
            shards = [path / f for f in _weight_files(path)]
            found = shards[0]
        if found is None:
            raise UserError(f"{path} holds no iattention checkpoint (best/model/last.safetensors)")
        path = found
    theirs = saved_by_transformers(path)
    meta, tensors = theirs or ckpt.read_checkpoint(path)  # one version of a file a live run may be replacing
    RunFolder(path.parent).check_checkpoint(path, meta)
    model_cfg = (meta.get("config") or {}).get("model")
    if not isinstance(model_cfg, dict):
        raise UserError(f"checkpoint {path} has no model config; it was not written by iattention")
    # the kernel a run trained with says where it ran, not what it computes: here, whatever runs here
    model = GPT(GPTConfig.from_dict({**model_cfg, "attn_kernel": "auto"}))
    for file in (shards or [path])[1:]:  # the other shards of a converted folder (no run replaces those)
        if not file.is_file():
            raise UserError(f"{file.parent / INDEX} names shard {file.name}, which is missing; copy the whole model "
                            "folder again, or convert again")
        tensors.update({(ckpt.MODEL if theirs else "") + k: v for k, v in ckpt.load_tensors(file).items()})
    # the embedding, under today's name whatever the layout it was written in (checkpoint/state.py upgrade_key)
    wte = next((v for k, v in tensors.items() if ckpt.upgrade_key(k) == ckpt.MODEL + ckpt.EMBEDDING), None)
    if wte is not None and wte.dtype.is_floating_point:  # a checkpoint saved in bf16/fp64 (convert --dtype)
        model = model.to(wte.dtype)                      # loads in its own dtype; any other mix is refused
    ckpt.load_model_state(model, tensors, path)
    return model.eval(), meta


# How a user names the tokenizer: the CLI's flag, or load_run's keyword argument (API_TOKENIZER) from Python.
CLI_TOKENIZER, API_TOKENIZER = "--tokenizer", "load_run(..., tokenizer=SPEC)"


def _data_spec_beside(folder: Path, flag: str = CLI_TOKENIZER) -> dict | None:
    f = folder / DATA_SPEC_FILE
    if not f.exists():
        return None
    return read_json_object(f, "the model's data spec", f"delete it and pass {flag} (gpt2, byte, bpe:N or hf:FOLDER)",
                            schema={"tokenizer": (str,)})


def own_tokenizer_spec(folder: Path) -> dict | None:
    """The data spec of a Hugging Face folder saved with its own tokenizer (tokenizer.json): `hf:FOLDER`,
    the folder made absolute (the spec is recorded: a converted model's, a run's started from the folder)."""
    return {"tokenizer": f"{HF_SPEC}{os.path.abspath(folder)}"} if (folder / "tokenizer.json").is_file() else None


def folder_tokenizer(path: str | Path) -> str | None:
    """`hf:FOLDER` where load_any reads the model in `path` with the tokenizer.json its folder keeps (a Hugging
    Face folder of a family other than GPT-2, or one of ours converted from it: no data spec), without loading
    the weights; else None."""
    path = Path(path)
    if not path.is_dir() or (path / DATA_SPEC_FILE).exists() or not (path / "tokenizer.json").is_file():
        return None
    if (folder := hf_folder(path)) is not None:
        return None if folder.read_with else own_tokenizer_spec(path)["tokenizer"]
    found = RunFolder(path).weights() or (path / _weight_files(path)[0] if (path / INDEX).is_file() else None)
    if found is None or not found.is_file() or (ckpt.read_meta(found).get("config") or {}).get("data"):
        return None
    return own_tokenizer_spec(path)["tokenizer"]


def load_any(path: str | Path | HFFolder, flag: str = CLI_TOKENIZER) -> tuple[GPT, dict | None, dict]:
    """(model in eval mode, data spec, metadata) from an HF model folder or any iattention checkpoint.

    The data spec is the run's `data` config section (dataset, tokenizer, ...); an HF GPT-2 folder without
    our spec file beside it is GPT-2 with its own BPE tokenizer (or, of another vocabulary size, the tokenizer.json
    saved in it), another family's folder (or one converted
    from it, which keeps its tokenizer files) the tokenizer saved in it (hf:FOLDER, its tokenizer.json); None
    if a checkpoint or folder does not say. The metadata of an HF folder: its source and the tokenizer_identity its
    export recorded (GPT-2); a checkpoint's own (a conversion's keeps its source's special-token ids, "token_ids")."""
    folder = path if isinstance(path, HFFolder) else None
    path = folder.path if folder else Path(path)
    if not path.exists():
        raise UserError(f"{path} does not exist; give an HF model folder or an iattention checkpoint")
    if (folder := folder or hf_folder(path)) is not None:  # read once, passed down
        spec = _data_spec_beside(path, flag)
        gpt2 = folder.read_with  # GPT-2's BPE, else the folder's own (or a one-line refusal)
        recorded = spec.pop(TOKENIZER_ID, None) if spec and gpt2 else None
        if recorded is not None and not isinstance(recorded, str):
            raise UserError(f"{path / DATA_SPEC_FILE} is corrupt (the model's data spec: key {TOKENIZER_ID!r}: "
                            f"{type(recorded).__name__}, expected str); convert the model again")
        model = from_hf_folder(folder)
        if not gpt2:
            return model, spec or own_tokenizer_spec(path), {"source": str(path)}
        if spec is None and model.config.vocab_size != GPT2_VOCAB:  # not GPT-2's BPE: the tokenizer saved with it
            spec = own_tokenizer_spec(path)  # (an export of a run on hf:FOLDER, or a GPT-2 trained on another BPE)
        return model, spec or dict(HF_DATA_SPEC), {"source": str(path), "tokenizer": recorded}
    model, meta = load_model(path)
    beside = path if path.is_dir() else path.parent
    if path.is_dir():
        _check_beside(beside, meta)
    # a folder converted from Hugging Face (iattn convert copies its tokenizer files) says its tokenizer so
    data = (meta.get("config") or {}).get("data") or _data_spec_beside(beside, flag) or own_tokenizer_spec(beside)
    return model, dict(data) if data else None, meta


def _check_beside(folder: Path, meta: dict) -> None:
    """A converted folder's config.json and iattention-data.json repeat what its checkpoint carries, for
    people and other tools; one that says something else (edited, damaged) is refused, not ignored."""
    config = meta.get("config") or {}
    for name, key in (("config.json", "model"), (DATA_SPEC_FILE, "data")):
        if (folder / name).exists() and key in config:
            beside = read_json_object(folder / name, f"the {key} config beside the checkpoint",
                                      f"delete {name} (the checkpoint carries its own) or convert again")
            own = config[key]
            if name == "config.json":
                if beside.get("model_type") == OURS_MODEL_TYPE:  # save_pretrained's holds it under "iattention"
                    beside = beside["iattention"] if isinstance(beside.get("iattention"), dict) else \
                        {k: v for k, v in beside.items() if k not in ("model_type", "note", "auto_map")}
                # a folder written before the one family says its Llama-family config in the old names
                beside, own = normal_form(beside), normal_form(own)
            if beside != own:
                differ = sorted(k for k in {*beside, *own} if beside.get(k) != own.get(k))
                raise UserError(f"{folder / name} does not match the checkpoint's own {key} config (differs in "
                                f"{', '.join(map(str, differ[:3]))}); delete {name} or convert again")


def data_config_for(data: dict | None, source: str, tokenizer: str | None = None, flag: str = CLI_TOKENIZER,
                    **paths):
    """The DataConfig to tokenize with: the model's own spec, `tokenizer` overriding its tokenizer,
    `paths` (data_dir, tokenizer_file) overriding where files are read; `flag`: how the caller names it."""

    if data is None and tokenizer is None:
        raise UserError(f"{source} does not say which tokenizer it was trained with; pass {flag} "
                        "(gpt2, byte, bpe:N or hf:FOLDER)")
    spec = {k: v for k, v in (data or {}).items() if k in DataConfig.__dataclass_fields__}
    if tokenizer:
        spec["tokenizer"] = tokenizer
    return DataConfig(**{**spec, **{k: v for k, v in paths.items() if v}})


def kept_tokenizer(path: str | Path, data: dict | None, override: str | None = None):
    """The tokenizer a model folder keeps beside it, or None: a `bpe:N` run's tokenizer.json, or an exported
    HF folder's (the same BPE in transformers' form), with which a model needs no train split to tokenize; an
    `hf:FOLDER` run's copy of FOLDER's tokenizer files (HF_KEPT, written and checked by keep_hf_tokenizer; never
    one it did not write: kept_copy), with which it needs no FOLDER. Its identity is FOLDER's (the same files)."""

    path = Path(path)
    folder = path if path.is_dir() else path.parent
    spec = (data or {}).get("tokenizer", "")
    if override and override != spec:
        return None
    if isinstance(spec, str) and spec.startswith("bpe:") and (folder / "tokenizer.json").is_file():
        return tokenizer_from_file(folder / "tokenizer.json", spec)
    if isinstance(spec, str) and spec.startswith(HF_SPEC) and (kept := kept_copy(folder)) is not None:
        # named as the run recorded it (reports, the export's card); read from the copy
        return dataclasses.replace(load_tokenizer(DataConfig(tokenizer=f"{HF_SPEC}{kept.absolute()}")), name=spec)
    return None


def check_tokenizer(tok: Tokenizer, meta: dict, data: dict | None, source, override: str | None = None,
                    flag: str = CLI_TOKENIZER) -> None:
    """The tokenizer found for a model (its folder's tokenizer.json, or one rebuilt from its data) must be the
    one it was trained with, as its checkpoint or export recorded it (`tokenizer_identity`): a tokenizer.json
    copied in from another run, a train file changed under a bpe:N run, or an export's iattention-data.json
    edited to another tokenizer name would score (or label) the right weights with the wrong tokenizer.
    Models saved before the record are not checked; `--tokenizer` naming another spec is a choice."""
    recorded = meta.get("tokenizer")
    if not isinstance(recorded, str) or not recorded:
        return
    if override and override != (data or {}).get("tokenizer"):
        return
    now = tokenizer_identity(tok)
    if recorded not in tokenizer_identities(tok):  # an hf:FOLDER checkpoint of before issue 67: its older identity
        raise UserError(f"{source} was trained with tokenizer {recorded}, but the tokenizer found for it is {now} "
                        "(a tokenizer.json or data spec beside it, or the train data of a bpe:N tokenizer, changed "
                        f"since); restore the model's own tokenizer.json and data spec, or pass {flag} to use "
                        "another tokenizer on purpose")


def load_run(path: str | Path, data_dir: str | None = None, tokenizer: str | None = None):
    """(model in eval mode, tokenizer) from a run folder, a checkpoint, a converted folder or an HF model
    folder: the tokenizer the model was trained with (a run's own tokenizer.json when it has one, else
    rebuilt from its data spec; GPT-2's BPE for an HF GPT-2 folder, the folder's own tokenizer.json for
    another family's), or the spec `tokenizer` names (gpt2, byte, bpe:N, hf:FOLDER), as `iattn eval
    --tokenizer` does. `data_dir` overrides where data files are read (default:
    $IATTN_DATA_DIR, else the folder the run recorded). Its errors name the keyword, not the CLI's flag."""

    return model_and_tokenizer(path, data_dir, tokenizer, API_TOKENIZER)


def model_and_tokenizer(path: str | Path, data_dir: str | None = None, tokenizer: str | None = None,
                        flag: str = CLI_TOKENIZER):
    """load_run's work, its errors naming `flag` (the CLI's --tokenizer, or load_run's keyword)."""
    model, data, meta = load_any(path, flag)
    tok = kept_tokenizer(path, data, tokenizer) or tokenizer_of(
        data_config_for(data, str(path), tokenizer, flag, data_dir=data_dir_told(data_dir)))
    check_tokenizer(tok, meta, data, path, tokenizer, flag)
    return model, tok


def check_vocab(tok: Tokenizer, model: GPT, flag: str = CLI_TOKENIZER) -> None:
    """A tokenizer whose ids run past the model's embedding (a foreign folder's, another run's) is refused."""
    if tok.vocab_size > model.config.vocab_size:
        raise UserError(f"tokenizer {tok.name} has {tok.vocab_size:,} tokens, more than the model's "
                        f"{model.config.vocab_size:,}; use the tokenizer the model was trained with ({flag})")
