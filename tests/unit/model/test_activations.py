"""Unit tests of iattention.model.activations."""

import pytest
import torch

from helpers import make_model
from iattention.attention.registry import variant_names
from iattention.model.activations import run_with_cache


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
