"""iattention: symmetry-reduced attention (I-Attention) for GPT-style language models.

The public names are imported on first use (PEP 562), so that `import iattention` (and the `iattn` command
starting) does not import torch before the command line can handle a Ctrl-C (cli/__init__.py)."""

__version__ = "0.1.0"
__all__ = ["GPT", "GPTConfig", "load_run", "model_preset", "__version__"]


def __getattr__(name: str):
    if name == "GPT":
        from iattention.model import GPT

        return GPT
    if name in ("GPTConfig", "model_preset"):
        from iattention import config

        return getattr(config, name)
    raise AttributeError(f"module 'iattention' has no attribute {name!r}")


def load_run(path, data_dir=None, tokenizer=None):
    """(model, tokenizer) of a run folder, checkpoint, converted or HF model folder (`tokenizer`: another spec
    to use, gpt2, byte, bpe:N or hf:FOLDER): see `iattention.interop.load.load_run`."""
    from iattention.interop.load import load_run as _load_run

    return _load_run(path, data_dir, tokenizer)
