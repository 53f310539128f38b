"""iattention: symmetry-reduced attention (I-Attention) for GPT-style language models."""

from iattention.config import GPTConfig, model_preset
from iattention.interop.load import load_run as _load_run
from iattention.model import GPT

__version__ = "0.1.0"
__all__ = ["GPT", "GPTConfig", "load_run", "model_preset", "__version__"]


def load_run(path, data_dir=None):
    """(model, tokenizer) of a run folder, checkpoint, converted or HF GPT-2 folder: see
    `iattention.interop.load.load_run`."""

    return _load_run(path, data_dir)
