"""Exact conversion between transformers' models and ours (`GPT` of every family in config/families.py): one
loader, one exporter, one float64 reference for all of them. A folder is read by interop/folder.py (its files, sizes
and dtype checked before transformers builds anything), a family's config.json by its dialect (interop/dialects.py),
its tensor names by model/names.py. Canonical / identity_q models are expanded to standard attention before export.
`transformers` is an optional dependency: pip install iattention[hf].
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError

from iattention.checkpoint.state import TOKEN_IDS, check_finite
from iattention.config.families import FAMILIES, family_record
from iattention.config.model import GPTConfig
from iattention.errors import UserError, first_words
from iattention.interop.dialects import _EMBEDDINGS, DIALECTS, _class, _strict_error, _transformers, dialect_of
from iattention.interop.folder import FINITE_FIX, HFFolder
from iattention.model.gpt import GPT
from iattention.model.names import from_family, to_family
from iattention.symmetry.transforms import expand


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


def from_hf(source) -> GPT:
    """A transformers model of any family (the object, or a local folder saved with save_pretrained, read from
    safetensors only: its path or the HFFolder a command read) -> our standard model, same dtype, same logits."""
    tf = _transformers()
    if isinstance(source, tf.PreTrainedModel):
        family = family_record(source.config.model_type, "the Hugging Face model").name
        check_finite(source.state_dict(), "the Hugging Face model", FINITE_FIX)
        return from_hf_model(source, family)
    return from_hf_folder(HFFolder.at(source))


def from_hf_folder(folder: HFFolder) -> GPT:
    """An HF folder, read and checked (HFFolder.read) before transformers loads it -> our standard model."""
    fam, path = folder.family, folder.path
    cls = _class(fam.name)
    folder.read(whole=True)
    # use_safetensors: never unpickle a pytorch_model.bin
    try:
        hf, info = cls.from_pretrained(str(path), use_safetensors=True, output_loading_info=True,
                                       **folder.load_options())
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
    return from_hf_model(hf.eval(), fam.name, path)


@torch.no_grad()
def hf_logits(source, x: torch.Tensor) -> torch.Tensor:
    """The logits of an HF folder's own transformers class (`source`: its path or HFFolder) in float64 on tokens x
    (the reference a conversion's source is checked against; the folder was read by from_hf first)."""
    folder = HFFolder.at(source)
    dtype = "dtype" if int(_transformers().__version__.split(".")[0]) >= 5 else "torch_dtype"  # 4.x's name
    hf = _class(folder.family.name).from_pretrained(str(folder.path), use_safetensors=True,
                                                    **{dtype: torch.float64}, **folder.load_options())
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
        rope.pop("partial_rotary_factor", None)
        cfg.update(rope_theta=theta, rope_scaling={"rope_type": rope_type, **rope} if rope_type != "default" else None)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


