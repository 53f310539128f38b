"""Unit tests of iattention.experiments.report_words."""

import json
import math

from iattention.experiments.report import write_report
from iattention.train import load_config


def _write_run(folder, arm, heads, seed, best, config, word_ppl=None):
    folder.mkdir(parents=True)
    with open(folder / "metrics.jsonl", "w") as f:
        for e, v in enumerate((best + 10, best), 1):
            f.write(json.dumps(dict(kind="epoch", epoch=e, step=10 * e, train_ppl=v, val_ppl=v)) + "\n")
    summary = dict(config=config, attention=arm, n_head=heads, seed=seed, params=1000, best_val_ppl=best,
                   best_epoch=2, test_ppl=best + 1, epochs_run=2, train_tokens_per_s=1.0)
    if word_ppl is not None:
        summary["best_val_word_ppl"] = word_ppl
    (folder / "summary.json").write_text(json.dumps(summary))


def test_report_has_a_per_word_column_blank_for_runs_without_it(tmp_path):
    config = load_config("tiny", None, []).to_dict()
    for seed, word in ((0, 900.0), (1, 1100.0)):  # new runs: the column is their mean ± std
        _write_run(tmp_path / f"standard-h2-s{seed}", "standard", 2, seed, 50.0 + seed, config, word)
    for seed in (0, 1):  # runs from before the metric: "–"
        _write_run(tmp_path / f"canonical-h2-s{seed}", "canonical", 2, seed, 60.0 + seed, config)
    for seed, word in ((0, 700.0), (1, None)):  # a mix: the mean of those that have it, and how many
        _write_run(tmp_path / f"identity_q-h2-s{seed}", "identity_q", 2, seed, 40.0 + seed, config, word)
    report = write_report([tmp_path], tmp_path / "out").read_text()
    table = report.split("## Results (ours)")[1].split("\n## ")[0]
    assert "| test ppl | best val ppl per word |" in table
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    assert f"| 51.50 ± 0.71 | {1000:.2f} ± {math.sqrt(20000):.2f} |" in rows["standard"]
    assert "| 61.50 ± 0.71 | – |" in rows["canonical"]
    assert "| 41.50 ± 0.71 | 700.00 (1 of 2) |" in rows["identity_q"]
