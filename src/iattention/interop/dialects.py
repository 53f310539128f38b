"""The config.json dialects (`Family.dialect`: "gpt2", "llama", "neox"): how a folder's config.json is checked,
the shape it describes, our config of a transformers config and the transformers config an export writes. What
differs between the families of a dialect is in their records (config/families.py); a value iattention does not
reproduce (MLP biases, RoPE types that rescale cos/sin, a layer pattern it does not hold) is refused in one line.

GPT-2: Conv1D weights (in, out), transposed by its record; our embedding padded to vocab_pad_multiple and cut back on
export; the head tied (an untied head is refused unless it equals the embedding). The Llama layout: separate q/k/v/o,
RMSNorm, SwiGLU, RoPE in the rotate_half layout, our standard model holding the same tensors under GPT-2's prefixes;
the rotary width read from transformers' own inv_freq, our frequencies equal to it bit for bit; a sliding window
(Mistral's on every layer, Qwen2's from max_window_layers on) is GPTConfig.sliding_window. GPT-NeoX: LayerNorm with
biases, exact GELU, a parallel residual, query_key_value laid out per head, rotary on the first rotary_pct x d_head
dims of each head, an untied head (`embed_out` in its files).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from iattention.config.families import BIAS_RULES, FAMILIES, Family, family_record
from iattention.config.model import LLAMA3_SCALING, ROPE_TYPES, GPTConfig
from iattention.errors import UserError, shown
from iattention.model.gpt import inv_freq_of

_FIX = "fix the key or re-save the model with save_pretrained"


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


def _strict_error():
    """huggingface_hub's config-validation error (not a ValueError: a type it finds wrong in config.json would
    otherwise escape as a traceback); Exception's subclass that nothing raises where it is missing."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:
        return UserError  # never raised inside from_pretrained
    return StrictDataclassError


# ------------------------------------------------------------------------------------------- config and sizes

# What a config.json must hold and may hold (key: accepted types), per family, checked before transformers reads it:
# its own answers to a bad value are tracebacks (TypeError, ZeroDivisionError, KeyError,
# StrictDataclassFieldValidationError), messages cut mid-word, or a model of a million layers allocated before any
# check against the weights.
_NONE = type(None)
_NUM = (float, int)


def _finite_positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf


def _read_config(cfg: dict, path: Path, required: dict, optional: dict, positive) -> dict:
    """A folder's config.json (`cfg`, read from `path`, its model_type a family's) with each key of `required`
    present, each key of either of its types, and the keys `positive` names (where given) >= 1; else one line
    naming the key."""
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


# -------------------------------------------------------------------------------------------------------- GPT-2

GPT2_REQUIRED = {"model_type": (str,), "n_layer": (int,), "n_head": (int,), "n_embd": (int,), "vocab_size": (int,),
                 "n_positions": (int,)}
# Keys GPT2Config reads that may be absent (its defaults), each of the types it can use.
GPT2_OPTIONAL = {"n_inner": (int, _NONE), "layer_norm_epsilon": _NUM, "resid_pdrop": _NUM, "embd_pdrop": _NUM,
                 "attn_pdrop": _NUM, "initializer_range": _NUM, "activation_function": (str,),
                 "scale_attn_weights": (bool,), "scale_attn_by_inverse_layer_idx": (bool,),
                 "reorder_and_upcast_attn": (bool,), "tie_word_embeddings": (bool,), "use_cache": (bool,),
                 "n_ctx": (int, _NONE), "bos_token_id": (int, _NONE), "eos_token_id": (int, _NONE)}


def read_gpt2_config(cfg: dict, path: Path) -> dict:
    """A GPT-2 folder's config.json, checked: the keys GPT2Config reads, of its types, the sizes positive."""
    return _read_config(cfg, path, GPT2_REQUIRED, GPT2_OPTIONAL, [k for k in GPT2_REQUIRED if k != "model_type"])


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


def read_llama_config(cfg: dict, path: Path) -> dict:
    """A Llama-family folder's config.json, checked as transformers would need it, else one line naming the key."""
    cfg = _read_config(cfg, path, CONFIG_SCHEMA, LLAMA_CONFIG_OPTIONAL, _POSITIVE)
    family_record(cfg["model_type"], path)
    if cfg.get("rms_norm_eps") is not None and not _finite_positive(cfg["rms_norm_eps"]):
        raise UserError(f"{path}: rms_norm_eps={cfg['rms_norm_eps']} must be a finite number > 0 (1e-5 or 1e-6 in "
                        f"released models); {_FIX}")
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    if heads % kv:
        raise UserError(f"{path}: num_key_value_heads={kv} does not divide num_attention_heads={heads} (each key/value "
                        f"head serves the same number of query heads); {_FIX}")
    rope_of(cfg, path)  # a rope type or theta we do not reproduce is one line
    nope_every_of(cfg, family_record(cfg["model_type"], path), path)  # layers without RoPE we cannot hold: one line
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
    older top-level `rope_theta` / `rope_scaling`; a type iattention does not reproduce, or a theta that is no finite
    number > 0, is one line."""
    params = cfg.get("rope_parameters") or {}
    legacy = cfg.get("rope_scaling") or {}
    where = "rope_parameters" if params else "rope_scaling"
    rope_type = params.get("rope_type", legacy.get("rope_type", legacy.get("type", "default")))
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    if rope_type not in ROPE_TYPES:
        raise UserError(f"{path}: {where} has rope_type {shown(repr(rope_type), 100)}; iattention reproduces "
                        f"{' and '.join(map(repr, ROPE_TYPES))} only: evaluate this model with transformers")
    if not _finite_positive(theta):
        raise UserError(f"{path}: rope_theta={theta!r} must be a finite number > 0 (10000 or 500000 in released "
                        f"models); {_FIX}")
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
    transformers needed (these families rotate whole heads)."""
    n_head, d = cfg["num_attention_heads"], cfg["hidden_size"]
    d_head = cfg.get("head_dim") or d // n_head
    bias = bool(cfg.get("attention_bias", False))
    return GPTConfig(n_layer=cfg["num_hidden_layers"], n_head=n_head,
                     n_kv_head=cfg.get("num_key_value_heads") or n_head, n_embd=d, d_head=d_head,
                     mlp_hidden=cfg["intermediate_size"], vocab_size=cfg["vocab_size"], block_size=1, rot=d_head,
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
    if cfg.rot != cfg.d_head or cfg.rope_layout != "half":
        raise UserError(f"transformers' {fam.hf_class} rotates all of a head's dims in the 'half' layout; "
                        f"this model has rot={cfg.rot} of d_head={cfg.d_head}, layout {cfg.rope_layout!r}")
    holds = {"qkv_only": (True, False), "none": (False, False)}.get(fam.bias_rule, (cfg.qkv_bias, cfg.qkv_bias))
    if (cfg.qkv_bias, cfg.o_bias) != holds:
        raise UserError(f"transformers' {fam.hf_class} cannot hold qkv_bias={cfg.qkv_bias} with "
                        f"o_bias={cfg.o_bias} ({fam.label}: {BIAS_RULES[fam.bias_rule]})")
    kw = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.n_embd, intermediate_size=cfg.d_mlp,
              num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_kv_head,
              head_dim=cfg.d_head, max_position_embeddings=cfg.max_positions or cfg.block_size,
              rms_norm_eps=cfg.norm_eps, tie_word_embeddings=cfg.tie_embeddings, hidden_act="silu",
              rope_parameters={"rope_type": cfg.rope_type, "rope_theta": cfg.rope_theta, **cfg.rope_scaling})
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


def read_neox_config(cfg: dict, path: Path) -> dict:
    """A GPT-NeoX folder's config.json with the keys our model reads, each of its type and in range (one line naming
    the config.json key, not the training setting it becomes)."""
    cfg = _read_config(cfg, path, CONFIG_SCHEMA, NEOX_CONFIG_OPTIONAL,
                       [k for k in (*CONFIG_SCHEMA, "max_position_embeddings") if k != "model_type"])
    if cfg["hidden_size"] % cfg["num_attention_heads"]:
        raise UserError(f"{path}: hidden_size={cfg['hidden_size']} is not a multiple of num_attention_heads="
                        f"{cfg['num_attention_heads']}; {_FIX}")
    for key, example in (("layer_norm_eps", "1e-5"), ("rotary_emb_base", "10000")):
        if key in cfg and not _finite_positive(cfg[key]):
            raise UserError(f"{path}: {key}={cfg[key]} must be a finite number > 0 ({example} in released models); "
                            f"{_FIX}")
    if not 0 < _rotary_pct(cfg) <= 1:
        key = "rope_parameters.partial_rotary_factor" if "partial_rotary_factor" in (cfg.get("rope_parameters") or {}) \
            else "rotary_pct"
        raise UserError(f"{path}: {key}={shown(repr(_rotary_pct(cfg)), 40)} must be a number in (0, 1] (the share of "
                        f"each head's dims that rotate; 0.25 in Pythia); {_FIX}")
    rope_of(cfg, path)  # a rope type or theta we do not reproduce is one line
    return cfg


def _rotary_pct(cfg: dict):
    pct = (cfg.get("rope_parameters") or {}).get("partial_rotary_factor", cfg.get("rotary_pct", 1.0))
    return pct if isinstance(pct, (int, float)) and not isinstance(pct, bool) else float("nan")


def _neox_shape(cfg: dict, fam: Family) -> GPTConfig:
    """The shape a GPT-NeoX folder's config.json (checked) describes (no weights, no transformers): its rotary
    width int(d_head x rotary_pct) as transformers computes it."""
    d_head = cfg["hidden_size"] // cfg["num_attention_heads"]
    pct = _rotary_pct(cfg)
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


# ---------------------------------------------------------------------------------------------- every family

@dataclass(frozen=True)
class Dialect:
    """How the folders of a config.json dialect (`Family.dialect`) are read and written."""

    read_config: Callable[[dict, Path], dict]  # config.json (parsed, and its path) checked, one line per problem
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


def _class(family: str):
    fam = FAMILIES[family]
    return getattr(_transformers_v5() if fam.v5 else _transformers(), fam.hf_class)


