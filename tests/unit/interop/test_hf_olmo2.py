"""OLMo 2 (an RMSNorm over the whole query and key projections before RoPE, `q_norm` / `k_norm` of n_head x head_dim
and n_kv_head x head_dim, and norms after attention and after the MLP, none before) as one record: tiny random
transformers models load exactly, convert to canonical and back (float64 <= 1e-9 of transformers' own logits,
float32 <= 1e-5), whole and streamed; canonical fixes the key norm's gain on one dim of each rotary pair per KV group
and the value/output block, and no W_K block; its counts equal transformers'; greedy generation equals
transformers'; a rotation inside a RoPE pair, a symmetry without the norm, moves transformers' own logits."""

import pytest
import torch

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Olmo2ForCausalLM"):
    pytest.skip("OLMo 2 needs a transformers with Olmo2ForCausalLM", allow_module_level=True)

from helpers import float32_round_trip, max_rel, streamed_round_trip, turn_rope_pair  # noqa: E402
from iattention.cli.app import main  # noqa: E402
from iattention.config.shapes import shape_preset  # noqa: E402
from iattention.interop.convert import convert  # noqa: E402
from iattention.interop.hf import from_hf_model, to_hf  # noqa: E402
from iattention.symmetry.counts import param_count, removed_split, standard_param_count  # noqa: E402
from iattention.symmetry.transforms import random_gauge  # noqa: E402

X = torch.randint(0, 97, (2, 24), generator=torch.Generator().manual_seed(1))


def olmo2(seed=0, **kw):
    """A tiny random OLMo 2 (2 layers, MHA, head_dim 12 != hidden / heads unless said), every weight random (norm
    gains 1 + noise, so no pair of a gain is constant)."""
    torch.manual_seed(seed)
    cfg = transformers.Olmo2Config(**{**dict(
        vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, head_dim=12, max_position_embeddings=64, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=None, pad_token_id=None), **kw})
    hf = transformers.Olmo2ForCausalLM(cfg).to(torch.float64).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.copy_((1.0 if "norm" in name else 0.0) + 0.3 * torch.randn_like(p))
    return hf


CASES = {"mha": {}, "gqa-tied-biased": dict(num_key_value_heads=2, attention_bias=True, tie_word_embeddings=True,
                                            head_dim=8)}


@pytest.mark.parametrize("kw", CASES.values(), ids=list(CASES))
def test_canonical_and_back_to_transformers_is_exact_in_float64(kw):
    hf = olmo2(**kw)
    src = from_hf_model(hf, "olmo2")
    c0 = src.config
    assert (c0.qk_norm, c0.norm_place, c0.d_head, c0.rot) == ("whole", "post", kw.get("head_dim", 12), c0.d_head)
    with torch.no_grad():
        ref = hf(X).logits
        assert max_rel(src(X)[0], ref) <= 1e-9
    random_gauge(src, seed=3)  # S per KV group and a random rescaling of the gains per KV group, constant on pairs
    canon, rep = convert(src, "canonical", block="pivoted", dtype="float64")
    assert rep.conversion <= 1e-9
    with torch.no_grad():
        assert max_rel(canon(X)[0], ref) <= 1e-9
        assert max_rel(to_hf(canon)(X).logits, ref) <= 1e-9
    c, r, G, L = canon.config, c0.d_head, c0.n_kv_head, 2
    for moved, attn in zip(src.attention_layers, canon.attention_layers):
        hw = attn.to_heads()
        assert torch.equal(hw.W_K, moved.to_heads().W_K)  # no W_K block fixed: there is no GL(r) to fix it with
        fixed = attn.k_norm.gain_perm[:, :r // 2]  # (G, r/2): one dim of each pair of each KV head's key gain
        assert fixed.shape == (G, r // 2) and bool((torch.gather(hw.g_K, 1, fixed) == 1).all())
        assert all(sorted(row) == list(range(r // 2)) for row in fixed.remainder(r // 2).tolist())
    # what canonical removes: G r/2 per layer on the query/key side (qk_gauge), G r^2 per layer on the value side
    assert removed_split(c)["query_key"] == L * G * r // 2
    assert src.num_params() - canon.num_params() == L * G * (r // 2 + r * r)
    assert canon.num_params() == param_count(c) and src.num_params() == standard_param_count(src.config) \
        == hf.num_parameters()


def test_a_rotation_inside_a_rope_pair_moves_transformers_own_logits():
    """W_Q and W_K of every head turned inside RoPE pair 0 (a symmetry of a layer without the norm): with OLMo 2's
    gains not constant on that pair the function changes, so the exactness above is not vacuous."""
    hf = olmo2()
    with torch.no_grad():
        ref = hf(X).logits
        turn_rope_pair(hf)
        assert max_rel(hf(X).logits, ref) > 1e-3


def test_float32_folders_round_trip_within_1e_5_and_the_count_is_transformers(tmp_path):
    hf = olmo2()
    got = float32_round_trip(tmp_path, hf, X)
    assert got["counted"] == hf.num_parameters()  # from config.json alone, no weights read
    assert got["conversion"] <= 1e-5 and got["back"] <= 1e-5


def test_the_streamed_conversion_both_ways_params_from_the_folder_and_inspect(tmp_path, capsys):
    hf = olmo2()
    got = streamed_round_trip(tmp_path, capsys, hf, X)
    assert got["back"] <= 1e-9
    rows = got["params"]
    assert rows["standard"]["params"] == hf.num_parameters()
    assert rows["standard"]["params"] - rows["canonical"]["params"] == 2 * 4 * (12 // 2 + 12 * 12)
    # the canonical folder's patterns, spectra and canonical view (raw bytes: the prompt's are all under 97)
    assert main(["inspect", str(tmp_path / "c"), "--prompt", "AB CD", "--tokenizer", "byte", "--canonical",
                 "--out", str(tmp_path / "inspect")]) == 0


def test_greedy_generation_equals_transformers():
    hf = olmo2(head_dim=8)  # 4 x 8 key dims = d: the K-only cache applies
    ours = from_hf_model(hf, "olmo2")
    prompt = X[:1, :6]
    theirs = hf.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert torch.equal(ours.generate(prompt, 12, temperature=0.0), theirs)
    assert torch.equal(ours.generate(prompt, 12, temperature=0.0, cache_kind="k-only"), theirs)


def test_params_family_olmo2_is_the_arithmetic_and_transformers_count_of_its_shape():
    cfg = shape_preset("olmo-2-0425-1b")
    d, L, V, m = 2048, 16, 100352, 8192
    # embed, (q, k, v, o, q_norm and k_norm over the whole projections, gate/up/down, two post norms), final norm,
    # an untied head
    arithmetic = V * d + L * (4 * d * d + 2 * d + 3 * d * m + 2 * d) + d + V * d
    assert standard_param_count(cfg) == arithmetic == 1_484_916_736
    hc = transformers.Olmo2Config(vocab_size=V, hidden_size=d, intermediate_size=m, num_hidden_layers=L,
                                  num_attention_heads=16, num_key_value_heads=16, tie_word_embeddings=False,
                                  max_position_embeddings=4096)
    with torch.device("meta"):
        assert transformers.Olmo2ForCausalLM(hc).num_parameters() == arithmetic
