"""The one model (`gpt.py`: GPT-2, Llama, Qwen2, Mistral as configurations), sampling (`generate.py`) and
activation caching (`activations.py`)."""

from iattention.model.gpt import GPT


def build_model(config) -> GPT:
    """The model a run's model section (a GPTConfig) describes."""
    return GPT(config)


__all__ = ["GPT", "build_model"]
