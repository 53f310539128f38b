"""Experiments: the Welch interval, verdicts, and the report built from run folders on disk."""

import json

import numpy as np
import pytest
from scipy import stats

from iattention.errors import UserError
from iattention.experiments.report import write_report
from iattention.experiments.stats import welch_difference
from iattention.train import load_config


def test_welch_interval_matches_scipy():
    rng = np.random.default_rng(0)
    a, b = rng.normal(10, 1, 4), rng.normal(11, 3, 5)
    d = welch_difference(a, b)
    ref = stats.ttest_ind(b, a, equal_var=False).confidence_interval(0.95)
    assert d.mean == pytest.approx(b.mean() - a.mean())
    assert (d.low, d.high) == (pytest.approx(ref.low), pytest.approx(ref.high))
    assert not welch_difference([1.0], [2.0, 3.0]).has_ci  # one seed: no interval


def _write_run(folder, attention, heads, seed, val_curve, test_ppl, config):
    """A finished run folder in the trainer's format (summary.json + metrics.jsonl)."""
    folder.mkdir(parents=True)
    best = int(np.argmin(val_curve))
    with open(folder / "metrics.jsonl", "w") as f:
        for i, v in enumerate(val_curve):
            f.write(json.dumps(dict(kind="epoch", epoch=i + 1, train_ppl=v * 0.8, val_ppl=v)) + "\n")
    summary = dict(config=config, attention=attention, n_head=heads, seed=seed, params=1000 - 10 * heads,
                   best_val_ppl=float(val_curve[best]), best_epoch=best + 1, test_ppl=test_ppl,
                   epochs_run=len(val_curve), train_tokens_per_s=1234.0)
    (folder / "summary.json").write_text(json.dumps(summary))


def _study(root, config, shift=0.0):
    """Canonical clearly better at 2 heads (lower and earlier), the same at 4 heads."""
    values = {}
    for seed in range(3):
        for heads in (2, 4):
            for attention in ("standard", "canonical"):
                better = attention == "canonical" and heads == 2
                best_epoch = 3 if better else 6
                best = (100.0 if better else 150.0) + seed + shift
                curve = [best + 5 * abs(e - best_epoch) for e in range(1, 9)]
                _write_run(root / f"{attention}-h{heads}-s{seed}", attention, heads, seed, curve, best + 1, config)
                values.setdefault((attention, heads), []).append(best)
    return values


@pytest.fixture
def config():
    return load_config("tiny", None, []).to_dict()


def test_report_table_intervals_and_figures(tmp_path, config):
    values = _study(tmp_path / "a", config)
    report = write_report([tmp_path / "a"], tmp_path / "out").read_text()
    mean, std = np.mean(values[("canonical", 2)]), np.std(values[("canonical", 2)], ddof=1)
    assert f"| canonical | 2 | 980 | {mean:.2f} ± {std:.2f} | 3.0 ± 0.0 | 0 of 3 |" in report
    diffs = report.split("## Canonical − standard")[1].split("##")[0]
    rows = {line.split("|")[1].strip(): line for line in diffs.splitlines() if line.startswith(("| 2 |", "| 4 |"))}
    assert "canonical lower perplexity; faster to best" in rows["2"]
    assert "no perplexity difference detected; no difference in epoch of best" in rows["4"]
    assert "-50.00" in rows["2"] and "+0.00" in rows["4"]
    assert "published numbers (not ours)" in report and "| 1 | 345 | 234 | 30 | 6 |" in report
    for png in ("perplexity_vs_epoch.png", "best_val_ppl_vs_heads.png", "best_epoch_vs_heads.png"):
        data = (tmp_path / "out" / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
        assert f"]({png})" in report


def test_report_merges_folders_once_and_refuses_mixed_studies(tmp_path, config):
    _study(tmp_path / "a", config)
    half = tmp_path / "b"  # the same runs copied into a second folder are merged once
    half.mkdir()
    for run in sorted((tmp_path / "a").iterdir())[:4]:
        (half / run.name).mkdir()
        for f in run.iterdir():
            (half / run.name / f.name).write_bytes(f.read_bytes())
    report = write_report([tmp_path / "a", half], tmp_path / "out").read_text()
    table = [line for line in report.split("## Canonical")[0].splitlines() if line.startswith("| standard")
             or line.startswith("| canonical")]
    assert len(table) == 4 and all(line.endswith("| 1,234 | 3 |") for line in table)  # 3 seeds each, not 5
    other = dict(config, optim=dict(config["optim"], lr=config["optim"]["lr"] * 2))
    _study(tmp_path / "c", other)
    with pytest.raises(UserError, match="different study configs"):
        write_report([tmp_path / "a", tmp_path / "c"], tmp_path / "out2")
    assert not (tmp_path / "out2" / "report.md").exists()


def test_censored_best_epoch_is_counted(tmp_path, config):
    for seed in range(2):
        _write_run(tmp_path / f"standard-h2-s{seed}", "standard", 2, seed, [300, 200, 150 + seed], 151, config)
        _write_run(tmp_path / f"canonical-h2-s{seed}", "canonical", 2, seed, [300, 140 + seed, 200], 141, config)
    report = write_report([tmp_path], tmp_path / "out").read_text()
    assert "| standard | 2 | 980 | 150.50 ± 0.71 | 3.0 ± 0.0 | 2 of 2 |" in report
    assert "| canonical | 2 | 980 | 140.50 ± 0.71 | 2.0 ± 0.0 | 0 of 2 |" in report
    diff = report.split("## Canonical − standard")[1].split("##")[0]
    assert "| 2 | -10.00 [" in diff and "canonical lower perplexity; faster to best" in diff
