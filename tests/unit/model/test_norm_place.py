"""Norms after the sublayers (GPTConfig.norm_place "post": OLMo 2's post_attention_layernorm and
post_feedforward_layernorm, no norm on their input), in a test-only record: the block computes x + ln_1(attn(x)),
then x + ln_2(mlp(x)); the value/output gauge still keeps the function (the norm acts on the attention's output,
which it leaves unchanged), so canonical is exact; a family whose class puts its norms before is one line."""

import copy
import dataclasses

import pytest
import torch

from helpers import make_llama, tells
from iattention.config.families import FAMILIES, LLAMA_DEFAULTS
from iattention.config.model import GPTConfig
from iattention.errors import UserError
from iattention.model.gpt import GPT, exact_norms
from iattention.symmetry.transforms import canonicalize, expand, random_gauge

X = torch.randint(0, 50, (2, 24), generator=torch.Generator().manual_seed(1))


# OLMo 2's names: the Llama layout's, but its post_attention_layernorm is our ln_1 (the Llama layout's ln_2)
POST_NAMES = tuple((ours, theirs.replace("input_layernorm", "post_attention_layernorm") if ".ln_1." in ours else
                    theirs.replace("post_attention_layernorm", "post_feedforward_layernorm"))
                   for ours, theirs in FAMILIES["llama"].names)


@pytest.fixture(autouse=True)
def post_family(monkeypatch):
    monkeypatch.setitem(FAMILIES, "post_test", dataclasses.replace(
        FAMILIES["llama"], name="post_test", defaults={**LLAMA_DEFAULTS, "norm_place": "post", "qk_norm": "whole"},
        names=POST_NAMES))


def _model(**kw):
    return make_llama(**{**dict(family="post_test", n_layer=2, n_head=4, n_kv_head=2, n_embd=32, vocab_size=50,
                                block_size=24), **kw})


def _logits(model):
    with torch.no_grad(), exact_norms(model):
        return model(X)[0]


def test_each_norm_acts_on_its_sublayer_s_output_and_none_on_its_input():
    model = _model()
    assert model.config.norm_place == "post" and "norm_place" not in model.config.to_dict()  # the family's
    block, x = model.transformer.h[0], torch.randn(2, 5, 32, dtype=torch.float64)
    rope = model.transformer.rotary_emb(torch.arange(5), torch.float64)
    with torch.no_grad():
        h = x + block.ln_1(block.attn(x, rope=rope))
        assert torch.equal(block(x, rope=rope), h + block.ln_2(block.mlp(h)))
        pre = GPT(model.config.replace(family="llama", norm_place="", qk_norm="")).double().eval()
        pre.load_state_dict({k: v for k, v in model.state_dict().items() if "_norm." not in k})
        assert (pre(X)[0] - _logits(model)).abs().max() > 1e-3


@pytest.mark.parametrize("kw", [{}, dict(n_kv_head=4, qkv_bias=True, o_bias=True)], ids=["gqa", "mha-biased"])
def test_the_value_output_gauge_and_canonical_keep_the_function_under_norms_after_the_sublayers(kw):
    model = _model(**kw)
    ref = _logits(model)
    moved = random_gauge(copy.deepcopy(model), seed=2)
    assert (_logits(moved) - ref).abs().max() <= 1e-12
    canon = canonicalize(moved, block="pivoted")
    assert (_logits(canon) - ref).abs().max() <= 1e-12 and (_logits(expand(canon)) - ref).abs().max() <= 1e-12
    assert canon.config.norm_place == "post"


def test_a_family_whose_class_puts_its_norms_before_refuses_post_in_one_line():
    with pytest.raises(UserError) as err:
        GPTConfig(family="llama", n_head=4, n_embd=32, norm_place="post")
    tells(err, "model.norm_place=post", "transformers' llama has them before attention and MLP",
          "drop model.norm_place")

