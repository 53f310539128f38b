"""`iattn conditioning`'s study (`conditioning.study`) on a real tiny GPT whose head 0 of layer 0 has a nearly
rank-one aligned key block: its condition numbers are those of the blocks it fixes, its perplexities those of
the model, and the float32 cost of canonicalizing shows where the block is ill-conditioned."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers import make_model
from iattention.experiments.conditioning import study

D, R, H, V, BLOCK = 16, 8, 2, 32, 16  # n_embd, d_head, n_head, vocab_size, block_size


@pytest.fixture
def model():
    """float32, n_layer=2, n_head=2, n_embd=16; layer 0 head 0: the aligned key block (its W_K rows 0..7)
    made nearly rank one (condition number ~1e8)."""
    m = make_model(dtype=torch.float32, n_layer=2, n_head=H, n_embd=D, vocab_size=V, block_size=BLOCK)
    with torch.no_grad():
        w = m.attention_layers[0].c_attn.weight[D: D + R]  # head 0's keys: (r, d), W_K[0] transposed
        w[1:, :R] = w[0:1, :R] + 1e-7 * torch.randn(R - 1, R)
    return m


@pytest.fixture
def tokens():
    return np.random.default_rng(0).integers(0, V, 4 * BLOCK + 1)


def _key(model, layer, h):
    """W_K of head h, (d, r), read straight off the fused projection (rows d + h r .. of c_attn)."""
    return model.attention_layers[layer].c_attn.weight.detach().double()[D + h * R: D + (h + 1) * R].T


def _out(model, layer, h):
    """W_O of head h transposed, (d, r): the columns of c_proj that read head h."""
    return model.attention_layers[layer].c_proj.weight.detach().double()[:, h * R: (h + 1) * R]


def _cond(m):
    return torch.linalg.cond(m).item()


def _best_cond(W):
    """The smallest condition number of any r of W's d rows (all C(16, 8) = 12870 of them)."""
    subsets = torch.tensor(list(itertools.combinations(range(W.shape[0]), W.shape[1])))
    return torch.linalg.cond(W[subsets]).min().item()


def test_the_aligned_condition_numbers_are_those_of_each_head_s_own_coordinates(model, tokens):
    got = study(model, tokens, "tiny", BLOCK)["blocks"]["aligned"]
    keys = [_cond(_key(model, layer, h)[h * R: (h + 1) * R]) for layer in (0, 1) for h in range(H)]
    outs = [_cond(_out(model, layer, h)[h * R: (h + 1) * R]) for layer in (0, 1) for h in range(H)]
    assert keys[0] > 1e6 and keys[0] == max(keys)  # the planted block
    allc = np.array(keys + outs)
    assert got["key_max"] == pytest.approx(max(keys), rel=1e-6)
    assert got["output_max"] == pytest.approx(max(outs), rel=1e-9)
    assert got["cond_max"] == pytest.approx(allc.max(), rel=1e-6)
    assert got["cond_median"] == pytest.approx(np.median(allc), rel=1e-9)
    assert got["cond_p90"] == pytest.approx(np.percentile(allc, 90), rel=1e-6)


def test_the_pivoted_blocks_avoid_the_ill_conditioned_rows(model, tokens):
    """Pivoted QR picks, per head, r rows near the best-conditioned choice: never better than the best of all
    C(d, r) choices, and within a factor 10 of it here; far from the planted 1e8."""
    got = study(model, tokens, "tiny", BLOCK)["blocks"]["pivoted"]
    best_key = max(_best_cond(_key(model, layer, h)) for layer in (0, 1) for h in range(H))
    best_out = max(_best_cond(_out(model, layer, h)) for layer in (0, 1) for h in range(H))
    assert best_key <= got["key_max"] < 10 * best_key
    assert best_out <= got["output_max"] < 10 * best_out
    assert got["cond_max"] == max(got["key_max"], got["output_max"]) < 100


def _own_ppl(model, tokens, dtype):
    """exp(mean NLL) over the non-overlapping windows of BLOCK tokens, computed here."""
    m = copy.deepcopy(model).to(dtype).eval()
    x = torch.as_tensor(tokens[:-1]).reshape(-1, BLOCK)
    y = torch.as_tensor(tokens[1:]).reshape(-1, BLOCK)
    with torch.no_grad():
        logits, _ = m(x)
    return torch.exp(F.cross_entropy(logits.float().reshape(-1, V), y.reshape(-1))).item()


def test_the_original_perplexities_are_the_model_s_own_in_each_dtype(model, tokens):
    out = study(model, tokens, "tiny", BLOCK)
    assert out["model"] == "tiny" and out["tokens"] == 4 * BLOCK
    assert out["original_ppl"]["float32"] == pytest.approx(_own_ppl(model, tokens, torch.float32), rel=1e-5)
    assert out["original_ppl"]["bfloat16"] == pytest.approx(_own_ppl(model, tokens, torch.bfloat16), rel=1e-4)


def test_canonicalizing_at_the_ill_conditioned_block_costs_float32_perplexity_and_at_the_pivoted_one_not(
        model, tokens):
    out = study(model, tokens, "tiny", BLOCK)
    for block in ("aligned", "pivoted"):
        b = out["blocks"][block]
        for dt in ("float32", "bfloat16"):
            assert b["ppl_change"][dt] == b["canonical_ppl"][dt] - out["original_ppl"][dt]
    aligned, pivoted = (abs(out["blocks"][b]["ppl_change"]["float32"]) for b in ("aligned", "pivoted"))
    assert aligned > 1e-3 and pivoted < 1e-4 * out["original_ppl"]["float32"]


def test_the_caller_s_model_is_left_as_it_was(model, tokens):
    before = {k: v.clone() for k, v in model.state_dict().items()}
    study(model, tokens, "tiny", BLOCK)
    after = model.state_dict()
    assert next(model.parameters()).dtype == torch.float32
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
