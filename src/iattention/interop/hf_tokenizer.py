"""A run's tokenizer in the form transformers reads (tokenizer.json + tokenizer_config.json), so an
exported folder works with `AutoTokenizer`, `AutoModelForCausalLM` and `pipeline` offline.

- gpt2: the GPT-2 BPE built from the r50k ranks by transformers' own tiktoken converter
  (`TikTokenConverter`), with `<|endoftext|>` (50256) as bos/eos, as the Hub's gpt2 tokenizer has.
  The ranks are written to a temporary file in tiktoken's format first (transformers' one-call helper
  would need the `blobfile` package for that step).
- bpe:N: the byte-level BPE the run trained (Hugging Face `tokenizers`), as is, plus one added special
  token `<|endoftext|>` at id N (the first id past the run's vocabulary) as bos/eos, so clients that start a
  document with it (lm-eval's rolling loglikelihood) work. The run was trained without such a token: the
  exported model gets a row for it whose logit is a constant far below every real logit (see
  `interop.hf.add_eos_row`), so it takes no probability: the model's trained logits, and every text's
  score, are the run's own.
- byte: a byte-level BPE with the 256 byte tokens at their byte values and no merges (ids = bytes), and
  `<|endoftext|>` at id 256, as for bpe:N.

Every export: model_max_length = the model's block size (longer inputs are truncated by the tokenizer
when asked, never an IndexError inside the model), and tokenizer_class `PreTrainedTokenizerFast`, a class
every transformers since 4.x knows (5.x writes `TokenizersBackend`, which 4.x cannot load).
"""

from __future__ import annotations

import base64
import json
import tempfile
from pathlib import Path

from iattention.data.tokenizers import Tokenizer
from iattention.errors import UserError


def _byte_tokenizer():
    # lazy: tokenizers/transformers are heavy and needed only when a tokenizer is exported
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
    from transformers.convert_slow_tokenizer import TikTokenConverter  # lazy: heavy, only for an export

    ranks = sorted(encoding._mergeable_ranks.items(), key=lambda kv: kv[1])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "r50k_base.tiktoken"
        path.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in ranks))
        return TikTokenConverter(vocab_file=str(path), pattern=encoding._pat_str,
                                 extra_special_tokens=encoding._special_tokens).converted()


EOS = "<|endoftext|>"
# tokenizer_config.json keys written; others that a transformers version adds (e.g. 5.x's "backend") are
# dropped, so older versions read the file as it is.
_CONFIG_KEYS = ("bos_token", "eos_token", "unk_token", "model_max_length")


def save_hf_tokenizer(tok: Tokenizer, folder: str | Path, model_max_length: int | None = None) -> int:
    """Write `tok` as tokenizer.json + tokenizer_config.json; returns the id of its end-of-text token
    (50256 for gpt2; the added `<|endoftext|>` = the tokenizer's own size for bpe:N and byte)."""
    try:
        from transformers import PreTrainedTokenizerFast  # lazy: heavy and optional (iattention[hf])
    except ImportError:
        raise UserError("exporting the tokenizer needs transformers; pip install 'iattention[hf]'") from None
    if tok.name == "gpt2":
        fast = PreTrainedTokenizerFast(tokenizer_object=_gpt2_tokenizer(tok._impl), bos_token=EOS,
                                       eos_token=EOS, unk_token=EOS)
    else:
        obj = _byte_tokenizer() if tok.name == "byte" else tok._impl
        fast = PreTrainedTokenizerFast(tokenizer_object=obj, bos_token=EOS, eos_token=EOS)
    if model_max_length:
        fast.model_max_length = int(model_max_length)
    fast.save_pretrained(str(folder))
    config_path = Path(folder) / "tokenizer_config.json"
    written = json.loads(config_path.read_text())
    config = {k: written[k] for k in _CONFIG_KEYS if k in written}
    config.update(tokenizer_class="PreTrainedTokenizerFast", clean_up_tokenization_spaces=False)
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    _merges_as_strings(Path(folder) / "tokenizer.json")
    return int(fast.convert_tokens_to_ids(EOS))


def _merges_as_strings(path: Path) -> None:
    """tokenizers >= 0.20 writes BPE merges as pairs (["a", "b"]); the tokenizers that transformers 4.40-4.44
    ship (0.19) read only the older "a b" strings, and fail with "data did not match any variant of untagged
    enum ModelWrapper". Every tokenizers version reads the strings, and they are exact for byte-level BPE,
    whose tokens never hold a space (it is Ġ there), so the export writes those."""
    data = json.loads(path.read_text(encoding="utf-8"))
    model = data.get("model") or {}
    merges = model.get("merges")
    if model.get("type") != "BPE" or not merges or not isinstance(merges[0], list):
        return
    if any(" " in part for pair in merges for part in pair):
        return  # a merge with a space cannot be written as a string: keep the pairs
    model["merges"] = [" ".join(pair) for pair in merges]
    path.write_text(json.dumps(data, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
