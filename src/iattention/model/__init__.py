"""The GPT model (`gpt.py`), the Llama-family model (`llama.py`), sampling (`generate.py`) and activation
caching (`activations.py`)."""

from iattention.config.llama import LlamaConfig
from iattention.errors import UserError
from iattention.model.gpt import GPT
from iattention.model.llama import Llama


def build_model(config) -> GPT | Llama:
    """The model a run's model section describes: a Llama-family decoder for a LlamaConfig, else GPT-2."""
    return Llama(config) if isinstance(config, LlamaConfig) else GPT(config)


def gpt_only(config, what: str, instead: str) -> None:
    """One line refusing a Llama-family model (a LlamaConfig) in a tool that reads GPT-2 models only."""
    if isinstance(config, LlamaConfig):
        raise UserError(f"{what} reads GPT-2 models, and this one is of the Llama family; {instead}")


__all__ = ["GPT", "Llama", "build_model", "gpt_only"]
