"""Unit tests of iattention.experiments.scales."""

import pytest
import torch

from helpers import tiny_overrides, write_corpus
from iattention import GPT, GPTConfig
from iattention.config import OptimConfig
from iattention.train import load_config
from iattention.train.optim import build_optimizer


def _model(attention="canonical", heads=2, init="gpt2"):
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=2, n_head=heads, n_embd=32, vocab_size=50, block_size=16, attention=attention,
                         init=init))


@pytest.mark.slow
def test_scales_reports_sizes_steps_and_the_decay_each_group_really_gets(tmp_path):
    """`iattn scales`' numbers: step-0 RMS of each attention map, one AdamW step's change relative to it,
    and the weight decay / lr multiplier the optimizer applies (standard: decayed; nowd: none)."""
    from iattention.experiments.scales import measure

    paths = write_corpus(tmp_path)

    def run(**over):
        cfg = load_config("tiny", None, tiny_overrides(paths, tmp_path / "cache", **over))
        return measure(cfg, steps=3)

    std = run(**{"model.attention": "standard"})
    assert set(std) == {"W_Q", "W_K", "W_V", "W_O"}
    assert std["W_Q"]["rms0"] == pytest.approx(0.02, rel=0.1)
    for m in std.values():
        assert m["weight_decay"] == 0.1 and m["lr_scale"] == 1.0
        assert m["relative"] == pytest.approx(m["update"] / m["rms0"]) and 0 < m["relative"] < 0.2
    matched = run(**{"model.attention": "canonical", "model.init": "matched", "model.n_head": "2",
                     "model.n_layer": "2", "optim.decay_attention": "false", "optim.attn_lr_by_init_rms": "true"})
    assert {"W_Q", "W_V", "W_K_free", "W_O_free"} <= set(matched)
    assert matched["W_K_free"]["rms0"] > 5 * matched["W_Q"]["rms0"]  # canonicalization moved the scale
    for kind, m in matched.items():
        assert m["weight_decay"] == 0.0, kind
        assert m["lr_scale"] == pytest.approx(m["rms0"] / 0.02, rel=0.1), kind  # per layer; mean vs pooled


def test_scales_reads_muons_groups_through_its_blocks():
    """`iattn scales` with optim.name=muon: each attention matrix takes the group of its per-head blocks."""
    from iattention.experiments.scales import optimizer_settings

    model = _model("canonical", heads=2)
    opt = build_optimizer(model, OptimConfig(name="muon", decay_attention=False), "cpu")
    settings = optimizer_settings(model, opt)
    assert set(settings) == {"W_Q", "W_V", "W_K_free", "W_O_free"}
    assert all(s["weight_decay"] == 0.0 and s["lr_scale"] == 1.0 for s in settings.values())
