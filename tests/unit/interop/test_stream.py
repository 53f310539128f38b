"""Unit tests of iattention.interop.stream: the streaming rotary-family conversion (HF folder -> canonical/standard
folder -> HF folder) on tiny random transformers models, single-file and sharded, float64/float32/bf16, each bad
input one line with nothing written, and a conversion killed mid-write leaving no finished-looking folder."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from helpers import tells
from iattention.checkpoint.state import model_tensors
from iattention.errors import UserError
from iattention.interop import convert, stream
from iattention.interop.hf import from_hf_model
from iattention.interop.load import load_any
from iattention.model.names import from_family
from iattention.symmetry import transforms

tf = pytest.importorskip("transformers")
tf.utils.logging.set_verbosity_error()
_ = tf.LlamaForCausalLM, tf.Qwen2ForCausalLM, tf.MistralForCausalLM, tf.GPTNeoXForCausalLM  # lazy imports, now

BASE = dict(vocab_size=67, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
            max_position_embeddings=32)
CASES = {
    "llama-gqa-untied-bias": ("Llama", dict(num_key_value_heads=2, tie_word_embeddings=False, attention_bias=True)),
    "qwen2-tied": ("Qwen2", dict(num_key_value_heads=2, tie_word_embeddings=True)),
    "mistral-mqa-d12": ("Mistral", dict(num_key_value_heads=1, head_dim=12, sliding_window=None)),
    "llama-rope-llama3": ("Llama", dict(num_key_value_heads=2, rope_parameters=dict(
        rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=8))),
    "gpt-neox-partial-rotary": ("GPTNeoX", dict(rotary_pct=0.25)),  # embed_out in the file, lm_head in memory
}
FAMILY = {"Llama": "llama", "Qwen2": "qwen2", "Mistral": "mistral", "GPTNeoX": "gpt_neox"}


def hf_folder(path, kind="Llama", dtype=torch.float64, shard=None, seed=0, **kw):
    """A random transformers model (norm gains and biases random too) saved with save_pretrained; returns it."""
    torch.manual_seed(seed)
    model = getattr(tf, f"{kind}ForCausalLM")(getattr(tf, f"{kind}Config")(**{**BASE, **kw})).double().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype)) if p.dim() == 1 else \
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) / p.shape[-1] ** 0.5)
    model = model.to(dtype)
    model.save_pretrained(str(path), **({"max_shard_size": shard} if shard else {}))
    (path / "tokenizer_config.json").write_text('{"model_max_length": 32}\n')  # a companion file to copy through
    return model


def quiet(*_):
    pass


def ours_logits(folder) -> torch.Tensor:
    model = load_any(folder)[0].to(torch.float64)
    with torch.no_grad():
        return model(torch.arange(20).reshape(2, 10) % 67)[0]


def rel(a, b) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_streamed_canonical_is_the_whole_model_canonical_bit_for_bit(tmp_path, case):
    """float64: every tensor the streaming converter writes equals what canonicalize() makes of the whole model,
    and the folder's metadata names the same config."""
    kind, kw = CASES[case]
    hf = hf_folder(tmp_path / "src", kind, **kw)
    rep = stream.hf_to_ours(tmp_path / "src", tmp_path / "out", "canonical", say=quiet)
    want = transforms.canonicalize(from_hf_model(hf, FAMILY[kind]), block="pivoted")  # the stream default
    model, _, meta = load_any(tmp_path / "out")
    have, expected = model.state_dict(), want.state_dict()
    assert sorted(have) == sorted(expected)
    assert all(torch.equal(have[k], expected[k]) for k in expected), [k for k in expected
                                                                      if not torch.equal(have[k], expected[k])]
    assert meta["config"]["model"] == want.config.to_dict()
    # one layout on disk: the names save_checkpoint gives the same model (a tied head once), read by safetensors
    assert sorted(load_file(str(tmp_path / "out" / "model.safetensors"))) == sorted(model_tensors(want))
    assert rep.source_load <= 1e-12 and rep.conversion <= 1e-12 and rep.worst[1] <= 1e-12
    assert (tmp_path / "out" / "tokenizer_config.json").read_text() == '{"model_max_length": 32}\n'


@pytest.mark.slow
def test_sharded_source_and_sharded_output_give_the_single_file_result(tmp_path):
    hf_folder(tmp_path / "one", "Qwen2", num_key_value_heads=2)
    hf_folder(tmp_path / "many", "Qwen2", shard="20KB", num_key_value_heads=2)
    assert (tmp_path / "many" / "model.safetensors.index.json").exists()
    stream.hf_to_ours(tmp_path / "one", tmp_path / "a", say=quiet)
    rep = stream.hf_to_ours(tmp_path / "many", tmp_path / "b", shard_bytes=20_000, say=quiet)
    assert len(rep.files) > 2 and (tmp_path / "b" / "model.safetensors.index.json").exists()
    index = json.loads((tmp_path / "b" / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == sorted(rep.files)
    for name in rep.files:  # each shard is a safetensors file safetensors itself reads, within the size asked
        with safe_open(str(tmp_path / "b" / name), "pt") as f:
            assert sum(f.get_tensor(k).numel() * f.get_tensor(k).element_size() for k in f.keys()) <= 20_000 or \
                len(list(f.keys())) == 1
    assert torch.equal(ours_logits(tmp_path / "a"), ours_logits(tmp_path / "b"))


@pytest.mark.slow
@pytest.mark.parametrize("dtype,tol", [("float64", 1e-12), ("float32", 1e-5)])
def test_round_trip_through_canonical_loads_in_transformers_with_the_source_logits(tmp_path, dtype, tol):
    src = hf_folder(tmp_path / "src", "Llama", dtype=getattr(torch, dtype), shard="30KB", num_key_value_heads=2)
    stream.hf_to_ours(tmp_path / "src", tmp_path / "c", say=quiet)
    rep = stream.ours_to_hf(tmp_path / "c", tmp_path / "back", shard_bytes=30_000, say=quiet)
    assert rep.conversion <= tol and "no transformers reference" in rep.source_note
    back = tf.AutoModelForCausalLM.from_pretrained(str(tmp_path / "back")).eval()
    assert back.dtype == getattr(torch, dtype)
    x = torch.arange(24).reshape(2, 12) % 67
    with torch.no_grad():
        assert rel(back(x).logits.double(), src(x).logits.double()) <= tol
    assert (tmp_path / "back" / "tokenizer_config.json").exists()


def test_a_gpt_neox_folder_with_old_mask_buffers_streams_and_comes_back_exactly(tmp_path):
    """Older GPT-NeoX checkpoints (Pythia's) hold each layer's causal-mask buffers (attention.bias, masked_bias),
    which transformers ignores: so does the converter. There and back: transformers' own logits, float64."""
    hf = hf_folder(tmp_path / "src", "GPTNeoX", rotary_pct=0.25)
    tensors = load_file(str(tmp_path / "src" / "model.safetensors"))
    for i in range(BASE["num_hidden_layers"]):
        tensors[f"gpt_neox.layers.{i}.attention.bias"] = torch.ones(1, 1, 32, 32, dtype=torch.bool).tril()
        tensors[f"gpt_neox.layers.{i}.attention.masked_bias"] = torch.tensor(-1e9, dtype=torch.float64)
    save_file(tensors, str(tmp_path / "src" / "model.safetensors"), metadata={"format": "pt"})
    stream.hf_to_ours(tmp_path / "src", tmp_path / "c", say=quiet)
    rep = stream.ours_to_hf(tmp_path / "c", tmp_path / "back", say=quiet)
    assert rep.conversion <= 1e-12
    with safe_open(str(tmp_path / "back" / "model.safetensors"), "pt") as f:
        assert "embed_out.weight" in f.keys() and not any(k.endswith("attention.bias") for k in f.keys())
    back = tf.AutoModelForCausalLM.from_pretrained(str(tmp_path / "back")).eval()
    x = torch.arange(24).reshape(2, 12) % 67
    with torch.no_grad():
        assert rel(back(x).logits.double(), hf(x).logits.double()) <= 1e-12


def test_a_streamed_export_says_its_rope_to_transformers_4_as_well(tmp_path):
    """The streamed --to hf writes transformers 4.x's rope_theta and rope_scaling beside rope_parameters (4.x read
    its defaults instead: another model, silently); transformers 5 reads the folder as before."""
    from helpers import transformers4_rope

    kind, kw = CASES["llama-rope-llama3"]
    src = hf_folder(tmp_path / "src", kind, **kw)
    stream.hf_to_ours(tmp_path / "src", tmp_path / "c", say=quiet)
    stream.ours_to_hf(tmp_path / "c", tmp_path / "back", say=quiet)
    cfg = json.loads((tmp_path / "back" / "config.json").read_text())
    rope = kw["rope_parameters"]
    assert transformers4_rope(cfg) == (rope["rope_theta"], {k: v for k, v in rope.items() if k != "rope_theta"})
    back = tf.AutoModelForCausalLM.from_pretrained(str(tmp_path / "back")).eval()
    assert back.config.rope_parameters == rope
    x = torch.arange(24).reshape(2, 12) % 67
    with torch.no_grad():
        assert rel(back(x).logits.double(), src(x).logits.double()) <= 1e-12


def test_a_bf16_folder_stays_bf16_with_its_other_tensors_untouched(tmp_path, monkeypatch):
    """...copied in slices (COPY_BYTES made small here: the embedding goes in 8 slices, a norm in 2)."""
    monkeypatch.setattr(stream, "COPY_BYTES", 600)
    hf_folder(tmp_path / "src", "Qwen2", dtype=torch.bfloat16, num_key_value_heads=2, tie_word_embeddings=True)
    rep = stream.hf_to_ours(tmp_path / "src", tmp_path / "out", say=quiet)
    src, out = load_file(str(tmp_path / "src" / "model.safetensors")), load_file(str(tmp_path / "out" /
                                                                                      "model.safetensors"))
    kept = [k for k in src if ".self_attn." not in k]
    # embeddings, norms, MLPs, bit-exact, under our names (the one layout of a checkpoint)
    assert kept and all(torch.equal(out[f"model/{from_family(k, 'qwen2')}"], src[k]) for k in kept)
    assert all(v.dtype in (torch.bfloat16, torch.int64) for v in out.values())
    assert rep.dtype == torch.bfloat16 and all(0 < r["rounded"] < 5e-2 and r["algebra"] < 1e-12 for r in rep.layers)
    assert load_any(tmp_path / "out")[0].transformer.wte.weight.dtype == torch.bfloat16


def test_a_check_over_its_tolerance_writes_nothing_unless_forced(tmp_path, monkeypatch):
    hf_folder(tmp_path / "src", "Llama", dtype=torch.bfloat16, num_key_value_heads=2)
    monkeypatch.setitem(convert.TOLERANCE, torch.bfloat16, 1e-6)
    with pytest.raises(UserError) as err:
        stream.hf_to_ours(tmp_path / "src", tmp_path / "out", say=quiet)
    tells(err, "conversion", "> 1e-06", "nothing was written", "--force")
    assert not (tmp_path / "out").exists() and os.listdir(tmp_path) == ["src"]
    said = []
    stream.hf_to_ours(tmp_path / "src", tmp_path / "out", force=True, say=said.append)
    assert (tmp_path / "out" / "model.safetensors").exists() and "written anyway (--force)" in said[-1]


# ------------------------------------------------------------------------------------------------ bad input


def _digest(folder) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _refused(tmp_path, src, *facts):
    before = _digest(src)
    with pytest.raises(UserError) as err:
        stream.hf_to_ours(src, tmp_path / "out", say=quiet)
    assert "\n" not in str(err.value)
    tells(err, *facts)
    assert not (tmp_path / "out").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]
    assert _digest(src) == before  # the source is never touched
    return str(err.value)


def test_an_index_naming_a_missing_shard_is_one_line(tmp_path):
    hf_folder(tmp_path / "src", shard="20KB", num_key_value_heads=2)
    gone = sorted((tmp_path / "src").glob("model-*.safetensors"))[1]
    gone.unlink()
    _refused(tmp_path, tmp_path / "src", "names shard", gone.name, "is missing")


def test_a_shard_truncated_mid_tensor_is_one_line(tmp_path):
    hf_folder(tmp_path / "src", shard="20KB", num_key_value_heads=2)
    cut = sorted((tmp_path / "src").glob("model-*.safetensors"))[1]
    os.truncate(cut, cut.stat().st_size - 100)
    _refused(tmp_path, tmp_path / "src", str(cut), "truncated")


def test_a_tensor_shaped_against_config_json_is_one_line(tmp_path):
    """Layer 2's k_proj (beyond the layer-0 check of read time) of the wrong shape: named with its shapes."""
    hf_folder(tmp_path / "src", num_key_value_heads=2)
    path = tmp_path / "src" / "model.safetensors"
    tensors = load_file(str(path))
    tensors["model.layers.2.self_attn.k_proj.weight"] = tensors["model.layers.2.self_attn.k_proj.weight"][:8]
    save_file(tensors, str(path), metadata={"format": "pt"})
    _refused(tmp_path, tmp_path / "src", "model.layers.2.self_attn.k_proj.weight", "[8, 32]", "[16, 32]",
             "disagree")


def test_a_dtype_the_converter_does_not_handle_is_one_line(tmp_path):
    hf_folder(tmp_path / "src", num_key_value_heads=2)
    path = tmp_path / "src" / "model.safetensors"
    tensors = load_file(str(path))
    tensors["model.layers.1.mlp.up_proj.weight"] = tensors["model.layers.1.mlp.up_proj.weight"].to(
        torch.float8_e4m3fn)
    save_file(tensors, str(path), metadata={"format": "pt"})
    _refused(tmp_path, tmp_path / "src", "model.layers.1.mlp.up_proj.weight", "F8_E4M3", "dequantize")


def test_a_token_id_that_is_no_id_is_one_line(tmp_path):
    """An empty eos list passes transformers' config validation; kept in the metadata, it would be refused only
    when the converted folder is read ('bad metadata'), so the conversion refuses it, naming the key."""
    hf_folder(tmp_path / "src", num_key_value_heads=2)
    cfg = json.loads((tmp_path / "src" / "config.json").read_text())
    (tmp_path / "src" / "config.json").write_text(json.dumps({**cfg, "eos_token_id": []}))
    _refused(tmp_path, tmp_path / "src", "config.json: eos_token_id is list []", "expected a token id")


def test_a_disk_that_fills_mid_write_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    hf_folder(tmp_path / "src", shard="20KB", num_key_value_heads=2)
    monkeypatch.setenv("IATTN_FAULT", "disk_full:5")
    _refused(tmp_path, tmp_path / "src", "disk full", "nothing was written")


@pytest.mark.slow
def test_a_conversion_killed_mid_write_leaves_no_finished_looking_folder(tmp_path):
    hf_folder(tmp_path / "src", shard="20KB", num_key_value_heads=2)
    code = ("import sys; from iattention.interop.stream import hf_to_ours; "
            "hf_to_ours(sys.argv[1], sys.argv[2], shard_bytes=20_000, say=lambda *a: None)")
    env = {**os.environ, "IATTN_FAULT": "convert_write:6"}
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path / "src"), str(tmp_path / "out")], env=env,
                         capture_output=True, text=True)
    assert run.returncode == -9, run.stderr
    assert not (tmp_path / "out").exists()
    left = [p.name for p in tmp_path.iterdir() if p.name != "src"]
    assert len(left) == 1 and left[0].startswith(".out.iattn-") and left[0].endswith(".conv")  # a temp, by name
    stream.hf_to_ours(tmp_path / "src", tmp_path / "out", shard_bytes=20_000, say=quiet)  # the rerun clears it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "src"]


def test_to_standard_streams_the_source_tensors_unchanged(tmp_path):
    hf_folder(tmp_path / "src", "Mistral", dtype=torch.bfloat16, num_key_value_heads=2, sliding_window=None)
    stream.hf_to_ours(tmp_path / "src", tmp_path / "out", "standard", say=quiet)
    src = load_file(str(tmp_path / "src" / "model.safetensors"))
    out = load_file(str(tmp_path / "out" / "model.safetensors"))
    ours = {k: f"model/{from_family(k, 'mistral')}" for k in src}  # under our names: the one layout
    assert sorted(out) == sorted(ours.values())
    assert all(torch.equal(out[ours[k]], v) for k, v in src.items())
    assert load_any(tmp_path / "out")[0].config.attention == "standard"


@pytest.mark.parametrize("name, value, layer", [("model.layers.1.mlp.down_proj.weight", float("nan"), " (layer 1)"),
                                                ("model.layers.2.self_attn.q_proj.weight", float("inf"), " (layer 2)"),
                                                ("model.embed_tokens.weight", float("nan"), "")],
                         ids=["copied-mlp", "attention", "embedding"])
def test_a_non_finite_source_weight_is_one_line_naming_it(tmp_path, name, value, layer):
    """A NaN or Inf in a source tensor: a copied one (MLP, embedding) used to be written silently, and the
    per-layer check reads attention weights only. Now one line naming the tensor and its layer, nothing written."""
    hf_folder(tmp_path / "src", num_key_value_heads=2)
    path = tmp_path / "src" / "model.safetensors"
    tensors = load_file(str(path))
    tensors[name][1, 2] = value
    save_file(tensors, str(path), metadata={"format": "pt"})
    _refused(tmp_path, tmp_path / "src", f"{tmp_path / 'src'}{layer} holds non-finite weights",
             f"1 {'NaN' if value != value else 'Inf'} value(s) in {name}")


def test_a_non_finite_weight_the_conversion_makes_is_one_line(tmp_path):
    """Finite source weights, an Inf made by the gauge algebra: layer 1's key head 0 scaled by 1e6 (as well
    conditioned as before; its canonical keys are fixed) moves the factor into its queries, past float16's range.
    One line naming the tensor and the layer, nothing written."""
    hf_folder(tmp_path / "src", dtype=torch.float32, num_key_value_heads=2)
    path = tmp_path / "src" / "model.safetensors"
    tensors = load_file(str(path))
    tensors["model.layers.1.self_attn.k_proj.weight"][:8] *= 1e6
    save_file(tensors, str(path), metadata={"format": "pt"})
    with pytest.raises(UserError) as err:
        stream.hf_to_ours(tmp_path / "src", tmp_path / "out", "canonical", dtype="float16", say=quiet)
    assert "\n" not in str(err.value)
    tells(err, "the conversion (layer 1) holds non-finite weights",
          "Inf value(s) in model/transformer.h.1.attn.W_Q", "float16", "nothing was written")
    assert not (tmp_path / "out").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_a_gpt2_folder_is_refused_in_one_line_not_streamed(tmp_path):
    """GPT-2 is a row of the one loader (interop/hf.py) but not of the streaming converter (Conv1D weights,
    learned positions): one line, nothing written."""
    tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=10, n_positions=16)).save_pretrained(
        tmp_path / "hf")
    with pytest.raises(UserError, match="GPT-2 model, which converts whole"):
        stream.hf_to_ours(tmp_path / "hf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["out-of-range", "repeated"])
def test_a_damaged_structural_tensor_in_a_streamed_folder_is_one_line_and_nothing_written(tmp_path, kind):
    """The streamed --to hf reads a canonical folder a layer at a time: a pivot row or permutation out of range was
    a traceback, a repeated entry another model written silently. Checked as read (checkpoint/state.py's
    check_structure, the loader's own check), before anything is written."""
    hf_folder(tmp_path / "src", num_key_value_heads=2)
    stream.hf_to_ours(tmp_path / "src", tmp_path / "c", say=quiet)
    path = tmp_path / "c" / "model.safetensors"
    with safe_open(str(path), "pt") as f:
        metadata = f.metadata()
    tensors = load_file(str(path))
    names = [k for k in tensors if k.endswith("_perm")]
    assert {k.rsplit(".", 1)[-1] for k in names} == {"rot_perm", "o_perm"}  # Llama: every dim rotary, no k_perm
    for name in names:
        bad = tensors[name].clone()
        n = bad.shape[-1]
        bad.view(-1, n)[0, 1] = n + 3 if kind == "out-of-range" else bad.view(-1, n)[0, 0]
        save_file({**tensors, name: bad}, str(path), metadata=metadata)
        with pytest.raises(UserError) as err:
            stream.ours_to_hf(tmp_path / "c", tmp_path / "back", say=quiet)
        tells(err, str(tmp_path / "c"), name, "permutation", "use another checkpoint")
        assert "\n" not in str(err.value) and not (tmp_path / "back").exists()


def test_the_streamed_check_is_judged_at_the_output_dtype_s_tolerance_and_names_it(tmp_path):
    """A float64 folder converted to bfloat16: each layer's rounded check (about 1e-2) is judged at bfloat16's
    tolerance, not at the source's float64 one (which would refuse every such conversion), and the report says
    bfloat16; back to HF in float32 from that bfloat16 folder, float32's, and the report says float32."""
    from iattention.interop.convert import TOLERANCE

    hf_folder(tmp_path / "src", num_key_value_heads=2)
    said = []
    rep = stream.hf_to_ours(tmp_path / "src", tmp_path / "c", dtype="bfloat16", say=said.append)
    assert rep.dtype == torch.bfloat16 and 1e-9 < rep.worst[1] <= TOLERANCE[torch.bfloat16]
    assert "-> canonical [bfloat16]" in said[0] and "rounded to bfloat16" in said[1]
    assert f"tolerance {TOLERANCE[torch.bfloat16]:.0e} for bfloat16" in "\n".join(said)
    said = []
    rep = stream.ours_to_hf(tmp_path / "c", tmp_path / "back", dtype="float32", say=said.append)
    assert rep.dtype == torch.float32 and rep.conversion <= TOLERANCE[torch.float32]
    assert "-> hf [float32]" in said[0] and f"relative (tolerance {TOLERANCE[torch.float32]:.0e})" in "\n".join(said)
    assert tf.AutoModelForCausalLM.from_pretrained(str(tmp_path / "back")).dtype == torch.float32


def test_a_sharded_export_s_index_and_report_count_the_bytes_on_disk(tmp_path):
    """model.safetensors.index.json's total_size is the tensors' bytes (as save_pretrained writes it, what
    transformers and the Hub read), and the report's "N file(s), X GB" says the files and bytes written: both
    agree with the shards on disk, in the output dtype."""
    hf_folder(tmp_path / "src", num_key_value_heads=2)
    stream.hf_to_ours(tmp_path / "src", tmp_path / "c", say=quiet)
    said = []
    rep = stream.ours_to_hf(tmp_path / "c", tmp_path / "back", dtype="bfloat16", shard_bytes=30_000,
                            say=said.append)
    index = json.loads((tmp_path / "back" / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    held = 0
    for name in shards:
        with safe_open(str(tmp_path / "back" / name), "pt") as f:
            held += sum(math.prod(f.get_slice(k).get_shape()) * 2 for k in f.keys())  # bfloat16: 2 bytes each
        assert (tmp_path / "back" / name).stat().st_size > 0
    assert len(shards) > 1 and index["metadata"]["total_size"] == held == rep.bytes_written
    assert sum((tmp_path / "back" / n).stat().st_size for n in shards) > held  # headers on top: the data counted
    assert f": {len(shards)} file(s), {held / 1e9:.3g} GB" in said[0], said[0]
