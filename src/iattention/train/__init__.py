"""Training: config, optimizer, schedule, checkpoints, the loop."""

from iattention.config import LoopConfig, OptimConfig, RunConfig, load_config, preset_names
from iattention.train.trainer import Trainer, load_run_config, train

__all__ = ["LoopConfig", "OptimConfig", "RunConfig", "Trainer", "load_config", "load_run_config", "preset_names",
           "train"]
