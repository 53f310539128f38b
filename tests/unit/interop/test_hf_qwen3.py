"""Qwen3 (an RMSNorm on each head's query and key before RoPE, `q_norm` / `k_norm`, one gain of head_dim per layer)
as one record: tiny random transformers models load exactly, convert to canonical and back (float64 <= 1e-9 of
transformers' own logits, float32 <= 1e-5), whole and streamed; canonical fixes the key norm's gain on one dim of
each rotary pair per layer and the value/output block, and no W_K block; its counts equal transformers'; greedy
generation equals transformers'; a rotation inside a RoPE pair, a symmetry without the norm, moves transformers'
own logits."""

import pytest
import torch

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Qwen3ForCausalLM"):
    pytest.skip("Qwen3 needs a transformers with Qwen3ForCausalLM", allow_module_level=True)

from helpers import float32_round_trip, max_rel, streamed_round_trip, turn_rope_pair  # noqa: E402
from iattention.cli.app import main  # noqa: E402
from iattention.config.shapes import shape_preset  # noqa: E402
from iattention.interop.convert import convert  # noqa: E402
from iattention.interop.hf import from_hf_model, to_hf  # noqa: E402
from iattention.symmetry.counts import param_count, removed_split, standard_param_count  # noqa: E402
from iattention.symmetry.transforms import random_gauge  # noqa: E402

X = torch.randint(0, 97, (2, 24), generator=torch.Generator().manual_seed(1))


def qwen3(folder=None, dtype=torch.float64, seed=0, **kw):
    """A tiny random Qwen3 (2 layers, GQA, head_dim 12 != hidden / heads unless said), every weight random (norm
    gains 1 + noise, so no pair of a gain is constant), saved with save_pretrained where `folder` is given."""
    torch.manual_seed(seed)
    cfg = transformers.Qwen3Config(**{**dict(
        vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=12, max_position_embeddings=64, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=None, pad_token_id=None), **kw})
    hf = transformers.Qwen3ForCausalLM(cfg).to(torch.float64).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.copy_((1.0 if "norm" in name else 0.0) + 0.3 * torch.randn_like(p))
    if folder is not None:
        hf.to(dtype).save_pretrained(str(folder))
    return hf


CASES = {"gqa": {}, "mha-tied-biased": dict(num_key_value_heads=4, attention_bias=True, tie_word_embeddings=True),
         "window-from-layer-1": dict(use_sliding_window=True, sliding_window=8, max_window_layers=1, head_dim=8)}


@pytest.mark.parametrize("kw", CASES.values(), ids=list(CASES))
def test_canonical_and_back_to_transformers_is_exact_in_float64(kw):
    hf = qwen3(**kw)
    src = from_hf_model(hf, "qwen3")
    c0 = src.config
    assert c0.qk_norm == "head" and c0.d_head == kw.get("head_dim", 12) and c0.rot == c0.d_head
    window = (kw.get("sliding_window", 0), kw.get("max_window_layers", 0))  # Qwen2's rule: from max_window_layers on
    assert (c0.sliding_window, c0.full_attention_layers) == window
    with torch.no_grad():
        ref = hf(X).logits
        assert max_rel(src(X)[0], ref) <= 1e-9
    random_gauge(src, seed=3)  # S per KV group and a random rescaling of the q/k norm gains, constant on RoPE pairs
    canon, rep = convert(src, "canonical", block="pivoted", dtype="float64")
    assert rep.conversion <= 1e-9
    with torch.no_grad():
        assert max_rel(canon(X)[0], ref) <= 1e-9
        assert max_rel(to_hf(canon)(X).logits, ref) <= 1e-9
    c, r, G, L = canon.config, c0.d_head, c0.n_kv_head, 2
    for moved, attn in zip(src.attention_layers, canon.attention_layers):
        hw = attn.to_heads()
        assert torch.equal(hw.W_K, moved.to_heads().W_K)  # no W_K block fixed: there is no GL(r) to fix it with
        fixed = attn.k_norm.gain_perm[0, :r // 2]  # one dim of each pair of the layer's one key gain, fixed to 1
        assert bool((hw.g_K[0, fixed] == 1).all()) and sorted(fixed.remainder(r // 2).tolist()) == list(range(r // 2))
    # what canonical removes: rot/2 per layer on the query/key side (qk_gauge), G r^2 per layer on the value side
    assert removed_split(c)["query_key"] == L * r // 2
    assert src.num_params() - canon.num_params() == L * (r // 2 + G * r * r)
    assert canon.num_params() == param_count(c) and src.num_params() == standard_param_count(src.config) \
        == hf.num_parameters()


def test_a_rotation_inside_a_rope_pair_moves_transformers_own_logits():
    """W_Q and W_K of every head turned inside RoPE pair 0 (a symmetry of a Qwen2 layer: a unit complex scalar):
    with Qwen3's q/k norm gains not constant on that pair the function changes, so the exactness above is not
    vacuous."""
    hf = qwen3()
    with torch.no_grad():
        ref = hf(X).logits
        turn_rope_pair(hf)
        assert max_rel(hf(X).logits, ref) > 1e-3


def test_float32_folders_round_trip_within_1e_5_and_the_count_is_transformers(tmp_path):
    hf = qwen3()
    got = float32_round_trip(tmp_path, hf, X)
    assert got["counted"] == hf.num_parameters()  # from config.json alone, no weights read
    assert got["conversion"] <= 1e-5 and got["back"] <= 1e-5


def test_the_streamed_conversion_both_ways_params_from_the_folder_and_inspect(tmp_path, capsys):
    hf = qwen3()
    got = streamed_round_trip(tmp_path, capsys, hf, X)
    assert got["back"] <= 1e-9
    rows = got["params"]
    assert rows["standard"]["params"] == hf.num_parameters()
    assert rows["standard"]["params"] - rows["canonical"]["params"] == 2 * (12 // 2 + 2 * 12 * 12)
    # the canonical folder's patterns, spectra and canonical view (raw bytes: the prompt's are all under 97)
    assert main(["inspect", str(tmp_path / "c"), "--prompt", "AB CD", "--tokenizer", "byte", "--canonical",
                 "--out", str(tmp_path / "inspect")]) == 0


def test_greedy_generation_equals_transformers():
    hf = qwen3()
    ours = from_hf_model(hf, "qwen3")
    prompt = X[:1, :6]
    theirs = hf.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert torch.equal(ours.generate(prompt, 12, temperature=0.0), theirs)


def test_params_family_qwen3_is_the_arithmetic_and_transformers_count_of_its_shape():
    cfg = shape_preset("qwen3-0.6b")
    d, r, H, G, L, V, m = 1024, 128, 16, 8, 28, 151936, 3072
    arithmetic = V * d + L * (d * H * r * 2 + d * G * r * 2 + 2 * r + 3 * d * m + 2 * d) + d  # tied head
    assert standard_param_count(cfg) == arithmetic == 596_049_920
    hc = transformers.Qwen3Config(vocab_size=V, hidden_size=d, intermediate_size=m, num_hidden_layers=L,
                                  num_attention_heads=H, num_key_value_heads=G, head_dim=r, tie_word_embeddings=True,
                                  max_position_embeddings=40960)
    with torch.device("meta"):
        assert transformers.Qwen3ForCausalLM(hc).num_parameters() == arithmetic
