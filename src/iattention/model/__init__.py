"""The one model (`gpt.py`: GPT-2, Llama, Qwen2, Mistral as configurations), sampling (`generate.py`) and
activation caching (`activations.py`)."""

from iattention.model.gpt import GPT

__all__ = ["GPT"]
