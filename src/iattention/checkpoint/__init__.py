"""What a run leaves on disk: checkpoint files (`state.py`) and the run folder that holds them
(`run_folder.py`, the one owner of every file in it)."""

from iattention.checkpoint.run_folder import RunFolder
from iattention.checkpoint.state import (
    load_model_state,
    load_optimizer_state,
    load_tensors,
    read_checkpoint,
    read_meta,
    read_state,
    save_checkpoint,
)

__all__ = ["RunFolder", "load_model_state", "load_optimizer_state", "load_tensors", "read_checkpoint", "read_meta",
           "read_state", "save_checkpoint"]
