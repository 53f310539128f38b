"""Data: WikiText-2 / text files, tokenizers, token cache, window semantics."""

from iattention.data.config import DataConfig
from iattention.data.dataset import TokenData, epoch_order, eval_windows, load_data, n_train_windows, train_batch
from iattention.data.tokenizers import Tokenizer, load_tokenizer

__all__ = ["DataConfig", "TokenData", "Tokenizer", "epoch_order", "eval_windows", "load_data", "load_tokenizer",
           "n_train_windows", "train_batch"]
