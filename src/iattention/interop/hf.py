"""Exact conversion between transformers' models and ours (`GPT` of family gpt2, llama, qwen2, mistral or
gpt_neox): one loader, one exporter, one float64 reference for all of them. What a family costs is a row of `SPECS`
(its transformers class, config.json reader, size check and the two config maps) and its tensor names
(model/names.py); the loader reads config.json once, checks the weights' headers against it, and only then lets
transformers build the model. Canonical / identity_q models are expanded to standard attention before export.
`transformers` is an optional dependency: pip install iattention[hf].

GPT-2. `GPT2LMHeadModel` stores its projections as Conv1D with weight (in, out) where we use nn.Linear (out, in):
its row transposes them (`Spec.transposed`). Our embedding table is padded (zero rows) to vocab_pad_multiple and cut
back on export; the head is tied to it (an untied head is refused unless it equals the embedding).

Llama family. `LlamaForCausalLM`, `Qwen2ForCausalLM` and `MistralForCausalLM` (SmolLM2 is LlamaForCausalLM) share
one layout: separate q/k/v/o projections, RMSNorm, SwiGLU, RoPE in the rotate_half layout. Our standard model
(projection "separate") holds the same tensors under GPT-2's prefixes, so the weights copy one to one. A family
whose record stores them fused (projection "fused", fused_gate_up: Phi-3's qkv_proj and gate_up_proj) holds its
tensors as they are too, renamed by its name map. The rotary width is read from the model's own `inv_freq` (Llama
accepts `partial_rotary_factor` in its config and ignores it; a record with `partial_rotary` reads and writes it),
and our frequencies must equal transformers' bit for bit.
Out of scope, refused in one line: QK-norm models (Qwen3, Gemma-3, OLMo-2: a norm between the projection and RoPE
breaks the gauge), MLP biases, RoPE types that rescale cos/sin or switch with the length (Phi-3's longrope). A
sliding window (Mistral's and Phi-3's on every layer, Qwen2's from max_window_layers on) is the same mask here
(GPTConfig.sliding_window).

GPT-NeoX (the Pythia suite): LayerNorm with biases, exact GELU, a parallel residual, `query_key_value` laid out per
head (projection "neox"), rotary on the first rotary_pct x d_head dims of each head in the rotate_half layout, an
untied head (`embed_out` in older checkpoints; transformers 5 renames it on load).
"""

from __future__ import annotations

import importlib
import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from iattention.checkpoint.run_folder import read_json_object
from iattention.checkpoint.state import TOKEN_IDS, check_declared_size, check_finite, is_token_id
from iattention.config.families import BIAS_RULES, FAMILIES, Family, family_record
from iattention.config.model import LLAMA3_SCALING, ROPE_TYPES, GPTConfig
from iattention.errors import UserError, first_words, shown
from iattention.model.gpt import GPT, inv_freq_of
from iattention.model.names import from_family, from_file, to_family, to_file
from iattention.symmetry.transforms import expand

FINITE_FIX = "use a model with finite weights (it diverged or was damaged)"  # a NaN/Inf weight's refusal
_FIX = "fix the key or re-save the model with save_pretrained"
_RESAVE = "download or copy the model folder again, or re-save it with save_pretrained"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _transformers():
    try:
        import transformers  # lazy: heavy and optional (iattention[hf]), only for HF import/export
    except ImportError:
        raise UserError("this needs Hugging Face transformers; install it with pip install 'iattention[hf]'") \
            from None
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return transformers


def _transformers_v5():
    """transformers for the Llama family: 5 or later, whose configs hold `rope_parameters` (4.x keeps
    `rope_theta`/`rope_scaling` apart, and would build an export with the default theta)."""
    tf = _transformers()
    if int(tf.__version__.split(".")[0]) < 5:
        raise UserError(f"Llama-family and GPT-NeoX conversion needs transformers 5 or later (found {tf.__version__}); "
                        "pip install 'transformers>=5'")
    return tf


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
        _transformers().GenerationConfig.from_pretrained(str(folder))
    except Exception as e:  # ValueError, and AttributeError for a nested config of the wrong type
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"{path} is refused by transformers ({why}); {fix}") from None
    return obj


def _strict_error():
    """huggingface_hub's config-validation error (not a ValueError: a type it finds wrong in config.json would
    otherwise escape as a traceback); Exception's subclass that nothing raises where it is missing."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:
        return UserError  # never raised inside from_pretrained
    return StrictDataclassError


INDEX = "model.safetensors.index.json"
_ST = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
_OTHER = {"I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}
# old HF checkpoints' saved frequencies and GPT-NeoX's causal-mask buffers: transformers ignores them too
_IGNORED = ("rotary_emb.inv_freq", ".attention.bias", ".attention.masked_bias")


def _weight_files(path: Path) -> list[str]:
    """The safetensors files an HF folder's weights live in: its index's shards (each a file inside the
    folder: a path that leaves it is refused, not followed), else model.safetensors."""
    index = path / INDEX
    if not index.exists():
        return ["model.safetensors"]
    fix = "re-save the model with save_pretrained"
    obj = read_json_object(index, "a safetensors index", fix, schema={"weight_map": (dict,)})
    files = list(dict.fromkeys(obj["weight_map"].values()))
    for f in files:
        # lexically, not resolved: a shard symlinked into a cache (as the hub's snapshots are) stays readable
        if not isinstance(f, str) or not f or os.path.isabs(f) or os.path.normpath(f).split(os.sep)[0] == "..":
            raise UserError(f"{index} maps tensors to {f!r}, outside the model folder {path}; an index names "
                            f"files inside its folder only; {fix}")
    return files


class Source:
    """An HF-layout folder's safetensors files (one, or an index's shards), their headers read at once, their
    tensors a few at a time: what the whole-model loader checks before transformers reads the folder
    (transformers casts every tensor to the model's dtype without a word: an int64 or fp16 tensor in a float32
    file would load as another model), and what the streaming converter (interop/stream.py) reads layer by layer.
    `files`: by default the folder's (its index's shards, else model.safetensors); `declared`: each file's
    declared size checked first (a whole load would materialise a crafted header over a sparse file; a streamed
    one reads a layer at a time, so a model larger than memory is its point)."""

    def __init__(self, folder: Path, files: list[str] | None = None, declared: bool = False):
        self.folder = folder
        self.where: dict[str, str] = {}
        self.shapes: dict[str, list[int]] = {}
        self.dtypes: dict[str, str] = {}
        index = folder / INDEX if (folder / INDEX).exists() else None
        for name in _weight_files(folder) if files is None else files:
            if not (folder / name).is_file():
                named = f"{index} names shard {name}, which" if index else f"its weights file {name}"
                raise UserError(f"{folder}: {named} is missing; {_RESAVE}")
            if declared:
                check_declared_size(folder / name)
            with self._open(name) as f:
                for k in f.keys():
                    sl = f.get_slice(k)
                    self.where[k], self.shapes[k], self.dtypes[k] = name, list(sl.get_shape()), sl.get_dtype()
        if index:  # every tensor the index names must be where it says
            wm = read_json_object(index, "a safetensors index", _RESAVE, schema={"weight_map": (dict,)})["weight_map"]
            for k, shard in wm.items():
                if self.where.get(k) != shard:
                    raise UserError(f"{index} maps {k} to {shard}, which does not hold it; {_RESAVE}")

    def _open(self, name: str):
        path = self.folder / name
        try:
            return safe_open(str(path), framework="pt")
        except SafetensorError as e:
            raise UserError(f"cannot read {path} as safetensors ({first_words(e, 80)}): it is truncated "
                            f"or damaged; {_RESAVE}") from None

    def read(self, names: list[str]) -> dict[str, torch.Tensor]:
        """The tensors `names`, each file opened once and closed again (its mapped pages let go)."""
        files: dict[str, list[str]] = {}
        for k in names:
            files.setdefault(self.where[k], []).append(k)
        out = {}
        for name, keys in files.items():
            try:
                with self._open(name) as f:
                    for k in keys:
                        out[k] = f.get_tensor(k)
            except SafetensorError as e:
                raise UserError(f"cannot read {self.folder / name} ({first_words(e, 80)}); {_RESAVE}") \
                    from None
        return out

    def chunks(self, name: str, max_bytes: int):
        """One tensor in slices of whole rows of at most `max_bytes` (one row if a row is bigger), the file opened
        for each slice and closed again: copying the embedding of a big model holds a slice, not the table."""
        shape = self.shapes[name]
        row = math.prod(shape[1:]) * _ST.get(self.dtypes[name], torch.float32).itemsize
        step = max(1, max_bytes // max(row, 1))
        for start in range(0, max(shape[0], 1) if shape else 1, step):
            try:
                with self._open(self.where[name]) as f:
                    sl = f.get_slice(name)
                    yield sl[start:start + step] if shape else sl[:]
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
                raise UserError(f"{self.folder / self.where[k]} holds {k} as {_OTHER.get(dt, dt)}, not floating "
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


# ------------------------------------------------------------------------------------------- config and sizes

# What a config.json must hold and may hold (key: accepted types), per family, checked before transformers reads it:
# its own answers to a bad value are tracebacks (TypeError, ZeroDivisionError, KeyError,
# StrictDataclassFieldValidationError), messages cut mid-word, or a model of a million layers allocated before any
# check against the weights.
_NONE = type(None)
_NUM = (float, int)


def _finite_positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf


def _read_config(folder: Path, required: dict, optional: dict, positive) -> dict:
    """A folder's config.json with each key of `required` present, each key of either of its types, and the keys
    `positive` names (where given) >= 1; else one line naming the key."""
    path = folder / "config.json"
    cfg = read_json_object(path, "a Hugging Face config", "re-save the model with save_pretrained",
                           schema={"model_type": (str,)})
    missing = [k for k in required if k not in cfg]
    if missing:
        raise UserError(f"{path} lacks {', '.join(missing)}, which a {cfg['model_type']} config needs; {_FIX}")
    for key, types in {**required, **optional}.items():
        value = cfg.get(key)
        if key in cfg and (not isinstance(value, types) or isinstance(value, bool) and bool not in types):
            raise UserError(f"{path}: {key} is {type(value).__name__} {shown(repr(value), 100)}"
                            f", expected {' or '.join(t.__name__ for t in types)}; {_FIX}")
    for key in positive:
        if cfg.get(key) is not None and cfg[key] < 1:
            raise UserError(f"{path}: {key}={cfg[key]} must be a positive integer; {_FIX}")
    return cfg


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


def check_sizes(path: Path, fam: Family, cfg: dict, shapes: dict[str, list[int]]) -> None:
    """config.json's sizes against the tensors' shapes (from the safetensors headers), before transformers builds a
    model of the config's size (its own message about a mismatch is long, cut short, and names the wrong fix): the
    layer count, then each tensor outside the layers and of layer 0 (`expected_shapes`); the first disagreement
    named with the config.json keys that size that tensor (found by moving each key and seeing the shape move)."""
    dialect = DIALECTS[fam.dialect]
    where = path / "config.json"
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


# -------------------------------------------------------------------------------------------------------- GPT-2

GPT2_REQUIRED = {"model_type": (str,), "n_layer": (int,), "n_head": (int,), "n_embd": (int,), "vocab_size": (int,),
                 "n_positions": (int,)}
# Keys GPT2Config reads that may be absent (its defaults), each of the types it can use.
GPT2_OPTIONAL = {"n_inner": (int, _NONE), "layer_norm_epsilon": _NUM, "resid_pdrop": _NUM, "embd_pdrop": _NUM,
                 "attn_pdrop": _NUM, "initializer_range": _NUM, "activation_function": (str,),
                 "scale_attn_weights": (bool,), "scale_attn_by_inverse_layer_idx": (bool,),
                 "reorder_and_upcast_attn": (bool,), "tie_word_embeddings": (bool,), "use_cache": (bool,),
                 "n_ctx": (int, _NONE), "bos_token_id": (int, _NONE), "eos_token_id": (int, _NONE)}


def read_gpt2_config(folder: Path) -> dict:
    """A GPT-2 folder's config.json, checked: the keys GPT2Config reads, of its types, the sizes positive."""
    return _read_config(folder, GPT2_REQUIRED, GPT2_OPTIONAL, [k for k in GPT2_REQUIRED if k != "model_type"])


def _gpt2_mlp(n_inner, n_embd: int) -> int:
    return 0 if n_inner in (None, 4 * n_embd) else int(n_inner)  # 0: our default, 4 x n_embd


def _gpt2_shape(c: dict, fam: Family) -> GPTConfig:
    """The shape a GPT-2 folder's config.json (checked) describes: no weights read, no transformers needed."""
    return GPTConfig(n_layer=c["n_layer"], n_head=c["n_head"], n_embd=c["n_embd"], vocab_size=c["vocab_size"],
                     block_size=c["n_positions"], mlp_hidden=_gpt2_mlp(c.get("n_inner"), c["n_embd"]))


# The GPT2Config keys the standard GPT-2 block fixes: key -> whether a value is the standard block's
_GPT2_BLOCK = {"scale_attn_by_inverse_layer_idx": lambda v: not v, "scale_attn_weights": bool,
               "activation_function": lambda v: v in ("gelu_new", "gelu_pytorch_tanh"),
               "layer_norm_epsilon": lambda v: abs(v - 1e-5) <= 1e-12}


def gpt2_config_of(hc, rotary, tied: bool, fam: Family) -> GPTConfig:
    """Our config for a transformers GPT2Config (the standard GPT-2 block only; its head tied: see `from_hf_model`)."""
    problems = [f"{k}={getattr(hc, k)}" for k, standard in _GPT2_BLOCK.items() if not standard(getattr(hc, k))]
    if problems:
        raise UserError(f"unsupported GPT-2 variant ({', '.join(problems)}); iattention models the standard GPT-2 "
                        "block only")
    return GPTConfig(n_layer=hc.n_layer, n_head=hc.n_head, n_embd=hc.n_embd, vocab_size=hc.vocab_size,
                     block_size=hc.n_positions, dropout=float(hc.resid_pdrop), bias=True, attention="standard",
                     mlp_hidden=_gpt2_mlp(hc.n_inner, hc.n_embd))


def hf_gpt2_config(cfg: GPTConfig):
    return _transformers().GPT2Config(
        vocab_size=cfg.vocab_size, n_positions=cfg.block_size, n_embd=cfg.n_embd, n_layer=cfg.n_layer,
        n_head=cfg.n_head, activation_function="gelu_new", n_inner=cfg.mlp_hidden or None, resid_pdrop=cfg.dropout,
        embd_pdrop=cfg.dropout, attn_pdrop=cfg.dropout, layer_norm_epsilon=1e-5, tie_word_embeddings=True)


# ------------------------------------------------------------------------------------------------ Llama family

CONFIG_SCHEMA = {"model_type": (str,), "num_hidden_layers": (int,), "num_attention_heads": (int,),
                 "hidden_size": (int,), "intermediate_size": (int,), "vocab_size": (int,)}
LLAMA_CONFIG_OPTIONAL = {"num_key_value_heads": (int, _NONE), "head_dim": (int, _NONE),
                         "max_position_embeddings": (int,), "rms_norm_eps": (float,), "tie_word_embeddings": (bool,),
                         "attention_bias": (bool,), "mlp_bias": (bool,), "hidden_act": (str,),
                         "rope_parameters": (dict, _NONE), "rope_theta": (float, int), "rope_scaling": (dict, _NONE),
                         "sliding_window": (int, _NONE), "use_sliding_window": (bool,),
                         "no_rope_layers": (list, _NONE), "no_rope_layer_interval": (int,)}
_POSITIVE = ("num_hidden_layers", "num_attention_heads", "hidden_size", "intermediate_size", "vocab_size",
             "max_position_embeddings", "num_key_value_heads", "head_dim")


def read_llama_config(folder: Path) -> dict:
    """A Llama-family folder's config.json, checked as transformers would need it, else one line naming the key."""
    path = folder / "config.json"
    cfg = _read_config(folder, CONFIG_SCHEMA, LLAMA_CONFIG_OPTIONAL, _POSITIVE)
    family_record(cfg["model_type"], path)
    if cfg.get("rms_norm_eps") is not None and not _finite_positive(cfg["rms_norm_eps"]):
        raise UserError(f"{path}: rms_norm_eps={cfg['rms_norm_eps']} must be a finite number > 0 (1e-5 or 1e-6 in "
                        f"released models); {_FIX}")
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    if heads % kv:
        raise UserError(f"{path}: num_key_value_heads={kv} does not divide num_attention_heads={heads} (each key/value "
                        f"head serves the same number of query heads); {_FIX}")
    rope_type, theta, _ = rope_of(cfg, path)
    if not _finite_positive(theta):
        raise UserError(f"{path}: rope_theta={theta!r} must be a finite number > 0 (10000 or 500000 in released "
                        f"models); {_FIX}")
    fam = family_record(cfg["model_type"], path)
    nope_every_of(cfg, fam, path)  # layers without RoPE we cannot hold: one line
    if fam.partial_rotary:
        _check_share(cfg, "partial_rotary_factor", path, "1 in Phi-3-mini")
    return cfg


def nope_every_of(cfg, fam: Family, where) -> int:
    """GPTConfig.nope_every of a family whose class has layers without RoPE (`Family.nope`: SmolLM3's
    no_rope_layers, 1 = rotary; absent, transformers makes every no_rope_layer_interval-th layer unrotated), 0 for
    any other; a pattern other than every N-th layer is one line. `cfg` is a config.json dict or a transformers
    config."""
    if not fam.nope:
        return 0
    get = cfg.get if isinstance(cfg, dict) else lambda k, default=None: getattr(cfg, k, default)
    n, interval = get("num_hidden_layers"), get("no_rope_layer_interval", 4)
    flags = get("no_rope_layers")
    if flags is None:  # transformers makes them from the interval
        flags = [int((i + 1) % interval != 0) for i in range(n)] if isinstance(interval, int) and interval > 0 \
            else None
    bare = [i for i, f in enumerate(flags or []) if f == 0]
    every = bare[0] + 1 if bare else 0  # the first layer without RoPE says N; the rest must follow it
    if not isinstance(flags, list) or len(flags) != n or any(f not in (0, 1) or isinstance(f, bool) for f in flags) \
            or flags != [int(not every or (i + 1) % every != 0) for i in range(n)]:
        raise UserError(f"{where}: no_rope_layers {shown(repr(flags), 60)} is not one 0 or 1 per layer with every N-th "
                        f"layer unrotated (SmolLM3's: 1, 1, 1, 0, ...), which is what iattention holds; {_FIX}")
    return every


def rope_of(cfg: dict, path: Path) -> tuple[str, object, dict]:
    """(rope_type, rope_theta, the scaling numbers) of a config.json, in transformers 5's `rope_parameters` or the
    older top-level `rope_theta` / `rope_scaling`; a type iattention does not reproduce is one line."""
    params = cfg.get("rope_parameters") or {}
    legacy = cfg.get("rope_scaling") or {}
    where = "rope_parameters" if params else "rope_scaling"
    rope_type = params.get("rope_type", legacy.get("rope_type", legacy.get("type", "default")))
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    if rope_type not in ROPE_TYPES:
        raise UserError(f"{path}: {where} has rope_type {shown(repr(rope_type), 100)}; iattention reproduces "
                        f"{' and '.join(map(repr, ROPE_TYPES))} only: evaluate this model with transformers")
    given = {**legacy, **params}
    # transformers fills original_max_position_embeddings from max_position_embeddings when it is absent
    defaults = {"original_max_position_embeddings": cfg.get("max_position_embeddings")}
    scaling = {k: given.get(k, defaults.get(k)) for k in LLAMA3_SCALING} if rope_type == "llama3" else {}
    bad = [k for k, v in scaling.items() if not _finite_positive(v)]
    if bad:
        raise UserError(f"{path}: {where} has rope_type 'llama3' but no positive number for {', '.join(bad)}; add "
                        "them as the model's own config gives them")
    if scaling and scaling["high_freq_factor"] <= scaling["low_freq_factor"]:
        raise UserError(f"{path}: {where} has high_freq_factor={scaling['high_freq_factor']} <= low_freq_factor="
                        f"{scaling['low_freq_factor']}; llama3 scaling blends between them (Llama 3.1: 4 and 1)")
    return rope_type, theta, scaling


def attention_biases(fam: Family, attention_bias: bool) -> dict[str, bool]:
    """Our qkv_bias / o_bias for a family's attention_bias (its record's bias rule)."""
    if fam.bias_rule == "qkv_only":
        return {"qkv_bias": True, "o_bias": False}
    return {"qkv_bias": attention_bias, "o_bias": attention_bias}


def _llama_shape(cfg: dict, fam: Family) -> GPTConfig:
    """The shape a Llama-family folder's config.json (checked by `read_llama_config`) describes: no weights read, no
    transformers needed (whole heads rotate, or, where the record says partial_rotary, int(d_head x
    partial_rotary_factor) dims as transformers computes it)."""
    n_head, d = cfg["num_attention_heads"], cfg["hidden_size"]
    d_head = cfg.get("head_dim") or d // n_head
    bias = bool(cfg.get("attention_bias", False))
    rot = int(d_head * _rotary_share(cfg, "partial_rotary_factor")) // 2 * 2 if fam.partial_rotary else d_head
    return GPTConfig(n_layer=cfg["num_hidden_layers"], n_head=n_head,
                     n_kv_head=cfg.get("num_key_value_heads") or n_head, n_embd=d, d_head=d_head,
                     mlp_hidden=cfg["intermediate_size"], vocab_size=cfg["vocab_size"], block_size=1, rot=rot,
                     **attention_biases(fam, bias),
                     tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),  # transformers' default
                     family=fam.name, nope_every=nope_every_of(cfg, fam, "config.json"))


def rotary_of(hf_config, family: str):
    """transformers' own rotary embedding module for a config (its inv_freq, without building the model)."""
    name = FAMILIES[family].hf_class.removesuffix("ForCausalLM")
    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    return getattr(module, f"{name}RotaryEmbedding")(hf_config)


def window_of(c, fam: Family, where: str) -> tuple[int, int]:
    """(sliding_window, full_attention_layers) of a transformers config: Mistral's window is on every layer;
    Qwen2's (use_sliding_window) on the layers its layer_types call "sliding_attention", which transformers makes
    those from max_window_layers on. A window at least as long as the model's positions never binds (0); layer types
    in another order than full layers then windowed ones are one line."""
    window = getattr(c, "sliding_window", None) or 0
    if not fam.window:  # its class's window, where it has one, is on layers iattention does not window
        if "sliding_attention" in (getattr(c, "layer_types", None) or []):
            raise UserError(f"{where} has sliding-window layers (layer_types), which iattention does not model for "
                            f"{fam.name}; evaluate this model with transformers")
        return 0, 0
    if not window or window >= c.max_position_embeddings:
        return 0, 0
    if fam.window == "every_layer":
        return window, 0
    types = list(getattr(c, "layer_types", None) or ["full_attention"] * c.num_hidden_layers)
    full = next((i for i, t in enumerate(types) if t != "full_attention"), len(types))
    if full == len(types):
        return 0, 0
    if any(t != "sliding_attention" for t in types[full:]):
        raise UserError(f"{where} has layer_types {types[:8]}{'...' if len(types) > 8 else ''}; iattention windows "
                        "the layers from one index on (Qwen2's max_window_layers), not this order")
    return window, full


def llama_config_of(c, rotary, tied: bool, fam: Family) -> GPTConfig:
    """Our config for a transformers config `c`, its rotary embedding module and whether the head is tied."""
    where = f"this {fam.name} model"
    if getattr(c, "mlp_bias", False):
        raise UserError(f"{where} has MLP biases (mlp_bias=true), which iattention's SwiGLU does not hold")
    if getattr(c, "hidden_act", "silu") != "silu":
        raise UserError(f"{where} uses hidden_act={c.hidden_act!r}; iattention's SwiGLU uses silu")
    window, full_layers = window_of(c, fam, where)
    rope = dict(c.rope_parameters or {})
    rope_type = rope.pop("rope_type", "default")
    theta = float(rope.pop("rope_theta"))
    rope.pop("partial_rotary_factor", None)  # Llama ignores it; the width comes from inv_freq
    if getattr(rotary, "attention_scaling", 1.0) != 1.0:
        raise UserError(f"{where} uses rope_type {rope_type!r}, which scales cos/sin; iattention reproduces "
                        "'default' and 'llama3'")
    n_head = c.num_attention_heads
    d_head = getattr(c, "head_dim", None) or c.hidden_size // n_head
    bias = bool(getattr(c, "attention_bias", False))
    cfg = GPTConfig(
        n_layer=c.num_hidden_layers, n_head=n_head, n_kv_head=c.num_key_value_heads or n_head, n_embd=c.hidden_size,
        d_head=d_head, mlp_hidden=c.intermediate_size, vocab_size=c.vocab_size,
        block_size=c.max_position_embeddings,
        rot=2 * rotary.inv_freq.numel(), rope_theta=theta, rope_type=rope_type,
        rope_scaling=rope if rope_type != "default" else {}, norm_eps=float(c.rms_norm_eps),
        **attention_biases(fam, bias),
        tie_embeddings=tied, family=fam.name, sliding_window=window, full_attention_layers=full_layers,
        max_positions=c.max_position_embeddings, nope_every=nope_every_of(c, fam, where))
    if not torch.equal(inv_freq_of(cfg), rotary.inv_freq.float().cpu()):
        raise UserError(f"{where}'s RoPE frequencies (rope_type {rope_type!r}) differ from what iattention computes "
                        "for them; iattention reproduces 'default' and 'llama3'")
    return cfg


def hf_llama_config(cfg: GPTConfig):
    fam = FAMILIES[cfg.family]
    config_class = _class(cfg.family).config_class  # LlamaConfig, ...: transformers 5's (rope_parameters)
    if cfg.rot != cfg.d_head and not fam.partial_rotary or cfg.rope_layout != "half":
        raise UserError(f"transformers' {fam.hf_class} rotates {'some' if fam.partial_rotary else 'all'} of a head's "
                        f"dims in the 'half' layout; this model has rot={cfg.rot} of d_head={cfg.d_head}, layout "
                        f"{cfg.rope_layout!r}")
    holds = {"qkv_only": (True, False), "none": (False, False)}.get(fam.bias_rule, (cfg.qkv_bias, cfg.qkv_bias))
    if (cfg.qkv_bias, cfg.o_bias) != holds:
        raise UserError(f"transformers' {fam.hf_class} cannot hold qkv_bias={cfg.qkv_bias} with "
                        f"o_bias={cfg.o_bias} ({fam.label}: {BIAS_RULES[fam.bias_rule]})")
    kw = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.n_embd, intermediate_size=cfg.d_mlp,
              num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_kv_head,
              head_dim=cfg.d_head, max_position_embeddings=cfg.max_positions or cfg.block_size,
              rms_norm_eps=cfg.norm_eps, tie_word_embeddings=cfg.tie_embeddings, hidden_act="silu",
              rope_parameters={"rope_type": cfg.rope_type, "rope_theta": cfg.rope_theta, **cfg.rope_scaling,
                               **({"partial_rotary_factor": cfg.rot / cfg.d_head} if fam.partial_rotary else {})})
    if fam.bias_rule == "attention_bias":
        kw["attention_bias"] = cfg.qkv_bias
    if fam.window == "every_layer":
        kw["sliding_window"] = cfg.sliding_window or None
    if fam.nope:  # SmolLM3: 1 = a rotary layer, 0 = none
        kw["no_rope_layers"] = [int(not cfg.nope_every or (i + 1) % cfg.nope_every != 0) for i in range(cfg.n_layer)]
        kw["no_rope_layer_interval"] = cfg.nope_every or cfg.n_layer + 1
    if fam.window == "from_layer" and cfg.sliding_window:  # its window on the layers from max_window_layers on
        kw.update(use_sliding_window=True, sliding_window=cfg.sliding_window,
                  max_window_layers=cfg.full_attention_layers)
    return config_class(**kw)


# ---------------------------------------------------------------------------------------------------- GPT-NeoX


# Keys GPTNeoXConfig reads that may be absent (its defaults), each of the types it can use.
NEOX_CONFIG_OPTIONAL = {"max_position_embeddings": (int,), "layer_norm_eps": _NUM, "rotary_pct": _NUM,
                        "rotary_emb_base": _NUM, "rope_theta": _NUM, "rope_parameters": (dict, _NONE),
                        "rope_scaling": (dict, _NONE), "use_parallel_residual": (bool,), "attention_bias": (bool,),
                        "tie_word_embeddings": (bool,), "hidden_act": (str,)}


def read_neox_config(folder: Path) -> dict:
    """A GPT-NeoX folder's config.json with the keys our model reads, each of its type and in range (one line naming
    the config.json key, not the training setting it becomes)."""
    path = folder / "config.json"
    cfg = _read_config(folder, CONFIG_SCHEMA, NEOX_CONFIG_OPTIONAL,
                       [k for k in (*CONFIG_SCHEMA, "max_position_embeddings") if k != "model_type"])
    if cfg["hidden_size"] % cfg["num_attention_heads"]:
        raise UserError(f"{path}: hidden_size={cfg['hidden_size']} is not a multiple of num_attention_heads="
                        f"{cfg['num_attention_heads']}; {_FIX}")
    for key, example in (("layer_norm_eps", "1e-5"), ("rotary_emb_base", "10000")):
        if key in cfg and not _finite_positive(cfg[key]):
            raise UserError(f"{path}: {key}={cfg[key]} must be a finite number > 0 ({example} in released models); "
                            f"{_FIX}")
    _check_share(cfg, "rotary_pct", path, "0.25 in Pythia")
    _, theta, _ = rope_of(cfg, path)  # a rope type we do not reproduce is one line
    if not _finite_positive(theta):
        raise UserError(f"{path}: rope_theta={theta!r} must be a finite number > 0 (10000 in released models); {_FIX}")
    return cfg


def _rotary_share(cfg: dict, legacy: str):
    """The share of each head's dims that rotate: rope_parameters' partial_rotary_factor, else the older top-level
    key `legacy` (GPT-NeoX's rotary_pct, Phi-3's partial_rotary_factor), else 1; NaN where it is no number."""
    pct = (cfg.get("rope_parameters") or {}).get("partial_rotary_factor", cfg.get(legacy, 1.0))
    return pct if isinstance(pct, (int, float)) and not isinstance(pct, bool) else float("nan")


def _check_share(cfg: dict, legacy: str, path: Path, example: str) -> None:
    """`_rotary_share` in (0, 1], else one line naming the config.json key it was read from."""
    share = _rotary_share(cfg, legacy)
    if not 0 < share <= 1:
        key = "rope_parameters.partial_rotary_factor" if "partial_rotary_factor" in (cfg.get("rope_parameters") or {}) \
            else legacy
        raise UserError(f"{path}: {key}={shown(repr(share), 40)} must be a number in (0, 1] (the share of each head's "
                        f"dims that rotate; {example}); {_FIX}")


def _neox_shape(cfg: dict, fam: Family) -> GPTConfig:
    """The shape a GPT-NeoX folder's config.json (checked) describes (no weights, no transformers): its rotary
    width int(d_head x rotary_pct) as transformers computes it."""
    d_head = cfg["hidden_size"] // cfg["num_attention_heads"]
    pct = _rotary_share(cfg, "rotary_pct")
    bias = bool(cfg.get("attention_bias", True))
    return GPTConfig(family=fam.name, n_layer=cfg["num_hidden_layers"], n_head=cfg["num_attention_heads"],
                     n_embd=cfg["hidden_size"], mlp_hidden=cfg["intermediate_size"], vocab_size=cfg["vocab_size"],
                     block_size=1, rot=int(d_head * pct) // 2 * 2, qkv_bias=bias, o_bias=bias,
                     tie_embeddings=bool(cfg.get("tie_word_embeddings", False)))


def neox_config_of(c, rotary, tied: bool, fam: Family) -> GPTConfig:
    """Our config for a transformers GPTNeoXConfig `c` and its rotary embedding module (the rotary width from its
    inv_freq, as transformers computes it from rotary_pct)."""
    where = f"this {fam.name} model"
    if getattr(c, "hidden_act", "gelu") != "gelu":
        raise UserError(f"{where} uses hidden_act={c.hidden_act!r}; iattention's GPT-NeoX MLP uses exact gelu")
    rope = dict(c.rope_parameters or {})
    rope_type = rope.pop("rope_type", "default")
    if rope_type != "default" or getattr(rotary, "attention_scaling", 1.0) != 1.0:
        raise UserError(f"{where} uses rope_type {rope_type!r}; iattention reproduces 'default' for GPT-NeoX")
    cfg = GPTConfig(family=fam.name, n_layer=c.num_hidden_layers, n_head=c.num_attention_heads, n_embd=c.hidden_size,
                    mlp_hidden=c.intermediate_size, vocab_size=c.vocab_size, block_size=c.max_position_embeddings,
                    rot=2 * rotary.inv_freq.numel(), rope_theta=float(rope.get("rope_theta", 10000.0)),
                    norm_eps=float(c.layer_norm_eps), bias=True, qkv_bias=bool(c.attention_bias),
                    o_bias=bool(c.attention_bias), parallel_residual=bool(c.use_parallel_residual),
                    tie_embeddings=tied)
    if not torch.equal(inv_freq_of(cfg), rotary.inv_freq.float().cpu()):
        raise UserError(f"{where}'s RoPE frequencies differ from what iattention computes for them")
    return cfg


def hf_neox_config(cfg: GPTConfig):
    if cfg.rope_layout != "half" or cfg.rope_type != "default" or cfg.qkv_bias != cfg.o_bias or not cfg.bias:
        raise UserError("transformers' GPTNeoXForCausalLM holds the 'half' rope layout, the default rope type and one "
                        f"attention_bias with LayerNorm biases; this model has layout {cfg.rope_layout!r}, rope type "
                        f"{cfg.rope_type!r}, qkv_bias={cfg.qkv_bias}, o_bias={cfg.o_bias}, bias={cfg.bias}")
    return _transformers_v5().GPTNeoXConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.n_embd, num_hidden_layers=cfg.n_layer,
        num_attention_heads=cfg.n_head, intermediate_size=cfg.d_mlp, hidden_act="gelu",
        max_position_embeddings=cfg.max_positions or cfg.block_size, layer_norm_eps=cfg.norm_eps,
        use_parallel_residual=cfg.parallel_residual, attention_bias=cfg.qkv_bias,
        tie_word_embeddings=cfg.tie_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta,
                         "partial_rotary_factor": cfg.rot / cfg.d_head})


def write_transformers4_keys(folder: Path) -> None:
    """Add to an export's config.json (written by transformers 5: RoPE in `rope_parameters` only) the keys transformers
    4.x reads RoPE from, which it would otherwise fill with its defaults and run another model without a word:
    `rope_theta` and, for a scaled type, `rope_scaling` (Llama, Qwen2, Mistral: 4.x default 10000, no scaling);
    `rotary_pct` and `rotary_emb_base` (GPT-NeoX: 4.x default 0.25 and 10000; a model rotating all of each head
    gave other logits in 4.40.2). transformers 5 reads `rope_parameters` first, and the two say the same."""
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    rope = dict(cfg.get("rope_parameters") or {})
    theta, rope_type = rope.pop("rope_theta", 10000.0), rope.pop("rope_type", "default")
    fam = FAMILIES.get(cfg.get("model_type"))
    if fam is not None and fam.dialect == "neox":
        cfg.update(rotary_pct=rope.get("partial_rotary_factor", 1.0), rotary_emb_base=theta)
    else:
        share = rope.pop("partial_rotary_factor", None)
        if fam is not None and fam.partial_rotary:  # 4.x's Phi3Config reads it at the top level
            cfg["partial_rotary_factor"] = 1.0 if share is None else share
        cfg.update(rope_theta=theta, rope_scaling={"rope_type": rope_type, **rope} if rope_type != "default" else None)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


# ---------------------------------------------------------------------------------------------- every family

@dataclass(frozen=True)
class Dialect:
    """How the folders of a config.json dialect (`Family.dialect`) are read and written."""

    read_config: Callable[[Path], dict]  # config.json checked, one line per problem
    shape: Callable[[dict, Family], GPTConfig]  # a checked config.json -> the shape it describes (no weights)
    config_of: Callable  # (transformers config, its rotary module or None, tied, record) -> our GPTConfig
    hf_config: Callable[[GPTConfig], object]  # our config -> the transformers config an export writes
    layers_key: str  # config.json's layer count
    size_keys: tuple[str, ...]  # config.json's sizes, in the order a size disagreement names them


_LLAMA_SIZES = ("vocab_size", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size",
                "intermediate_size", "max_position_embeddings")
DIALECTS = {
    "gpt2": Dialect(read_gpt2_config, _gpt2_shape, gpt2_config_of, hf_gpt2_config, "n_layer",
                    ("vocab_size", "n_positions", "n_head", "n_embd", "n_inner")),
    "llama": Dialect(read_llama_config, _llama_shape, llama_config_of, hf_llama_config, "num_hidden_layers",
                     _LLAMA_SIZES),
    "neox": Dialect(read_neox_config, _neox_shape, neox_config_of, hf_neox_config, "num_hidden_layers",
                    _LLAMA_SIZES),
}


def dialect_of(family: str) -> Dialect:
    return DIALECTS[FAMILIES[family].dialect]


_EMBEDDINGS = ("transformer.wte.weight", "lm_head.weight")  # padded to vocab_pad_multiple here, cut on export


def shape_from_folder(folder: Path) -> GPTConfig:
    """The shape an HF folder's config.json describes, for counting: no weights read, no transformers needed."""
    fam = FAMILIES[family_of(folder)]
    dialect = dialect_of(fam.name)
    return dialect.shape(dialect.read_config(folder), fam)


def family_of(path: Path) -> str:
    """The family of an HF folder (its config.json's model_type), or a one-line refusal naming what is converted."""
    model_type = read_json_object(path / "config.json", "a Hugging Face config", "re-save the model with "
                                  "save_pretrained", schema={"model_type": (str,)})["model_type"]
    return family_record(model_type, path / "config.json").name


def _class(family: str):
    fam = FAMILIES[family]
    return getattr(_transformers_v5() if fam.v5 else _transformers(), fam.hf_class)


def _tied(hf) -> bool:
    """Whether the loaded model's head IS its embedding: transformers unties a config's tie_word_embeddings when the
    checkpoint holds a different lm_head.weight (and says so only in a warning), so the config alone can mislead."""
    head, embed = hf.get_output_embeddings().weight, hf.get_input_embeddings().weight
    return head is embed or head.data_ptr() == embed.data_ptr()


@torch.no_grad()
def from_hf_model(hf, family: str, source="the Hugging Face model") -> GPT:
    """A loaded transformers model of a family -> our standard model, same dtype, same logits."""
    fam = FAMILIES[family]
    tied = _tied(hf)
    if not tied and fam.tied_only:
        if not torch.equal(hf.get_output_embeddings().weight, hf.get_input_embeddings().weight):
            # our model ties its output head to the embedding: loading both would keep one of them for both roles
            raise UserError(f"{source} has an untied output head (config.json: tie_word_embeddings false, and "
                            f"lm_head.weight differs from {to_family(_EMBEDDINGS[0], family)}); iattention models "
                            f"{fam.hf_class} with tied embeddings only: evaluate this model with transformers, or tie "
                            "its head and re-save it")
        tied = True  # untied in name only: the same function
    cfg = DIALECTS[fam.dialect].config_of(hf.config, getattr(hf.base_model, "rotary_emb", None), tied, fam)
    model = GPT(cfg).to(hf.get_input_embeddings().weight.dtype)
    state = {}
    for k, v in hf.state_dict().items():
        if k.endswith(fam.buffers):
            continue
        name = from_family(k, family)
        if k.endswith(fam.transposed):
            v = v.t()
        if name in _EMBEDDINGS and cfg.padded_vocab_size > cfg.vocab_size:
            v = torch.cat([v, v.new_zeros(cfg.padded_vocab_size - cfg.vocab_size, v.shape[1])])
        state[name] = v.contiguous()
    model.load_state_dict(state, strict=True)
    return model.eval()


def from_hf(model_or_path) -> GPT:
    """A transformers model of any family (the object, or a local folder saved with save_pretrained, read from
    safetensors only) -> our standard model, same dtype, same logits."""
    tf = _transformers()
    if isinstance(model_or_path, tf.PreTrainedModel):
        family = family_record(model_or_path.config.model_type, "the Hugging Face model").name
        check_finite(model_or_path.state_dict(), "the Hugging Face model", FINITE_FIX)
        return from_hf_model(model_or_path, family)
    path = Path(model_or_path)
    if not (path / "config.json").exists():
        raise UserError(f"{path} is not a Hugging Face model folder (no config.json); give a folder saved with "
                        "save_pretrained")
    fam = FAMILIES[family_of(path)]
    family, cls = fam.name, _class(fam.name)
    cfg = DIALECTS[fam.dialect].read_config(path)
    source = Source(path, declared=True)
    source.float_dtype(skip=(".attn.bias", ".attn.masked_bias"))  # old GPT-2 files' attention-mask buffers
    check_sizes(path, fam, cfg, source.shapes)
    generation_settings(path)  # transformers reads it below: a bad one named here, not as the weights
    # use_safetensors: never unpickle a pytorch_model.bin
    try:
        hf, info = cls.from_pretrained(str(path), use_safetensors=True, output_loading_info=True)
    except (OSError, ValueError, RuntimeError, TypeError, KeyError, SafetensorError, _strict_error()) as e:
        raise UserError(f"cannot load {path} as {fam.hf_class} from safetensors ({first_words(e)}); "
                        "re-save it with save_pretrained(safe_serialization=True)") from None
    # transformers fills a missing or wrongly shaped tensor with a fresh random init and only warns: a silently
    # different model. Refuse it, naming the tensor.
    missing = [k for k in info.get("missing_keys", []) if not (k == "lm_head.weight" and _tied(hf))]
    shaped = [k[0] if isinstance(k, tuple) else k for k in info.get("mismatched_keys", [])]
    for what, keys in (("missing", missing), ("unexpected", info.get("unexpected_keys", [])),
                       ("wrongly shaped", shaped)):
        if keys:
            raise UserError(f"{path}: its safetensors has {what} tensor(s) {', '.join(map(str, list(keys)[:3]))} for "
                            f"{fam.hf_class} with its config.json; re-save the model with save_pretrained")
    check_finite(hf.state_dict(), path, FINITE_FIX)  # as a checkpoint's
    return from_hf_model(hf.eval(), family, path)


@torch.no_grad()
def hf_logits(path: str | Path, x: torch.Tensor) -> torch.Tensor:
    """The logits of an HF folder's own transformers class in float64 on tokens x (the reference a conversion's
    source is checked against; the folder was read by from_hf first)."""
    cls = _class(family_of(Path(path)))
    dtype = "dtype" if int(_transformers().__version__.split(".")[0]) >= 5 else "torch_dtype"  # 4.x's name
    hf = cls.from_pretrained(str(path), use_safetensors=True, **{dtype: torch.float64})
    return hf.eval()(x).logits


def hf_config_of(cfg: GPTConfig, token_ids: dict | None = None):
    """The transformers config an export of a model of `cfg` writes (a one-line refusal where its class cannot
    hold the structure), with the special-token ids `token_ids` (`token_ids_of` its source's) and None for those it
    lacks, never the family class's defaults (GPTNeoXConfig's eos 2, LlamaConfig's bos 1 and eos 2, ...): an id
    nothing says is unknown. An export of a run gets its end-of-text token's from add_eos_row."""
    hc = dialect_of(cfg.family).hf_config(cfg)
    for key in TOKEN_IDS:
        setattr(hc, key, (token_ids or {}).get(key))
    return hc


def token_ids_of(hf_config, folder: Path) -> dict:
    """The special-token ids the transformers config of `folder` sets (bos, eos, pad; an eos may be a list): what a
    conversion from Hugging Face records in its checkpoint's metadata ("token_ids") and an export writes back
    (hf_config_of); one that is no id is one line."""
    ids = {key: value for key in TOKEN_IDS if (value := getattr(hf_config, key, None)) is not None}
    for key, value in ids.items():
        if not is_token_id(value):
            raise UserError(f"{Path(folder) / 'config.json'}: {key} is {type(value).__name__} {shown(repr(value), 100)}"
                            f", expected a token id (an integer) or a list of them; {_FIX}")
    return ids


def hf_config_from_folder(folder: Path, family: str):
    """An HF folder's config.json as its family's transformers config class reads it, or one line."""
    config_class = _class(family).config_class
    try:
        return config_class.from_pretrained(str(folder))
    except (OSError, ValueError, TypeError, KeyError, _strict_error()) as e:
        raise UserError(f"cannot read {folder / 'config.json'} as {config_class.__name__} "
                        f"({first_words(e)}); fix the key or re-save the model with save_pretrained") \
            from None


def folder_token_ids(folder: Path) -> dict:
    """token_ids_of an HF folder's config.json, as its family's transformers config reads it."""
    folder = Path(folder)
    return token_ids_of(hf_config_from_folder(folder, family_of(folder)), folder)


@torch.no_grad()
def to_hf(model: GPT, token_ids: dict | None = None):
    """Any iattention model (canonical is expanded) -> the transformers model of its family, same logits;
    `token_ids`: its special-token ids (hf_config_of)."""
    if model.config.attention != "standard":
        model = expand(model)
    c = model.config
    fam = FAMILIES[c.family]
    hf = _class(c.family)(hf_config_of(c, token_ids)).to(model.transformer.wte.weight.dtype)
    rotary = getattr(hf.base_model, "rotary_emb", None)
    if rotary is not None:
        theirs, ours = rotary.inv_freq.float().cpu(), model.transformer.rotary_emb.inv_freq.float().cpu()
        if theirs.shape != ours.shape or not torch.equal(theirs, ours):
            raise UserError(f"transformers' {fam.hf_class} would rotate {2 * theirs.numel()} dims of each head with "
                            f"other frequencies than this model's rot={c.rot}; it cannot be exported exactly")
    state = {}
    for k, v in model.state_dict().items():
        name = to_family(k, c.family)
        if name.endswith(fam.transposed):
            v = v.t()
        if k in _EMBEDDINGS:
            v = v[: c.vocab_size]
        state[name] = v.contiguous()
    for k, v in hf.state_dict().items():
        if k not in state and not c.bias and k.endswith(".bias") and not k.endswith(fam.buffers):
            state[k] = torch.zeros_like(v)  # a bias-free model: HF GPT-2 always has biases; zero is the same function
    missing, unexpected = hf.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if not k.endswith(fam.buffers)]:
        raise RuntimeError(f"no one-to-one state dict: missing {missing[:3]}, unexpected {unexpected[:3]}")
    hf.tie_weights()
    return hf.eval()


# The added end-of-text token's logit, relative to the lowest real one: its probability, exp(-EOS_BELOW) of
# the least likely real token's, is 0 in float32 and float64, so every text scores exactly as in the run.
EOS_BELOW = 1000.0


@torch.no_grad()
def add_eos_row(hf, eos_id: int) -> bool:
    """Give an exported model its end-of-text token (see interop/hf_tokenizer.py): bos/eos = `eos_id` in the
    model and generation configs, and, when `eos_id` is past the model's vocabulary (bpe:N, byte: an added
    token), a row for it whose logit is far below every real one at every position, so that it takes no
    probability: the export scores every text as the run does (a zero row, logit 0, took exp(-logsumexp)).

    The row is the head's (GPT-2's head is tied to the embedding, so it is the input row too; GPT-NeoX's untied
    input row stays zero) and must be one vector w with w . ln_f(x) constant: LayerNorm's output is
    gamma * xhat + beta with sum(xhat) = 0, so w = k / gamma gives k * sum(beta / gamma) at every position,
    whatever x. Returns False (the row is then zero, the old logit 0) where no such w exists: the Llama family's
    RMSNorm (no beta), a zero gamma, or beta / gamma summing to about 0 (a model without biases)."""
    n = hf.config.vocab_size
    if eos_id > n:
        raise UserError(f"the tokenizer has {eos_id} tokens, more than the model's {n}; export with the "
                        "tokenizer the model was trained with (its run folder's tokenizer.json, or --data-dir)")
    silent = True
    if eos_id == n:
        hf.resize_token_embeddings(n + 1, mean_resizing=False)
        row = hf.get_input_embeddings().weight[n]
        row.zero_()
        head = hf.get_output_embeddings()
        if head is not None and head.weight.data_ptr() != hf.get_input_embeddings().weight.data_ptr():
            head.weight[n].zero_()  # an untied head (Llama family): logit 0 as well, not a random row
        # GPT-2's and GPT-NeoX's final LayerNorm has a bias to silence the row with; the Llama family's RMSNorm
        # has none (GPT-NeoX's row was left zero too: lm-eval scored its tiny exports 0.16% above iattn eval)
        w = _silent_row(hf, n) if _final_layernorm(hf) is not None else None
        if w is None:
            silent = False
        else:
            hf.get_output_embeddings().weight[n].copy_(w)
        hf.tie_weights()
    for cfg in (hf.config, hf.generation_config):
        cfg.bos_token_id = cfg.eos_token_id = eos_id
    return silent


def _final_layernorm(hf):
    """The model's final LayerNorm (GPT-2's ln_f, GPT-NeoX's final_layer_norm), or None (an RMSNorm)."""
    base = hf.base_model
    ln = getattr(base, "ln_f", None) or getattr(base, "final_layer_norm", None)
    return ln if isinstance(ln, torch.nn.LayerNorm) else None


def _silent_row(hf, n: int):
    """The head row k / gamma whose logit is at least EOS_BELOW under every real logit on a probe batch
    (checked in the model's own dtype), or None."""
    ln = _final_layernorm(hf)
    gamma = ln.weight.double()
    beta = ln.bias.double() if ln.bias is not None else torch.zeros_like(gamma)
    if not torch.all(gamma != 0):
        return None
    c = (beta / gamma).sum()
    g = torch.Generator().manual_seed(0)
    positions = getattr(hf.config, "n_positions", None) or hf.config.max_position_embeddings
    probe = torch.randint(0, n, (4, min(positions, 64)), generator=g)
    real = hf(probe).logits[..., :n].double()
    target = real.min() - 2 * EOS_BELOW  # the constant logit k * c aimed at; at least EOS_BELOW below after
    if c.abs() < 1e-6 * (beta.abs() / gamma.abs()).sum().clamp_min(1e-30):
        return None
    w = (target / c) / gamma
    if not torch.isfinite(w).all():
        return None
    head = hf.get_output_embeddings().weight  # the embedding itself where tied (GPT-2)
    dtype = head.dtype
    old = head[n].clone()
    head[n] = w.to(dtype)
    probe[:, 0] = n  # as a document start (lm-eval's rolling loglikelihood): finite logits after it
    logits = hf(probe).logits.double()
    head[n] = old
    ok = torch.isfinite(logits).all() and (logits[..., n] <= logits[..., :n].min(-1).values - EOS_BELOW).all()
    return w.to(dtype) if ok else None
