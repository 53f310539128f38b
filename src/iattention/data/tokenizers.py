"""Tokenizers: GPT-2 BPE (tiktoken), a small byte-level BPE (Hugging Face `tokenizers`), raw bytes, and a model
folder's own Hugging Face tokenizer (`hf:FOLDER`, read with transformers)."""

from __future__ import annotations

import hashlib
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from iattention.data.cache import cache_root
from iattention.data.config import DataConfig
from iattention.data.sources import data_dir
from iattention.errors import UserError, first_words
from iattention.utils.atomic import write_text
from iattention.utils.files import expand_user

R50K_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
GPT2_VOCAB = 50257
HF_SPEC = "hf:"  # hf:FOLDER: the tokenizer a Hugging Face model folder was saved with (tokenizer.json)


@dataclass
class Tokenizer:
    name: str
    vocab_size: int
    fingerprint: str  # changes whenever the mapping text -> ids could change
    _impl: Any = field(repr=False)

    def encode(self, text: str) -> np.ndarray:
        if self.name == "byte":
            return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)
        if self.name == "gpt2":
            return np.asarray(self._impl.encode_ordinary(text), dtype=np.int64)
        try:
            if isinstance(self._impl, HFFolderTokenizer):
                return np.asarray(self._impl.encode(text), dtype=np.int64)
            # no special tokens: a post-processor (an export's template, or a foreign one) adds none to our text
            return np.asarray(self._impl.encode(text, add_special_tokens=False).ids, dtype=np.int64)
        except BaseException as e:  # the tokenizers library's Rust panic is a BaseException (PanicException)
            if type(e).__name__ != "PanicException":
                raise
            raise UserError(f"tokenizer {self.name} failed on this text (the tokenizers library panicked: "
                            f"{first_words(e, 80)}); use the model's own tokenizer") from None

    @property
    def bos(self) -> int | None:
        """The id `encode` puts before a document's text (an `hf:` tokenizer whose config adds one, as
        transformers does: Llama), or None. It is input only: never a predicted token of the text."""
        return self._impl.bos if isinstance(self._impl, HFFolderTokenizer) else None

    @property
    def exact_bytes(self) -> bool:
        """Whether `decode_bytes` gives the exact bytes of text (always, but for an `hf:` tokenizer whose
        pieces do not spell bytes as byte-level BPE or SentencePiece byte fallback do)."""
        return self._impl.exact if isinstance(self._impl, HFFolderTokenizer) else True

    def decode(self, ids) -> str:
        ids = [int(i) for i in ids]
        if self.name == "byte":
            return bytes(ids).decode("utf-8", errors="replace")
        if isinstance(self._impl, HFFolderTokenizer):
            return self._impl.tok.decode(ids, clean_up_tokenization_spaces=False)
        return self._impl.decode(ids)

    def decode_bytes(self, ids, at_start: bool = False) -> bytes:
        """The exact UTF-8 bytes `ids` stand for (`decode` replaces a character cut at either end with
        U+FFFD; this keeps its bytes). `at_start`: the ids begin a document, so a BOS the tokenizer put there
        and the space a SentencePiece tokenizer puts before the text are not text. For a whole encoded text,
        `decode_bytes(encode(t), at_start=True) == t.encode()` (exactly where `exact_bytes`)."""
        ids = [int(i) for i in ids]
        if self.name == "byte":
            return bytes(ids)
        if self.name == "gpt2":
            return self._impl.decode_bytes(ids)
        if isinstance(self._impl, HFFolderTokenizer):
            return self._impl.decode_bytes(ids, at_start)
        table = _byte_level_bytes()  # bpe:N: byte-level tokens spell their bytes in GPT-2's printable alphabet
        return bytes(table[c] for i in ids for c in self._impl.id_to_token(i))


def _byte_level_bytes() -> dict[str, int]:
    """Character -> byte of the alphabet byte-level BPE spells its tokens in (GPT-2's `bytes_to_unicode`,
    which `tokenizers`' ByteLevel uses): printable Latin-1 bytes stand for themselves, the other 68
    bytes for the characters from U+0100 on, in byte order."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in keep]
    return {**{chr(b): b for b in keep}, **{chr(256 + i): b for i, b in enumerate(others)}}


# Text the `hf:` tokenizers are checked on when read: every piece of it must come back as its exact bytes.
_BYTES_PROBE = "Ünïcödé ∑ — naïve café\n = Heading = \n 日本語 text  with   spaces\t\n x😀 <b> 1,234.5\r\n"
# The files a Hugging Face tokenizer is saved as: what `hf:` tokenizers were identified by before every file
# AutoTokenizer reads was (issue 67); an identity a checkpoint recorded then is still recognised (tokenizer_identities).
_HF_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
# Every file AutoTokenizer may read from a folder (transformers' tokenizer file names, chat templates, and
# config.json, where it finds the class when tokenizer_config.json names none): what a run on hf:FOLDER keeps a
# copy of in HF_KEPT/ (keep_hf_tokenizer), so that the run is read without FOLDER.
HF_TOKENIZER_FILES = (*_HF_FILES, "added_tokens.json", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model",
                      "vocab.json", "vocab.txt", "merges.txt", "chat_template.jinja", "chat_template.json",
                      "config.json")
HF_KEPT = "hf-tokenizer"
HF_CHAT_TEMPLATES = "additional_chat_templates"  # named chat templates, one NAME.jinja each (transformers 5)


def hf_tokenizer_files(folder: Path) -> dict[str, bytes]:
    """Every file AutoTokenizer may read from `folder` that is there (HF_TOKENIZER_FILES, and HF_CHAT_TEMPLATES/
    NAME.jinja), name -> bytes: what an hf:FOLDER tokenizer is identified by (and its token cache keyed by), what a
    run keeps a copy of, and what a resume compares with that copy."""
    files = {name: (folder / name).read_bytes() for name in HF_TOKENIZER_FILES if (folder / name).is_file()}
    templates = folder / HF_CHAT_TEMPLATES
    if templates.is_dir():
        for t in sorted(templates.iterdir()):
            if t.suffix == ".jinja" and t.is_file():
                files[f"{HF_CHAT_TEMPLATES}/{t.name}"] = t.read_bytes()
    return files


def _tokenizer_own_files(folder: Path) -> dict[str, bytes]:
    """hf_tokenizer_files without config.json: the model's config, which AutoTokenizer reads only for the
    tokenizer's class (identified by its name), and which an export or a converted folder rewrites."""
    return {name: raw for name, raw in hf_tokenizer_files(folder).items() if name != "config.json"}


def hf_tokenizer_changes(kept: Path, folder: Path) -> list[str]:
    """The names of the tokenizer files (_tokenizer_own_files) that differ between a run's copy `kept` and `folder`:
    changed, added or removed since the copy was made."""
    a, b = _tokenizer_own_files(kept), _tokenizer_own_files(folder)
    return sorted(name for name in {*a, *b} if a.get(name) != b.get(name))
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class HFFolderTokenizer:
    """A model folder's own tokenizer, as transformers reads it (`AutoTokenizer`, so that its pipeline, special
    tokens and BOS are what the model's users get), with what evaluation needs on top: the BOS it puts once
    before a document (where `tok(text)` adds one: Llama, not Qwen2), and the exact bytes of its pieces, which
    transformers' `decode` does not give (it drops the space before a continuation, U+FFFD for a cut
    character). Byte-level BPE pieces (GPT-2, Qwen2, GPT-NeoX) spell bytes in GPT-2's alphabet; SentencePiece
    pieces (Llama 2, Mistral) spell a space as '▁' and an unknown byte as <0xNN>."""

    def __init__(self, tok):
        import json

        self.tok = tok
        self.folder: Path | None = None  # where it was read from (_hf)
        self.legacy_identity: str | None = None  # the identity checkpoints recorded before issue 67 (_hf)
        backend = json.loads(tok.backend_tokenizer.to_str())
        kinds = json.dumps([backend.get("decoder"), backend.get("pre_tokenizer")])
        self.byte_level = '"ByteLevel"' in kinds
        self.byte_fallback = bool((backend.get("model") or {}).get("byte_fallback"))
        self.added = {int(i): t.content.encode("utf-8") for i, t in tok.added_tokens_decoder.items()}
        sp, plain = tok.encode("x"), tok.encode("x", add_special_tokens=False)
        # BOS as transformers adds it: the one id `tok(text)` puts before what it encodes without special tokens
        self.bos = sp[0] if len(sp) == len(plain) + 1 and sp[1:] == plain and sp[0] == tok.bos_token_id else None
        raw = self._pieces(plain)
        self.prefix = raw[:-1] if raw.endswith(b"x") else None  # what it puts before a text (SentencePiece: " ")
        self.exact = self.prefix is not None and self.decode_bytes(self.encode(_BYTES_PROBE), True) == \
            _BYTES_PROBE.encode("utf-8")

    def encode(self, text: str) -> list[int]:
        ids = self.tok.encode(text, add_special_tokens=False, verbose=False)
        return [self.bos, *ids] if self.bos is not None else ids

    def _pieces(self, ids) -> bytes:
        table = _byte_level_bytes() if self.byte_level else None
        out = []
        for i, piece in zip(ids, self.tok.convert_ids_to_tokens(ids), strict=True):
            if i in self.added:
                out.append(self.added[i])
            elif piece is None:
                out.append(b"")
            elif table is not None:
                out.append(bytes(table.get(c, 0) for c in piece) if all(c in table for c in piece) else
                           piece.encode("utf-8"))
            elif self.byte_fallback and _BYTE_PIECE.fullmatch(piece):
                out.append(bytes([int(piece[3:5], 16)]))
            else:
                out.append(piece.replace("\u2581", " ").encode("utf-8"))
        return b"".join(out)

    def decode_bytes(self, ids: list[int], at_start: bool) -> bytes:
        if at_start and ids and ids[0] == self.bos:
            ids = ids[1:]
        raw = self._pieces(ids)
        return raw[len(self.prefix):] if at_start and self.prefix and raw.startswith(self.prefix) else raw


def _hf(spec: str) -> Tokenizer:
    """The tokenizer saved in the folder `hf:FOLDER` names (tokenizer.json, tokenizer_config.json), read offline."""
    folder = spec[len(HF_SPEC):]
    path = expand_user(folder) if folder else Path()
    if not folder or not (path / "tokenizer.json").is_file():
        raise UserError(f"tokenizer {spec}: {folder or 'no folder given'} holds no tokenizer.json; name the folder a "
                        "Hugging Face tokenizer was saved in (hf:FOLDER), or use gpt2, byte or bpe:N")
    try:
        import transformers  # lazy: only the tokenizer a run asks for is imported
    except ImportError:
        raise UserError(f"tokenizer {spec} needs transformers; pip install transformers") from None
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # a model_max_length shorter than a split is not a problem here
    try:
        # no code of the folder's is run: the tokenizer needs none, and a folder of ours names a model shim (hf_model)
        tok = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
        impl = HFFolderTokenizer(tok)
    except Exception as e:
        raise UserError(f"tokenizer {spec}: transformers cannot read the tokenizer in {path} ({type(e).__name__}: "
                        f"{first_words(e) if str(e) else ''}); re-save it with save_pretrained") from None
    finally:
        transformers.logging.set_verbosity(verbosity)
    impl.folder = path
    h, legacy = hashlib.sha256(type(tok).__name__.encode()), hashlib.sha256(type(tok).__name__.encode())
    for name, raw in _tokenizer_own_files(path).items():  # every file AutoTokenizer reads, the class by its name
        h.update(name.encode() + b"\0" + raw + b"\0")
    for name in _HF_FILES:
        legacy.update(name.encode() + b"\0" + ((path / name).read_bytes() if (path / name).is_file() else b"") + b"\0")
    impl.legacy_identity = f"hf:{legacy.hexdigest()[:16]}"
    size = max([*tok.get_vocab().values(), *impl.added]) + 1  # ids run 0 .. size - 1
    # the fingerprint keys the token cache, so it names the transformers version too (it builds the pipeline)
    return Tokenizer(spec, size, f"hf:{h.hexdigest()[:16]}:{transformers.__version__}", impl)


def vocab_size_of(spec: str) -> int:
    """The vocabulary size a tokenizer spec gives, without building the tokenizer."""
    if spec == "gpt2":
        return GPT2_VOCAB
    if spec == "byte":
        return 256
    if spec.startswith("bpe:") and spec[4:].isdigit():
        return int(spec[4:])
    if spec.startswith(HF_SPEC):
        return _hf(spec).vocab_size
    raise UserError(f"unknown tokenizer {spec!r}; use gpt2, byte, bpe:N (e.g. bpe:4096) or hf:FOLDER")


def _sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _gpt2(cfg: DataConfig) -> Tokenizer:
    import tiktoken  # lazy: only the tokenizer a run asks for is imported
    from tiktoken.load import load_tiktoken_bpe
    from tiktoken_ext.openai_public import r50k_pat_str

    local = cfg.tokenizer_file or os.environ.get("IATTN_TOKENIZER_FILE", "")
    if not local:

        folder = data_dir(cfg)
        guess = folder / "tokenizers" / "r50k_base.tiktoken" if folder else None
        local = str(guess) if guess and guess.is_file() else ""
    if not local:  # online users: tiktoken's own download and cache
        try:
            enc = tiktoken.get_encoding("gpt2")
        except Exception as e:
            raise UserError(f"GPT-2 tokenizer not available offline ({type(e).__name__}); set --tokenizer-file "
                            "or IATTN_TOKENIZER_FILE to a local r50k_base.tiktoken") from None
        return Tokenizer("gpt2", GPT2_VOCAB, "gpt2:tiktoken", enc)
    path = expand_user(local)
    if not path.is_file():
        raise UserError(f"tokenizer file {path} does not exist; give the path of r50k_base.tiktoken")
    digest = _sha256_file(path)
    if digest != R50K_SHA256:
        raise UserError(f"tokenizer file {path} has sha256 {digest[:12]}..., not the GPT-2 r50k_base ranks "
                        f"({R50K_SHA256[:12]}...); replace it with the official r50k_base.tiktoken")
    enc = tiktoken.Encoding(name="gpt2", pat_str=r50k_pat_str, mergeable_ranks=load_tiktoken_bpe(str(path)),
                            special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=GPT2_VOCAB)
    return Tokenizer("gpt2", GPT2_VOCAB, f"gpt2:{digest[:16]}", enc)


# BPE training costs time quadratic in the length of a pre-tokenized "word" (a run of letters, digits or
# punctuation): a few MB without spaces would take hours. Runs longer than this are fed to the trainer in
# pieces of this length; text with shorter runs (WikiText-2's longest is 20) is fed exactly as before.
_MAX_RUN = 256
_LONG_RUN = re.compile(rf"\S{{{_MAX_RUN + 1},}}")
_PROGRESS_FROM = 1_000_000  # characters of training text from which BPE training shows progress


def _training_pieces(text: str):
    """The lines of `text` (as the trainer always saw them), with every run of more than _MAX_RUN
    non-space characters cut into pieces of _MAX_RUN."""
    for line in text.splitlines(keepends=True):
        pos = 0
        for m in _LONG_RUN.finditer(line):
            if m.start() > pos:
                yield line[pos:m.start()]
            yield from (m[0][i:i + _MAX_RUN] for i in range(0, len(m[0]), _MAX_RUN))
            pos = m.end()
        if pos < len(line):
            yield line[pos:]


def _bpe(cfg: DataConfig, size: int, train_text: str) -> Tokenizer:
    """Byte-level BPE trained on the train split; cached by (train text hash, size)."""
    from tokenizers import Tokenizer as HFTokenizer  # lazy: only the tokenizer a run asks for is imported
    from tokenizers import decoders, models, pre_tokenizers, trainers

    key = hashlib.sha256(train_text.encode("utf-8")).hexdigest()[:16]
    root = cache_root(cfg)
    path = root / "tokenizers" / f"bpe{size}-{key}.json" if root else None  # None: no home, no cache kept
    tok = None
    if path is not None and path.is_file():
        try:
            tok = HFTokenizer.from_file(str(path))
        except Exception as e:  # cut short, empty, overwritten: rebuilt, as a damaged token cache is
            print(f"iattn: tokenizer cache {path} is unreadable ({first_words(e, 60)}); rebuilding it",
                  file=sys.stderr)
    if tok is None:
        tok = HFTokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        show = len(train_text) >= _PROGRESS_FROM and sys.stderr.isatty()
        trainer = trainers.BpeTrainer(vocab_size=size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=show)
        if show:
            print(f"iattn: training the bpe:{size} tokenizer on {len(train_text):,} characters (cached after)",
                  file=sys.stderr)
        tok.train_from_iterator(_training_pieces(train_text), trainer=trainer)
        if path is not None:
            write_text(path, tok.to_str())
    return Tokenizer(f"bpe:{size}", tok.get_vocab_size(), f"bpe:{size}:{key}", tok)


def load_tokenizer(cfg: DataConfig, train_text: str | None = None) -> Tokenizer:
    spec = cfg.tokenizer
    if spec == "gpt2":
        return _gpt2(cfg)
    if spec == "byte":
        return Tokenizer("byte", 256, "byte", None)
    if spec.startswith("bpe:"):
        try:
            size = int(spec[4:])
        except ValueError:
            size = 0
        if not 257 <= size <= 65535:
            raise UserError(f"tokenizer {spec!r}: N must be an integer in [257, 65535], e.g. bpe:4096")
        if train_text is None:
            raise ValueError("bpe tokenizer needs the train text")
        return _bpe(cfg, size, train_text)
    if spec.startswith(HF_SPEC):
        return _hf(spec)
    raise UserError(f"unknown tokenizer {spec!r}; choose gpt2, bpe:N (e.g. bpe:4096), byte or hf:FOLDER")


def tokenizer_from_file(path: str | Path, spec: str) -> Tokenizer:
    """A bpe:N tokenizer from the tokenizer.json a run folder keeps (no train text needed)."""
    from tokenizers import Tokenizer as HFTokenizer  # lazy: only the tokenizer a run asks for is imported

    path = Path(path)
    raw = path.read_bytes()
    problem = _not_our_bpe(raw)
    if problem:  # a foreign tokenizer runs whatever it names (a Split regex that backtracks: a Rust panic)
        raise UserError(f"{path} is not a byte-level BPE tokenizer as iattention writes ({problem}); restore the "
                        "run's own tokenizer.json, or delete it to rebuild the tokenizer from the run's data")
    try:
        tok = HFTokenizer.from_file(str(path))
    except Exception as e:
        raise UserError(f"{path} is not a readable tokenizer file ({type(e).__name__}); delete it to rebuild the "
                        "tokenizer from the run's data") from None
    key = hashlib.sha256(raw).hexdigest()[:16]
    return Tokenizer(spec, tok.get_vocab_size(), f"{spec}:file:{key}", tok)


# The BPE model's options as `_bpe` trains them (tokenizers' defaults): dropout samples other splits, a
# prefix or suffix changes the merges' strings, byte fallback and unk change unknown text.
_PLAIN_BPE = {"dropout": None, "unk_token": None, "continuing_subword_prefix": None, "end_of_word_suffix": None,
              "fuse_unk": False, "byte_fallback": False, "ignore_merges": False}


def _not_our_bpe(raw: bytes) -> str | None:
    """What makes a tokenizer.json other than the byte-level BPE `_bpe` trains (and an export writes: the same,
    plus `<|endoftext|>`), or None: a BPE model, no normalizer, ByteLevel pre-tokenizer and decoder, special
    added tokens only. Anything else would run code paths (regexes, normalizers) the run never used."""
    import json

    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return "not UTF-8 JSON"
    if not isinstance(data, dict):
        return "not a JSON object"
    kind = {k: (data.get(k) or {}).get("type") if isinstance(data.get(k) or {}, dict) else "?"
            for k in ("model", "pre_tokenizer", "decoder", "normalizer")}
    want = {"model": "BPE", "pre_tokenizer": "ByteLevel", "decoder": "ByteLevel", "normalizer": None}
    for key, expected in want.items():
        if kind[key] != expected:
            return f"{key} {kind[key]}, expected {expected}"
    options = {k: v for k, v in data["model"].items() if k not in ("type", "vocab", "merges")}
    for key, plain in _PLAIN_BPE.items():  # what a trained BPE has: anything else splits text otherwise
        if options.get(key, plain) != plain:
            return f"model.{key} {options[key]!r}, expected {plain!r}"
    added = data.get("added_tokens") or []
    if not isinstance(added, list) or not all(isinstance(t, dict) and t.get("special") is True for t in added):
        return "added tokens that are not special"
    return None


def tokenizer_identity(tok: Tokenizer) -> str:
    """What a tokenizer maps text to, as a short string that two tokenizers share only if they encode every
    text alike: "byte", "gpt2" (the r50k ranks, checked by hash wherever they are read), or for bpe:N the
    name and a hash of the normalizer, pre-tokenizer, the BPE model's options, vocabulary and merges (encoding
    adds no special tokens, so a post-processor plays no part), whatever file form holds them (a
    run's tokenizer.json and an export's, which adds `<|endoftext|>` past the vocabulary, agree); for hf:FOLDER
    "hf:", its class and a hash of every file AutoTokenizer reads (_tokenizer_own_files; whatever folder holds them).
    Recorded in checkpoints and exports, so that a tokenizer swapped in beside a model is refused, not used."""
    if tok.name in ("byte", "gpt2"):
        return tok.name
    if isinstance(tok._impl, HFFolderTokenizer):  # its files (wherever the folder is), without the version
        return ":".join(tok.fingerprint.split(":")[:2])
    import json

    data = json.loads(tok._impl.to_str())
    model = data.get("model") or {}
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    added = {t.get("content") for t in data.get("added_tokens") or [] if t.get("special")}
    vocab = sorted((t, i) for t, i in (model.get("vocab") or {}).items() if t not in added)
    options = {k: v for k, v in model.items() if k not in ("vocab", "merges")}
    what = json.dumps([data.get("normalizer"), data.get("pre_tokenizer"), options, vocab, merges],
                      sort_keys=True, ensure_ascii=False)
    return f"{tok.name}:{hashlib.sha256(what.encode('utf-8')).hexdigest()[:16]}"


def tokenizer_identities(tok: Tokenizer) -> tuple[str, ...]:
    """The identities a record of `tok` may hold: tokenizer_identity, and for hf:FOLDER the one a checkpoint written
    before every tokenizer file counted recorded (a hash of three of them)."""
    legacy = getattr(tok._impl, "legacy_identity", None)
    return (tokenizer_identity(tok), legacy) if legacy else (tokenizer_identity(tok),)


def same_hf_tokenizer(a: Tokenizer, b: Tokenizer) -> bool:
    """Do two hf:FOLDER tokenizers read as one: the same identity (class and files), the same backend (normalizer,
    pre-tokenizer, model, added tokens, post-processor), vocabulary, special tokens and BOS, and the same ids for
    probe texts with and without special tokens (what tokenizer_config.json and the other files change)."""
    x, y = a._impl, b._impl
    if not isinstance(x, HFFolderTokenizer) or not isinstance(y, HFFolderTokenizer):
        return False
    added = " ".join(t.decode("utf-8", errors="replace") for t in x.added.values())
    probes = (_BYTES_PROBE, f"{added} the cat sat on the mat.", " x")

    def seen(impl):
        tok = impl.tok
        return (type(tok).__name__, tok.backend_tokenizer.to_str(), tok.get_vocab(), tok.all_special_ids,
                tok.all_special_tokens, getattr(tok, "chat_template", None), impl.bos, impl.added, impl.prefix,
                impl.exact,
                [(tok.encode(t), tok.encode(t, add_special_tokens=False)) for t in probes])

    return (tokenizer_identity(a) == tokenizer_identity(b) and a.vocab_size == b.vocab_size
            and seen(x) == seen(y))


def _is_kept_copy(path: Path) -> bool:
    """Is `path` a folder keep_hf_tokenizer wrote: a real folder of HF_TOKENIZER_FILES (regular files) and
    HF_CHAT_TEMPLATES (NAME.jinja files), nothing else, no symlink anywhere."""
    try:
        if path.is_symlink() or not path.is_dir():
            return False
        for p in path.iterdir():
            if p.name == HF_CHAT_TEMPLATES and p.is_dir() and not p.is_symlink():
                if any(q.suffix != ".jinja" or q.is_symlink() or not q.is_file() for q in p.iterdir()):
                    return False
            elif p.name not in HF_TOKENIZER_FILES or p.is_symlink() or not p.is_file():
                return False
    except OSError:  # unreadable: not one to read or replace
        return False
    return True


def kept_copy(run: Path) -> Path | None:
    """`run`'s copy of its hf:FOLDER tokenizer (HF_KEPT), or None where it has none, or one iattention did not
    write (never read)."""
    kept = run / HF_KEPT
    return kept if _is_kept_copy(kept) and (kept / "tokenizer.json").is_file() else None


def keep_hf_tokenizer(tok: Tokenizer, run: Path) -> str | None:
    """Keep a copy of an hf:FOLDER tokenizer's files (hf_tokenizer_files: HF_TOKENIZER_FILES and
    HF_CHAT_TEMPLATES/) in `run`/HF_KEPT, so that the run is read without FOLDER (kept_tokenizer: eval, generate,
    convert --to hf, load_run). Byte for byte (its identity is a hash of its files), into a temp folder beside it
    that is read back and compared (same_hf_tokenizer) before it is renamed into place. The copy is the run's
    tokenizer, fixed when the run starts: one of ours already there is never replaced (a resume on a FOLDER that
    differs from it is refused before this, by Checkpointer.check). Call it once the run is known to be this one
    (after a resume's checks). Returns None, or why no copy was made (a warning: the run then reads FOLDER, as
    before): a HF_KEPT there that iattention did not write (_is_kept_copy: a symlink, a file, other files) is left
    as it is."""
    import shutil
    import tempfile

    from iattention.utils.atomic import apply_umask, temp_prefix

    if not isinstance(tok._impl, HFFolderTokenizer) or tok._impl.folder is None:
        return None
    dest, src = run / HF_KEPT, tok._impl.folder
    if os.path.lexists(dest):
        return None if _is_kept_copy(dest) else f"{dest} is not a tokenizer copy iattention wrote; left as it is"
    tmp = None
    try:
        tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(dest), suffix=".tmp", dir=run))
        for name, raw in hf_tokenizer_files(src).items():
            (tmp / name).parent.mkdir(exist_ok=True)
            (tmp / name).write_bytes(raw)
        apply_umask(tmp, folder=True)
        try:
            copy = _hf(f"{HF_SPEC}{tmp.absolute()}")
        except UserError as e:
            return f"a copy of {src}'s tokenizer files cannot be read ({e})"
        if not same_hf_tokenizer(copy, tok):
            return f"a copy of {src}'s tokenizer files does not read as the tokenizer the run uses"
        os.rename(tmp, dest)
        tmp = None
    except OSError as e:
        return f"its tokenizer files could not be copied ({e.strerror or e})"
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return None


def save_tokenizer_file(tok: Tokenizer, path: str | Path) -> bool:
    """Write a bpe:N tokenizer as tokenizer.json (True), so a run folder is self-contained; False for the
    tokenizers that need no file (byte) or have their own (gpt2: the r50k ranks)."""
    if not tok.name.startswith("bpe:"):
        return False
    write_text(Path(path), tok._impl.to_str())
    return True
