"""A run's tokenizer in the form transformers reads (tokenizer.json + tokenizer_config.json), so an
exported folder works with `AutoTokenizer`, `AutoModelForCausalLM` and `pipeline` offline.

- gpt2: the GPT-2 BPE built from the local r50k ranks by transformers' own tiktoken converter, with
  `<|endoftext|>` (50256) as bos/eos, as the Hub's gpt2 tokenizer has.
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


def save_hf_tokenizer(tok: Tokenizer, folder: str | Path) -> None:
    try:
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        raise UserError("exporting the tokenizer needs transformers; pip install 'iattention[hf]'") from None
    if tok.name == "gpt2":
        from transformers.integrations.tiktoken import convert_tiktoken_to_fast

        convert_tiktoken_to_fast(tok._impl, str(folder))
        fast = PreTrainedTokenizerFast(tokenizer_file=str(Path(folder) / "tokenizer.json"),
                                       bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                       unk_token="<|endoftext|>")
    elif tok.name == "byte":
        fast = PreTrainedTokenizerFast(tokenizer_object=_byte_tokenizer())
    else:
        fast = PreTrainedTokenizerFast(tokenizer_object=tok._impl)
    fast.model_max_length = int(1e30)
    fast.save_pretrained(str(folder))
