"""Our parameter names (GPT-2's, for every family: model/gpt.py) and each family's transformers names, read from
its record (`Family.names`, config/families.py: the only place a family's weight names are spelled). A name that no
rule matches is the same in both.

GPT-2's own export (interop/hf.py) also transposes its Conv1D weights and splits nothing; the Llama family's names
differ only by these prefixes. Checkpoints written before the one family (a Llama-family model named its
parameters as transformers does, and its canonical layer called two of them otherwise) and folders the streaming
converter wrote before issue 64 (its source's transformers names) are read through `upgrade_name`, which
checkpoint/state.py's `upgrade_key` applies for every reader of a checkpoint.
"""

from __future__ import annotations

import re

from iattention.config.families import FAMILIES


def _rules(family: str, reverse: bool) -> list[tuple[re.Pattern, str]]:
    out = []
    for ours, theirs in FAMILIES[family].names:
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
    return FAMILIES[family].file_names.get(name, name)


def from_file(name: str, family: str) -> str:
    """The name a family's checkpoint file holds -> its transformers name."""
    return {v: k for k, v in FAMILIES[family].file_names.items()}.get(name, name)


# The two-family layout's Llama canonical layer: W_K's pass dims were `W_K_pass_free` / `pass_perm`.
OLD_ATTENTION_NAMES = {"W_K_pass_free": "W_K_free", "pass_perm": "k_perm"}


def upgrade_name(name: str) -> str:
    """A parameter name of a checkpoint written before the one family, or of a folder the streaming converter
    wrote (it keeps its source's transformers names: `gpt_neox.*`), under today's name (unchanged if ours)."""
    owner = next((f for f in FAMILIES if from_family(name, f) != name), None)  # the family whose names it has
    if owner is None:
        return name
    name = from_family(name, owner)
    head, _, leaf = name.rpartition(".")
    return f"{head}.{OLD_ATTENTION_NAMES.get(leaf, leaf)}" if ".attn." in name else name
