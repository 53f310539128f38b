"""Draws curves.png from the run folders beside it: python results/paper/h100-2026-11-23/plot.py (repository root)."""
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

D = Path("results/paper/h100-2026-11-23")
COLOR = {"standard": "C0", "canonical": "C1", "identity_ko": "C2"}
PAPER = {1: {"standard": 345, "canonical": 234}, 12: {"standard": 295, "canonical": 248}}


def epochs(run):
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if r["kind"] == "epoch"]


fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), sharey=True)
for ax, heads in zip(axes, (1, 12)):
    for run in sorted(D.glob(f"runs/*-h{heads}-s*")):
        arm, seed = run.name.rsplit("-h", 1)[0], run.name.rsplit("-s", 1)[1]
        ep = epochs(run)
        best = min(ep, key=lambda r: r["val_ppl"])
        ls = "-" if seed == "0" else "--"
        ax.plot([r["epoch"] for r in ep], [r["val_ppl"] for r in ep], ls, color=COLOR[arm],
                label=f"{arm}, seed {seed}: best {best['val_ppl']:.1f} (epoch {best['epoch']})")
        ax.plot(best["epoch"], best["val_ppl"], "o", color=COLOR[arm], ms=4)
    for arm, value in PAPER[heads].items():
        ax.axhline(value, color=COLOR[arm], lw=0.8, alpha=0.5)
        name = "I-Attention" if arm == "canonical" else arm
        ax.text(39.5, value, f"paper's best: {name} {value}", ha="right", va="bottom", fontsize=8, color=COLOR[arm])
    ax.set(yscale="log", xlabel="epoch (of a 40-epoch schedule; stopped after 5 without improvement)",
           xlim=(0, 40), ylim=(30, 400), title=f"{heads} head{'s' if heads > 1 else ''}: validation perplexity")
    ax.legend(fontsize=7, loc="lower left")
axes[0].set_ylabel("validation perplexity (GPT-2 BPE token)")
fig.suptitle("paper preset (GPT-2 small, WikiText-2) on one H100, ours", fontsize=10)
fig.tight_layout()
fig.savefig(D / "curves.png", dpi=110)
