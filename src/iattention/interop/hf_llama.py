"""Exact conversion between transformers' Llama-family models and `iattention.model.llama.Llama`.

`LlamaForCausalLM`, `Qwen2ForCausalLM` and `MistralForCausalLM` (SmolLM2 is LlamaForCausalLM) share one layout:
separate q/k/v/o projections, RMSNorm, SwiGLU, RoPE in the rotate_half layout. Our standard model uses the same
parameter names, so the weights copy one to one; canonical models are expanded first on export. The rotary width
is read from the model's own `inv_freq` (Llama accepts `partial_rotary_factor` in its config and ignores it), and
our frequencies must equal transformers' bit for bit. Out of scope, refused in one line: QK-norm models (Qwen3,
Gemma-3, OLMo-2: a norm between the projection and RoPE breaks the gauge), fused projections (Phi-3), MLP biases,
sliding-window Qwen2, RoPE types that rescale cos/sin.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError

from iattention.checkpoint.run_folder import read_json_object
from iattention.config.llama import LlamaConfig
from iattention.errors import UserError
from iattention.interop.hf import _check_hf_weights, _transformers
from iattention.model.llama import Llama, inv_freq_of
from iattention.symmetry.grouped import expand

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
                        f"{', '.join(FAMILIES)} and gpt2")
    raise UserError(f"{where} describes a {model_type!r} model; iattention converts gpt2, {', '.join(FAMILIES)}")


def config_from_hf(hf, family: str) -> LlamaConfig:
    """Our config for a loaded transformers model (its rotary width from its inv_freq)."""
    c = hf.config
    where = f"this {family} model"
    if getattr(c, "mlp_bias", False):
        raise UserError(f"{where} has MLP biases (mlp_bias=true), which iattention's SwiGLU does not hold")
    if getattr(c, "hidden_act", "silu") != "silu":
        raise UserError(f"{where} uses hidden_act={c.hidden_act!r}; iattention's SwiGLU uses silu")
    if family == "qwen2" and getattr(c, "use_sliding_window", False):
        raise UserError(f"{where} uses sliding-window attention (use_sliding_window=true), which iattention does "
                        "not implement")
    rope = dict(c.rope_parameters or {})
    rope_type = rope.pop("rope_type", "default")
    theta = float(rope.pop("rope_theta"))
    rope.pop("partial_rotary_factor", None)  # Llama ignores it; the width comes from inv_freq
    rotary = hf.model.rotary_emb
    if getattr(rotary, "attention_scaling", 1.0) != 1.0:
        raise UserError(f"{where} uses rope_type {rope_type!r}, which scales cos/sin; iattention reproduces "
                        "'default' and 'llama3'")
    n_head = c.num_attention_heads
    d_head = getattr(c, "head_dim", None) or c.hidden_size // n_head
    window = getattr(c, "sliding_window", None) if family == "mistral" else None
    bias = bool(getattr(c, "attention_bias", False))
    cfg = LlamaConfig(
        n_layer=c.num_hidden_layers, n_head=n_head, n_kv_head=c.num_key_value_heads or n_head, n_embd=c.hidden_size,
        d_head=d_head, d_ff=c.intermediate_size, vocab_size=c.vocab_size,
        block_size=min(c.max_position_embeddings, window or c.max_position_embeddings),
        rot=2 * rotary.inv_freq.numel(), rope_theta=theta, rope_type=rope_type,
        rope_scaling=rope if rope_type != "default" else {}, rms_eps=float(c.rms_norm_eps),
        qkv_bias=True if family == "qwen2" else bias, o_bias=False if family == "qwen2" else bias,
        tie_embeddings=bool(c.tie_word_embeddings), family=family, sliding_window=window or 0,
        max_positions=c.max_position_embeddings)
    if not torch.equal(inv_freq_of(cfg), rotary.inv_freq.float().cpu()):
        raise UserError(f"{where}'s RoPE frequencies (rope_type {rope_type!r}) differ from what iattention computes "
                        "for them; iattention reproduces 'default' and 'llama3'")
    return cfg


@torch.no_grad()
def from_hf_llama(hf, family: str) -> Llama:
    """A loaded transformers Llama-family model -> our standard model, same dtype, same logits."""
    cfg = config_from_hf(hf, family)
    dtype = hf.model.embed_tokens.weight.dtype
    model = Llama(cfg).to(dtype)
    state = {k: v for k, v in hf.state_dict().items() if not k.endswith("rotary_emb.inv_freq")}
    model.load_state_dict(state, strict=True)
    return model.eval()


def _transformers_v5():
    """transformers for the Llama family: 5 or later, whose configs hold `rope_parameters` (4.x keeps
    `rope_theta`/`rope_scaling` apart, and would build an export with the default theta)."""
    tf = _transformers()
    if int(tf.__version__.split(".")[0]) < 5:
        raise UserError(f"Llama-family conversion needs transformers 5 or later (found {tf.__version__}); "
                        "pip install 'transformers>=5'")
    return tf


def load_hf_llama(path: str | Path) -> Llama:
    """An HF Llama / Qwen2 / Mistral folder (safetensors) -> our standard model."""
    tf = _transformers_v5()
    path = Path(path)
    cfg = read_json_object(path / "config.json", "a Hugging Face config", "re-save the model with save_pretrained",
                           schema={"model_type": (str,)})
    family = llama_family(cfg["model_type"], path / "config.json")
    _check_hf_weights(path)
    try:
        hf, info = getattr(tf, FAMILIES[family]).from_pretrained(str(path), use_safetensors=True,
                                                                 output_loading_info=True)
    except (OSError, ValueError, RuntimeError, TypeError, SafetensorError) as e:
        raise UserError(f"cannot load {path} as {FAMILIES[family]} from safetensors "
                        f"({str(e).splitlines()[0][:100]}); re-save it with save_pretrained") from None
    tied = cfg.get("tie_word_embeddings")
    missing = [k for k in info.get("missing_keys", []) if not (k == "lm_head.weight" and tied)]
    shapes = [k[0] if isinstance(k, tuple) else k for k in info.get("mismatched_keys", [])]
    unexpected = info.get("unexpected_keys", [])
    for what, keys in (("missing", missing), ("unexpected", unexpected), ("wrongly shaped", shapes)):
        if keys:
            raise UserError(f"{path}: its safetensors has {what} tensor(s) {', '.join(map(str, list(keys)[:3]))} for "
                            f"{FAMILIES[family]} with its config.json; re-save the model with save_pretrained")
    return from_hf_llama(hf.eval(), family)


def hf_llama_config(cfg: LlamaConfig):
    tf = _transformers_v5()
    if cfg.rot != cfg.d_head or cfg.rope_layout != "half":
        raise UserError(f"transformers' {FAMILIES[cfg.family]} rotates all of a head's dims in the 'half' layout; "
                        f"this model has rot={cfg.rot} of d_head={cfg.d_head}, layout {cfg.rope_layout!r}")
    if cfg.family == "qwen2" and not (cfg.qkv_bias and not cfg.o_bias) or \
            cfg.family != "qwen2" and cfg.qkv_bias != cfg.o_bias:
        raise UserError(f"transformers' {FAMILIES[cfg.family]} cannot hold qkv_bias={cfg.qkv_bias} with "
                        f"o_bias={cfg.o_bias}")
    kw = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.n_embd, intermediate_size=cfg.d_ff,
              num_hidden_layers=cfg.n_layer, num_attention_heads=cfg.n_head, num_key_value_heads=cfg.n_kv_head,
              head_dim=cfg.d_head, max_position_embeddings=cfg.max_positions or cfg.block_size,
              rms_norm_eps=cfg.rms_eps, tie_word_embeddings=cfg.tie_embeddings, hidden_act="silu",
              rope_parameters={"rope_type": cfg.rope_type, "rope_theta": cfg.rope_theta, **cfg.rope_scaling})
    if cfg.family == "llama":
        kw["attention_bias"] = cfg.qkv_bias
    if cfg.family == "mistral":
        kw["sliding_window"] = cfg.sliding_window or None
    return getattr(tf, CONFIGS[cfg.family])(**kw)


@torch.no_grad()
def to_hf_llama(model: Llama):
    """Any iattention Llama (canonical is expanded) -> the transformers model of its family, same logits."""
    tf = _transformers_v5()
    if model.config.attention != "standard":
        model = expand(model)
    hf = getattr(tf, FAMILIES[model.config.family])(hf_llama_config(model.config))
    hf = hf.to(model.model.embed_tokens.weight.dtype)
    if not torch.equal(hf.model.rotary_emb.inv_freq.float().cpu(), model.model.rotary_emb.inv_freq.float().cpu()):
        raise UserError("the exported model's RoPE frequencies differ from this model's; it cannot be exported exactly")
    missing, unexpected = hf.load_state_dict(model.state_dict(), strict=False)
    if unexpected or [k for k in missing if not k.endswith("inv_freq")]:
        raise RuntimeError(f"no one-to-one state dict: missing {missing[:3]}, unexpected {unexpected[:3]}")
    return hf.eval()
