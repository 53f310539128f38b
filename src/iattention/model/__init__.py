"""The GPT model (`gpt.py`), sampling (`generate.py`) and activation caching (`activations.py`)."""

from iattention.model.gpt import GPT

__all__ = ["GPT"]
