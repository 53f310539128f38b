"""Unit tests of iattention.interop.hf for the Llama family, and its path through interop.convert /
interop.load: exact conversion of random-init tiny transformers Llama / Qwen2 / Mistral models (nothing downloaded)."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import transformers4_rope
from iattention.cli import main
from iattention.errors import UserError
from iattention.interop.convert import convert, save_converted
from iattention.interop.hf import from_hf, from_hf_model, to_hf
from iattention.interop.load import load_any
from iattention.model.names import to_family

tf = pytest.importorskip("transformers")
tf.utils.logging.set_verbosity_error()

BASE = dict(vocab_size=67, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=32)
# (id, transformers class, config overrides)
CASES = [
    ("llama-mha", "Llama", dict(num_key_value_heads=4)),
    ("llama-gqa-untied", "Llama", dict(num_key_value_heads=2, tie_word_embeddings=False)),
    ("llama-mqa-tied", "Llama", dict(num_key_value_heads=1, tie_word_embeddings=True)),
    ("llama-d_head-12-bias", "Llama", dict(num_key_value_heads=2, head_dim=12, attention_bias=True)),
    ("llama-partial-factor-ignored", "Llama", dict(num_key_value_heads=2, partial_rotary_factor=0.5)),
    ("llama-rope-llama3", "Llama", dict(num_key_value_heads=2, rope_parameters=dict(
        rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=8))),
    ("qwen2-gqa-tied", "Qwen2", dict(num_key_value_heads=2, tie_word_embeddings=True)),
    ("mistral-gqa", "Mistral", dict(num_key_value_heads=2, sliding_window=None)),
    ("llama-eps-1e-5", "Llama", dict(num_key_value_heads=2, rms_norm_eps=1e-5)),  # Llama 2, SmolLM2: not our default
]
IDS = [c[0] for c in CASES]


def hf_model(kind: str, seed: int = 0, **kw):
    """A float64 random-init transformers model with its norm gains and biases random too (init leaves them 1 and
    0, which would hide a dropped bias or gain)."""
    torch.manual_seed(seed)
    cfg = getattr(tf, f"{kind}Config")(**{**BASE, **kw})
    model = getattr(tf, f"{kind}ForCausalLM")(cfg).double().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype)) if p.dim() == 1 else \
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) / p.shape[-1] ** 0.5)
    return model


def _x():
    return torch.randint(0, 67, (2, 24), generator=torch.Generator().manual_seed(1))


def _family(kind: str) -> str:
    return kind.lower()


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_our_model_computes_transformers_logits(case):
    _, kind, kw = case
    hf = hf_model(kind, **kw)
    ours = from_hf_model(hf, _family(kind))
    with torch.no_grad():
        assert (ours(_x())[0] - hf(_x()).logits).abs().max().item() <= 1e-9
    assert ours.config.rot == ours.config.d_head  # Llama rotates the whole head whatever partial_rotary_factor says
    assert ours.num_params() == sum(p.numel() for p in hf.parameters())


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("to", ["canonical", "standard"])
def test_hf_to_ours_to_hf_is_exact(case, to):
    """HF -> canonical (or standard) -> HF: the same logits in float64 and within 1e-4 relative in float32; canonical
    holds exactly L G (rot + (r - rot)^2 + r^2) fewer parameters."""
    _, kind, kw = case
    hf = hf_model(kind, **kw)
    src = from_hf_model(hf, _family(kind))
    mid, rep = convert(src, to, dtype="float64")
    back = to_hf(mid)
    assert type(back) is type(hf)
    with torch.no_grad():
        ref = hf(_x()).logits
        assert (back(_x()).logits - ref).abs().max().item() <= 1e-9
    c = src.config
    removed = c.n_layer * c.n_kv_head * (c.rot + (c.d_head - c.rot) ** 2 + c.d_head**2) if to == "canonical" else 0
    assert rep.params_before - rep.params_after == removed
    assert rep.max_abs_logit_diff <= 1e-9
    _, rep32 = convert(src, to, dtype="float32")
    assert rep32.conversion <= 1e-4


def test_the_conversion_changes_what_it_should():
    """The canonical weights differ from the source (the round trip is not a copy), and a wrong export fails:
    swapping two KV heads of the key map changes the logits (so the 1e-9 check can fail)."""
    hf = hf_model("Llama", num_key_value_heads=2)
    src = from_hf_model(hf, "llama")
    canon, _ = convert(src, "canonical", dtype="float64")
    back = to_hf(canon)
    moved = max((a - b).abs().max().item() for a, b in zip(src.state_dict().values(), canon.state_dict().values())
                if a.shape == b.shape)
    assert moved > 0.1
    with torch.no_grad():
        back.model.layers[0].self_attn.k_proj.weight.copy_(back.model.layers[0].self_attn.k_proj.weight.roll(8, 0))
        assert (back(_x()).logits - hf(_x()).logits).abs().max().item() > 1e-3


@pytest.mark.parametrize("kind,kw", [("Qwen2", dict(num_key_value_heads=2, tie_word_embeddings=True)),
                                     ("Llama", dict(num_key_value_heads=2, tie_word_embeddings=False))])
def test_saved_folders_reload_bitwise(tmp_path, kind, kw):
    hf = hf_model(kind, **kw)
    hf.save_pretrained(tmp_path / "hf")
    src, data, _ = load_any(tmp_path / "hf")
    assert data is None
    ours = {to_family(k, src.config.family): v for k, v in src.state_dict().items()}
    assert set(ours) == set(hf.state_dict())  # the same names (ours renamed to transformers'), one to one
    for name, a in hf.state_dict().items():
        assert torch.equal(a, ours[name]), name
    canon, rep = convert(src, "canonical", dtype="float64")
    save_converted(canon, tmp_path / "canon", "canonical", rep, source="test")
    again, _, _ = load_any(tmp_path / "canon")
    assert again.config == canon.config
    for (name, a), b in zip(canon.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), name
    out, rep = convert(again, "hf", dtype="float64")
    save_converted(out, tmp_path / "back", "hf", rep, source="test")
    back = from_hf(tmp_path / "back")
    with torch.no_grad():
        assert (back(_x())[0] - hf(_x()).logits).abs().max().item() <= 1e-9


@pytest.mark.parametrize("kind,kw", [("Llama", dict(num_key_value_heads=2)),
                                     ("Qwen2", dict(num_key_value_heads=2, tie_word_embeddings=True)),
                                     ("Mistral", dict(num_key_value_heads=2, sliding_window=None))])
def test_a_bf16_folder_gives_transformers_float64_logits_at_long_positions(tmp_path, kind, kw):
    """A bf16 checkpoint (as Hub models ship) loaded and cast to float64 computes transformers' float64 logits of the
    same folder at T = 2048: the RoPE frequencies stay float32 through every cast (with bf16 ones this relative
    difference was 4e-2 to 6e-2 on these models)."""
    T = 2048
    hf = hf_model(kind, max_position_embeddings=T, **kw).to(torch.bfloat16)
    hf.save_pretrained(tmp_path / "hf")
    ours, _, _ = load_any(tmp_path / "hf")
    assert ours.transformer.wte.weight.dtype == torch.bfloat16  # loaded in the folder's dtype ...
    assert ours.transformer.rotary_emb.inv_freq.dtype == torch.float32  # ... its frequencies not
    ours = ours.double()
    ref = getattr(tf, f"{kind}ForCausalLM").from_pretrained(str(tmp_path / "hf"), dtype=torch.float64).eval()
    x = torch.randint(0, 67, (1, T), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        a, b = ours(x)[0], ref(x).logits
    assert ((a - b).abs().max() / b.abs().max()).item() <= 1e-9


def _folder(tmp_path, config: dict):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize("model_type,why", [("gemma3", "QK-norm"), ("gemma3_text", "QK-norm"),
                                            ("phi3", "num_hidden_layers"), ("mamba", "converts gpt2, llama"),
                                            ("gpt_neox", "num_hidden_layers"), ("qwen3", "num_hidden_layers"),
                                            ("olmo2", "num_hidden_layers")])
def test_out_of_scope_models_are_refused_in_one_line(tmp_path, model_type, why):
    with pytest.raises(UserError, match=why) as e:
        load_any(_folder(tmp_path, {"model_type": model_type}))
    assert "\n" not in str(e.value)


def test_a_missing_tensor_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    hf = hf_model("Llama", num_key_value_heads=2, tie_word_embeddings=False)
    hf.save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    del state["model.layers.1.self_attn.k_proj.weight"]
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UserError, match="missing tensor.*k_proj"):
        load_any(tmp_path)


def test_a_model_transformers_cannot_hold_is_not_exported():
    hf = hf_model("Llama", num_key_value_heads=2)
    src = from_hf_model(hf, "llama")
    partial = type(src)(src.config.replace(rot=4))
    with pytest.raises(UserError, match="rot=4 of d_head=8"):
        to_hf(partial)


def test_transformers_4_is_refused_in_one_line_for_the_llama_family(tmp_path, monkeypatch):
    """transformers 4.x keeps rope_theta outside rope_parameters: an export would silently get the default
    theta, so the Llama family asks for 5 or later by name."""
    import transformers

    from helpers import make_llama
    from iattention.errors import UserError
    from iattention.interop.hf import from_hf, to_hf

    _, folder = _saved(tmp_path)  # the folder's family decides which transformers it needs
    monkeypatch.setattr(transformers, "__version__", "4.46.3")
    with pytest.raises(UserError, match=r"transformers 5 or later \(found 4\.46\.3\)"):
        from_hf(folder)
    with pytest.raises(UserError, match="transformers 5 or later"):
        to_hf(make_llama())


def _saved(tmp_path, kind="Llama", name="hf", shard=None, **kw):
    hf = hf_model(kind, **{"num_key_value_heads": 2, **kw})
    hf.save_pretrained(tmp_path / name, **({"max_shard_size": shard} if shard else {}))
    return hf, tmp_path / name


def _edit(folder, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, **changes}))


# config.json edits a user's folder may carry -> the words the one-line refusal must contain (the key, named)
HOSTILE = {
    "heads-0": (dict(num_attention_heads=0), "num_attention_heads=0 must be a positive integer"),
    "heads-negative": (dict(num_attention_heads=-4), "num_attention_heads=-4 must be a positive integer"),
    "vocab-0": (dict(vocab_size=0), "vocab_size=0 must be a positive integer"),
    "layers-as-text": (dict(num_hidden_layers="2"), "num_hidden_layers is str '2', expected int"),
    "kv-not-dividing": (dict(num_key_value_heads=3), "num_key_value_heads=3 does not divide num_attention_heads=4"),
    "head_dim-wrong": (dict(head_dim=12), r"num_attention_heads=4, head_dim=12, hidden_size=32, so "
                                          r"model.layers.0.self_attn.q_proj.weight would be \[48, 32\]"),
    "hidden-absurd": (dict(hidden_size=2**20), r"hidden_size=1048576, so model.embed_tokens.weight would be"),
    "layers-absurd": (dict(num_hidden_layers=10**6), "num_hidden_layers=1000000, but the weights hold 2 layer"),
    "rope-junk": (dict(rope_parameters="junk"), "rope_parameters is str 'junk', expected dict"),
    "rope-dynamic": (dict(rope_parameters=dict(rope_type="dynamic", rope_theta=1e4, factor=2.0)),
                     "rope_type 'dynamic'; iattention reproduces 'default' and 'llama3' only"),
    "llama3-without-numbers": (dict(rope_parameters=dict(rope_type="llama3", rope_theta=1e4)),
                               "'llama3' but no positive number for factor, low_freq_factor, high_freq_factor;"),
    "theta-0": (dict(rope_parameters=dict(rope_type="default", rope_theta=0)), "rope_theta=0 must be a finite"),
    "theta-nan": (dict(rope_parameters=dict(rope_type="default", rope_theta=float("nan"))), "rope_theta=nan must"),
    "theta-inf-legacy-key": (dict(rope_parameters=None, rope_theta=float("inf")), "rope_theta=inf must"),
    "eps-negative": (dict(rms_norm_eps=-1e-6), "rms_norm_eps=-1e-06 must be a finite number > 0"),
}


@pytest.mark.parametrize("case", HOSTILE, ids=list(HOSTILE))
def test_a_hostile_config_json_is_one_line_naming_its_key(tmp_path, case):
    """Each was a traceback (ZeroDivisionError, KeyError, huggingface_hub's validation error), transformers' message
    cut mid-word, advice about a training override the user never set, or (a million layers) a hang while
    transformers allocated the model: now one line naming the config.json key, before transformers reads it."""
    changes, words = HOSTILE[case]
    _, folder = _saved(tmp_path)
    _edit(folder, **changes)
    with pytest.raises(UserError, match=words) as e:
        load_any(folder)
    assert "\n" not in str(e.value) and "config.json" in str(e.value)


def test_a_sharded_folder_missing_a_shard_or_holding_a_truncated_one_is_one_line(tmp_path):
    _, folder = _saved(tmp_path, shard="20KB")
    shards = sorted(folder.glob("model-*.safetensors"))
    assert len(shards) > 2
    assert load_any(folder)[0].config.n_layer == 2  # the sharded folder as saved loads
    shards[1].write_bytes(shards[1].read_bytes()[:-100])
    with pytest.raises(UserError, match=f"cannot read .*{shards[1].name} as safetensors"):
        load_any(folder)
    shards[1].unlink()
    with pytest.raises(UserError, match=f"names shard {shards[1].name}, which is missing; download"):
        load_any(folder)


def test_a_tied_config_with_its_own_head_loads_as_transformers_does(tmp_path):
    """config.json says tie_word_embeddings but the weights hold a distinct lm_head.weight: transformers leaves the
    head untied (with a warning); we did the opposite (the head's values loaded into the embedding, loss 5.724 where
    transformers gave 5.846), and convert compared against that wrong import."""
    hf, folder = _saved(tmp_path, tie_word_embeddings=False)
    _edit(folder, tie_word_embeddings=True)
    ours, _, _ = load_any(folder)
    ref = tf.LlamaForCausalLM.from_pretrained(str(folder)).eval()
    assert not ours.config.tie_embeddings
    with torch.no_grad():
        assert torch.equal(ours.transformer.wte.weight, hf.model.embed_tokens.weight)
        assert (ours(_x())[0] - ref(_x()).logits).abs().max().item() <= 1e-12


def _relative(a, ref):
    return ((a - ref).abs().max() / ref.abs().max()).item()


def test_a_sliding_window_mistral_loads_at_its_positions_and_equals_transformers(tmp_path, capsys):
    """A Mistral whose sliding window (16) is shorter than its positions (128) ran here on blocks of 16 (with a
    note): the window is now the same mask as transformers' (i - 16 < j <= i), so it loads at its 128 positions
    and equals transformers' float64 logits on 128 tokens, as do its canonical conversion (`iattn convert --to
    canonical`, streamed) and the export of that back to MistralForCausalLM."""
    hf, folder = _saved(tmp_path, "Mistral", sliding_window=16, max_position_embeddings=128)
    capsys.readouterr()  # transformers' own progress bars
    ours, _, _ = load_any(folder)
    assert capsys.readouterr().err == ""  # no note: nothing is cut
    assert (ours.config.block_size, ours.config.sliding_window) == (128, 16)
    x = torch.randint(0, 67, (2, 128), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = hf(x).logits
        assert _relative(ours(x)[0], ref) <= 1e-9
        assert _relative(ours(x[:, :16])[0], ref[:, :16]) <= 1e-9
        assert main(["convert", "--from", str(folder), "--to", "canonical", "--out", str(tmp_path / "c")]) == 0
        canon = load_any(tmp_path / "c")[0].double()
        assert canon.config.attention == "canonical" and canon.config.sliding_window == 16
        assert _relative(canon(x)[0], ref) <= 1e-9
        assert main(["convert", "--from", str(tmp_path / "c"), "--to", "hf", "--out", str(tmp_path / "h")]) == 0
        back = tf.MistralForCausalLM.from_pretrained(str(tmp_path / "h"), dtype=torch.float64).eval()
        assert back.config.sliding_window == 16 and _relative(back(x).logits, ref) <= 1e-9


@pytest.mark.parametrize("heads", [dict(num_key_value_heads=2), dict(num_key_value_heads=4)], ids=["gqa", "mha"])
def test_cached_greedy_generation_past_the_window_equals_transformers_generate(heads):
    """60 tokens after a 5-token prompt (well past the window of 16): our cached greedy decoding (the full cache;
    with MHA the K-only cache too; the canonical conversion's) gives transformers' generate's tokens."""
    hf = hf_model("Mistral", **heads, sliding_window=16, max_position_embeddings=128)
    hf.generation_config.eos_token_id = None  # a random model says "</s>" now and then: keep going
    prompt = torch.randint(0, 67, (2, 5), generator=torch.Generator().manual_seed(5))
    want = hf.generate(prompt, max_new_tokens=60, do_sample=False, pad_token_id=0)
    ours = from_hf_model(hf, "mistral")
    canon, _ = convert(ours, "canonical", dtype="float64")
    kinds = ["full", "k-only"] if heads["num_key_value_heads"] == 4 else ["full"]
    for model in (ours, canon):
        for kind in kinds:
            assert torch.equal(model.generate(prompt, 60, temperature=0, cache_kind=kind), want), (model, kind)


def test_a_qwen2_windows_the_layers_from_max_window_layers_on(tmp_path):
    """Qwen2 with use_sliding_window: transformers windows the layers from max_window_layers (1 of 3) on; so do
    we (per layer), exactly, and the export keeps it. Layer types in another order are one line."""
    kw = dict(num_hidden_layers=3, use_sliding_window=True, sliding_window=16, max_window_layers=1,
              max_position_embeddings=128)
    hf = hf_model("Qwen2", num_key_value_heads=2, **kw)
    ours = from_hf_model(hf, "qwen2")
    assert [b.attn.window for b in ours.transformer.h] == [0, 16, 16]
    x = torch.randint(0, 67, (2, 128), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        ref = hf(x).logits
        assert _relative(ours(x)[0], ref) <= 1e-9
        assert _relative(to_hf(ours)(x).logits, ref) <= 1e-9
    odd = hf_model("Qwen2", **{**kw, "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]})
    with pytest.raises(UserError, match="layer_types .* windows the layers from one index on"):
        from_hf_model(odd, "qwen2")


def test_a_converted_folder_says_what_it_is_to_transformers_and_still_loads_here(tmp_path):
    """transformers refused a --to canonical folder with "Should have a model_type key"; its config.json now says
    model_type iattention with a note on how to export it and an auto_map (issue 66: transformers reads it through
    iattention.hf_model, registered on import, or with trust_remote_code=True), and it loads here as before, as does
    a folder written before (no model_type)."""
    _, folder = _saved(tmp_path)
    src, _, _ = load_any(folder)
    canon, rep = convert(src, "canonical", dtype="float64")
    save_converted(canon, tmp_path / "canon", "canonical", rep, source="test")
    cfg = json.loads((tmp_path / "canon" / "config.json").read_text())
    assert cfg["model_type"] == "iattention" and "--to hf" in cfg["note"]
    import iattention.hf_model  # noqa: F401  (registers the auto classes)

    assert type(tf.AutoModelForCausalLM.from_pretrained(str(tmp_path / "canon"))).__name__ == "IAttentionForCausalLM"
    again, _, _ = load_any(tmp_path / "canon")
    assert again.config == canon.config
    old = {k: v for k, v in cfg.items() if k not in ("model_type", "note", "auto_map")}
    (tmp_path / "canon" / "config.json").write_text(json.dumps(old))
    assert load_any(tmp_path / "canon")[0].config == canon.config
    (tmp_path / "canon" / "config.json").write_text(json.dumps({**cfg, "n_layer": 3}))
    with pytest.raises(UserError, match="does not match the checkpoint's own model config"):
        load_any(tmp_path / "canon")


def test_an_export_says_its_rope_to_transformers_4_as_well(tmp_path):
    """transformers 5 writes RoPE in rope_parameters only; 4.x read its defaults instead (theta 10000, no scaling):
    a Llama 3 export would have run with other frequencies there, silently. The export writes 4.x's keys too, and
    transformers 5 still loads the folder to the same logits."""
    rope = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                original_max_position_embeddings=8)
    hf = hf_model("Llama", num_key_value_heads=2, rope_parameters=rope)
    exported, rep = convert(from_hf_model(hf, "llama"), "hf", dtype="float64")
    save_converted(exported, tmp_path / "hf", "hf", rep, source="test")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    assert transformers4_rope(cfg) == (500000.0, scaling)
    again = tf.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float64).eval()
    assert again.config.rope_parameters == rope
    with torch.no_grad():
        assert torch.equal(again(_x()).logits, hf(_x()).logits)


def test_a_non_finite_weight_in_a_llama_folder_is_one_line(tmp_path):
    """A NaN in an HF Llama-family folder: GPT-2 folders and checkpoints were refused by name, this one loaded (and
    gave nan logits). Now the same one line."""
    from safetensors.torch import load_file, save_file
    _, folder = _saved(tmp_path, "Qwen2")
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["model.layers.1.mlp.up_proj.weight"][0, 0] = float("nan")
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UserError, match=r"holds non-finite weights \(1 NaN value\(s\) in model.layers.1.mlp.up_proj"):
        load_any(folder)
