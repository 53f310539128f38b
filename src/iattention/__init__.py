"""iattention: symmetry-reduced attention (I-Attention) for GPT-style language models."""

from iattention.model import GPT, GPTConfig, model_preset

__version__ = "0.1.0"
__all__ = ["GPT", "GPTConfig", "model_preset", "__version__"]
