"""Phi-3 (the Llama layout with fused qkv_proj and gate_up_proj, a sliding window on every layer, partial rotary) as
one record: tiny random transformers models load exactly, convert to canonical and back (float64 <= 1e-9 of
transformers' own logits, float32 <= 1e-5), whole and streamed; its counts equal transformers'; greedy generation
(full and K-only caches) equals transformers'; longrope is refused in one line."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Phi3ForCausalLM"):
    pytest.skip("Phi-3 needs a transformers with Phi3ForCausalLM", allow_module_level=True)

from fixtures import folders_round_trip, hf_random  # noqa: E402
from helpers import max_rel, refused  # noqa: E402
from iattention.cli.app import main  # noqa: E402
from iattention.config.shapes import shape_preset  # noqa: E402
from iattention.errors import UserError  # noqa: E402
from iattention.interop.convert import convert  # noqa: E402
from iattention.interop.folder import HFFolder  # noqa: E402
from iattention.interop.hf import from_hf_model, to_hf  # noqa: E402
from iattention.interop.load import load_any  # noqa: E402
from iattention.symmetry.counts import param_count, standard_param_count  # noqa: E402
from iattention.symmetry.transforms import random_gauge  # noqa: E402

X = torch.randint(0, 97, (2, 24), generator=torch.Generator().manual_seed(1))
CASES = {"gqa": {}, "mha-tied-window": dict(num_key_value_heads=4, tie_word_embeddings=True, sliding_window=8),
         "partial-rotary": dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                 "partial_rotary_factor": 0.5})}


def phi3(folder=None, dtype=torch.float64, **kw):
    """A tiny random Phi-3 (3 layers, 4 query heads of width 8 sharing 2 key/value heads unless said), saved with
    save_pretrained where `folder` is given."""
    return hf_random("phi3", folder, dtype, **{**dict(
        vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, original_max_position_embeddings=64,
        bos_token_id=None, eos_token_id=None, pad_token_id=None), **kw})


@pytest.mark.parametrize("kw", CASES.values(), ids=CASES)
def test_canonical_and_back_to_transformers_is_exact_in_float64(kw):
    hf = phi3(**kw)
    src = from_hf_model(hf, "phi3")
    c = src.config
    assert (c.projection, c.fused_gate_up, c.sliding_window) == ("fused", True, kw.get("sliding_window", 0))
    assert c.rot == (4 if "rope_parameters" in kw else 8)
    # the fused tensors are held as they are: qkv_proj is our c_attn, gate_up_proj ours
    attn, mlp = hf.model.layers[1].self_attn, hf.model.layers[1].mlp
    assert torch.equal(src.transformer.h[1].attn.c_attn.weight, attn.qkv_proj.weight)
    assert torch.equal(src.transformer.h[1].mlp.gate_up_proj.weight, mlp.gate_up_proj.weight)
    with torch.no_grad():
        ref = hf(X).logits
        assert max_rel(src(X)[0], ref) <= 1e-9
    random_gauge(src, seed=3)  # an arbitrary point on the orbit
    canon, rep = convert(src, "canonical", block="pivoted", dtype="float64")
    assert rep.conversion <= 1e-9
    assert canon.num_params() == param_count(canon.config) and src.num_params() == standard_param_count(c)
    with torch.no_grad():
        assert max_rel(canon(X)[0], ref) <= 1e-9
        back = to_hf(canon)
        assert max_rel(back(X).logits, ref) <= 1e-9
    assert back.config.sliding_window == hf.config.sliding_window
    assert back.config.rope_parameters["partial_rotary_factor"] == hf.config.rope_parameters["partial_rotary_factor"]


def test_float32_folders_round_trip_within_1e_5_and_the_count_is_transformers(tmp_path):
    hf = phi3(tmp_path / "hf", dtype=torch.float32, **CASES["partial-rotary"], sliding_window=8)
    assert standard_param_count(HFFolder.at(tmp_path / "hf").shape) == hf.num_parameters()  # no weights read
    assert HFFolder.at(tmp_path / "hf").shape.rot == 4
    assert folders_round_trip(tmp_path, "float32") <= 1e-5  # hf -> canon -> back
    saved = json.loads((tmp_path / "back" / "config.json").read_text())
    assert saved["partial_rotary_factor"] == 0.5 and saved["sliding_window"] == 8  # 4.x reads the top-level key
    again = transformers.Phi3ForCausalLM.from_pretrained(str(tmp_path / "back"), dtype=torch.float64).eval()
    with torch.no_grad():
        assert max_rel(again(X).logits, hf(X).logits) <= 1e-5


@pytest.mark.parametrize("to", ["canonical", "standard"])
def test_the_streamed_conversion_both_ways_and_params_from_the_folder(tmp_path, capsys, to):
    hf = phi3(tmp_path / "hf", **CASES["mha-tied-window"])
    assert main(["convert", "--from", str(tmp_path / "hf"), "--to", to, "--out", str(tmp_path / "ours")]) == 0
    assert main(["convert", "--from", str(tmp_path / "ours"), "--to", "hf", "--out", str(tmp_path / "back")]) == 0
    capsys.readouterr()
    ours = load_any(tmp_path / "ours")[0].double()  # a streamed folder holds our names (the one layout)
    back = transformers.Phi3ForCausalLM.from_pretrained(str(tmp_path / "back"), dtype=torch.float64).eval()
    with torch.no_grad():
        ref = hf(X).logits
        assert max_rel(ours(X)[0], ref) <= 1e-9
        assert max_rel(back(X).logits, ref) <= 1e-9
    assert main(["params", "--from", str(tmp_path / "hf"), "--json"]) == 0
    rows = {r["attention"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["standard"]["params"] == hf.num_parameters()


@pytest.mark.parametrize("to", ["canonical", "standard"])
def test_a_streamed_folder_under_phi3_s_names_the_layout_before_issue_64_reads_through_its_family(tmp_path, to):
    """A streamed conversion written before the one key layout kept its source's names (model/model.layers.0.
    self_attn.qkv_proj.weight); read through the model's family first (checkpoint/state.py upgrade_key), qkv_proj
    is our c_attn, not the Llama names' attn.qkv_proj: loaded whole and streamed back with the logits it gives."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from iattention.interop.stream import hf_to_ours, ours_to_hf
    from iattention.model.names import to_family

    hf = phi3(tmp_path / "hf", **CASES["partial-rotary"])
    hf_to_ours(tmp_path / "hf", tmp_path / "ours", to, say=lambda *_: None)
    path = tmp_path / "ours" / "model.safetensors"
    with safe_open(str(path), framework="pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    old = {"model/" + to_family(k.removeprefix("model/"), "phi3"): v for k, v in tensors.items()}
    assert "model/model.layers.0.self_attn.qkv_proj.weight" in old or to == "canonical"
    save_file(old, str(path), metadata=meta)
    ours_to_hf(tmp_path / "ours", tmp_path / "back", say=lambda *_: None)
    back = transformers.Phi3ForCausalLM.from_pretrained(str(tmp_path / "back"), dtype=torch.float64).eval()
    with torch.no_grad():
        ref = hf(X).logits
        assert max_rel(load_any(tmp_path / "ours")[0].double()(X)[0], ref) <= 1e-9
        assert max_rel(back(X).logits, ref) <= 1e-9


@pytest.mark.parametrize("kw", [CASES["gqa"], CASES["mha-tied-window"]], ids=["gqa", "mha-window"])
def test_greedy_generation_equals_transformers_and_multi_head_has_the_k_only_cache(kw):
    hf = phi3(**kw)
    ours = from_hf_model(hf, "phi3")
    prompt = X[:1, :6]
    theirs = hf.generate(prompt, max_new_tokens=16, do_sample=False, pad_token_id=0)  # past the window of 8
    assert torch.equal(ours.generate(prompt, 16, temperature=0.0), theirs)
    if ours.config.n_kv_head == ours.config.n_head:  # keys determine the layer input: n_kv_head x d_head = n_embd
        assert torch.equal(ours.generate(prompt, 16, temperature=0.0, cache_kind="k-only"), theirs)
    else:
        with pytest.raises(UserError, match="grouped-query attention already caches fewer"):
            ours.make_cache("k-only")


@pytest.mark.parametrize("scaling", [{"type": "longrope"}, {"type": "su"}, {"rope_type": "longrope"}])
def test_longrope_is_refused_in_one_line_naming_the_key(tmp_path, capsys, scaling):
    phi3(tmp_path / "hf")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    cfg.pop("rope_parameters", None)  # as Phi-3-mini-128k's config.json says it
    rope = {**scaling, "short_factor": [1.0] * 4, "long_factor": [2.0] * 4}
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**cfg, "rope_scaling": rope, "rope_theta": 10000.0}))
    kind = scaling.get("type", scaling.get("rope_type"))
    with pytest.raises(UserError, match=rf"rope_scaling has rope_type '{kind}'; iattention reproduces 'default'"):
        load_any(tmp_path / "hf")
    refused(capsys, ["convert", "--from", tmp_path / "hf", "--to", "canonical", "--out", tmp_path / "c"],
            "rope_scaling", f"'{kind}'", "'default'")
    assert not (tmp_path / "c").exists()


def test_phi_3_mini_s_published_shape_is_transformers_count_and_arithmetic():
    mini = transformers.Phi3Config(vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
                                   num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096,
                                   sliding_window=2047, rms_norm_eps=1e-5)
    with torch.device("meta"):
        theirs = transformers.Phi3ForCausalLM(mini).num_parameters()
    # embedding and untied head; per layer qkv (3 d x d), o, gate_up (2 x 8192 x d), down, two norms; final norm
    d = 3072
    arithmetic = 2 * 32064 * d + 32 * (3 * d * d + d * d + 2 * 8192 * d + 8192 * d + 2 * d) + d
    assert standard_param_count(shape_preset("phi-3-mini-4k")) == theirs == arithmetic == 3_821_079_552
