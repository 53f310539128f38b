"""Configuration: the model (`model.py`), a whole run (`run.py`), loading them from presets, YAML and
overrides (`load.py`), and run identity (`identity.py`)."""

from iattention.config.identity import EXECUTION_KEYS, config_identity, config_mismatch, extends
from iattention.config.load import (
    config_from_dict,
    default_heads,
    load_config,
    model_preset,
    override,
    parse_override,
    preset_names,
    read_yaml_mapping,
    resolve_vocab,
)
from iattention.config.model import CANONICAL_HALVES, INITS, GPTConfig
from iattention.config.run import BUDGET_KEYS, LoopConfig, OptimConfig, RunConfig

__all__ = [
    "BUDGET_KEYS", "CANONICAL_HALVES", "EXECUTION_KEYS", "INITS", "GPTConfig", "LoopConfig", "OptimConfig", "RunConfig",
    "config_from_dict", "config_identity", "config_mismatch", "default_heads", "extends", "load_config",
    "model_preset", "override", "parse_override", "preset_names", "read_yaml_mapping", "resolve_vocab",
]
