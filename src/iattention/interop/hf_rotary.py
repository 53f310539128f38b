"""Exact conversion between transformers' rotary families and our model (`GPT` with family llama, qwen2, mistral
or gpt_neox): one loader, one exporter, one float64 reference for all of them. What a family costs is a row of
`SPECS` (its transformers class, config.json reader and the two config maps below) and its tensor names
(model/names.py); GPT-2 (interop/hf.py) differs in kind: Conv1D weights stored transposed, learned positions.

Llama family. `LlamaForCausalLM`, `Qwen2ForCausalLM` and `MistralForCausalLM` (SmolLM2 is LlamaForCausalLM) share
one layout: separate q/k/v/o projections, RMSNorm, SwiGLU, RoPE in the rotate_half layout. Our standard model
(projection "separate") holds the same tensors under GPT-2's prefixes, so the weights copy one to one; canonical
models are expanded first on export. The rotary width is read from the model's own `inv_freq` (Llama accepts
`partial_rotary_factor` in its config and ignores it), and our frequencies must equal transformers' bit for bit.
Out of scope, refused in one line: QK-norm models (Qwen3, Gemma-3, OLMo-2: a norm between the projection and RoPE
breaks the gauge), fused projections (Phi-3), MLP biases, RoPE types that rescale cos/sin. A sliding window
(Mistral's on every layer, Qwen2's from max_window_layers on) is the same mask here (GPTConfig.sliding_window).

GPT-NeoX (the Pythia suite): LayerNorm with biases, exact GELU, a parallel residual, `query_key_value` laid out per
head (projection "neox"), rotary on the first rotary_pct x d_head dims of each head in the rotate_half layout, an
untied head (`embed_out` in older checkpoints; transformers 5 renames it on load).
"""

from __future__ import annotations

import importlib
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from safetensors import SafetensorError

from iattention.checkpoint.run_folder import read_json_object
from iattention.checkpoint.state import check_finite
from iattention.config.model import LLAMA3_SCALING, ROPE_TYPES, GPTConfig
from iattention.errors import UserError
from iattention.interop.hf import FINITE_FIX, _check_hf_weights, _transformers
from iattention.model.gpt import GPT, inv_freq_of
from iattention.model.names import from_family, to_family
from iattention.symmetry.transforms import expand

# ------------------------------------------------------------------------------------------------ Llama family

# model_type -> transformers class name
FAMILIES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}
CONFIGS = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "mistral": "MistralConfig"}
# model_type -> why not (one line each)
REFUSED = {
    "qwen3": "QK-norm (q_norm/k_norm between the projections and RoPE) changes the attention symmetry",
    "gemma3": "QK-norm (q_norm/k_norm between the projections and RoPE) changes the attention symmetry",
    "gemma3_text": "QK-norm (q_norm/k_norm between the projections and RoPE) changes the attention symmetry",
    "olmo2": "QK-norm (q_norm/k_norm between the projections and RoPE) changes the attention symmetry",
    "phi3": "its fused qkv_proj and gate_up_proj are not converted (only separate q/k/v projections are)",
}


def llama_family(model_type: str, where) -> str:
    """The family of an HF folder's model_type, or a one-line refusal."""
    if model_type in FAMILIES:
        return model_type
    if model_type in REFUSED:
        raise UserError(f"{where}: {model_type} models are out of scope: {REFUSED[model_type]}; iattention converts "
                        f"{', '.join(FAMILIES)}, gpt_neox and gpt2")
    raise UserError(f"{where} describes a {model_type!r} model; iattention converts gpt2, {', '.join(FAMILIES)}, "
                    "gpt_neox")


# What a Llama-family (and GPT-NeoX) config.json must hold (key: accepted types), then the keys it may hold, each
# of the types transformers accepts. Checked before transformers reads the file: its own answers to a bad value
# are tracebacks (ZeroDivisionError, KeyError, StrictDataclassFieldValidationError), messages cut mid-word, or a
# model of a million layers allocated before any check against the weights.
CONFIG_SCHEMA = {"model_type": (str,), "num_hidden_layers": (int,), "num_attention_heads": (int,),
                 "hidden_size": (int,), "intermediate_size": (int,), "vocab_size": (int,)}
_NONE = type(None)
LLAMA_CONFIG_OPTIONAL = {"num_key_value_heads": (int, _NONE), "head_dim": (int, _NONE),
                         "max_position_embeddings": (int,), "rms_norm_eps": (float,), "tie_word_embeddings": (bool,),
                         "attention_bias": (bool,), "mlp_bias": (bool,), "hidden_act": (str,),
                         "rope_parameters": (dict, _NONE), "rope_theta": (float, int), "rope_scaling": (dict, _NONE),
                         "sliding_window": (int, _NONE), "use_sliding_window": (bool,)}
_POSITIVE = ("num_hidden_layers", "num_attention_heads", "hidden_size", "intermediate_size", "vocab_size",
             "max_position_embeddings", "num_key_value_heads", "head_dim")
_FIX = "fix the key or re-save the model with save_pretrained"


def _finite_positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf


def read_llama_config(folder: Path) -> dict:
    """A Llama-family folder's config.json, checked as transformers would need it, else one line naming the key."""
    path = folder / "config.json"
    cfg = read_json_object(path, "a Hugging Face config", "re-save the model with save_pretrained",
                           schema={"model_type": (str,)})
    llama_family(cfg["model_type"], path)
    missing = [k for k, types in CONFIG_SCHEMA.items() if k not in cfg]
    if missing:
        raise UserError(f"{path} lacks {', '.join(missing)}, which a {cfg['model_type']} config needs; {_FIX}")
    for key, types in {**CONFIG_SCHEMA, **LLAMA_CONFIG_OPTIONAL}.items():
        value = cfg.get(key)
        if key in cfg and (not isinstance(value, types) or isinstance(value, bool) and bool not in types):
            raise UserError(f"{path}: {key} is {type(value).__name__} {value!r}"[:160] +
                            f", expected {' or '.join(t.__name__ for t in types)}; {_FIX}")
    for key in _POSITIVE:
        if cfg.get(key) is not None and cfg[key] < 1:
            raise UserError(f"{path}: {key}={cfg[key]} must be a positive integer; {_FIX}")
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
    return cfg


def rope_of(cfg: dict, path: Path) -> tuple[str, object, dict]:
    """(rope_type, rope_theta, the scaling numbers) of a config.json, in transformers 5's `rope_parameters` or the
    older top-level `rope_theta` / `rope_scaling`; a type iattention does not reproduce is one line."""
    params = cfg.get("rope_parameters") or {}
    legacy = cfg.get("rope_scaling") or {}
    where = "rope_parameters" if params else "rope_scaling"
    rope_type = params.get("rope_type", legacy.get("rope_type", legacy.get("type", "default")))
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    if rope_type not in ROPE_TYPES:
        raise UserError(f"{path}: {where} has rope_type {rope_type!r}"[:160] + f"; iattention reproduces "
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


def _check_llama_sizes(path: Path, cfg: dict, shapes: dict[str, list[int]]) -> None:
    """config.json's sizes against the tensors' shapes (from the safetensors headers), before transformers builds a
    model of the config's size: the first disagreement, named with its keys."""
    layers = {int(m.group(1)) for k in shapes if (m := re.match(r"model\.layers\.(\d+)\.", k))}
    n = cfg["num_hidden_layers"]
    if layers and n != len(layers):
        raise UserError(f"{path / 'config.json'} says num_hidden_layers={n}, but the weights hold {len(layers)} "
                        f"layer(s); set num_hidden_layers={len(layers)} or re-save the model with save_pretrained")
    H, d, V, ff = (cfg[k] for k in ("num_attention_heads", "hidden_size", "vocab_size", "intermediate_size"))
    G = cfg.get("num_key_value_heads") or H
    r = cfg.get("head_dim") or d // H
    heads, kv = f"num_attention_heads={H}, head_dim={r}", f"num_key_value_heads={G}, head_dim={r}"
    expected = [("model.embed_tokens.weight", [V, d], f"vocab_size={V}, hidden_size={d}"),
                ("model.layers.0.self_attn.q_proj.weight", [H * r, d], f"{heads}, hidden_size={d}"),
                ("model.layers.0.self_attn.k_proj.weight", [G * r, d], f"{kv}, hidden_size={d}"),
                ("model.layers.0.self_attn.v_proj.weight", [G * r, d], f"{kv}, hidden_size={d}"),
                ("model.layers.0.self_attn.o_proj.weight", [d, H * r], f"hidden_size={d}, {heads}"),
                ("model.layers.0.mlp.gate_proj.weight", [ff, d], f"intermediate_size={ff}, hidden_size={d}")]
    for name, want, keys in expected:
        have = shapes.get(name)
        if have is not None and have != want:
            raise UserError(f"{path / 'config.json'} says {keys}, so {name} would be {want}, but the weights hold "
                            f"{have}; the config and the weights disagree: set those keys to what the weights hold, "
                            "or re-save the model with save_pretrained")


def attention_biases(family: str, attention_bias: bool) -> dict[str, bool]:
    """Our qkv_bias / o_bias for a family: Qwen2 always has q/k/v biases and no output bias; Llama and Mistral's
    attention_bias sets both."""
    if family == "qwen2":
        return {"qkv_bias": True, "o_bias": False}
    return {"qkv_bias": attention_bias, "o_bias": attention_bias}


def _llama_shape(folder: Path) -> GPTConfig:
    """The shape a Llama-family folder's config.json describes (checked as `read_llama_config` checks it), for
    counting: no weights read, no transformers needed (these families rotate whole heads)."""
    cfg = read_llama_config(folder)
    family = cfg["model_type"]
    n_head, d = cfg["num_attention_heads"], cfg["hidden_size"]
    d_head = cfg.get("head_dim") or d // n_head
    bias = bool(cfg.get("attention_bias", False))
    return GPTConfig(n_layer=cfg["num_hidden_layers"], n_head=n_head,
                     n_kv_head=cfg.get("num_key_value_heads") or n_head, n_embd=d, d_head=d_head,
                     mlp_hidden=cfg["intermediate_size"], vocab_size=cfg["vocab_size"], block_size=1, rot=d_head,
                       **attention_biases(family, bias),
                       tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),  # transformers' default
                       family=family)


def rotary_of(hf_config, family: str):
    """transformers' own rotary embedding module for a config (its inv_freq, without building the model)."""
    name = SPECS[family].cls.removesuffix("ForCausalLM")
    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    return getattr(module, f"{name}RotaryEmbedding")(hf_config)


def window_of(c, family: str, where: str) -> tuple[int, int]:
    """(sliding_window, full_attention_layers) of a transformers config: Mistral's window is on every layer;
    Qwen2's (use_sliding_window) on the layers its layer_types call "sliding_attention", which transformers makes
    those from max_window_layers on. A window at least as long as the model's positions never binds (0); layer types
    in another order than full layers then windowed ones are one line."""
    window = getattr(c, "sliding_window", None) or 0
    if not window or window >= c.max_position_embeddings:
        return 0, 0
    if family == "mistral":
        return window, 0
    if family != "qwen2":
        return 0, 0
    types = list(getattr(c, "layer_types", None) or ["full_attention"] * c.num_hidden_layers)
    full = next((i for i, t in enumerate(types) if t != "full_attention"), len(types))
    if full == len(types):
        return 0, 0
    if any(t != "sliding_attention" for t in types[full:]):
        raise UserError(f"{where} has layer_types {types[:8]}{'...' if len(types) > 8 else ''}; iattention windows "
                        "the layers from one index on (Qwen2's max_window_layers), not this order")
    return window, full


def llama_config_of(c, rotary, tied: bool, family: str) -> GPTConfig:
    """Our config for a transformers config `c`, its rotary embedding module and whether the head is tied."""
    where = f"this {family} model"
    if getattr(c, "mlp_bias", False):
        raise UserError(f"{where} has MLP biases (mlp_bias=true), which iattention's SwiGLU does not hold")
    if getattr(c, "hidden_act", "silu") != "silu":
        raise UserError(f"{where} uses hidden_act={c.hidden_act!r}; iattention's SwiGLU uses silu")
    window, full_layers = window_of(c, family, where)
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
        **attention_biases(family, bias),
        tie_embeddings=tied, family=family, sliding_window=window, full_attention_layers=full_layers,
        max_positions=c.max_position_embeddings)
    if not torch.equal(inv_freq_of(cfg), rotary.inv_freq.float().cpu()):
        raise UserError(f"{where}'s RoPE frequencies (rope_type {rope_type!r}) differ from what iattention computes "
                        "for them; iattention reproduces 'default' and 'llama3'")
    return cfg


def _transformers_v5():
    """transformers for the Llama family: 5 or later, whose configs hold `rope_parameters` (4.x keeps
    `rope_theta`/`rope_scaling` apart, and would build an export with the default theta)."""
    tf = _transformers()
    if int(tf.__version__.split(".")[0]) < 5:
        raise UserError(f"Llama-family and GPT-NeoX conversion needs transformers 5 or later (found {tf.__version__}); "
                        "pip install 'transformers>=5'")
    return tf


def _strict_error():
    """huggingface_hub's config-validation error (not a ValueError: a type it finds wrong in config.json would
    otherwise escape as a traceback); Exception's subclass that nothing raises where it is missing."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:
        return UserError  # never raised inside from_pretrained
    return StrictDataclassError


def hf_llama_config(cfg: GPTConfig):
    tf = _transformers_v5()
    if cfg.rot != cfg.d_head or cfg.rope_layout != "half":
        raise UserError(f"transformers' {FAMILIES[cfg.family]} rotates all of a head's dims in the 'half' layout; "
                        f"this model has rot={cfg.rot} of d_head={cfg.d_head}, layout {cfg.rope_layout!r}")
    if cfg.family == "qwen2" and not (cfg.qkv_bias and not cfg.o_bias) or \
            cfg.family != "qwen2" and cfg.qkv_bias != cfg.o_bias:
        raise UserError(f"transformers' {FAMILIES[cfg.family]} cannot hold qkv_bias={cfg.qkv_bias} with "
                        f"o_bias={cfg.o_bias}")
    kw = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.n_embd, intermediate_size=cfg.d_mlp,
              num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_kv_head,
              head_dim=cfg.d_head, max_position_embeddings=cfg.max_positions or cfg.block_size,
              rms_norm_eps=cfg.norm_eps, tie_word_embeddings=cfg.tie_embeddings, hidden_act="silu",
              rope_parameters={"rope_type": cfg.rope_type, "rope_theta": cfg.rope_theta, **cfg.rope_scaling})
    if cfg.family == "llama":
        kw["attention_bias"] = cfg.qkv_bias
    if cfg.family == "mistral":
        kw["sliding_window"] = cfg.sliding_window or None
    if cfg.family == "qwen2" and cfg.sliding_window:  # its window on the layers from max_window_layers on
        kw.update(use_sliding_window=True, sliding_window=cfg.sliding_window,
                  max_window_layers=cfg.full_attention_layers)
    return getattr(tf, CONFIGS[cfg.family])(**kw)


# ---------------------------------------------------------------------------------------------------- GPT-NeoX

def read_neox_config(folder: Path) -> dict:
    """A GPT-NeoX folder's config.json with the keys our model reads, each of its type and positive."""
    path = folder / "config.json"
    cfg = read_json_object(path, "a Hugging Face config", "re-save the model with save_pretrained",
                           schema=CONFIG_SCHEMA)
    for key in CONFIG_SCHEMA:
        if key != "model_type" and cfg[key] < 1:
            raise UserError(f"{path}: {key}={cfg[key]} must be a positive integer; {_FIX}")
    if cfg["hidden_size"] % cfg["num_attention_heads"]:
        raise UserError(f"{path}: hidden_size={cfg['hidden_size']} is not a multiple of num_attention_heads="
                        f"{cfg['num_attention_heads']}; {_FIX}")
    rope_of(cfg, path)  # a rope type we do not reproduce is one line
    return cfg


def _neox_shape(folder: Path) -> GPTConfig:
    """The shape a GPT-NeoX folder's config.json describes, for counting (no weights, no transformers): its rotary
    width int(d_head x rotary_pct) as transformers computes it."""
    cfg = read_neox_config(folder)
    d_head = cfg["hidden_size"] // cfg["num_attention_heads"]
    pct = (cfg.get("rope_parameters") or {}).get("partial_rotary_factor", cfg.get("rotary_pct", 1.0))
    bias = bool(cfg.get("attention_bias", True))
    return GPTConfig(family="gpt_neox", n_layer=cfg["num_hidden_layers"], n_head=cfg["num_attention_heads"],
                     n_embd=cfg["hidden_size"], mlp_hidden=cfg["intermediate_size"], vocab_size=cfg["vocab_size"],
                     block_size=1, rot=int(d_head * pct) // 2 * 2, qkv_bias=bias, o_bias=bias,
                     tie_embeddings=bool(cfg.get("tie_word_embeddings", False)))


def neox_config_of(c, rotary, tied: bool) -> GPTConfig:
    """Our config for a transformers GPTNeoXConfig `c` and its rotary embedding module (the rotary width from its
    inv_freq, as transformers computes it from rotary_pct)."""
    where = "this gpt_neox model"
    if getattr(c, "hidden_act", "gelu") != "gelu":
        raise UserError(f"{where} uses hidden_act={c.hidden_act!r}; iattention's GPT-NeoX MLP uses exact gelu")
    rope = dict(c.rope_parameters or {})
    rope_type = rope.pop("rope_type", "default")
    if rope_type != "default" or getattr(rotary, "attention_scaling", 1.0) != 1.0:
        raise UserError(f"{where} uses rope_type {rope_type!r}; iattention reproduces 'default' for GPT-NeoX")
    cfg = GPTConfig(family="gpt_neox", n_layer=c.num_hidden_layers, n_head=c.num_attention_heads, n_embd=c.hidden_size,
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
    if cfg.get("model_type") == "gpt_neox":
        cfg.update(rotary_pct=rope.get("partial_rotary_factor", 1.0), rotary_emb_base=theta)
    else:
        rope.pop("partial_rotary_factor", None)
        cfg.update(rope_theta=theta, rope_scaling={"rope_type": rope_type, **rope} if rope_type != "default" else None)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


# ---------------------------------------------------------------------------------------------- every family

@dataclass(frozen=True)
class Spec:
    cls: str  # the transformers class
    read_config: Callable[[Path], dict]  # config.json checked, one line per problem
    config_of: Callable  # (transformers config, its rotary module, tied) -> our GPTConfig
    hf_config: Callable[[GPTConfig], object]  # our config -> the transformers config an export writes
    check_sizes: Callable | None = None  # (folder, config.json, tensor shapes): config against weights, by key


SPECS = {**{family: Spec(cls, read_llama_config, partial(llama_config_of, family=family),
                         hf_llama_config, _check_llama_sizes)
            for family, cls in FAMILIES.items()},
         "gpt_neox": Spec("GPTNeoXForCausalLM", read_neox_config, neox_config_of,
                          hf_neox_config)}


def shape_from_folder(folder: Path) -> GPTConfig:
    """The shape an HF folder's config.json describes, for counting: no weights read, no transformers needed."""
    return (_neox_shape if family_of(folder) == "gpt_neox" else _llama_shape)(folder)


def family_of(path: Path) -> str:
    """The rotary family of an HF folder (its config.json's model_type), or a one-line refusal naming what is
    converted."""
    model_type = read_json_object(path / "config.json", "a Hugging Face config", "re-save the model with "
                                  "save_pretrained", schema={"model_type": (str,)})["model_type"]
    return model_type if model_type in SPECS else llama_family(model_type, path / "config.json")


def _class(family: str):
    return getattr(_transformers_v5(), SPECS[family].cls)


def _tied(hf) -> bool:
    """Whether the loaded model's head IS its embedding: transformers unties a config's tie_word_embeddings when the
    checkpoint holds a different lm_head.weight (and says so only in a warning), so the config alone can mislead."""
    head, embed = hf.lm_head.weight, hf.get_input_embeddings().weight
    return head is embed or head.data_ptr() == embed.data_ptr()


def config_from_hf(hf, family: str) -> GPTConfig:
    """Our config for a loaded transformers model (its rotary width from its own inv_freq)."""
    return SPECS[family].config_of(hf.config, hf.base_model.rotary_emb, _tied(hf))


@torch.no_grad()
def from_hf_model(hf, family: str) -> GPT:
    """A loaded transformers model of a rotary family -> our standard model, same dtype, same logits."""
    model = GPT(config_from_hf(hf, family)).to(hf.get_input_embeddings().weight.dtype)
    state = {from_family(k, family): v for k, v in hf.state_dict().items() if not k.endswith("rotary_emb.inv_freq")}
    model.load_state_dict(state, strict=True)
    return model.eval()


def load_hf_rotary(path: str | Path) -> GPT:
    """An HF Llama / Qwen2 / Mistral / GPT-NeoX folder (safetensors) -> our standard model."""
    tf = _transformers_v5()
    path = Path(path)
    family = family_of(path)
    spec = SPECS[family]
    cfg = spec.read_config(path)
    shapes = _check_hf_weights(path)
    if spec.check_sizes:
        spec.check_sizes(path, cfg, shapes)
    try:
        hf, info = getattr(tf, spec.cls).from_pretrained(str(path), use_safetensors=True, output_loading_info=True)
    except (OSError, ValueError, RuntimeError, TypeError, KeyError, SafetensorError, _strict_error()) as e:
        raise UserError(f"cannot load {path} as {spec.cls} from safetensors ({str(e).splitlines()[0][:100]}); "
                        "re-save it with save_pretrained") from None
    missing = [k for k in info.get("missing_keys", []) if not (k == "lm_head.weight" and _tied(hf))]
    shaped = [k[0] if isinstance(k, tuple) else k for k in info.get("mismatched_keys", [])]
    for what, keys in (("missing", missing), ("unexpected", info.get("unexpected_keys", [])),
                       ("wrongly shaped", shaped)):
        if keys:
            raise UserError(f"{path}: its safetensors has {what} tensor(s) {', '.join(map(str, list(keys)[:3]))} for "
                            f"{spec.cls} with its config.json; re-save the model with save_pretrained")
    check_finite(hf.state_dict(), path, FINITE_FIX)  # as a GPT-2 folder's (from_hf) and a checkpoint's
    return from_hf_model(hf.eval(), family)


@torch.no_grad()
def hf_rotary_logits(path: str | Path, x: torch.Tensor) -> torch.Tensor:
    """The logits of a rotary-family folder's own transformers class in float64 on tokens x (the reference a
    conversion's source is checked against; the folder was read by load_hf_rotary first)."""
    hf = _class(family_of(Path(path))).from_pretrained(str(path), dtype=torch.float64)
    return hf.eval()(x).logits


def hf_config_of(cfg: GPTConfig):
    """The transformers config an export of a model of `cfg` writes (a one-line refusal where its class cannot
    hold the structure)."""
    return SPECS[cfg.family].hf_config(cfg)


@torch.no_grad()
def to_hf_rotary(model: GPT):
    """Any iattention model of a rotary family (canonical is expanded) -> the transformers model of its family, same
    logits."""
    if model.config.attention != "standard":
        model = expand(model)
    c = model.config
    hf = _class(c.family)(hf_config_of(c)).to(model.transformer.wte.weight.dtype)
    theirs, ours = hf.base_model.rotary_emb.inv_freq.float().cpu(), model.transformer.rotary_emb.inv_freq.float().cpu()
    if theirs.shape != ours.shape or not torch.equal(theirs, ours):
        raise UserError(f"transformers' {SPECS[c.family].cls} would rotate {2 * theirs.numel()} dims of each head with "
                        f"other frequencies than this model's rot={c.rot}; it cannot be exported exactly")
    state = {to_family(k, c.family): v for k, v in model.state_dict().items()}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if not k.endswith("inv_freq")]:
        raise RuntimeError(f"no one-to-one state dict: missing {missing[:3]}, unexpected {unexpected[:3]}")
    return hf.eval()
