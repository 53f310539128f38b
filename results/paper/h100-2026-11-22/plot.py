"""Draws curves.png from the run folders beside it: python results/paper/h100-2026-11-22/plot.py (repository root)."""
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

D = "results/paper/h100-2026-11-22"


def ep(m, arm):
    recs = [json.loads(line) for line in open(f"{D}/{m}/runs/{arm}-h1-s0/metrics.jsonl")]
    return [r for r in recs if r["kind"] == "epoch"]


fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
for m, ls in (("machine1", ":"), ("machine2", "-")):
    s = ep(m, "standard")
    a.plot([r["epoch"] for r in s], [r["val_ppl"] for r in s], ls, color="C0", label=f"standard, {m}")
    c = ep(m, "canonical")
    a.plot([c[0]["epoch"]], [c[0]["val_ppl"]], "o" if m == "machine2" else "x", color="C1",
           label=f"canonical, epoch 1 only, {m}")
    for arm, col in (("standard", "C0"), ("canonical", "C1")):
        r = ep(m, arm)
        b.plot([x["epoch"] for x in r], [x["train_ppl"] for x in r], ls, color=col, label=f"{arm}, {m}")
for value, col, text in ((345, "C0", "paper: standard 345"), (234, "C1", "paper: I-Attention 234")):
    a.axhline(value, color=col, lw=0.8, alpha=0.5)
    a.text(40, value, text, ha="right", va="bottom", fontsize=8, color=col)
a.set(yscale="log", xlabel="epoch", ylabel="validation perplexity (GPT-2 BPE)", xlim=(0, 41),
      title="validation, 1 head (ours: H100, seed 0, runs cut short)")
b.set(yscale="log", xlabel="epoch", ylabel="training perplexity (epoch mean, dropout on)", xlim=(0, 41),
      title="training, 1 head")
a.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.45, 0.78))
b.legend(fontsize=7)
fig.tight_layout()
fig.savefig(f"{D}/curves.png", dpi=110)
