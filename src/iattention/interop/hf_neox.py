"""Exact conversion between transformers' GPT-NeoX (the Pythia suite) and our model (`GPT` with family gpt_neox).

What a family costs here: its config keys (`neox_config_of`, `hf_neox_config`) and its names (model/names.py); the
model, the attention variants, the gauge and the checks are the ones every family uses. GPT-NeoX: LayerNorm with
biases, exact GELU, a parallel residual, `query_key_value` laid out per head (projection "neox"), rotary on the
first rotary_pct x d_head dims of each head in the rotate_half layout, an untied head (`embed_out` in older
checkpoints; transformers 5 renames it on load).
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError

from iattention.checkpoint.run_folder import read_json_object
from iattention.checkpoint.state import check_finite
from iattention.config.model import GPTConfig
from iattention.errors import UserError
from iattention.interop.hf import FINITE_FIX, _check_hf_weights
from iattention.interop.hf_llama import _strict_error, _transformers_v5, rope_of
from iattention.model.gpt import GPT, inv_freq_of
from iattention.model.names import from_family, to_family
from iattention.symmetry.transforms import expand

FAMILY = "gpt_neox"
CLASS = "GPTNeoXForCausalLM"
SCHEMA = {"model_type": (str,), "num_hidden_layers": (int,), "num_attention_heads": (int,), "hidden_size": (int,),
          "intermediate_size": (int,), "vocab_size": (int,)}
_FIX = "fix the key or re-save the model with save_pretrained"


def read_neox_config(folder: Path) -> dict:
    """A GPT-NeoX folder's config.json with the keys our model reads, each of its type and positive."""
    path = folder / "config.json"
    cfg = read_json_object(path, "a Hugging Face config", "re-save the model with save_pretrained", schema=SCHEMA)
    for key in SCHEMA:
        if key != "model_type" and cfg[key] < 1:
            raise UserError(f"{path}: {key}={cfg[key]} must be a positive integer; {_FIX}")
    if cfg["hidden_size"] % cfg["num_attention_heads"]:
        raise UserError(f"{path}: hidden_size={cfg['hidden_size']} is not a multiple of num_attention_heads="
                        f"{cfg['num_attention_heads']}; {_FIX}")
    rope_of(cfg, path)  # a rope type we do not reproduce is one line
    return cfg


def shape_from_folder(folder: Path) -> GPTConfig:
    """The shape a GPT-NeoX folder's config.json describes, for counting (no weights, no transformers): its rotary
    width int(d_head x rotary_pct) as transformers computes it."""
    cfg = read_neox_config(folder)
    d_head = cfg["hidden_size"] // cfg["num_attention_heads"]
    pct = (cfg.get("rope_parameters") or {}).get("partial_rotary_factor", cfg.get("rotary_pct", 1.0))
    bias = bool(cfg.get("attention_bias", True))
    return GPTConfig(family=FAMILY, n_layer=cfg["num_hidden_layers"], n_head=cfg["num_attention_heads"],
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
    cfg = GPTConfig(family=FAMILY, n_layer=c.num_hidden_layers, n_head=c.num_attention_heads, n_embd=c.hidden_size,
                    mlp_hidden=c.intermediate_size, vocab_size=c.vocab_size, block_size=c.max_position_embeddings,
                    rot=2 * rotary.inv_freq.numel(), rope_theta=float(rope.get("rope_theta", 10000.0)),
                    norm_eps=float(c.layer_norm_eps), bias=True, qkv_bias=bool(c.attention_bias),
                    o_bias=bool(c.attention_bias), parallel_residual=bool(c.use_parallel_residual),
                    tie_embeddings=tied)
    if not torch.equal(inv_freq_of(cfg), rotary.inv_freq.float().cpu()):
        raise UserError(f"{where}'s RoPE frequencies differ from what iattention computes for them")
    return cfg


def _tied(hf) -> bool:
    return hf.lm_head.weight.data_ptr() == hf.gpt_neox.embed_in.weight.data_ptr()


@torch.no_grad()
def from_hf_neox(hf) -> GPT:
    """A loaded transformers GPT-NeoX model -> our standard model, same dtype, same logits."""
    cfg = neox_config_of(hf.config, hf.gpt_neox.rotary_emb, _tied(hf))
    model = GPT(cfg).to(hf.gpt_neox.embed_in.weight.dtype)
    state = {from_family(k, FAMILY): v for k, v in hf.state_dict().items() if not k.endswith("rotary_emb.inv_freq")}
    model.load_state_dict(state, strict=True)
    return model.eval()


def load_hf_neox(path: str | Path) -> GPT:
    """An HF GPT-NeoX folder (safetensors) -> our standard model."""
    tf = _transformers_v5()
    path = Path(path)
    read_neox_config(path)
    _check_hf_weights(path)
    try:
        hf, info = tf.GPTNeoXForCausalLM.from_pretrained(str(path), use_safetensors=True, output_loading_info=True)
    except (OSError, ValueError, RuntimeError, TypeError, KeyError, SafetensorError, _strict_error()) as e:
        raise UserError(f"cannot load {path} as {CLASS} from safetensors ({str(e).splitlines()[0][:100]}); re-save "
                        "it with save_pretrained") from None
    missing = [k for k in info.get("missing_keys", []) if not (k == "lm_head.weight" and _tied(hf))]
    for what, keys in (("missing", missing), ("unexpected", info.get("unexpected_keys", []))):
        if keys:
            raise UserError(f"{path}: its safetensors has {what} tensor(s) {', '.join(map(str, list(keys)[:3]))} for "
                            f"{CLASS} with its config.json; re-save the model with save_pretrained")
    check_finite(hf.state_dict(), path, FINITE_FIX)  # as a GPT-2 folder's (from_hf) and a checkpoint's
    return from_hf_neox(hf.eval())


@torch.no_grad()
def hf_neox_logits(path: str | Path, x: torch.Tensor) -> torch.Tensor:
    """The logits of a GPT-NeoX folder's own transformers class in float64 on tokens x."""
    hf = _transformers_v5().GPTNeoXForCausalLM.from_pretrained(str(path), dtype=torch.float64)
    return hf.eval()(x).logits


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


@torch.no_grad()
def to_hf_neox(model: GPT):
    """Our GPT-NeoX model (canonical is expanded) -> transformers' GPTNeoXForCausalLM, same logits."""
    if model.config.attention != "standard":
        model = expand(model)
    hf = _transformers_v5().GPTNeoXForCausalLM(hf_neox_config(model.config)).to(model.transformer.wte.weight.dtype)
    if 2 * hf.gpt_neox.rotary_emb.inv_freq.numel() != model.config.rot or not torch.equal(
            hf.gpt_neox.rotary_emb.inv_freq.float().cpu(), model.transformer.rotary_emb.inv_freq.float().cpu()):
        raise UserError(f"transformers' GPT-NeoX rotates int(d_head x rotary_pct) dims, not this model's rot="
                        f"{model.config.rot} with the same frequencies; it cannot be exported exactly")
    state = {to_family(k, FAMILY): v for k, v in model.state_dict().items()}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if not k.endswith("inv_freq")]:
        raise RuntimeError(f"no one-to-one state dict: missing {missing[:3]}, unexpected {unexpected[:3]}")
    return hf.eval()
