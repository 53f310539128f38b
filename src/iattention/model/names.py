"""Our parameter names (GPT-2's, for every family: model/gpt.py) and each family's transformers names, one table
per family: the only place a family's weight names are spelled. A name that no rule matches is the same in both.

GPT-2's own export (interop/hf.py) also transposes its Conv1D weights and splits nothing; the Llama family's names
differ only by these prefixes. Checkpoints written before the one family (a Llama-family model named its
parameters as transformers does, and its canonical layer called two of them otherwise) are read through
`upgrade_state` (checkpoint/state.py, interop/load.py).
"""

from __future__ import annotations

import re

_LLAMA = [  # (ours, theirs), {i}: the layer index
    ("transformer.wte.", "model.embed_tokens."),
    ("transformer.h.{i}.ln_1.", "model.layers.{i}.input_layernorm."),
    ("transformer.h.{i}.attn.", "model.layers.{i}.self_attn."),
    ("transformer.h.{i}.ln_2.", "model.layers.{i}.post_attention_layernorm."),
    ("transformer.h.{i}.mlp.", "model.layers.{i}.mlp."),
    ("transformer.ln_f.", "model.norm."),
    ("transformer.rotary_emb.", "model.rotary_emb."),
]
_NEOX = [
    ("transformer.wte.", "gpt_neox.embed_in."),
    ("transformer.h.{i}.ln_1.", "gpt_neox.layers.{i}.input_layernorm."),
    ("transformer.h.{i}.attn.", "gpt_neox.layers.{i}.attention."),
    ("transformer.h.{i}.ln_2.", "gpt_neox.layers.{i}.post_attention_layernorm."),
    ("transformer.h.{i}.mlp.c_fc.", "gpt_neox.layers.{i}.mlp.dense_h_to_4h."),
    ("transformer.h.{i}.mlp.c_proj.", "gpt_neox.layers.{i}.mlp.dense_4h_to_h."),
    ("transformer.ln_f.", "gpt_neox.final_layer_norm."),
    ("transformer.rotary_emb.", "gpt_neox.rotary_emb."),
]
FAMILY_NAMES: dict[str, list[tuple[str, str]]] = {"gpt2": [], "llama": _LLAMA, "qwen2": _LLAMA, "mistral": _LLAMA,
                                                  "gpt_neox": _NEOX}
# Where a family's checkpoint file names a tensor otherwise than the transformers model it builds (transformers 5
# renames it on load and back on save): GPT-NeoX's untied head is `embed_out` in every file, `lm_head` in memory.
FILE_NAMES = {"gpt_neox": {"lm_head.weight": "embed_out.weight"}}
_FROM_FILE = {family: {v: k for k, v in names.items()} for family, names in FILE_NAMES.items()}


def _rules(family: str, reverse: bool) -> list[tuple[re.Pattern, str]]:
    out = []
    for ours, theirs in FAMILY_NAMES[family]:
        src, dst = (theirs, ours) if reverse else (ours, theirs)
        pattern = re.escape(src).replace(re.escape("{i}"), r"(\d+)")
        out.append((re.compile("^" + pattern), dst.replace("{i}", r"\1")))
    return out


def to_family(name: str, family: str) -> str:
    """Our name -> the family's transformers name."""
    for pattern, repl in _rules(family, False):
        if pattern.match(name):
            return pattern.sub(repl, name, count=1)
    return name


def from_family(name: str, family: str) -> str:
    """The family's transformers name -> ours."""
    for pattern, repl in _rules(family, True):
        if pattern.match(name):
            return pattern.sub(repl, name, count=1)
    return name


def to_file(name: str, family: str) -> str:
    """A family's transformers name -> the name its checkpoint files hold."""
    return FILE_NAMES.get(family, {}).get(name, name)


def from_file(name: str, family: str) -> str:
    """The name a family's checkpoint file holds -> its transformers name."""
    return _FROM_FILE.get(family, {}).get(name, name)


# The two-family layout's Llama canonical layer: W_K's pass dims were `W_K_pass_free` / `pass_perm`.
OLD_ATTENTION_NAMES = {"W_K_pass_free": "W_K_free", "pass_perm": "k_perm"}


def upgrade_name(name: str) -> str:
    """A parameter name of a checkpoint written before the one family, or of a folder the streaming converter
    wrote (it keeps its source's transformers names: `gpt_neox.*`), under today's name (unchanged if ours)."""
    if name.startswith("gpt_neox."):
        return from_family(name, "gpt_neox")
    if not name.startswith("model."):
        return name
    name = from_family(name, "llama")
    head, _, leaf = name.rpartition(".")
    return f"{head}.{OLD_ATTENTION_NAMES.get(leaf, leaf)}" if ".attn." in name else name


def upgrade_state(state: dict) -> dict:
    """A state dict with every old name (upgrade_name) renamed."""
    return {upgrade_name(k): v for k, v in state.items()}
