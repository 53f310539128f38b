"""GPT-NeoX (Pythia) as a configuration of the one model: tiny random transformers models load exactly, convert to
canonical and back exactly (float64 <= 1e-12, float32 <= 1e-5 relative), a bf16 checkpoint keeps exact RoPE
frequencies, and the canonical gauge under partial rotary removes a complex scalar per rotary pair, GL on the pass
dims and r^2 per head on the output map."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
if int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip("GPT-NeoX conversion needs transformers 5", allow_module_level=True)

from iattention.interop.convert import convert, save_converted  # noqa: E402
from iattention.interop.folder import HFFolder  # noqa: E402
from iattention.interop.hf import from_hf_model, hf_logits, to_hf  # noqa: E402
from iattention.interop.load import load_any  # noqa: E402
from iattention.symmetry.counts import param_count, standard_param_count  # noqa: E402
from iattention.symmetry.transforms import random_gauge  # noqa: E402

SHAPES = {
    "pythia-like": dict(rotary_pct=0.25),
    "full-rotary-sequential": dict(rotary_pct=1.0, use_parallel_residual=False),
    "no-bias-tied": dict(rotary_pct=0.5, attention_bias=False, tie_word_embeddings=True),
}


def neox(folder, dtype=torch.float64, seed=0, **kw):
    """A tiny random GPT-NeoX saved with save_pretrained (weights scaled up so the logits are not all alike)."""
    torch.manual_seed(seed)
    cfg = transformers.GPTNeoXConfig(vocab_size=61, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=48, max_position_embeddings=64, **kw)
    hf = transformers.GPTNeoXForCausalLM(cfg).to(torch.float64).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.3)
    hf.to(dtype).save_pretrained(str(folder))
    return hf


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


X = torch.randint(0, 61, (2, 40), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("kw", SHAPES.values(), ids=SHAPES.keys())
def test_a_neox_folder_loads_as_transformers_computes_it(tmp_path, kw):
    neox(tmp_path / "hf", **kw)
    model, _, _ = load_any(tmp_path / "hf")
    c = model.config
    assert (c.family, c.projection, c.mlp, c.parallel_residual) == ("gpt_neox", "neox", "gelu",
                                                                    kw.get("use_parallel_residual", True))
    assert c.rot == int(8 * kw["rotary_pct"])
    with torch.no_grad():
        ours = model.double()(X)[0]
    assert rel(ours, hf_logits(tmp_path / "hf", X)) <= 1e-12


@pytest.mark.parametrize("kw", SHAPES.values(), ids=SHAPES.keys())
def test_canonical_and_back_to_transformers_is_exact_in_float64(tmp_path, kw):
    hf = neox(tmp_path / "hf", **kw)
    src = from_hf_model(hf, "gpt_neox")
    random_gauge(src, seed=3)  # an arbitrary point on the orbit: the canonical form must not depend on it
    ref = hf(X).logits
    canon, rep = convert(src, "canonical", block="pivoted", dtype="float64")
    assert canon.config.attention == "canonical" and rep.conversion <= 1e-12
    with torch.no_grad():
        assert rel(canon(X)[0], ref) <= 1e-12
    back = to_hf(canon)
    with torch.no_grad():
        assert rel(back(X).logits, ref) <= 1e-12
    for name, tensor in back.state_dict().items():  # the same tensors transformers names, rot-aware
        assert tensor.shape == hf.state_dict()[name].shape, name


def test_float32_canonical_folder_round_trips_within_1e_5(tmp_path):
    hf = neox(tmp_path / "hf", rotary_pct=0.25)
    src = from_hf_model(hf, "gpt_neox")
    canon, rep = convert(src, "canonical", block="pivoted", dtype="float32")
    assert rep.conversion <= 1e-5
    save_converted(canon, tmp_path / "canon", "canonical", rep, source=str(tmp_path / "hf"))
    loaded, _, _ = load_any(tmp_path / "canon")
    assert loaded.config.attention == "canonical" and loaded.transformer.wte.weight.dtype == torch.float32
    exported, rep2 = convert(loaded, "hf", dtype="float32")
    save_converted(exported, tmp_path / "back", "hf", rep2, source=str(tmp_path / "canon"))
    again = transformers.GPTNeoXForCausalLM.from_pretrained(str(tmp_path / "back"), dtype=torch.float64).eval()
    assert rel(again(X).logits, hf(X).logits) <= 1e-5


def test_a_bf16_checkpoint_keeps_float32_rope_frequencies_and_converts_within_bf16(tmp_path):
    hf = neox(tmp_path / "hf", dtype=torch.bfloat16, rotary_pct=0.25)
    model, _, _ = load_any(tmp_path / "hf")
    assert model.transformer.wte.weight.dtype == torch.bfloat16
    assert model.transformer.rotary_emb.inv_freq.dtype == torch.float32
    torch.testing.assert_close(model.transformer.rotary_emb.inv_freq, 1.0 / 10000 ** (torch.arange(0, 2, 2) / 2))
    canon, rep = convert(model, "canonical", block="pivoted", dtype="bfloat16")
    assert rep.conversion <= 5e-2
    assert canon.transformer.rotary_emb.inv_freq.dtype == torch.float32
    with torch.no_grad():  # the bf16 weights in float64 arithmetic: transformers' own model of the same file
        ours = model.double()(X)[0]
        theirs = transformers.GPTNeoXForCausalLM.from_pretrained(str(tmp_path / "hf"),
                                                                  dtype=torch.float64).eval()(X).logits
    assert rel(ours, theirs) <= 1e-12
    assert hf.dtype == torch.bfloat16


def test_the_canonical_gauge_under_partial_rotary_removes_a_complex_scalar_per_pair(tmp_path):
    """Per layer and head: 2 per rotary pair (rot numbers), (r - rot)^2 on the pass dims, r^2 on the output map."""
    src = from_hf_model(neox(tmp_path / "hf", rotary_pct=0.25), "gpt_neox")
    c = src.config
    r, rot = c.d_head, c.rot
    canon, _ = convert(src, "canonical", block="pivoted", dtype="float64")
    removed = src.num_params() - canon.num_params()
    assert removed == c.n_layer * c.n_head * (rot + (r - rot) ** 2 + r * r) == 2 * 4 * (2 + 36 + 64)
    assert canon.num_params() == param_count(canon.config)
    assert src.num_params() == standard_param_count(c)
    attn = canon.attention_layers[0]
    pairs = attn.key_weight()[:, :, :rot]  # the rotary pair of each head: its pivot row is exactly (1, 0)
    pivot = attn.rot_perm[:, 0, 0]
    assert torch.equal(pairs[torch.arange(c.n_head), pivot], torch.tensor([[1.0, 0.0]] * c.n_head, dtype=pairs.dtype))


def test_the_shape_of_a_folder_is_read_without_weights_or_transformers(tmp_path):
    neox(tmp_path / "hf", rotary_pct=0.25)
    shape = HFFolder.at(tmp_path / "hf").shape
    model, _, _ = load_any(tmp_path / "hf")
    assert standard_param_count(shape) == model.num_params()
    assert (shape.rot, shape.parallel_residual, shape.tie_embeddings) == (2, True, False)


@pytest.mark.parametrize("pct", [1.0, 0.5])
def test_an_export_says_its_rotary_width_to_transformers_4_as_well(tmp_path, pct):
    """transformers 5 writes the rotary width as rope_parameters' partial_rotary_factor; 4.x reads rotary_pct
    (default 0.25) and rotary_emb_base: a tiny GPT-NeoX export rotating whole heads gave logits 3.9e-4 to 7.6e-3
    relative off ours in transformers 4.40.2 (benchmarks/results/interop-2026-11-26.md). The export writes both."""
    from helpers import transformers4_rope

    hf = neox(tmp_path / "src", rope_parameters=dict(rope_type="default", rope_theta=500.0, partial_rotary_factor=pct))
    src = from_hf_model(hf, "gpt_neox")
    assert src.config.rope_theta == 500.0
    exported, rep = convert(src, "hf", dtype="float64")
    save_converted(exported, tmp_path / "hf", "hf", rep, source="test")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert transformers4_rope(cfg) == (src.config.rot, 500.0) and src.config.rot == int(8 * pct)
    again = transformers.GPTNeoXForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float64).eval()
    with torch.no_grad():
        assert torch.equal(again(X).logits, hf(X).logits)


# config.json edits of a GPT-NeoX folder -> the words its one-line refusal must contain (the config.json key): the
# checks the Llama family got, through the family's record (size checks derived from its name map), not by hand
NEOX_HOSTILE = {
    "layers-absurd": (dict(num_hidden_layers=10**6), "num_hidden_layers=1000000, but the weights hold 2 layer"),
    "hidden-absurd": (dict(hidden_size=2**20), r"hidden_size=1048576, so gpt_neox.embed_in.weight would be"),
    "vocab-bigger-than-weights": (dict(vocab_size=300), r"vocab_size=300, hidden_size=32, so gpt_neox.embed_in.weight "
                                                        r"would be \[300, 32\], but the weights hold \[61, 32\]"),
    "ff-wrong": (dict(intermediate_size=50), r"intermediate_size=50, so gpt_neox.layers.0.mlp.dense_h_to_4h.weight"),
    "eps-text": (dict(layer_norm_eps="abc"), "layer_norm_eps is str 'abc', expected float or int"),
    "eps-negative": (dict(layer_norm_eps=-1), "layer_norm_eps=-1 must be a finite number > 0"),
    "rotary-pct-too-big": (dict(rotary_pct=1.5, rope_parameters=None), r"rotary_pct=1.5 must be a number in \(0, 1\]"),
    "partial-factor-too-big": (dict(rope_parameters=dict(rope_type="default", rope_theta=1e4, partial_rotary_factor=2)),
                               r"rope_parameters.partial_rotary_factor=2 must be a number in \(0, 1\]"),
    "theta-0": (dict(rope_theta=0, rope_parameters=None), "rope_theta=0 must be a finite number > 0"),
    "parallel-as-text": (dict(use_parallel_residual="yes"), "use_parallel_residual is str 'yes', expected bool"),
}


@pytest.mark.parametrize("case", NEOX_HOSTILE, ids=list(NEOX_HOSTILE))
def test_a_hostile_neox_config_json_is_one_line_naming_its_key(tmp_path, case):
    """Each was a traceback after minutes (a million layers: SystemError after 215 s), transformers' message cut
    mid-word, 're-save it' for a bad epsilon, or an error naming our training setting (model.rot, model.norm_eps)
    instead of the config.json key: now one line naming the key, before transformers reads the folder."""
    changes, words = NEOX_HOSTILE[case]
    neox(tmp_path / "hf", rotary_pct=0.25)
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**cfg, **changes}))
    with pytest.raises(Exception) as e:
        load_any(tmp_path / "hf")
    assert type(e.value).__name__ == "UserError", e.value
    assert "\n" not in str(e.value) and "config.json" in str(e.value) and "model." not in str(e.value), e.value
    import re
    assert re.search(words, str(e.value)), str(e.value)
