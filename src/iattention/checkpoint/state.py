"""Checkpoints: one safetensors file holding weights, optimizer state and RNG, plus JSON metadata.

Nothing is unpickled on load, so a checkpoint cannot run code. Files are written atomically
(temp + fsync + rename); a truncated or foreign file is reported, not loaded.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_bytes
from safetensors.torch import load_file

from iattention.checkpoint.writer import DTYPES, FORMAT, ShardWriter, checkpoint_metadata
from iattention.config.model import GPTConfig, upgrade_config, upgrade_model_keys
from iattention.errors import UserError, first_words
from iattention.model.gpt import available_memory
from iattention.model.names import upgrade_name
from iattention.utils.atomic import write_with
from iattention.utils.faults import fault_point
from iattention.utils.files import check_regular

MODEL = "model/"  # a model tensor's name in a checkpoint: MODEL + its parameter's name (optimizer: optim/, RNG: rng/)
TIED, EMBEDDING = "lm_head.weight", "transformer.wte.weight"  # a tied head is the embedding: stored once
# A model converted from Hugging Face keeps its source's special-token ids in its metadata ("token_ids": those of
# these keys its transformers config sets; an eos may be a list), which an export writes back (interop/hf.py).
TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def model_tensors(model) -> dict[str, torch.Tensor]:
    """The model's tensors, a tied head once (an untied one, as a Llama-family model may have, in full)."""
    state = model.state_dict()
    tied = TIED in state and EMBEDDING in state and state[EMBEDDING].data_ptr() == state[TIED].data_ptr()
    return {MODEL + k: v.detach().contiguous() for k, v in state.items() if not (tied and k == TIED)}


def upgrade_key(key: str) -> str:
    """A checkpoint's tensor name under today's layout, the one place every layout written before is read: a model
    tensor of the two-family layout (a Llama-family model named its parameters as transformers does) or of a folder
    the streaming converter wrote before issue 64 (its source's transformers names) as MODEL + today's name
    (model/names.py upgrade_name); every other name as it is."""
    return MODEL + upgrade_name(key[len(MODEL):]) if key.startswith(MODEL) else key


def _optimizer_tensors(optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    sd = optimizer.state_dict()
    tensors = {}
    for pid, state in sd["state"].items():
        for key, value in state.items():
            t = value if torch.is_tensor(value) else torch.tensor(value)
            tensors[f"optim/{pid}/{key}"] = t.detach().contiguous()
    return tensors, {"param_groups": sd["param_groups"]}


def save_checkpoint(path: str | Path, model, meta: dict, optimizer=None) -> None:
    tensors = model_tensors(model)
    meta = dict(meta)
    if optimizer is not None:
        opt_tensors, opt_meta = _optimizer_tensors(optimizer)
        tensors.update(opt_tensors)
        meta["optimizer"] = dict(opt_meta, tensors=sorted(opt_tensors))  # what a resume must find
        tensors["rng/torch"] = torch.get_rng_state()
    tensors = {k: v.cpu() for k, v in tensors.items()}

    def write(tmp: Path) -> None:
        plan = {k: (list(v.shape), v.dtype) for k, v in tensors.items()}
        ShardWriter(tmp.parent, plan, checkpoint_metadata(meta), name=tmp.name, reserve=0).write(tensors.items())
        fault_point("ckpt_write", torn=tmp)

    write_with(path, write)


@contextmanager
def _reading(path: Path):
    """A missing, corrupt, truncated or foreign file is one line naming it. A FIFO or device is refused
    before it is opened (reading one would wait forever). The message never says "delete it": the file
    may be anyone's (`--init-from /etc/passwd`)."""
    check_regular(path, "checkpoint", "give a .safetensors checkpoint or a run folder")
    try:
        yield
    except FileNotFoundError:
        raise UserError(f"checkpoint {path} does not exist; check the path") from None
    except (SafetensorError, OSError, ValueError) as e:
        raise UserError(f"checkpoint {path} is corrupt or truncated, or not a safetensors file at all "
                        f"({first_words(e, 80)}); use an intact checkpoint (a run's last or best "
                        "checkpoint, or one saved again), or retrain") from None


def read_meta(path: str | Path) -> dict:
    """A checkpoint's metadata, read with plain reads through one open (_read_once): safetensors' safe_open maps the
    file by its name a second time, which a live run's replacement in between makes a traceback."""
    path = Path(path)
    with _reading(path):
        metadata, _ = _read_once(path, tensors=False)
    return _meta_of(path, metadata.get("iattention"))


def read_metadata(path: str | Path) -> dict:
    """A safetensors file's header metadata as it is (ours under "iattention"; transformers writes {"format": "pt"})."""
    path = Path(path)
    with _reading(path):
        return _read_once(path, tensors=False)[0]


def _meta_of(path: Path, raw) -> dict:
    """A checkpoint's metadata, from the text its header holds under "iattention", checked (_check_meta)."""
    if not raw:
        raise UserError(f"{path} is a safetensors file but not an iattention checkpoint; "
                        "convert it with `iattn convert`")
    try:
        meta = json.loads(raw)
    except (json.JSONDecodeError, TypeError):  # TypeError: a crafted header's value that is not text
        meta = None
    if not isinstance(meta, dict):
        raise UserError(f"checkpoint {path} has corrupt metadata (not a JSON object); resume from another "
                        "checkpoint or retrain")
    if meta.get("format") != FORMAT:
        raise UserError(f"checkpoint {path} has format {meta.get('format')!r}, expected {FORMAT}")
    if "config" in meta:  # a checkpoint saved before a key was renamed reads under the new name
        meta["config"] = upgrade_config(meta["config"])
    _check_meta(path, meta)
    return meta


def _bad_meta(path: Path, key: str, problem: str) -> UserError:
    return UserError(f"checkpoint {path} has bad metadata ({key}: {problem}); resume from another checkpoint "
                     "(a run's last or best) or retrain")


def _kind(value) -> str:
    return f"{type(value).__name__} {value!r}"[:60]


def is_token_id(value) -> bool:
    """A special-token id as a transformers config holds one: an int (some configs say pad -1), or a non-empty list
    of them (an eos of several tokens)."""
    if isinstance(value, list):
        return bool(value) and all(map(is_token_id, value))
    return isinstance(value, int) and not isinstance(value, bool)


def _check_meta(path: Path, meta: dict) -> None:
    """The metadata's schema and types, checked on read, so that a crafted but parseable file is one line
    naming the key instead of a traceback wherever the value is used."""
    config = meta.get("config", {})
    if not isinstance(config, dict):
        raise _bad_meta(path, "config", f"{_kind(config)}, expected an object")
    for section, value in config.items():
        if not isinstance(value, dict):
            raise _bad_meta(path, f"config.{section}", f"{_kind(value)}, expected an object")
    model = config.get("model")
    if model is not None:
        cls = GPTConfig
        types = cls.key_types()
        try:
            model = config["model"] = upgrade_model_keys(model)  # a two-family layout's Llama section included
        except UserError as e:
            raise _bad_meta(path, "config.model", str(e)) from None
        for key, value in model.items():
            want = types.get(key)
            if want is None:
                raise _bad_meta(path, f"config.model.{key}", "not a model key")
            ok = (int, float) if want is float else (want,)
            if not isinstance(value, ok) or isinstance(value, bool) and want is not bool:
                raise _bad_meta(path, f"config.model.{key}", f"{_kind(value)}, expected {want.__name__}")
        try:
            cls.from_dict(model)
        except UserError as e:
            raise _bad_meta(path, "config.model", str(e)) from None
    if not isinstance(meta.get("tokenizer", ""), str):  # what its tokenizer maps text to (tokenizer_identity)
        raise _bad_meta(path, "tokenizer", f"{_kind(meta['tokenizer'])}, expected a string")
    ids = meta.get("token_ids", {})
    if not isinstance(ids, dict):
        raise _bad_meta(path, "token_ids", f"{_kind(ids)}, expected an object")
    for key, value in ids.items():
        if key not in TOKEN_IDS or not is_token_id(value):
            raise _bad_meta(path, f"token_ids.{key}", f"{_kind(value)}, expected a token id or a list of them"
                            if key in TOKEN_IDS else f"not one of {', '.join(TOKEN_IDS)}")
    state = meta.get("state", {})
    if not isinstance(state, dict):
        raise _bad_meta(path, "state", f"{_kind(state)}, expected an object")
    for key, value in state.items():
        if not isinstance(value, (int, float)):  # bools are ints; the trainer checks each key (read_state)
            raise _bad_meta(path, f"state.{key}", f"{_kind(value)}, expected a number")
    if "optimizer" in meta:
        groups = meta["optimizer"].get("param_groups") if isinstance(meta["optimizer"], dict) else None
        if not isinstance(groups, list) or not groups or not all(
                isinstance(g, dict) and isinstance(g.get("params"), list)
                and all(isinstance(i, int) and not isinstance(i, bool) for i in g["params"]) for g in groups):
            raise _bad_meta(path, "optimizer.param_groups", "expected a list of objects with integer 'params'")


def read_state(path: str | Path, meta: dict, cls):
    """The checkpoint's training state as the dataclass `cls`: every key one of its fields, of its type."""
    state = meta.get("state")
    if not isinstance(state, dict):
        raise _bad_meta(Path(path), "state", "missing")
    types = {f.name: type(f.default) for f in dataclasses.fields(cls)}
    for key, value in state.items():
        want = types.get(key)
        if want is None:
            raise _bad_meta(Path(path), f"state.{key}", f"not a key of the training state ({', '.join(types)})")
        ok = (int, float) if want is float else (want,)
        if not isinstance(value, ok) or isinstance(value, bool) and want is not bool:
            raise _bad_meta(Path(path), f"state.{key}", f"{_kind(value)}, expected {want.__name__}")
    return cls(**state)


_BYTES = {name: dtype.itemsize for name, dtype in DTYPES.items()}


def check_declared_size(path: Path) -> None:
    """Before a safetensors file is read into memory: the bytes its header declares must be data the file
    really holds (a crafted header over a sparse file declares gigabytes of holes), and must fit in the
    memory this process can still allocate. Only the header is read, with plain reads: safetensors maps the
    whole file into memory first, which a process under a memory limit (prlimit --as) cannot do for a
    16 GiB declaration (MemoryError)."""
    with _reading(path), open(path, "rb") as f:
        tensors = _header_tensors(f, path.stat().st_size)
    _check_declared(path, tensors, path.stat())


def _check_declared(path: Path, tensors: list[dict], st: os.stat_result) -> None:
    """check_declared_size's test, of the header entries `tensors` of a file whose stat is `st`."""
    declared = sum(math.prod(t["shape"]) * _BYTES.get(t["dtype"], 8) for t in tensors)
    held = st.st_blocks * 512 if getattr(st, "st_blocks", 0) else st.st_size  # allocated bytes, holes excluded
    gib = 2**30
    if declared > 2 * held + 2**20:
        raise UserError(f"checkpoint {path} declares {declared / gib:.3g} GiB of tensors but holds {held / gib:.3g} "
                        "GiB of data (a sparse or crafted file); use an intact checkpoint")
    free = available_memory()
    if free is not None and declared > free:
        raise UserError(f"checkpoint {path} declares {declared / gib:.3g} GiB of tensors, more than the "
                        f"{free / gib:.3g} GiB this machine has free; load it on a larger machine")


_MAX_HEADER = 100_000_000  # bytes: safetensors' own limit on a header


def _read_header(f, size: int) -> dict:
    """The header of the safetensors file open as `f` (at its start), `size` bytes long, read with plain reads; a
    file that cannot hold its header is a ValueError (reported by `_reading` as corrupt or truncated)."""
    length = f.read(8)
    if len(length) < 8:
        raise ValueError("shorter than a safetensors header")
    n = int.from_bytes(length, "little")
    if n > min(_MAX_HEADER, size - 8):
        raise ValueError(f"header length {n} is beyond the file")
    header = json.loads(f.read(n))
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    return header


def _header_tensors(f, size: int, header: dict | None = None) -> list[dict]:
    """The tensor entries of a safetensors header ({"dtype", "shape", ...}: `header`, else read from `f`)."""
    header = _read_header(f, size) if header is None else header
    tensors = [t for k, t in header.items() if k != "__metadata__"]
    if not all(isinstance(t, dict) and isinstance(t.get("shape"), list) and isinstance(t.get("dtype"), str)
               and all(isinstance(d, int) and d >= 0 for d in t["shape"]) for t in tensors):
        raise ValueError("header has a tensor entry without a dtype and shape")
    return tensors


def _check_layout(header: dict, tensors: list[dict], data_bytes: int) -> None:
    """The tensors' byte ranges tile the data exactly, each as long as its dtype and shape make it, as safetensors
    itself checks when it opens a file (a truncated or crafted file is a ValueError)."""
    spans = []
    for t in tensors:
        offsets = t.get("data_offsets")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            raise ValueError("header has a tensor entry without its data offsets")
        size = math.prod(t["shape"]) * _BYTES[t["dtype"]] if t["dtype"] in _BYTES else None
        if not 0 <= offsets[0] <= offsets[1] or size is not None and offsets[1] - offsets[0] != size:
            raise ValueError(f"a tensor's data offsets {offsets} do not fit its dtype and shape")
        spans.append(offsets)
    end = 0
    for start, stop in sorted(spans):
        if start != end:
            raise ValueError("the tensors' data does not tile the file")
        end = stop
    if end != data_bytes:
        raise ValueError(f"the header accounts for {end} bytes of data, the file holds {data_bytes}")
    metadata = header.get("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ValueError("the header's metadata is not a map of text")


def _open_file_path(fd: int) -> str | None:
    """A name of the file open as `fd` that opens that very file again, whatever has been renamed over its own name
    since (/proc/self/fd/N on Linux, /dev/fd/N on macOS); None where the system has neither."""
    for name in (f"/proc/self/fd/{fd}", f"/dev/fd/{fd}"):
        if os.path.exists(name):
            return name
    return None


def _read_once(path: Path, tensors: bool = True) -> tuple[dict, dict[str, torch.Tensor] | None]:
    """(header metadata, the tensors, or None when not `tensors`) of one version of the file: opened once, its
    header's declared size checked against what this open file holds and against free memory before the tensors are
    read, all from that open file. A live run replaces its checkpoints by rename (utils/atomic.py), so an open file
    stays the whole version it was. safetensors' safe_open and load_file map the file by its name a second time
    (after reading its header), which a replacement in between makes another file ("size ... is smaller than the
    required mapping size"), and a read_meta then load_tensors of one path may read two versions (issue 67): here
    safetensors reads the open file by a name that is that file (_open_file_path), mapped as before (no second
    copy in memory); where the system gives none, the file's bytes, read once, are parsed. The caller holds
    `_reading`."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        header = _read_header(f, st.st_size)
        entries = _header_tensors(f, st.st_size, header)
        _check_declared(path, entries, st)
        if not tensors:  # what safetensors would refuse on opening it, refused here (the metadata alone is read)
            _check_layout(header, entries, st.st_size - f.tell())
            loaded = None
        elif (name := _open_file_path(f.fileno())) is not None:
            loaded = load_file(name)
        else:
            f.seek(0)
            loaded = load_bytes(f.read())
    metadata = header.get("__metadata__")
    return metadata if isinstance(metadata, dict) else {}, loaded


def read_checkpoint(path: str | Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(metadata, tensors) of a checkpoint, both of one version of the file (_read_once): what every reader of a
    file that a live run may replace uses (eval, generate, convert, inspect, --init-from, a resume)."""
    path = Path(path)
    with _reading(path):
        metadata, tensors = _read_once(path)
    return _meta_of(path, metadata.get("iattention")), tensors


def load_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file (one version of it: _read_once), ours or not (a shard)."""
    path = Path(path)
    with _reading(path):
        return _read_once(path)[1]


def check_finite(tensors: dict[str, torch.Tensor], source, fix: str) -> None:
    """Refuse NaN or Inf in any floating tensor, naming it: such weights give "perplexity inf" or nan
    logits, never a number to stand behind."""
    for k, v in tensors.items():
        if torch.is_tensor(v) and v.is_floating_point() and not bool(torch.isfinite(v).all()):
            bad = ~torch.isfinite(v)
            kinds = "/".join(w for w, m in (("NaN", torch.isnan(v)), ("Inf", torch.isinf(v))) if bool(m.any()))
            raise UserError(f"{source} holds non-finite weights ({int(bad.sum())} {kinds} value(s) in {k}); {fix}")


# The structural tensors of every variant: a canonical layer's index buffers (rot_perm, k_perm, o_perm; the Llama
# family's pass_perm, read as k_perm), each row along the last dimension a permutation of range(its length) whose
# first entries are the fixed block (attention/canonical.py). Every other tensor is a float weight: a test checks
# that every variant's model holds no other non-float tensor, so a new kind of structural tensor must be named here.
STRUCTURAL = ("_perm",)


def _not_a_permutation(v: torch.Tensor) -> str | None:
    """Why `v` is not a permutation along its last dimension in every row, or None."""
    if v.dtype.is_floating_point or v.dtype.is_complex or v.dtype == torch.bool or v.dim() == 0:
        return f"a {str(v.dtype).replace('torch.', '')} tensor of shape {list(v.shape)}, not integer indices"
    n = v.shape[-1]
    rows = v.reshape(-1, n).long()
    for i, row in enumerate(rows):
        outside = (row < 0) | (row >= n)
        if bool(outside.any()):
            return f"row {i} holds {int(row[outside][0])}, outside 0..{n - 1}"
        counts = torch.bincount(row, minlength=n)
        if bool((counts != 1).any()):
            twice, gone = int(counts.argmax()), int(counts.argmin())
            return f"row {i} repeats {twice} ({int(counts[twice])} times) and lacks {gone}"
    return None


def check_structure(tensors: dict[str, torch.Tensor], source) -> None:
    """Refuse a structural tensor (STRUCTURAL) that is not a permutation in every row, naming it: an entry out of
    range is a traceback wherever the layer is assembled, a repeated one silently another model."""
    for k, v in tensors.items():
        if torch.is_tensor(v) and k.endswith(STRUCTURAL) and (problem := _not_a_permutation(v)) is not None:
            raise UserError(f"{source} holds a damaged {k} ({problem}; each row must be a permutation of the layer's "
                            "indices): the file was damaged or edited; use another checkpoint (a run's last or "
                            "best), or convert or train again")


def load_model_state(model, tensors: dict[str, torch.Tensor], path) -> None:
    """Load a checkpoint's model tensors (names of the two-family layout read under today's: model/names.py): every
    weight finite, every structural tensor a permutation (check_structure), each of the model's dtype."""
    state = {key[len(MODEL):]: v for k, v in tensors.items() if (key := upgrade_key(k)).startswith(MODEL)}
    check_finite(state, f"checkpoint {path}", "the run diverged or the file was damaged; use another checkpoint "
                 "or retrain")
    check_structure(state, f"checkpoint {path}")
    state.setdefault(TIED, state.get(EMBEDDING))  # a tied head is its embedding (an untied one was saved in full)
    own = model.state_dict()
    for k, v in state.items():  # load_state_dict would cast silently: an fp16 or int64 file is another model
        if k in own and v is not None and v.dtype != own[k].dtype:
            raise UserError(f"checkpoint {path} holds {k} as {str(v.dtype).replace('torch.', '')}, the model holds "
                            f"{str(own[k].dtype).replace('torch.', '')}; convert the checkpoint explicitly "
                            "(iattn convert --dtype) or use the file as it was saved")
    state = {k: v for k, v in state.items() if v is not None}
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise UserError(f"checkpoint {path} does not fit this model ({str(e).splitlines()[1].strip()[:100]}); "
                        "use the config the checkpoint was trained with") from None


_OPTIM_NAME = re.compile(r"optim/(\d+)/(\w+)")


def load_optimizer_state(optimizer, tensors: dict[str, torch.Tensor], meta: dict, path="(unnamed)") -> None:
    path = Path(path)
    if "optimizer" not in meta:
        raise _bad_meta(path, "optimizer", "missing: the checkpoint holds no optimizer state to resume")
    n_params = sum(len(g["params"]) for g in optimizer.param_groups)
    state: dict[int, dict] = {}
    for k, v in tensors.items():
        if k.startswith("optim/"):
            m = _OPTIM_NAME.fullmatch(k)
            if m is None or int(m[1]) >= n_params:
                raise _bad_meta(path, f"tensor {k}", f"expected optim/<parameter index < {n_params}>/<name>")
            state.setdefault(int(m[1]), {})[m[2]] = v
    _check_optimizer_complete(tensors, state, meta, path)
    try:
        optimizer.load_state_dict({"state": state, "param_groups": meta["optimizer"]["param_groups"]})
    except (ValueError, KeyError, TypeError, RuntimeError) as e:
        raise _bad_meta(path, "optimizer", f"does not fit this model's optimizer: {first_words(e, 80)}") \
            from None
    if "rng/torch" in tensors:
        rng = tensors["rng/torch"]
        if rng.dtype != torch.uint8 or rng.dim() != 1:
            raise _bad_meta(path, "tensor rng/torch", f"{str(rng.dtype).replace('torch.', '')} of shape "
                            f"{list(rng.shape)}, expected a 1-D uint8 RNG state")
        try:
            torch.set_rng_state(rng)
        except RuntimeError as e:
            raise _bad_meta(path, "tensor rng/torch", first_words(e, 80)) from None


def _check_optimizer_complete(tensors: dict, state: dict[int, dict], meta: dict, path) -> None:
    """A checkpoint past its first optimizer step holds the optimizer's state (AdamW's moments): one
    without it, or without some of it, would resume silently on fresh moments, another run than the one
    interrupted. The names it was written with are in its metadata (an older checkpoint, without them:
    it must hold some optimizer state once a step was applied)."""
    opt = meta.get("optimizer") if isinstance(meta.get("optimizer"), dict) else {}
    fix = "resume from a complete checkpoint or retrain"
    listed = opt.get("tensors")
    if isinstance(listed, list):
        missing = [k for k in listed if k not in tensors]
        if missing:
            raise UserError(f"checkpoint {path} lacks {len(missing)} of its {len(listed)} optimizer tensors (e.g. "
                            f"{missing[0]}): resuming would restart the optimizer's moments; {fix}")
        return
    run = meta.get("state") if isinstance(meta.get("state"), dict) else {}
    applied = int(run.get("step", 0) or 0) - int(run.get("skipped", 0) or 0)
    if applied <= 0:
        return
    if not state:
        raise UserError(f"checkpoint {path} has run {applied} optimizer step(s) but holds no optimizer tensors: "
                        f"resuming would restart the optimizer's moments; {fix}")
