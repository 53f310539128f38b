"""Run identity: whether a saved config and a new one describe the same run (or one extending it)."""

from __future__ import annotations

import dataclasses
import functools
import json

from iattention.config.model import NEW_KEYS, GPTConfig, normal_form, upgrade_config
from iattention.config.run import BUDGET_KEYS, RunConfig
from iattention.errors import UserError

# Keys that say where or how fast a run executes, not what it computes: a run may resume on
# another machine (other paths, thread count) and still be the same run.
EXECUTION_KEYS = {"data": ("data_dir", "tokenizer_file", "cache_dir"), "train": ("threads", "tensorboard", "wandb"),
                  "model": ("attn_kernel",)}


@functools.cache
def _defaults() -> dict[str, dict]:
    """Each section's default values (read only)."""
    return {f.name: {x.name: getattr(f.default_factory(), x.name) for x in dataclasses.fields(f.default_factory())}
            for f in dataclasses.fields(RunConfig)}


def config_identity(d: dict | None) -> dict | None:
    """A resolved config dict without its execution-only keys, and without keys at their default value,
    so a run recorded before a key existed is the same run as one that has the key at its default. The model's
    NEW_KEYS are left as normal_form writes them: it already left out each one at its family's value, and the
    defaults here are GPT-2's (a tied Llama and an untied one would otherwise both lose tie_embeddings)."""
    if not isinstance(d, dict):
        return d
    d = _normal(d)  # a run saved before a key was renamed, or by the two-family layout, is the same run
    defaults = _defaults()
    return {sec: ({k: v for k, v in vals.items() if k not in EXECUTION_KEYS.get(sec, ())
                   and not (k in defaults.get(sec, {}) and defaults[sec][k] == v
                            and not (sec == "model" and k in NEW_KEYS))}
                  if isinstance(vals, dict) else vals) for sec, vals in d.items()}


def _normal(d: dict) -> dict:
    d = upgrade_config(d)
    return {**d, "model": normal_form(d["model"])} if isinstance(d.get("model"), dict) else d


def _budget(train: dict) -> tuple[str, int]:
    """(the key that ends a run, its value), popped from a config's train section: max_steps or max_tokens
    when set, else epochs (which a budget makes moot, so it is popped as well)."""
    values = {k: train.pop(k, 0 if k != "epochs" else 1) for k in BUDGET_KEYS}
    key = next((k for k in BUDGET_KEYS[1:] if values[k]), "epochs")
    return key, values[key]


def extends(old: dict | None, new: dict) -> bool:
    """True when `new` is `old` trained longer (all else equal): a finished or running run that --resume may
    continue. A larger budget of the same kind (train.epochs, train.max_steps or train.max_tokens) is
    longer; one of another kind may be, which only the step count the run has reached tells (the trainer
    refuses one that is not: checkpointer.py)."""
    if not isinstance(old, dict):
        return False
    a, b = json.loads(json.dumps(config_identity(old))), json.loads(json.dumps(config_identity(new)))
    (ka, va), (kb, vb) = _budget(a.get("train", {})), _budget(b.get("train", {}))
    return a == b and (kb != ka or vb > va)


def _first_difference(a, b, where="") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return _first_difference(a.get(k), b.get(k), f"{where}{k}.")
    return f"{where.rstrip('.')}: {a!r} there vs {b!r} here"


def _with_defaults(d: dict) -> dict:
    """A config dict with every key its section's dataclass has (missing ones at their default; the model's at
    the value its family gives them, where the section builds)."""
    d = _normal(d)
    out = {sec: ({**_defaults().get(sec, {}), **vals} if isinstance(vals, dict) else vals) for sec, vals in d.items()}
    if isinstance(d.get("model"), dict):
        try:
            out["model"] = {**out["model"], **dataclasses.asdict(GPTConfig.from_dict(d["model"]))}
        except (UserError, TypeError):
            pass
    return out


def config_mismatch(old: dict | None, new: dict) -> str | None:
    """None when two resolved configs describe the same run, else the first differing key (a key
    one of them lacks is shown at its default value)."""
    a, b = config_identity(old), config_identity(new)
    if a == b:
        return None
    if isinstance(old, dict) and isinstance(new, dict):
        return _first_difference(config_identity_keep_defaults(old), config_identity_keep_defaults(new))
    return _first_difference(a, b)


def config_identity_keep_defaults(d: dict) -> dict:
    """config_identity's execution-key filter only, on a dict completed with defaults (for messages)."""
    full = _with_defaults(d)
    return {sec: ({k: v for k, v in vals.items() if k not in EXECUTION_KEYS.get(sec, ())}
                  if isinstance(vals, dict) else vals) for sec, vals in full.items()}
