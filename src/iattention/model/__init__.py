"""The GPT model (`gpt.py`), the Llama-family model (`llama.py`), sampling (`generate.py`) and activation
caching (`activations.py`)."""

from iattention.config.llama import LlamaConfig
from iattention.model.gpt import GPT
from iattention.model.llama import Llama


def build_model(config) -> GPT | Llama:
    """The model a run's model section describes: a Llama-family decoder for a LlamaConfig, else GPT-2."""
    return Llama(config) if isinstance(config, LlamaConfig) else GPT(config)


__all__ = ["GPT", "Llama", "build_model"]
