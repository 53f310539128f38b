"""`iattn inspect`."""

from __future__ import annotations

from iattention.cli.args import check_out_folder, out_path, utf8_text
from iattention.lab.trained_attention import inspect_runs


def cmd_inspect(args) -> None:

    check_out_folder(args.out)
    for path in inspect_runs(args.runs, args.prompt, args.out, args.data_dir, canonical=args.canonical,
                             tokenizer=args.tokenizer):
        print(f"wrote {path}")


def register(sub) -> None:
    p = sub.add_parser("inspect", help="attention patterns on a prompt and head spectra of trained runs",
                       description="For each run (run folder, checkpoint, converted or HF folder; of any model "
                                   "family): its "
                                   "attention pattern on --prompt for every layer and head, and the singular "
                                   "values of every head's W_Q W_K^T and W_V W_O, runs side by side. Python: "
                                   "iattention.model.activations.run_with_cache(model, ids).")
    p.add_argument("runs", nargs="+", help="runs to inspect (e.g. a standard and a canonical run); files are named "
                                           "by each run's folder, with the folders above it where two share a name")
    p.add_argument("--prompt", required=True, type=utf8_text, help="text whose attention patterns are drawn")
    p.add_argument("--out", type=out_path, default="inspect",
                   help="folder for the figures and spectra.md (default: inspect)")
    p.add_argument("--canonical", action="store_true",
                   help="also write each run's canonical view, <run>-canonical.safetensors: per layer and head "
                        "the learned and fixed (identity) blocks of W_K and W_O, W_Q, W_V, W_QK = W_Q W_K^T, and "
                        "W (= W_Q with the aligned block) at one head; for each run that has one (canonical runs; a "
                        "note names the others). Python: "
                        "run_with_cache(model, ids, canonical=True)")
    p.add_argument("--data-dir", help="data folder, where a run's tokenizer must be rebuilt from its data")
    p.add_argument("--tokenizer", metavar="SPEC",
                   help="read every run with this tokenizer (gpt2, byte, bpe:N, hf:FOLDER) instead of its own, as "
                        "iattn eval --tokenizer does: for a folder that does not say which it was trained with")
    p.set_defaults(func=cmd_inspect)
