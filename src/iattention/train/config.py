"""Run configuration: typed nested dataclasses, loaded from a preset, a YAML file and key=value overrides."""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import yaml

from iattention.config import GPTConfig
from iattention.data.config import DataConfig
from iattention.errors import UserError


@dataclass
class OptimConfig:
    """AdamW with linear warmup then cosine decay to min_lr_ratio * lr ("GPT-style")."""

    lr: float = 6e-4
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1  # on matrices only (dim >= 2); biases, LayerNorms excluded
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # 0 disables
    decay_attention: bool = True  # False: no weight decay on attention matrices (see train/optim.py)
    attn_lr_by_init_rms: bool = False  # True: attention matrix lr x RMS at step 0 / 0.02 (train/optim.py)


    def __post_init__(self) -> None:
        checks = (("lr", self.lr > 0, "> 0", "optim.lr=6e-4"),
                  ("min_lr_ratio", 0 <= self.min_lr_ratio <= 1, "in [0, 1]", "optim.min_lr_ratio=0.1"),
                  ("warmup_steps", self.warmup_steps >= 0, ">= 0", "optim.warmup_steps=100"),
                  ("weight_decay", self.weight_decay >= 0, ">= 0", "optim.weight_decay=0.1"),
                  ("beta1", 0 <= self.beta1 < 1, "in [0, 1)", "optim.beta1=0.9"),
                  ("beta2", 0 <= self.beta2 < 1, "in [0, 1)", "optim.beta2=0.95"),
                  ("grad_clip", self.grad_clip >= 0, ">= 0 (0 disables clipping)", "optim.grad_clip=1.0"))
        _check("optim", self, checks)


def _check(section: str, obj, checks) -> None:
    import math

    for name, ok, rule, example in checks:
        value = getattr(obj, name)
        if isinstance(value, float) and not math.isfinite(value) or not ok:
            raise UserError(f"{section}.{name} must be {rule}, got {value!r}; e.g. {example}")


DEVICES = ("auto", "cpu", "cuda")


@dataclass
class LoopConfig:
    epochs: int = 1
    batch_size: int = 32  # global batch, in windows of block_size tokens
    grad_accum: int = 1
    seed: int = 0
    eval_every_steps: int = 0  # extra validation evals between epochs (0: only at epoch ends)
    ckpt_every_steps: int = 0  # extra resumable checkpoints between epochs
    eval_batch_size: int = 32
    patience: int = 0  # early stopping after this many epochs without improvement (0: off)
    compile: bool = False
    device: str = "auto"  # auto | cpu | cuda
    amp: bool = True  # bf16 autocast on CUDA
    amp_cpu: bool = False  # bf16 autocast on CPU too (AMX: 1.3-1.8x faster here, but other numbers; BENCHMARKS.md)
    threads: int = 0  # torch CPU threads (0: torch default)
    tensorboard: bool = True
    skip_nonfinite: bool = False  # skip batches with a non-finite loss instead of stopping
    init_from: str = ""  # start from these weights (our checkpoint/run folder or an HF GPT-2 folder), not a fresh init

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise UserError(f"train.device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        checks = [(n, getattr(self, n) >= 1, ">= 1", f"train.{n}=32") for n in
                  ("epochs", "batch_size", "grad_accum", "eval_batch_size")]
        checks += [(n, getattr(self, n) >= 0, ">= 0 (0: off)" if n != "threads" else ">= 0 (0: torch's choice)",
                    f"train.{n}=0") for n in ("seed", "eval_every_steps", "ckpt_every_steps", "patience", "threads")]
        _check("train", self, checks)


@dataclass
class RunConfig:
    model: GPTConfig = field(default_factory=lambda: GPTConfig(vocab_size=0))
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: LoopConfig = field(default_factory=LoopConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


PRESET_DIR = "presets"
# Other names for a preset: GPT-2 small is the paper preset's model.
PRESET_ALIASES = {"gpt2-small": "paper"}


def preset_names() -> list[str]:
    """Every preset name any command takes (the YAML presets and their aliases)."""
    files = [p.name[:-5] for p in resources.files("iattention").joinpath(PRESET_DIR).iterdir()
             if p.name.endswith(".yaml")]
    return sorted([*files, *PRESET_ALIASES])


def _preset_dict(name: str) -> dict:
    path = resources.files("iattention").joinpath(PRESET_DIR, f"{PRESET_ALIASES.get(name, name)}.yaml")
    if not path.is_file():
        raise UserError(f"unknown preset {name!r}; choose one of {', '.join(preset_names())}")
    return yaml.safe_load(path.read_text()) or {}


def preset_model(name: str, **overrides) -> GPTConfig:
    """The model section of a preset; vocab_size 0 ("from the tokenizer") becomes the tokenizer's size."""
    from iattention.data.tokenizers import vocab_size_of

    cfg = _build(_merge(_preset_dict(name), {"model": overrides}))
    model = cfg.model
    if model.vocab_size == 0:
        model = model.replace(vocab_size=vocab_size_of(cfg.data.tokenizer))
    return model


def default_heads(model: GPTConfig) -> list[int]:
    """Head counts a command shows by default for a preset: 1, 2, 4, 8, 12 that divide d, up to its n_head."""
    return [h for h in (1, 2, 4, 8, 12) if model.n_embd % h == 0 and h <= max(model.n_head, 1)] or [model.n_head]


def _coerce(where: str, value, typ):
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):
        typ = next(t for t in typing.get_args(typ) if t is not type(None))
    if typ is bool:
        if isinstance(value, bool):
            return value
    elif typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif typ is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "1e-3" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif typ is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
    raise UserError(f"{where} expects {typ.__name__}, got {value!r}")


def _merge(base: dict, update: dict, where: str = "") -> dict:
    out = dict(base)
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v, f"{where}{k}.")
        else:
            out[k] = v
    return out


def _build(raw: dict) -> RunConfig:
    sections = {f.name: f for f in dataclasses.fields(RunConfig)}
    unknown = sorted(set(raw) - set(sections))
    if unknown:
        raise UserError(f"unknown config section(s) {unknown}; allowed: {sorted(sections)}")
    built = {}
    for name, f in sections.items():
        cls = f.default_factory().__class__
        values = raw.get(name) or {}
        if not isinstance(values, dict):
            raise UserError(f"config section {name!r} must be a mapping of keys, got {values!r}")
        hints = typing.get_type_hints(cls)
        allowed = [x.name for x in dataclasses.fields(cls)]
        for key in values:
            if key not in hints:
                raise UserError(f"unknown config key {name}.{key}; allowed keys: {', '.join(allowed)}")
        kwargs = {k: _coerce(f"{name}.{k}", v, hints[k]) for k, v in values.items()}
        if cls is GPTConfig:
            kwargs.setdefault("vocab_size", 0)
        built[name] = cls(**kwargs)
    return RunConfig(**built)


def parse_override(text: str) -> dict:
    """'optim.lr=1e-3' -> {'optim': {'lr': 0.001}}."""
    if "=" not in text:
        raise UserError(f"override {text!r} is not KEY=VALUE; write e.g. optim.lr=1e-3")
    key, value = text.split("=", 1)
    parts = key.strip().split(".")
    if len(parts) != 2 or not all(parts):
        raise UserError(f"override key {key!r} must be SECTION.KEY, e.g. model.n_head=4")
    try:
        parsed = yaml.safe_load(value) if value.strip() else ""
    except yaml.YAMLError:
        parsed = value
    return {parts[0]: {parts[1]: parsed}}


def read_yaml_mapping(path: str | Path, what: str, shape: str) -> dict:
    """A YAML file that must hold a mapping; a missing file, bad YAML or another shape is a one-line error."""
    path = Path(path)
    try:
        loaded = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{what} {path} does not exist; check the path") from None
    except yaml.YAMLError as e:
        raise UserError(f"{what} {path} is not valid YAML ({str(e).splitlines()[0]}); fix it") from None
    if not isinstance(loaded, dict):
        raise UserError(f"{what} {path} must {shape}")
    return loaded


def load_config(preset: str | None = None, config_file: str | None = None, overrides: list[str] = (),
                base: dict | None = None) -> RunConfig:
    """preset (or `base`, a saved run's config), then the YAML file, then KEY=VALUE overrides."""
    raw: dict = _preset_dict(preset) if preset else dict(base or {})
    if config_file:
        raw = _merge(raw, read_yaml_mapping(config_file, "config file",
                                            "hold a mapping of sections (model:, data:, optim:, train:)"))
    for o in overrides:
        raw = _merge(raw, parse_override(o))
    return _build(raw)


def config_from_dict(d: dict) -> RunConfig:
    return _build(d)


# Keys that say where or how fast a run executes, not what it computes: a run may resume on
# another machine (other paths, thread count) and still be the same run.
EXECUTION_KEYS = {"data": ("data_dir", "tokenizer_file", "cache_dir"), "train": ("threads", "tensorboard")}


@functools.cache
def _defaults() -> dict[str, dict]:
    """Each section's default values (read only)."""
    return {f.name: {x.name: getattr(f.default_factory(), x.name) for x in dataclasses.fields(f.default_factory())}
            for f in dataclasses.fields(RunConfig)}


def config_identity(d: dict | None) -> dict | None:
    """A resolved config dict without its execution-only keys, and without keys at their default value,
    so a run recorded before a key existed is the same run as one that has the key at its default."""
    if not isinstance(d, dict):
        return d
    defaults = _defaults()
    return {sec: ({k: v for k, v in vals.items() if k not in EXECUTION_KEYS.get(sec, ())
                   and not (k in defaults.get(sec, {}) and defaults[sec][k] == v)}
                  if isinstance(vals, dict) else vals) for sec, vals in d.items()}


def extends(old: dict | None, new: dict) -> bool:
    """True when `new` is `old` trained for more epochs (all else equal): a finished or running run
    that --resume may continue."""
    if not isinstance(old, dict):
        return False
    a, b = json.loads(json.dumps(config_identity(old))), json.loads(json.dumps(config_identity(new)))
    ea, eb = a.get("train", {}).pop("epochs", 1), b.get("train", {}).pop("epochs", 1)
    return a == b and eb > ea


def _first_difference(a, b, where="") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return _first_difference(a.get(k), b.get(k), f"{where}{k}.")
    return f"{where.rstrip('.')}: {a!r} there vs {b!r} here"


def _with_defaults(d: dict) -> dict:
    """A config dict with every key its section's dataclass has (missing ones at their default)."""
    return {sec: ({**_defaults().get(sec, {}), **vals} if isinstance(vals, dict) else vals) for sec, vals in d.items()}


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
