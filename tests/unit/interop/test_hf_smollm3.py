"""SmolLM3 (a Llama with no RoPE on every N-th layer, `no_rope_layers`) as one record: tiny random transformers
models load exactly, convert to canonical and back (float64 <= 1e-9 of transformers' own logits, float32 <= 1e-5),
whole and streamed; on its layers without RoPE the whole GL(r) query/key gauge is fixed; its counts equal
transformers'; greedy generation equals transformers'."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "SmolLM3ForCausalLM"):
    pytest.skip("SmolLM3 needs a transformers with SmolLM3ForCausalLM", allow_module_level=True)

from helpers import float32_round_trip, max_rel, streamed_round_trip  # noqa: E402
from iattention.errors import UserError  # noqa: E402
from iattention.interop.convert import convert  # noqa: E402
from iattention.interop.hf import from_hf_model, to_hf  # noqa: E402
from iattention.interop.load import load_any  # noqa: E402
from iattention.symmetry.counts import param_count, removed_split, standard_param_count  # noqa: E402
from iattention.symmetry.transforms import random_gauge  # noqa: E402

X = torch.randint(0, 97, (2, 24), generator=torch.Generator().manual_seed(1))


def smollm3(folder=None, dtype=torch.float64, seed=0, **kw):
    """A tiny random SmolLM3 (4 layers, every 2nd without RoPE unless said), weights scaled up so attention shapes
    the logits, saved with save_pretrained where `folder` is given."""
    torch.manual_seed(seed)
    cfg = transformers.SmolLM3Config(**{**dict(
        vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, no_rope_layer_interval=2, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=None, pad_token_id=None), **kw})
    hf = transformers.SmolLM3ForCausalLM(cfg).to(torch.float64).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.3)
    if folder is not None:
        hf.to(dtype).save_pretrained(str(folder))
    return hf


@pytest.mark.parametrize("kw", [{}, dict(no_rope_layer_interval=4, attention_bias=True, tie_word_embeddings=True),
                                dict(num_key_value_heads=4)], ids=["every-2nd", "every-4th-biased-tied", "mha"])
def test_canonical_and_back_to_transformers_is_exact_in_float64(kw):
    hf = smollm3(**kw)
    src = from_hf_model(hf, "smollm3")
    every = kw.get("no_rope_layer_interval", 2)
    assert src.config.nope_every == every and [b.attn.rot for b in src.transformer.h] == \
        [0 if (i + 1) % every == 0 else 8 for i in range(4)]
    with torch.no_grad():
        ref = hf(X).logits
        assert max_rel(src(X)[0], ref) <= 1e-9
    random_gauge(src, seed=3)  # an arbitrary point on the orbit, the layers without RoPE moved by a generic GL(r)
    canon, rep = convert(src, "canonical", block="pivoted", dtype="float64")
    assert rep.conversion <= 1e-9
    with torch.no_grad():
        assert max_rel(canon(X)[0], ref) <= 1e-9
        assert max_rel(to_hf(canon)(X).logits, ref) <= 1e-9
    # what canonical removes: per layer and KV group r^2 on the value side, rot numbers (rotary layers) or r^2
    # (layers without RoPE) on the query/key side; the counts are the built models'
    c, r, G = canon.config, 8, canon.config.n_kv_head
    bare = 4 // every
    assert removed_split(c)["query_key"] == G * ((4 - bare) * r + bare * r * r)
    assert src.num_params() - canon.num_params() == removed_split(c)["query_key"] + 4 * G * r * r
    assert canon.num_params() == param_count(c) and src.num_params() == standard_param_count(src.config)


def test_float32_folders_round_trip_within_1e_5_and_the_count_is_transformers(tmp_path):
    hf = smollm3()
    got = float32_round_trip(tmp_path, hf, X)
    assert got["counted"] == hf.num_parameters()  # from config.json alone, no weights read
    assert got["conversion"] <= 1e-5 and got["back"] <= 1e-5
    assert got["again"].config.no_rope_layers == hf.config.no_rope_layers


def test_the_streamed_conversion_both_ways_and_params_from_the_folder(tmp_path, capsys):
    hf = smollm3()
    got = streamed_round_trip(tmp_path, capsys, hf, X)
    assert got["back"] <= 1e-9
    assert got["params"]["standard"]["params"] == hf.num_parameters()


def test_greedy_generation_equals_transformers():
    hf = smollm3()
    ours = from_hf_model(hf, "smollm3")
    prompt = X[:1, :6]
    theirs = hf.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert torch.equal(ours.generate(prompt, 12, temperature=0.0), theirs)


def test_layers_without_rope_in_another_pattern_are_one_line(tmp_path):
    smollm3(tmp_path / "hf")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**cfg, "no_rope_layers": [0, 1, 1, 1]}))
    with pytest.raises(UserError, match=r"no_rope_layers \[0, 1, 1, 1\] is not one 0 or 1 per layer with every "
                                        r"N-th layer unrotated"):
        load_any(tmp_path / "hf")
