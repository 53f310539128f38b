"""Interop: load our checkpoints; exact conversion to and from Hugging Face GPT-2."""

from iattention.interop.hf import from_hf, to_hf
from iattention.interop.load import load_model

__all__ = ["from_hf", "load_model", "to_hf"]
