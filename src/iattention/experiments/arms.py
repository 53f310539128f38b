"""Arms of a study: a name plus config overrides, e.g. `canonical-matched` =
`model.attention=canonical model.init=matched`.

Built-in arms: one per registered attention variant (`variant_names()`) and `canonical-matched`. A study
defines more in a YAML file (name -> list of KEY=VALUE overrides) that `iattn sweep --arms-file` reads;
commit that file next to the study's runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from iattention.attention.registry import variant_names
from iattention.config import parse_override, read_yaml_mapping
from iattention.errors import UserError

# The axes of a sweep's grid: an arm or an override must not set them (they name the run folder).
GRID_KEYS = {"model.n_head": "--heads", "train.seed": "--seeds"}


@dataclass(frozen=True)
class Arm:
    name: str
    overrides: tuple[str, ...]

    def keys(self) -> set[str]:
        return {override_key(o) for o in self.overrides}


BUILTIN_ARMS: dict[str, Arm] = {v: Arm(v, (f"model.attention={v}",)) for v in variant_names()} | {
    "canonical-matched": Arm("canonical-matched", ("model.attention=canonical", "model.init=matched")),
    # The recipe under which I-Attention trains level with standard at CPU scale (results/README.md): the
    # matched start and per-group learning rates, and standard under the same rule as its control.
    "canonical-matched-rmslr": Arm("canonical-matched-rmslr", ("model.attention=canonical", "model.init=matched",
                                                               "optim.attn_lr_by_init_rms=true")),
    "standard-rmslr": Arm("standard-rmslr", ("model.attention=standard", "optim.attn_lr_by_init_rms=true")),
}


def override_key(text: str) -> str:
    """'optim.lr=1e-3' -> 'optim.lr' (validated like any override)."""
    ((section, values),) = parse_override(text).items()
    (key,) = values.keys()
    return f"{section}.{key}"


def _check_name(name: str, where: str) -> None:
    if not name or not all(c.isalnum() or c in "-_." for c in name):
        raise UserError(f"arm name {name!r} in {where} may hold only letters, digits, '-', '_' and '.'; rename it")


def load_arms_file(path: str | Path) -> dict[str, Arm]:
    raw = read_yaml_mapping(path, "arms file", "map arm names to lists of KEY=VALUE overrides")
    arms = {}
    for name, overrides in raw.items():
        _check_name(str(name), str(path))
        if isinstance(overrides, str):
            overrides = overrides.split()
        if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
            raise UserError(f"arm {name!r} in {path} must be a list of KEY=VALUE strings, e.g. [model.init=matched]")
        arms[str(name)] = Arm(str(name), tuple(overrides))
    return arms


def resolve_arms(names: list[str], arms_file: str | None = None) -> list[Arm]:
    """Look each name up in the arms file first, then the built-ins; check no arm sets a grid axis."""
    known = dict(BUILTIN_ARMS) | (load_arms_file(arms_file) if arms_file else {})
    out = []
    for name in names:
        if name not in known:
            raise UserError(f"unknown arm {name!r}; choose from {', '.join(known)} or define it in --arms-file")
        arm = known[name]
        for key in arm.keys() & set(GRID_KEYS):
            raise UserError(f"arm {name!r} sets {key}, an axis of the grid; use {GRID_KEYS[key]} instead")
        out.append(arm)
    if len({a.name for a in out}) != len(out):
        raise UserError(f"arm names repeat in {','.join(names)}; name each arm once")
    return out


def check_overrides(overrides: list[str], arms: list[Arm]) -> None:
    """An override for every run must not collide with a grid axis or with what an arm sets."""
    for o in overrides:
        key = override_key(o)
        if key in GRID_KEYS:
            raise UserError(f"override {o!r} sets {key}, an axis of the grid; use {GRID_KEYS[key]} instead")
        for arm in arms:
            if key in arm.keys():
                raise UserError(f"override {o!r} collides with arm {arm.name!r}, which sets {key}; define another "
                                "arm (--arms-file) instead of overriding it")
