"""Models and tokenizers that unit and e2e tests both build (`from fixtures import ...`): a GPT-2 from
transformers with every parameter random, its probe tokens, and the byte and bpe tokenizers over text with
non-ASCII characters and runs of whitespace."""

import torch

from helpers import write_corpus
from iattention.data import DataConfig, load_tokenizer

# GPT-2 shapes: several layers, one head, four heads, and an MLP width other than 4 d.
HF_SHAPES = [dict(n_layer=2, n_embd=96, n_head=3), dict(n_layer=4, n_embd=64, n_head=1),
             dict(n_layer=1, n_embd=40, n_head=4), dict(n_layer=1, n_embd=32, n_head=2, n_inner=100)]

UNICODE = "Ünïcödé ∑ — naïve café\n = Heading = \n 日本語 text  with   spaces\t\n"


def hf_gpt2(dtype=torch.float64, **shape):
    """transformers' GPT2LMHeadModel (vocabulary 211, 24 positions) with non-zero biases and LayerNorm
    affine, so every parameter matters. Needs transformers: call it after `pytest.importorskip`."""
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.GPT2Config(vocab_size=211, n_positions=24, bos_token_id=None, eos_token_id=None, **shape)
    hf = tf.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if p.dim() == 1:
                p.normal_(0.0 if name.endswith("bias") else 1.0, 0.1)
    return hf.to(dtype)


def hf_tokens():
    """A (3, 24) batch of token ids for hf_gpt2's models."""
    return torch.randint(0, 211, (3, 24), generator=torch.Generator().manual_seed(1))


def byte_tokenizer():
    return load_tokenizer(DataConfig(tokenizer="byte"))


def bpe_tokenizer(tmp_path):
    """bpe:300 trained on the synthetic corpus plus UNICODE (so it holds merges over multi-byte characters)."""
    paths = write_corpus(tmp_path)
    train_text = open(paths["train"]).read() + UNICODE * 20
    return load_tokenizer(DataConfig(tokenizer="bpe:300", cache_dir=str(tmp_path / "c")), train_text)
