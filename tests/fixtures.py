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


def hf_random(family: str, folder=None, dtype=torch.float64, seed=0, **config):
    """A transformers model of `family`'s class (its record's hf_class) and config class with these keys, every
    weight N(0, 0.3) so attention shapes the logits, in float64 eval mode; saved with save_pretrained (in `dtype`)
    where `folder` is given. Needs transformers: call it after `pytest.importorskip`."""
    import transformers as tf

    from iattention.config.families import FAMILIES

    cls = getattr(tf, FAMILIES[family].hf_class)
    torch.manual_seed(seed)
    hf = cls(cls.config_class(**config)).to(torch.float64).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.3)
    if folder is not None:
        hf.to(dtype).save_pretrained(str(folder))
        hf.to(torch.float64)
    return hf


def folders_round_trip(tmp_path, dtype: str = "float32") -> float:
    """tmp_path/hf (an HF folder) -> tmp_path/canon (whole-model --to canonical) -> tmp_path/back (--to hf), in
    `dtype`; returns the canonical conversion's checked difference."""
    from iattention.interop.convert import convert, save_converted
    from iattention.interop.load import load_any

    canon, rep = convert(load_any(tmp_path / "hf")[0], "canonical", block="pivoted", dtype=dtype)
    save_converted(canon, tmp_path / "canon", "canonical", rep, source=str(tmp_path / "hf"))
    exported, rep2 = convert(load_any(tmp_path / "canon")[0], "hf", dtype=dtype)
    save_converted(exported, tmp_path / "back", "hf", rep2, source=str(tmp_path / "canon"))
    return rep.conversion


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


# Text the tokenizers of hf_folder are trained on: ASCII words, with few enough characters kept (limit_alphabet)
# that accented and CJK text falls back to bytes (<0xNN>) in the SentencePiece-style one.
_HF_TRAIN = ("the cat sat on the mat . the dog ran to the park , and the cat saw it .\n" * 30 +
             "= Heading = \n a naïve café , 1,234.5 \n")


def _sentencepiece_style_tokenizer():
    """A Llama 2 / Mistral style tokenizer.json: BPE over '▁'-for-space pieces with byte fallback (<0x00> ..
    <0xFF> after <unk> <s> </s>, as Llama's vocabulary has them), '▁' put before a text."""
    import json

    from tokenizers import Tokenizer, decoders, models, normalizers, trainers

    t = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    t.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    t.train_from_iterator([_HF_TRAIN], trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "<s>", "</s>"],
                                                           limit_alphabet=30, show_progress=False))
    trained = json.loads(t.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for piece in sorted(trained["vocab"], key=trained["vocab"].get):
        vocab.setdefault(piece, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in trained["merges"]]
    out = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    out.normalizer = t.normalizer
    out.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    out.add_special_tokens(["<unk>", "<s>", "</s>"])
    return out


def _byte_level_tokenizer():
    """A Qwen2 / GPT-NeoX style tokenizer.json: byte-level BPE, <|endoftext|> special, no BOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator([_HF_TRAIN], trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    return t


# hf_folder's shapes: the Llama family's (2 KV heads), GPT-2's and GPT-NeoX's (a quarter of each head rotated)
_HF_SHAPES = {"GPT2": dict(n_embd=32, n_layer=2, n_head=4, n_positions=256),
              "GPTNeoX": dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                              max_position_embeddings=256, rotary_pct=0.25)}
_LLAMA_SHAPE = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=256)


def hf_folder(folder, kind="Llama", tokenizer=True, vocab_size=None, seed=0, **token_ids):
    """A random-init transformers `kind` (Llama, Qwen2, Mistral, GPT2, GPTNeoX) model saved in `folder` with its own
    tokenizer, as a user's model folder is: Llama and Mistral with a SentencePiece-style byte-fallback tokenizer that
    adds BOS, the others with a byte-level BPE one that adds none. `vocab_size`: the model's (default: the
    tokenizer's); `token_ids`: bos_token_id, eos_token_id, pad_token_id for its config (default: the tokenizer's bos
    and eos). Returns the folder. Needs transformers: call it after `pytest.importorskip`."""
    import transformers as tf

    if kind == "Qwen2":
        tok = tf.Qwen2TokenizerFast(tokenizer_object=_byte_level_tokenizer(), eos_token="<|endoftext|>",
                                    pad_token="<|endoftext|>", bos_token=None, unk_token=None)
    elif kind in _HF_SHAPES:
        tok = tf.PreTrainedTokenizerFast(tokenizer_object=_byte_level_tokenizer(), eos_token="<|endoftext|>")
    else:
        tok = tf.LlamaTokenizerFast(tokenizer_object=_sentencepiece_style_tokenizer(), bos_token="<s>",
                                    eos_token="</s>", unk_token="<unk>", add_bos_token=True)
    unknown = set(token_ids) - {"bos_token_id", "eos_token_id", "pad_token_id"}
    assert not unknown, f"hf_folder takes special-token ids as keywords, not {sorted(unknown)}"
    torch.manual_seed(seed)
    ids = {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, **token_ids}
    cfg = getattr(tf, f"{kind}Config")(vocab_size=vocab_size or len(tok), **_HF_SHAPES.get(kind, _LLAMA_SHAPE), **ids)
    model = getattr(tf, "GPT2LMHeadModel" if kind == "GPT2" else f"{kind}ForCausalLM")(cfg).eval()
    with torch.no_grad():  # logits far from uniform, so that a shifted or missing token shows
        for p in model.parameters():
            p.copy_(torch.randn(p.shape) / p.shape[-1] ** 0.5 if p.dim() > 1 else 1 + 0.3 * torch.randn(p.shape))
    model.save_pretrained(folder)
    if tokenizer:
        tok.save_pretrained(folder)
    return folder
