from iattention.config import GPTConfig, model_preset
from iattention.model.gpt import GPT

__all__ = ["GPT", "GPTConfig", "model_preset"]
