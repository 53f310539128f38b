"""Loading a run configuration: a named preset, then a YAML file, then KEY=VALUE overrides."""

from __future__ import annotations

import dataclasses
import os
import sys
import types
import typing
from importlib import resources
from pathlib import Path

import yaml

from iattention.config.model import GPTConfig, upgrade_config, upgrade_model_keys, upgrade_override_key
from iattention.config.run import RunConfig
from iattention.data.tokenizers import HF_SPEC, vocab_size_of
from iattention.errors import UserError
from iattention.utils.files import read_yaml

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


def resolve_vocab(model: GPTConfig, tokenizer: str, vocab: int | None = None) -> GPTConfig:
    """The one place `model.vocab_size = 0` ("from the tokenizer") is resolved; returns a new config.

    vocab: the size of the tokenizer as built (a bpe:N tokenizer can hold fewer than N tokens); without it,
    the size the spec names (exact for gpt2 and byte). A vocabulary smaller than the tokenizer's is refused."""
    size = vocab if vocab is not None else vocab_size_of(tokenizer)
    if model.vocab_size == 0:
        return model.replace(vocab_size=size)
    if vocab is not None and vocab > model.vocab_size:
        raise UserError(f"tokenizer {tokenizer} has {vocab} tokens but model.vocab_size is {model.vocab_size}; "
                        f"set model.vocab_size={vocab} (or 0 for automatic)")
    return model


def _renamed_note():
    """note(old, new) for a user's own YAML or override: one line on stderr per renamed key (per call)."""
    seen = set()

    def note(old: str, new: str) -> None:
        if old not in seen:
            seen.add(old)
            print(f"iattn: note: model.{old} is now model.{new}; read as model.{new}", file=sys.stderr)
    return note


def model_preset(name: str, **overrides) -> GPTConfig:
    """The model section of a preset; vocab_size 0 ("from the tokenizer") becomes the size its tokenizer names."""
    cfg = _build(_merge(_preset_dict(name), {"model": upgrade_model_keys(overrides, _renamed_note())}))
    return resolve_vocab(cfg.model, cfg.data.tokenizer)


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
    elif typ is dict:
        if isinstance(value, dict):
            return value
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
    raw = upgrade_config(raw)  # a saved run's old key names (the user's own get a note in load_config)
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


def _family(raw: dict | None) -> str:
    model = (upgrade_config(raw or {}) or {}).get("model")
    return model.get("family", "gpt2") if isinstance(model, dict) else "gpt2"


def parse_override(text: str, note=None) -> dict:
    """'optim.lr=1e-3' -> {'optim': {'lr': 0.001}}; a renamed key under its new name (note(old, new) if given)."""
    if "=" not in text:
        raise UserError(f"override {text!r} is not KEY=VALUE; write e.g. optim.lr=1e-3")
    key, value = text.split("=", 1)
    parts = key.strip().split(".")
    if len(parts) != 2 or not all(parts):
        raise UserError(f"override key {key!r} must be SECTION.KEY, e.g. model.n_head=4")
    parts = upgrade_override_key(".".join(parts), note).split(".")
    try:
        parsed = yaml.safe_load(value) if value.strip() else ""
    except yaml.YAMLError:
        parsed = value
    return {parts[0]: {parts[1]: parsed}}


def override(key: str, value) -> str:
    """A KEY=VALUE override that `parse_override` reads back as exactly `value`: the value YAML-quoted, so a
    path holding ' #' (a comment), ': ', a leading '!', '[' or '{', a trailing space, a newline or non-ASCII
    crosses a process boundary (a sweep's training children) as given, never re-read as other YAML."""
    quoted = yaml.safe_dump(value, default_style='"', allow_unicode=True, width=float("inf"))
    return f"{key}={quoted.strip()}"


def read_yaml_mapping(path: str | Path, what: str, shape: str) -> dict:
    """A YAML file that must hold a mapping; a missing file, bad YAML or another shape is a one-line error."""
    path = Path(path)
    loaded = read_yaml(path, what, "check the path and fix the file")
    if not isinstance(loaded, dict):
        raise UserError(f"{what} {path} must {shape}")
    return loaded


def load_config(preset: str | None = None, config_file: str | None = None, overrides: list[str] = (),
                base: dict | None = None) -> RunConfig:
    """preset (or `base`, a saved run's config), then the YAML file, then KEY=VALUE overrides."""
    note = _renamed_note()
    raw: dict = _preset_dict(preset) if preset else dict(upgrade_config(base) or {})
    if config_file:
        raw = _merge(raw, upgrade_config(read_yaml_mapping(config_file, "config file",
                                         "hold a mapping of sections (model:, data:, optim:, train:)"), note))
    for o in overrides:
        raw = _merge(raw, parse_override(o, note))
    if base is not None:
        was, now = (_family(d) for d in (base, raw))
        if was != now:
            raise UserError(f"this run trains a {was} model; model.family={now} would make it a {now} one: a run "
                            "keeps its model family, so train that in a new --out (or drop model.family)")
    cfg = _build(raw)
    spec = cfg.data.tokenizer
    if spec.startswith(HF_SPEC) and len(spec) > len(HF_SPEC):  # a folder's tokenizer: recorded resolved too
        folder = os.path.abspath(os.path.expanduser(spec[len(HF_SPEC):]))
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, tokenizer=HF_SPEC + folder))
    source = cfg.train.init_from
    if source and source != ((base or {}).get("train") or {}).get("init_from"):
        # stored resolved: a resume from another working folder must start from the same weights. A saved
        # run's own value is kept as it was (a run recorded before this has a relative one).
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, init_from=os.path.abspath(source)))
    return cfg


def config_from_dict(d: dict) -> RunConfig:
    return _build(d)
