"""`train.init_from`: start a run from existing weights instead of a fresh initialisation.

The source is one of our checkpoints (run folder, .safetensors, converted folder) or a Hugging Face GPT-2
folder; for a Llama-family run (model.family=llama), a Llama-family checkpoint of ours (a converted Llama,
Qwen2 or Mistral folder included) or the Hugging Face folder itself, whose own tokenizer (hf:FOLDER, which
`iattn train --init-from` makes the run's data.tokenizer) fixes the vocabulary. Its weights are moved exactly
into the run's attention variant: to `standard` by expanding (products formed, no solve), to `canonical` by
canonicalizing with pivoted blocks (the best-conditioned r x r blocks), so "convert a pretrained GPT-2 to
I-Attention and fine-tune it" is one command. `identity_q` / `identity_ko` are smaller classes: they start
only from their own kind.
"""

from __future__ import annotations

import os

import torch

from iattention.errors import UserError
from iattention.interop.load import load_any
from iattention.model.gpt import GPT
from iattention.symmetry.transforms import canonicalize, expand

# no block_size with RoPE: it has no position weights, so a run may train at any block (a source's
# max_position_embeddings, 8192 for SmolLM2, says how far it was trained, not what it holds)
# (a window changes the function the weights compute, as the norms do)
SHAPE_KEYS = ("family", "n_layer", "n_head", "n_kv_head", "n_embd", "d_head", "block_size", "bias", "pos", "rot",
              "rope_layout", "rope_theta", "rope_type", "rope_scaling", "norm", "norm_eps", "mlp", "mlp_hidden",
              "qkv_bias", "o_bias", "tie_embeddings", "projection", "fused_gate_up", "parallel_residual",
              "sliding_window", "full_attention_layers")


WINDOW_KEYS = ("sliding_window", "full_attention_layers")


def _window(c, block: int) -> dict:
    """A config's window keys as they act on blocks of `block` tokens (0 where the window never binds)."""
    window = c.sliding_window if 0 < c.sliding_window < block else 0
    return {"sliding_window": window, "full_attention_layers": c.full_attention_layers if window else 0}


def _check_fits(source: str, want, have, data: dict | None, cfg) -> None:
    """Every way the source differs from the run, in one line: the model keys to set, and the tokenizer (which
    fixes the vocabulary: model.vocab_size follows the run's tokenizer, unless the source's embedding has rows
    past it)."""
    w, h = want.to_dict(), have.to_dict()  # a key derived on both sides (d_head from n_embd) is not named
    # a window at least as long as the run's blocks never binds (an HF Mistral's 4096 in a block-256 run)
    w.update(_window(want, want.block_size)), h.update(_window(have, want.block_size))
    keys = [k for k in SHAPE_KEYS if w.get(k) != h.get(k) and (k in WINDOW_KEYS or getattr(want, k) != getattr(have, k))
            and not (k == "block_size" and want.pos == "rope")]
    problems, fixes = [], []
    if keys:
        problems.append(", ".join(f"model.{k} (source {getattr(have, k)}, run {getattr(want, k)})" for k in keys))
        # a run's n_kv_head follows its n_head unless set: setting n_head alone would then refuse a GQA source next
        also = ["n_kv_head"] if "n_head" in keys and "n_kv_head" not in keys and have.n_kv_head != have.n_head else []
        fixes.append("set " + " ".join(f"model.{k}={getattr(have, k)}" for k in [*keys, *also]))
    tokenizer = (data or {}).get("tokenizer")
    if tokenizer and tokenizer != cfg.data.tokenizer:
        problems.append(f"the tokenizer (source {tokenizer}, run {cfg.data.tokenizer})")
        fixes.append(f"data.tokenizer={tokenizer}")
    elif want.vocab_size < have.vocab_size and tokenizer:  # the source's embedding has rows past its tokenizer
        problems.append(f"the vocabulary (source {have.vocab_size:,} embedding rows, the run's tokenizer "
                        f"{want.vocab_size:,} tokens)")
        fixes.append(f"set model.vocab_size={have.vocab_size}")
    elif want.vocab_size != have.vocab_size:
        problems.append(f"the vocabulary (source {have.vocab_size:,} tokens, the run's tokenizer {cfg.data.tokenizer} "
                        f"{want.vocab_size:,})")
        fixes.append("train with the tokenizer the source was trained with (data.tokenizer)")
    if problems:
        raise UserError(f"train.init_from={source} differs from the run in {'; '.join(problems)}: "
                        f"{'; '.join(fixes)} (or use the preset the source was trained with)")


def with_init_tokenizer(cfg, config_file: str | None, overrides: list[str], missing_ok: bool = False):
    """`cfg` with the tokenizer of its train.init_from: a Hugging Face folder's weights come with the tokenizer
    that fixes their vocabulary (interop.load.folder_tokenizer: hf:FOLDER), and the run's data is tokenized with
    it unless the user named one (data.tokenizer= on the command line or in the YAML file; a preset's is only its
    default). The one derivation for a new run, its resume (a preset given again) and a sweep's check of its
    finished runs (`missing_ok`: a source no longer there leaves `cfg` as it is; else one line)."""
    import dataclasses

    from iattention.config import read_yaml_mapping
    from iattention.interop.load import folder_tokenizer

    if not cfg.train.init_from or any(o.split("=", 1)[0].strip() == "data.tokenizer" for o in overrides):
        return cfg
    data = read_yaml_mapping(config_file, "config file", "hold a mapping").get("data") if config_file else None
    if isinstance(data, dict) and "tokenizer" in data:
        return cfg
    if not os.path.lexists(cfg.train.init_from):  # else the preset's tokenizer, and a resume refused as another run
        if missing_ok:
            return cfg
        raise UserError(f"train.init_from={cfg.train.init_from} does not exist (the run starts from it and, from a "
                        "Hugging Face folder, tokenizes with it, on --resume too); restore it there, or name the "
                        "tokenizer (data.tokenizer=)")
    own = folder_tokenizer(cfg.train.init_from)
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, tokenizer=own)) if own else cfg


@torch.no_grad()
def load_initial_weights(model: GPT, source: str, cfg) -> dict:
    """Load `source` into `model` (built from the run's config), exactly; return what was loaded."""
    src, data, _ = load_any(source)
    want, have = model.config, src.config
    if want.family != have.family:
        raise UserError(f"train.init_from={source} holds a {have.family} model, the run trains a {want.family} one; "
                        f"start from a model of the run's family, or set model.family={have.family} and the source's "
                        "shape")
    _check_fits(source, want, have, data, cfg)
    target = want.attention
    form = ("canonical_halves", "minimal_bias")  # a canonical model's own form: which halves and biases are fixed
    if target == have.attention and (target != "canonical" or all(getattr(want, k) == getattr(have, k) for k in form)):
        moved = src
    elif target == "standard":
        moved = expand(src)
    elif target == "canonical":
        standard = src if have.attention == "standard" else expand(src)
        moved = canonicalize(standard.double(), block="pivoted", halves=want.canonical_halves,
                             minimal=want.minimal_bias)
    else:
        raise UserError(f"model.attention={target} cannot start from a {have.attention} model: it is a smaller "
                        "function class; start from a model of the same variant, or train standard/canonical")
    dtype = next(model.parameters()).dtype
    state = {k: v.to(dtype) for k, v in moved.state_dict().items()}
    model.load_state_dict(state)
    return {"source": source, "from_attention": have.attention, "to_attention": target}
