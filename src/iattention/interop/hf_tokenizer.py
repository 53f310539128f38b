"""A run's tokenizer in the form transformers reads (tokenizer.json + tokenizer_config.json), so an
exported folder works with `AutoTokenizer`, `AutoModelForCausalLM` and `pipeline` offline.

- gpt2: the GPT-2 BPE built from the r50k ranks by transformers' own tiktoken converter
  (`TikTokenConverter`), with `<|endoftext|>` (50256) as bos/eos, as the Hub's gpt2 tokenizer has.
  The ranks are written to a temporary file in tiktoken's format first (transformers' one-call helper
  would need the `blobfile` package for that step).
- bpe:N: the byte-level BPE the run trained (Hugging Face `tokenizers`), as is; it has no special
  tokens, so bos/eos stay unset.
- byte: a byte-level BPE with the 256 byte tokens at their byte values and no merges (ids = bytes).
"""

from __future__ import annotations

from pathlib import Path

from iattention.data.tokenizers import Tokenizer
from iattention.errors import UserError


def _byte_tokenizer():
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode  # GPT-2 byte <-> unicode table

    vocab = {ch: b for b, ch in bytes_to_unicode().items()}  # id = byte value, as our byte tokenizer
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def _gpt2_tokenizer(encoding):
    """A `tokenizers` GPT-2 BPE from a tiktoken Encoding, through transformers' TikTokenConverter."""
    import base64
    import tempfile

    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = sorted(encoding._mergeable_ranks.items(), key=lambda kv: kv[1])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "r50k_base.tiktoken"
        path.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in ranks))
        return TikTokenConverter(vocab_file=str(path), pattern=encoding._pat_str,
                                 extra_special_tokens=encoding._special_tokens).converted()


def save_hf_tokenizer(tok: Tokenizer, folder: str | Path) -> None:
    try:
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        raise UserError("exporting the tokenizer needs transformers; pip install 'iattention[hf]'") from None
    if tok.name == "gpt2":
        fast = PreTrainedTokenizerFast(tokenizer_object=_gpt2_tokenizer(tok._impl), bos_token="<|endoftext|>",
                                       eos_token="<|endoftext|>", unk_token="<|endoftext|>")
    elif tok.name == "byte":
        fast = PreTrainedTokenizerFast(tokenizer_object=_byte_tokenizer())
    else:
        fast = PreTrainedTokenizerFast(tokenizer_object=tok._impl)
    fast.model_max_length = int(1e30)
    fast.save_pretrained(str(folder))
