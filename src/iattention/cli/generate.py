"""`iattn generate`: sample text from a checkpoint or a Hugging Face model folder, streamed."""

from __future__ import annotations

import argparse
import math
import sys

import torch

from iattention.cli.args import DefaultsFormatter, add_data_flags, int_at_least, utf8_text
from iattention.data.dataset import tokenizer_of
from iattention.data.sources import data_dir_told
from iattention.errors import UserError
from iattention.interop.load import check_tokenizer, check_vocab, data_config_for, kept_tokenizer, load_any


def _nonneg_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text}")
    return value


def _probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a probability in (0, 1], got {text}")
    return value


def cmd_generate(args) -> None:
    model, data, meta = load_any(args.model)
    if not args.no_cache:
        model.make_cache(args.cache)  # a cache the model cannot have is refused before any work
    elif args.cache != "full":
        raise UserError(f"--cache {args.cache} and --no-cache contradict each other; give one of them")
    tok = kept_tokenizer(args.model, data, args.tokenizer) or tokenizer_of(
        data_config_for(data, args.model, args.tokenizer, data_dir=data_dir_told(args.data_dir),
                        tokenizer_file=args.tokenizer_file))
    check_tokenizer(tok, meta, data, args.model, args.tokenizer)
    check_vocab(tok, model)
    prompt = tok.encode(args.prompt)  # with the BOS a model folder's tokenizer puts before a text
    if len(prompt) == (tok.bos is not None):
        raise UserError("--prompt is empty after tokenization; give some text to continue")

    def continuation(ids: list[int]) -> str:
        """The text of the generated ids after the prompt: their exact bytes where the tokenizer gives them
        (`decode` drops the space a SentencePiece piece starts with, as the first piece of a text)."""
        return tok.decode_bytes(ids).decode("utf-8", errors="replace") if tok.exact_bytes else tok.decode(ids)

    gen = torch.Generator().manual_seed(args.seed)
    for i in range(args.num_samples):
        if args.num_samples > 1:
            print(f"--- sample {i + 1} ---")
        sys.stdout.write(args.prompt)
        ids: list[int] = []
        shown = ""

        def stream(t, ids=ids):
            nonlocal shown
            ids.append(int(t[0, 0]))
            text = continuation(ids)
            if not text.endswith("\ufffd"):  # wait for the rest of a multi-byte character
                sys.stdout.write(text[len(shown):])
                sys.stdout.flush()
                shown = text

        model.generate(torch.as_tensor(prompt)[None], args.max_new_tokens, temperature=args.temperature,
                       top_k=args.top_k, top_p=args.top_p, generator=gen, use_cache=not args.no_cache,
                       on_token=stream, cache_kind=args.cache)
        sys.stdout.write(continuation(ids)[len(shown):] + "\n")


def register(sub) -> None:

    g = sub.add_parser("generate", help="sample text from a checkpoint or Hugging Face model folder (streamed)",
                       formatter_class=DefaultsFormatter,
                       description="Continue a prompt with a trained or converted model, printing tokens as they "
                                   "come. Uses a key/value cache (every attention variant); --temperature 0 is "
                                   "greedy. The tokenizer is the one the model was trained with (an HF folder's "
                                   "own tokenizer.json).")
    g.add_argument("model", help="run folder, .safetensors checkpoint, converted folder or HF model folder")
    g.add_argument("--prompt", required=True, type=utf8_text, help="text to continue")
    g.add_argument("--max-new-tokens", type=int_at_least(1), default=100, help="tokens to generate")
    g.add_argument("--temperature", type=_nonneg_float, default=1.0, help="0: greedy (argmax)")
    g.add_argument("--top-k", type=int_at_least(1), default=None, help="sample among the k most likely tokens")
    g.add_argument("--top-p", type=_probability, default=None, help="nucleus sampling: smallest set with probability p")
    g.add_argument("--seed", type=int_at_least(0), default=0, help="sampling seed")
    g.add_argument("--num-samples", type=int_at_least(1), default=1, help="independent samples from the same prompt")
    g.add_argument("--cache", choices=("full", "k-only"), default="full",
                   help="full: keys and values; k-only: keys alone, values rebuilt from them (half the memory, the "
                        "same tokens; multi-head models only: GPT-2, MHA Llama)")
    g.add_argument("--no-cache", action="store_true", help="recompute the whole window every step")
    g.add_argument("--tokenizer", help="override the model's tokenizer spec (gpt2, byte, bpe:N, hf:FOLDER)")
    add_data_flags(g)
    g.set_defaults(func=cmd_generate)
