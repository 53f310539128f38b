"""The GPT model (`gpt.py`), sampling (`generate.py`) and activation caching (`inspect.py`)."""

from iattention.model.gpt import GPT

__all__ = ["GPT"]
