"""Reading a Hugging Face model folder: its safetensors files (`Source`), its generation_config.json, its family,
and its config.json's sizes against the weights' shapes."""

from __future__ import annotations

import math
import os
import re
import shutil
from functools import cached_property
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from iattention.checkpoint.beside import OURS_MODEL_TYPE
from iattention.checkpoint.run_folder import check_json_object, read_json_object
from iattention.checkpoint.state import TOKEN_IDS, check_declared_size, check_finite, is_token_id
from iattention.checkpoint.writer import DTYPES, INDEX
from iattention.config.families import FAMILIES, Family, family_record
from iattention.config.model import GPTConfig
from iattention.errors import UserError, first_words, shown
from iattention.interop.dialects import _FIX, DIALECTS, _class, _strict_error, _transformers, dialect_of
from iattention.model.gpt import GPT
from iattention.model.names import from_family, from_file, to_family, to_file

FINITE_FIX = "use a model with finite weights (it diverged or was damaged)"  # a NaN/Inf weight's refusal
_RESAVE = "download or copy the model folder again, or re-save it with save_pretrained"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


GENERATION = "generation_config.json"  # sampling defaults (do_sample, temperature, top_p, ...) and special ids


def generation_settings(folder: Path) -> dict | None:
    """An HF folder's generation_config.json as the JSON object it holds, or None where there is none; one line
    naming the file where it is not a JSON object or transformers refuses it (`max_new_tokens: 0`; greedy with
    `num_return_sequences: 3`), which transformers does while loading the model, as a traceback or with a
    message about the weights. Called before a folder is loaded or converted; values transformers only warns
    about (`temperature` without sampling, common on the Hub) pass."""
    path = Path(folder) / GENERATION
    if not path.is_file():
        return None
    fix = "fix or remove it"
    obj = read_json_object(path, "a generation config", fix)
    try:  # _transformers() has quieted its warnings, as everywhere in interop
        _transformers().GenerationConfig.from_dict(dict(obj))
    except Exception as e:  # ValueError, and AttributeError for a nested config of the wrong type
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"{path} is refused by transformers ({why}); {fix}") from None
    return obj


# Beside a converted or exported model: the data section (tokenizer spec) of the run it came from.
DATA_SPEC_FILE = "iattention-data.json"
# What a model folder holds beside its weights, copied through by a conversion so the output is complete (the
# streamed one's, and a whole-model one's of a folder read with its own tokenizer.json): with the data spec of an
# export of ours (iattention-data.json: the run's tokenizer and data), the converted folder is read as the run.
COPIED = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.json",
          "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json", GENERATION,
          DATA_SPEC_FILE)


def companions(folder: Path) -> list[str]:
    """The COPIED files `folder` holds: its tokenizer, chat template and generation files."""
    return [name for name in COPIED if (folder / name).is_file()]


def copy_companions(src: Path, dst: Path, names: list[str] | None = None) -> list[str]:
    """The tokenizer, chat template and generation files beside the weights (`names`: as listed already), copied."""
    copied = companions(src) if names is None else names
    for name in copied:
        shutil.copyfile(src / name, dst / name)
    return copied


_ST = {name: dtype for name, dtype in DTYPES.items() if dtype.is_floating_point}
# old HF checkpoints' saved frequencies and GPT-NeoX's causal-mask buffers: transformers ignores them too
_IGNORED = ("rotary_emb.inv_freq", ".attention.bias", ".attention.masked_bias")


def _weight_map(path: Path) -> dict | None:
    """An HF folder's index (tensor -> the file holding it, each a file inside the folder: a path that leaves it is
    refused, not followed), or None where it has none."""
    index = path / INDEX
    if not index.exists():
        return None
    fix = "re-save the model with save_pretrained"
    weight_map = read_json_object(index, "a safetensors index", fix, schema={"weight_map": (dict,)})["weight_map"]
    for f in dict.fromkeys(weight_map.values()):
        # lexically, not resolved: a shard symlinked into a cache (as the hub's snapshots are) stays readable
        if not isinstance(f, str) or not f or os.path.isabs(f) or os.path.normpath(f).split(os.sep)[0] == "..":
            raise UserError(f"{index} maps tensors to {f!r}, outside the model folder {path}; an index names "
                            f"files inside its folder only; {fix}")
    return weight_map


def _weight_files(path: Path, weight_map: dict | None = None) -> list[str]:
    """The safetensors files an HF folder's weights live in: its index's shards, else model.safetensors."""
    weight_map = _weight_map(path) if weight_map is None else weight_map
    return ["model.safetensors"] if weight_map is None else list(dict.fromkeys(weight_map.values()))


class Source:
    """An HF-layout folder's safetensors files (one, or an index's shards), their headers read at once, their
    tensors a few at a time: what the whole-model loader checks before transformers reads the folder
    (transformers casts every tensor to the model's dtype without a word: an int64 or fp16 tensor in a float32
    file would load as another model), and what the streaming converter (interop/stream.py) reads layer by layer.
    `files`: by default the folder's (its index's shards, else model.safetensors); `declared`: each file's
    declared size checked first (a whole load would materialise a crafted header over a sparse file; a streamed
    one reads a layer at a time, so a model larger than memory is its point); `rename`: the name each tensor is
    known by, from the name its file holds (a checkpoint of ours: `checkpoint.state.upgrade_key`)."""

    def __init__(self, folder: Path, files: list[str] | None = None, declared: bool = False, rename=None):
        self.folder = folder
        self.stored: dict[str, str] = {}  # a tensor's name -> the name its file holds
        self.where: dict[str, str] = {}
        self.shapes: dict[str, list[int]] = {}
        self.dtypes: dict[str, str] = {}
        weight_map = _weight_map(folder)
        index = folder / INDEX if weight_map is not None else None
        for name in _weight_files(folder, weight_map) if files is None else files:
            if not (folder / name).is_file():
                named = f"{index} names shard {name}, which" if index else f"its weights file {name}"
                raise UserError(f"{folder}: {named} is missing; {_RESAVE}")
            if declared:
                check_declared_size(folder / name)
            with self._open(name) as f:
                for stored in f.keys():
                    sl, k = f.get_slice(stored), rename(stored) if rename else stored
                    self.stored[k], self.where[k], self.shapes[k], self.dtypes[k] = \
                        stored, name, list(sl.get_shape()), sl.get_dtype()
        held = {stored: self.where[k] for k, stored in self.stored.items()}
        for k, shard in (weight_map or {}).items():  # every tensor the index names must be where it says
            if held.get(k) != shard:
                raise UserError(f"{index} maps {k} to {shard}, which does not hold it; {_RESAVE}")

    def _open(self, name: str):
        path = self.folder / name
        try:
            return safe_open(str(path), framework="pt")
        except SafetensorError as e:
            raise UserError(f"cannot read {path} as safetensors ({first_words(e, 80)}): it is truncated "
                            f"or damaged; {_RESAVE}") from None

    def _finite(self, tensor: torch.Tensor, name: str, layer: int | None) -> torch.Tensor:
        """`tensor` (tensor `name` of `layer`, or a slice of it), refused in one line naming it and its layer if it
        holds a NaN or Inf (the checkpoint loader's check_finite), as it is read: a copied NaN was written silently,
        and the streamed conversion's per-layer check sees the attention weights only."""
        where = f"{self.folder}{f' (layer {layer})' if layer is not None else ''}"
        check_finite({name: tensor}, where, f"{FINITE_FIX}; nothing was written")
        return tensor

    def read(self, names: list[str], layer: int | None = None) -> dict[str, torch.Tensor]:
        """The tensors `names` (of `layer`), each checked finite, each file opened once and closed again (its mapped
        pages let go)."""
        files: dict[str, list[str]] = {}
        for k in names:
            files.setdefault(self.where[k], []).append(k)
        out = {}
        for name, keys in files.items():
            try:
                with self._open(name) as f:
                    for k in keys:
                        out[k] = self._finite(f.get_tensor(self.stored[k]), k, layer)
            except SafetensorError as e:
                raise UserError(f"cannot read {self.folder / name} ({first_words(e, 80)}); {_RESAVE}") \
                    from None
        return out

    def chunks(self, name: str, max_bytes: int, layer: int | None = None):
        """One tensor (of `layer`) in slices of whole rows of at most `max_bytes` (one row if a row is bigger), each
        checked finite, the file opened for each slice and closed again: copying the embedding of a big model holds a
        slice, not the table."""
        shape = self.shapes[name]
        row = math.prod(shape[1:]) * _ST.get(self.dtypes[name], torch.float32).itemsize
        step = max(1, max_bytes // max(row, 1))
        for start in range(0, max(shape[0], 1) if shape else 1, step):
            try:
                with self._open(self.where[name]) as f:
                    sl = f.get_slice(self.stored[name])
                    chunk = sl[start:start + step] if shape else sl[:]
                yield self._finite(chunk, name, layer)
            except SafetensorError as e:
                raise UserError(f"cannot read {self.folder / self.where[name]} ({first_words(e, 80)}); "
                                f"{_RESAVE}") from None

    def float_dtype(self, skip: tuple[str, ...] = _IGNORED, allowed_ints: tuple[str, ...] = ()) -> torch.dtype:
        """The one floating dtype of the weights (the tensors named `skip` aside, as transformers ignores them,
        and int64 ones named `allowed_ints`); another dtype, or two, is one line."""
        seen: dict[str, str] = {}
        for k, dt in self.dtypes.items():
            if k.endswith(skip) or k.endswith(allowed_ints) and dt == "I64":
                continue
            if dt not in _ST:
                held = dtype_name(DTYPES[dt]) if dt in DTYPES else dt
                raise UserError(f"{self.folder / self.where[k]} holds {k} as {held}, not floating "
                                "point; iattention reads float16, bfloat16, float32 and float64 weights only: "
                                "dequantize the model (load it in transformers and save_pretrained it in bfloat16) "
                                "and convert that")
            seen.setdefault(dt, k)
        if len(seen) > 1:
            (a, ka), (b, kb) = list(seen.items())[:2]
            raise UserError(f"{self.folder / self.where[kb]} mixes dtypes ({ka} is {dtype_name(_ST[a])}, {kb} is "
                            f"{dtype_name(_ST[b])}); transformers would cast them silently: convert the model to one "
                            "dtype explicitly and re-save it")
        if not seen:
            raise UserError(f"{self.folder} holds no floating-point weights; {_RESAVE}")
        return _ST[next(iter(seen))]

    def check_against(self, expected: dict[str, list[int]], config: str) -> None:
        """Every tensor a model of this config has, of its shape, and nothing else."""
        have = {k for k in self.shapes if not k.endswith(_IGNORED)}
        missing, unexpected = sorted(set(expected) - have), sorted(have - set(expected))
        if missing:
            raise UserError(f"{self.folder} lacks tensor {missing[0]}"
                            f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}, which {config} "
                            f"needs; {_RESAVE}")
        if unexpected:
            raise UserError(f"{self.folder / self.where[unexpected[0]]} holds tensor {unexpected[0]}, which {config} "
                            f"does not have; {_RESAVE}")
        for k, shape in expected.items():
            if self.shapes[k] != shape:
                raise UserError(f"{self.folder / self.where[k]} holds {k} of shape {self.shapes[k]}, but {config} "
                                f"makes it {shape}; the config and the weights disagree: fix the config's sizes or "
                                f"{_RESAVE}")


def expected_shapes(shape: GPTConfig, fam: Family) -> dict[str, list[int]]:
    """{the name a family's checkpoint file holds: its shape} of every weight outside the layers and of layer 0,
    for a model of `shape` (our model built on the meta device, its names mapped by the family's record): the size
    check of every family, derived from its name map rather than tensor names written by hand."""
    cfg = shape.replace(n_layer=1, vocab_pad_multiple=1, attention="standard", init="normal", minimal_bias=False)
    with torch.device("meta"):
        state = GPT(cfg).state_dict()
    out = {}
    for k, v in state.items():
        name = to_file(to_family(k, fam.name), fam.name)
        if name.endswith(fam.buffers):
            continue
        out[name] = list(v.shape)[::-1] if name.endswith(fam.transposed) else list(v.shape)
    return out


_LAYER = re.compile(r"^transformer\.h\.(\d+)\.")  # our name of a layer's tensor; group 1: its index


def _layer_of(name: str, fam: Family) -> int | None:
    """The layer index of a tensor a family's file names (mapped back to our names), else None."""
    ours = from_family(from_file(name, fam.name), fam.name)
    m = _LAYER.match(ours) or _LAYER.match("transformer." + ours)  # old GPT-2 files: no prefix
    return int(m.group(1)) if m else None


def check_sizes(folder: HFFolder, shapes: dict[str, list[int]]) -> None:
    """config.json's sizes against the tensors' shapes (from the safetensors headers), before transformers builds a
    model of the config's size (its own message about a mismatch is long, cut short, and names the wrong fix): the
    layer count, then each tensor outside the layers and of layer 0 (`expected_shapes`); the first disagreement
    named with the config.json keys that size that tensor (found by moving each key and seeing the shape move)."""
    fam, cfg, where = folder.family, folder.config, folder.where
    dialect = DIALECTS[fam.dialect]
    layers = {i for k in shapes if (i := _layer_of(k, fam)) is not None}
    n = cfg[dialect.layers_key]
    if layers and n != len(layers):
        raise UserError(f"{where} says {dialect.layers_key}={n}, but the weights hold {len(layers)} layer(s); set "
                        f"{dialect.layers_key}={len(layers)} or re-save the model with save_pretrained")
    expected = expected_shapes(dialect.shape(cfg, fam), fam)
    for name, want in expected.items():
        have = shapes.get(name, shapes.get(name.removeprefix("transformer.")))  # old GPT-2 files: no prefix
        if have is None or have == want:
            continue
        keys = [k for k in dialect.size_keys if cfg.get(k) is not None and _sizes_of(cfg, k, fam, name) != want]
        said = ", ".join(f"{k}={cfg[k]}" for k in keys) or "its sizes"
        raise UserError(f"{where} says {said}, so {name} would be {want}, but the weights hold {have}; the config "
                        "and the weights disagree: set those keys to what the weights hold, or re-save the model "
                        "with save_pretrained")


def _sizes_of(cfg: dict, key: str, fam: Family, name: str):
    """The shape of tensor `name` with config.json's `key` moved (doubled, halved or one more: the first that still
    describes a model), or None where none does."""
    value = cfg[key]
    for moved in (2 * value, value // 2, value + 1):
        try:
            return expected_shapes(DIALECTS[fam.dialect].shape({**cfg, key: moved}, fam), fam).get(name)
        except (UserError, ValueError, ZeroDivisionError):
            continue
    return None


CONFIG = "config.json"


class HFFolder:
    """A Hugging Face model folder as a command reads it, once, where the command meets it (`hf_folder`), and passed
    down: config.json parsed once (`raw`) and checked by its family's dialect (`config`), generation_config.json
    (`generation`), its tokenizer and other companion files (`companions`), its safetensors index, shards and their
    headers (`source`) and the weights' one dtype (`dtype`). Every refusal about what the folder holds is made here,
    when a part is first asked for (`read` asks for all of them), never again by a consumer; transformers gets the
    config and generation config built from what was read (`load_options`), not the files again."""

    def __init__(self, path: Path, raw: dict):
        self.path, self.raw, self.where = Path(path), raw, Path(path) / CONFIG
        self.source: Source | None = None
        self.dtype: torch.dtype | None = None

    @classmethod
    def at(cls, path: str | Path) -> HFFolder:
        """The folder `path` (refused in one line where it has no config.json); an HFFolder is returned as it is."""
        if isinstance(path, HFFolder):
            return path
        folder = hf_folder(Path(path), ours=True)
        if folder is None:
            raise UserError(f"{path} is not a Hugging Face model folder (no config.json); give a folder saved with "
                            "save_pretrained")
        return folder

    @property
    def model_type(self) -> str:
        """config.json's model_type, as text (a value of another type is refused as the family is read)."""
        return str(self.raw.get("model_type"))

    @property
    def read_with(self) -> str | None:
        """The tokenizer spec its family's folders are read with (GPT-2's BPE, its record says), None where its own
        tokenizer reads it (or the model_type is no family: loading it refuses it in one line)."""
        return getattr(FAMILIES.get(self.model_type), "tokenizer", None)

    @cached_property
    def family(self) -> Family:
        check_json_object(self.raw, self.where, "a Hugging Face config", "re-save the model with save_pretrained",
                          schema={"model_type": (str,)})
        return family_record(self.raw["model_type"], self.where)

    @cached_property
    def config(self) -> dict:
        """config.json checked as its dialect reads it, one line per problem."""
        return dialect_of(self.family.name).read_config(self.raw, self.where)

    @cached_property
    def shape(self) -> GPTConfig:
        """The shape config.json describes, for counting: no weights read, no transformers needed."""
        return dialect_of(self.family.name).shape(self.config, self.family)

    @cached_property
    def generation(self) -> dict | None:
        return generation_settings(self.path)

    @cached_property
    def companions(self) -> list[str]:
        return companions(self.path)

    def read(self, whole: bool) -> HFFolder:
        """Every part checked, in this order: the family, config.json, generation_config.json (transformers reads it
        with the model: a bad one is named here, not as the weights), the safetensors files (`whole`: each file's
        declared size first, for a load of the whole model), the weights' one dtype and their sizes against
        config.json."""
        if self.source is None:
            self.config, self.generation  # noqa: B018 (each checked, once)
            source = Source(self.path, declared=whole)
            self.dtype = source.float_dtype(skip=_IGNORED + self.family.buffers)
            check_sizes(self, source.shapes)
            self.source = source
        return self

    @cached_property
    def hf_config(self):
        """config.json as its family's transformers config class reads it (from `raw`), or one line."""
        config_class = _class(self.family.name).config_class
        try:  # what from_pretrained does with the file's text, as transformers parses it
            return config_class.from_dict(getattr(config_class, "_decode_special_floats", dict)(dict(self.raw)))
        except (OSError, ValueError, TypeError, KeyError, _strict_error()) as e:
            raise UserError(f"cannot read {self.where} as {config_class.__name__} ({first_words(e)}); {_FIX}") \
                from None

    @cached_property
    def token_ids(self) -> dict:
        """The special-token ids the transformers config sets (bos, eos, pad; an eos may be a list): what a
        conversion from Hugging Face records in its checkpoint's metadata ("token_ids") and an export writes back
        (hf_config_of); one that is no id is one line."""
        ids = {key: value for key in TOKEN_IDS if (value := getattr(self.hf_config, key, None)) is not None}
        for key, value in ids.items():
            if not is_token_id(value):
                raise UserError(f"{self.where}: {key} is {type(value).__name__} {shown(repr(value), 100)}, expected a "
                                f"token id (an integer) or a list of them; {_FIX}")
        return ids

    def load_options(self) -> dict:
        """from_pretrained's keywords that hand transformers what was read (the config, the generation config)
        instead of its reading the files again; transformers 4.x takes the config only."""
        tf = _transformers()
        options = {"config": self.hf_config}
        if int(tf.__version__.split(".")[0]) >= 5:
            gen = self.generation
            options["generation_config"] = tf.GenerationConfig.from_dict(dict(gen)) if gen is not None else \
                tf.GenerationConfig.from_model_config(self.hf_config)
        return options


def hf_folder(path: str | Path, ours: bool = False) -> HFFolder | None:
    """The Hugging Face model folder `path`, its config.json parsed (the one read of it), or None where `path` is
    none: not a folder, no config.json, or (unless `ours`) ours: beside a converted model.safetensors it says
    iattention, or, written before, has no model_type."""
    path = Path(path)
    config = path / CONFIG
    if not (path.is_dir() and config.exists()):
        return None
    raw = read_json_object(config, "a model config", "re-save the model (save_pretrained or iattn convert)")
    if not ours and raw.get("model_type", OURS_MODEL_TYPE) == OURS_MODEL_TYPE:
        return None
    return HFFolder(path, raw)
