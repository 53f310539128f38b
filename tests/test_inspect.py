"""A look inside: run_with_cache's patterns are what each layer attends with, head spectra are
gauge-invariant, and `iattn inspect` writes its figures and table."""

import copy

import pytest
import torch

from helpers import make_model, tiny_overrides, write_corpus
from iattention.attention.registry import variant_names
from iattention.model.activations import run_with_cache
from iattention.symmetry import canonicalize, random_gauge
from iattention.symmetry.spectra import head_spectra


@pytest.mark.parametrize("attention", variant_names())
def test_cached_patterns_reproduce_each_layers_attention_output(attention):
    model = make_model(attention=attention, n_head=1 if attention == "identity_ko" else 3)
    idx = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(0))
    logits, cache = run_with_cache(model, idx)
    assert torch.equal(logits, model(idx)[0])
    for layer, block in enumerate(model.transformer.h):
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"]
        assert pattern.shape == (2, model.config.n_head, 12, 12)
        assert torch.allclose(pattern.sum(-1), torch.ones(2, model.config.n_head, 12, dtype=pattern.dtype))
        assert pattern.triu(1).abs().max() == 0  # causal
        attn = block.attn
        _, _, v = attn.qkv(block.ln_1(cache[f"blocks.{layer}.hook_resid_pre"]))
        v = v.reshape(2, 12, attn.n_head, attn.d_head).transpose(1, 2)
        y = (pattern @ v).transpose(1, 2).reshape(2, 12, -1)
        assert torch.allclose(attn.project_out(y), cache[f"blocks.{layer}.hook_attn_out"], atol=1e-12)
        resid_mid = cache[f"blocks.{layer}.hook_resid_pre"] + cache[f"blocks.{layer}.hook_attn_out"]
        assert torch.allclose(resid_mid + block.mlp(block.ln_2(resid_mid)), cache[f"blocks.{layer}.hook_resid_post"])


def test_head_spectra_are_gauge_invariant_and_the_svd_of_the_products():
    model = make_model(n_head=3)
    hw = model.transformer.h[0].attn.to_heads()
    s = head_spectra(hw)
    direct = torch.linalg.svdvals(hw.W_Q.double() @ hw.W_K.double().transpose(1, 2))[:, : model.config.d_head]
    assert torch.allclose(s["qk"], direct, rtol=1e-9)
    direct_ov = torch.linalg.svdvals(hw.W_V.double() @ hw.W_O.double())[:, : model.config.d_head]
    assert torch.allclose(s["ov"], direct_ov, rtol=1e-9)
    moved = copy.deepcopy(model)
    random_gauge(moved, seed=3)
    canon = canonicalize(copy.deepcopy(model), block="pivoted")
    for other in (moved, canon):
        t = head_spectra(other.transformer.h[0].attn.to_heads())
        assert torch.allclose(t["qk"], s["qk"], rtol=1e-8) and torch.allclose(t["ov"], s["ov"], rtol=1e-8)
    assert not torch.allclose(s["qk"], head_spectra(model.transformer.h[1].attn.to_heads())["qk"])


def test_iattn_inspect_writes_patterns_spectra_and_table(tmp_path, capsys):
    from iattention.cli import main

    ov = tiny_overrides(write_corpus(tmp_path), tmp_path / "cache", **{"train.epochs": 1})
    for attention in ("standard", "canonical"):
        assert main(["train", "--preset", "tiny", "--out", str(tmp_path / attention), "--quiet", *ov,
                     f"model.attention={attention}"]) == 0
    out = tmp_path / "inspect"
    assert main(["inspect", str(tmp_path / "standard"), str(tmp_path / "canonical"), "--prompt", "the cat sat",
                 "--out", str(out)]) == 0
    for name in ("standard-attention.png", "canonical-attention.png", "spectra.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    table = (out / "spectra.md").read_text()
    assert "| standard (standard, 2 heads) | 0 |" in table and "| canonical (canonical, 2 heads) | 0 |" in table
    # A prompt far longer than the block size: cut to it with a notice, and a title that keeps the figure
    # readable (a 600-character prompt once made a 4704-pixel-wide figure).
    import matplotlib.image

    capsys.readouterr()
    long_prompt = "the cat sat on the mat and then the dog ran to the park. " * 11
    assert main(["inspect", str(tmp_path / "standard"), "--prompt", long_prompt, "--out", str(tmp_path / "long")]) == 0
    err = capsys.readouterr().err
    assert f"the prompt has {len(long_prompt)} tokens" in err and "first 32 tokens are inspected" in err
    height, width = matplotlib.image.imread(tmp_path / "long" / "standard-attention.png").shape[:2]
    assert width < 1200 and height < 1200


def test_head_colours_differ_for_every_head():
    from iattention.lab.trained_attention import head_colors

    for n in (1, 4, 12, 25):
        assert len({tuple(c) for c in head_colors(n)}) == n
