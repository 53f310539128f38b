"""Data configuration."""

from __future__ import annotations

from dataclasses import dataclass

WIKITEXT_RELEASES = {"wikitext-2-v1": "wiki.{split}.tokens", "wikitext-2-raw-v1": "wiki.{split}.raw"}
DATASETS = (*WIKITEXT_RELEASES, "text")
SPLITS = ("train", "valid", "test")


@dataclass
class DataConfig:
    """dataset: a WikiText-2 release or "text" (then train/valid/test are file paths).

    data_dir: folder with the official files (or IATTN_DATA_DIR); else Hugging Face `datasets`.
    tokenizer: "gpt2" (tiktoken GPT-2 BPE), "bpe:N" (byte-level BPE trained on train split), "byte".
    tokenizer_file: local r50k_base.tiktoken for "gpt2" (or IATTN_TOKENIZER_FILE).
    train_tokens: keep only this many tokens of the train split (0 = all).
    valid_tokens: keep only the first this many tokens of the validation split (0 = all), which is
      evaluated every epoch for model selection; the test split is always whole.
    """

    dataset: str = "wikitext-2-v1"
    data_dir: str = ""
    train: str = ""
    valid: str = ""
    test: str = ""
    tokenizer: str = "gpt2"
    tokenizer_file: str = ""
    train_tokens: int = 0
    valid_tokens: int = 0
    cache_dir: str = ""
