"""Exact conversion between Hugging Face `GPT2LMHeadModel` and `iattention.GPT`.

HF GPT-2 stores projections as Conv1D with weight (in, out); we use nn.Linear (out, in), so every
projection weight is transposed. The embedding table is padded (zero rows) to our vocab_pad_multiple
and cut back on export. Canonical / identity_q models are expanded to standard attention first.
`transformers` is an optional dependency: pip install iattention[hf].
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from iattention.checkpoint.run_folder import read_json_object
from iattention.checkpoint.state import check_declared_size, check_finite
from iattention.config import GPTConfig
from iattention.errors import UserError
from iattention.model.gpt import GPT
from iattention.symmetry.transforms import expand

_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")

FINITE_FIX = "use a model with finite weights (it diverged or was damaged)"  # a NaN/Inf weight's refusal


def _transformers():
    try:
        import transformers  # lazy: heavy and optional (iattention[hf]), only for HF import/export
    except ImportError:
        raise UserError("this needs Hugging Face transformers; install it with pip install 'iattention[hf]'") \
            from None
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return transformers


def _load_hf(model_or_path):
    tf = _transformers()
    if isinstance(model_or_path, tf.GPT2LMHeadModel):
        return model_or_path
    path = Path(model_or_path)
    if not (path / "config.json").exists():
        raise UserError(f"{path} is not a Hugging Face model folder (no config.json); give a folder saved with "
                        "save_pretrained")
    _check_sizes(path, read_hf_config(path), _check_hf_weights(path))
    # use_safetensors: never unpickle a pytorch_model.bin
    try:
        model, info = tf.GPT2LMHeadModel.from_pretrained(str(path), use_safetensors=True, output_loading_info=True)
    except (OSError, ValueError, RuntimeError, SafetensorError) as e:
        files = ", ".join(sorted(p.name for p in path.glob("*.safetensors"))) or "no .safetensors file"
        raise UserError(f"cannot load {path} as GPT-2 from safetensors ({files}: {str(e).splitlines()[0][:100]}); "
                        "re-save it with save_pretrained(safe_serialization=True)") from None
    # transformers fills a missing or wrongly shaped tensor with a fresh random init and only warns: a
    # silently different model. Refuse it, naming the tensor.
    tied = model.config.tie_word_embeddings
    missing = [k for k in info.get("missing_keys", []) if not (tied and k == "lm_head.weight")]  # tied to wte
    problems = [(what, list(keys)) for what, keys in (("missing", missing),
                                                      ("unexpected", info.get("unexpected_keys", [])),
                                                      ("wrongly shaped", [k[0] if isinstance(k, tuple) else k for k
                                                                          in info.get("mismatched_keys", [])]))
                if keys]
    if problems:
        what, keys = problems[0]
        raise UserError(f"{path}: its safetensors has {what} tensor(s) {', '.join(map(str, keys[:3]))} for GPT-2 "
                        "with its config.json; re-save the model with save_pretrained")
    if not tied and not torch.equal(model.lm_head.weight, model.transformer.wte.weight):
        # our GPT ties its output head to the embedding: loading both would keep one of them for both roles
        raise UserError(f"{path} has an untied output head (config.json: tie_word_embeddings false, and "
                        "lm_head.weight differs from transformer.wte.weight); iattention models GPT-2 with tied "
                        "embeddings only: evaluate this model with transformers, or tie its head and re-save it")
    return model


INDEX = "model.safetensors.index.json"
_FLOAT = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64"}
_OTHER = {"I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


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


def _check_hf_weights(path: Path) -> dict[str, list[int]]:
    """transformers casts every tensor to the model's dtype without a word: an int64 or fp16 tensor in a
    float32 file would load as another model. All weights must share one floating dtype (as our own
    checkpoints must match the model's), the attention-mask buffers of old files aside. Returns each
    tensor's shape, as its header declares it."""
    seen: dict[str, tuple[str, str]] = {}
    shapes: dict[str, list[int]] = {}
    for name in _weight_files(path):
        if not (path / name).is_file():
            named = f"{path / INDEX} names shard {name}, which" if name != "model.safetensors" else \
                f"its weights file {name}"
            raise UserError(f"{path}: {named} is missing; download or copy the whole model folder again, or re-save "
                            "it with save_pretrained")
        check_declared_size(path / name)  # a crafted header over a sparse file would be materialised
        try:
            with safe_open(str(path / name), framework="pt") as f:
                for k in f.keys():
                    if k.endswith((".attn.bias", ".attn.masked_bias")):
                        continue
                    dtype = f.get_slice(k).get_dtype()
                    if dtype not in _FLOAT:
                        kind = _OTHER.get(dtype, dtype.lower())
                        raise UserError(f"{path / name} holds {k} as {kind}, not floating point; GPT-2 weights are "
                                        "float tensors: re-save the model with save_pretrained")
                    seen.setdefault(dtype, (name, k))
                    shapes[k] = list(f.get_slice(k).get_shape())
        except SafetensorError as e:
            raise UserError(f"cannot read {path / name} as safetensors ({str(e).splitlines()[0][:100]}); re-save "
                            "it with save_pretrained(safe_serialization=True)") from None
    if len(seen) > 1:
        (a, (_, ka)), (b, (fb, kb)) = list(seen.items())[:2]
        raise UserError(f"{path / fb} mixes dtypes ({ka} is {_FLOAT[a]}, {kb} is {_FLOAT[b]}); transformers would "
                        "cast them silently: convert the model to one dtype explicitly and re-save it")
    return shapes


def _check_sizes(path: Path, cfg: dict, shapes: dict[str, list[int]]) -> None:
    """config.json's sizes against the tensors' shapes, before transformers reads them (its own message about a
    mismatch is long, cut short here, and names the wrong fix): the disagreement, named."""
    def shape(name):
        return shapes.get(f"transformer.{name}", shapes.get(name))

    checks = [("vocab_size", "wte.weight", 0), ("n_embd", "wte.weight", 1), ("n_positions", "wpe.weight", 0),
              ("n_embd", "wpe.weight", 1)]
    for key, tensor, dim in checks:
        have = shape(tensor)
        if have is not None and (len(have) != 2 or have[dim] != cfg[key]):
            got = f"shape {have}" if len(have) != 2 else f"{have[dim]} {('rows', 'columns')[dim]}"
            raise UserError(f"{path / 'config.json'} says {key}={cfg[key]}, but its weights' transformer.{tensor} has "
                            f"{got}; the config and the weights disagree: set {key} to what the weights hold, or "
                            "re-save the model with save_pretrained")


# What GPT2Config needs from config.json (key: accepted types), checked before transformers reads it.
HF_CONFIG_SCHEMA = {"model_type": (str,), "n_layer": (int,), "n_head": (int,), "n_embd": (int,),
                    "vocab_size": (int,), "n_positions": (int,)}

_NUM = (float, int)
# Keys GPT2Config reads that may be absent (its defaults), each of the types it can use.
HF_CONFIG_OPTIONAL = {"n_inner": (int, type(None)), "layer_norm_epsilon": _NUM, "resid_pdrop": _NUM,
                      "embd_pdrop": _NUM, "attn_pdrop": _NUM, "initializer_range": _NUM, "activation_function": (str,),
                      "scale_attn_weights": (bool,), "scale_attn_by_inverse_layer_idx": (bool,),
                      "reorder_and_upcast_attn": (bool,), "tie_word_embeddings": (bool,), "use_cache": (bool,),
                      "n_ctx": (int, type(None)), "bos_token_id": (int, type(None)), "eos_token_id": (int, type(None))}


def read_hf_config(folder: Path) -> dict:
    """An HF folder's config.json, checked: a GPT-2 config with positive integer sizes, else one line."""
    path = folder / "config.json"
    fix = "re-save the model with save_pretrained"
    cfg = read_json_object(path, "a Hugging Face config", fix, schema=HF_CONFIG_SCHEMA)
    if cfg["model_type"] != "gpt2":
        raise UserError(f"{path} describes a {cfg['model_type']!r} model; iattention reads GPT-2 (model_type gpt2)")
    for key, types in HF_CONFIG_OPTIONAL.items():  # transformers would fail on them with a TypeError
        value = cfg.get(key)
        if key in cfg and (not isinstance(value, types) or isinstance(value, bool) and bool not in types):
            raise UserError(f"{path} is corrupt (a Hugging Face config: key {key!r}: "
                            f"{type(value).__name__} {value!r}"[:200] + f", expected {types[0].__name__}); {fix}")
    bad = [k for k in ("n_layer", "n_head", "n_embd", "vocab_size", "n_positions") if cfg[k] < 1]
    if bad:
        raise UserError(f"{path} is corrupt ({bad[0]}={cfg[bad[0]]} must be >= 1); {fix}")
    return cfg


def _check_supported(hc) -> None:
    problems = []
    if hc.scale_attn_by_inverse_layer_idx:
        problems.append("scale_attn_by_inverse_layer_idx=True")
    if not hc.scale_attn_weights:
        problems.append("scale_attn_weights=False")
    if hc.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
        problems.append(f"activation_function={hc.activation_function}")
    if abs(hc.layer_norm_epsilon - 1e-5) > 1e-12:
        problems.append(f"layer_norm_epsilon={hc.layer_norm_epsilon}")
    if problems:
        raise UserError(f"unsupported GPT-2 variant ({', '.join(problems)}); iattention models the standard GPT-2 "
                        "block only")


@torch.no_grad()
def hf_logits(path, x: torch.Tensor) -> torch.Tensor:
    """The logits of an HF GPT-2 folder's own transformers class in float64 on tokens x: the reference a
    conversion's source is checked against."""
    return _load_hf(path).double().eval()(x).logits


def from_hf(model_or_path) -> GPT:
    """A transformers GPT2LMHeadModel (object or local folder) -> standard-attention GPT, same logits."""
    hf = _load_hf(model_or_path)
    source = model_or_path if isinstance(model_or_path, (str, Path)) else "the Hugging Face model"
    check_finite(hf.state_dict(), source, FINITE_FIX)
    hc = hf.config
    _check_supported(hc)
    cfg = GPTConfig(n_layer=hc.n_layer, n_head=hc.n_head, n_embd=hc.n_embd, vocab_size=hc.vocab_size,
                    block_size=hc.n_positions, dropout=float(hc.resid_pdrop), bias=True, attention="standard",
                    mlp_hidden=0 if hc.n_inner in (None, 4 * hc.n_embd) else int(hc.n_inner))
    dtype = next(hf.parameters()).dtype
    model = GPT(cfg).to(dtype)
    src = {k: v for k, v in hf.state_dict().items() if not k.endswith((".attn.bias", ".attn.masked_bias"))}
    state = {}
    for k, v in src.items():
        if k.endswith(_CONV1D):
            v = v.t()
        if k in ("transformer.wte.weight", "lm_head.weight"):
            v = torch.cat([v, v.new_zeros(cfg.padded_vocab_size - cfg.vocab_size, cfg.n_embd)])
        state[k] = v.contiguous()
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise UserError(f"HF checkpoint does not map onto GPT-2 (missing {missing[:3]}, unexpected {unexpected[:3]})")
    return model.eval()


def hf_config(cfg: GPTConfig):
    tf = _transformers()
    return tf.GPT2Config(vocab_size=cfg.vocab_size, n_positions=cfg.block_size, n_embd=cfg.n_embd,
                         n_layer=cfg.n_layer, n_head=cfg.n_head, activation_function="gelu_new",
                         n_inner=cfg.mlp_hidden or None,
                         resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout, attn_pdrop=cfg.dropout,
                         layer_norm_epsilon=1e-5, tie_word_embeddings=True,
                         bos_token_id=50256 if cfg.vocab_size == 50257 else None,
                         eos_token_id=50256 if cfg.vocab_size == 50257 else None)


@torch.no_grad()
def to_hf(model: GPT):
    """Any iattention GPT -> transformers GPT2LMHeadModel with the same logits (canonical is expanded)."""

    tf = _transformers()
    if model.config.attention != "standard":
        model = expand(model)
    cfg = model.config
    dtype = model.transformer.wte.weight.dtype
    hf = tf.GPT2LMHeadModel(hf_config(cfg)).to(dtype)
    target = hf.state_dict()
    ours = model.state_dict()
    state = {}
    for k, v in target.items():
        if k.endswith((".attn.bias", ".attn.masked_bias")):
            continue
        if k in ours:
            w = ours[k]
            if k.endswith(_CONV1D):
                w = w.t()
            if k in ("transformer.wte.weight", "lm_head.weight"):
                w = w[: cfg.vocab_size]
        elif not cfg.bias and k.endswith(".bias"):
            w = torch.zeros_like(v)  # bias-free model: HF GPT-2 always has biases; zero is the same function
        else:
            raise RuntimeError(f"no source for {k}")
        state[k] = w.contiguous()
    hf.load_state_dict(state, strict=False)
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
