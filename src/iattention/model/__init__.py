from iattention.config import MODEL_PRESETS, GPTConfig, model_preset
from iattention.model.gpt import GPT

__all__ = ["GPT", "GPTConfig", "MODEL_PRESETS", "model_preset"]
