"""Per-word and per-byte perplexity of the H100 runs, from the per-token losses they recorded.

These runs evaluated every token of the validation (and test) split after the first, once, with
non-overlapping windows (train/evaluate.py: split_nll), and recorded the mean NLL per scored token. So
the total NLL is loss x tokens scored, and word perplexity = exp(total NLL / words), words counted as
lm-evaluation-harness counts them on the scored text (data/dataset.py: scored_text): the same identity
`iattn eval --json` and new runs' summary.json use. Usage (the data folder of ../shared/data's layout):

    IATTN_DATA_DIR=../shared/data .venv/bin/python results/paper/h100-2026-11-23/per_word.py
"""

import json
import math
from pathlib import Path

from iattention.data.dataset import load_data, scored_text, tokenizer_of
from iattention.train import load_config

HERE = Path(__file__).parent
cfg = load_config("paper", None, [])
data = load_data(cfg.data, splits=("valid", "test"))
tok = tokenizer_of(cfg.data)
text = {s: scored_text(tok, data.splits[s]) for s in ("valid", "test")}
for s, t in text.items():
    print(f"{s}: {t.tokens:,} tokens scored, {t.words:,} words, {t.bytes:,} bytes ({t.tokens / t.words:.4f} tokens a word)")
print()
print("| run | best val ppl per token (epoch) | per word | bits per byte | test ppl per token | per word |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
for run in sorted((HERE / "runs").iterdir()):
    s = json.loads((run / "summary.json").read_text())
    v, te = s["best_val_loss"] * text["valid"].tokens, s["test_loss"] * text["test"].tokens
    print(f"| {run.name} | {math.exp(s['best_val_loss']):.2f} ({s['best_epoch']}) | {math.exp(v / text['valid'].words):.2f} "
          f"| {v / text['valid'].bytes / math.log(2):.4f} | {math.exp(s['test_loss']):.2f} "
          f"| {math.exp(te / text['test'].words):.2f} |")
