"""Converting a model (`interop/convert.py`): the converted model computes the source's function, its report
says what really changed (parameters, logit difference), the source is left as it was, and a converted
folder is written whole or not at all and loads back as the same model."""

import copy

import numpy as np
import pytest
import torch

from fixtures import hf_gpt2
from helpers import make_model
from iattention.errors import UserError
from iattention.interop.convert import (
    check_failures,
    convert,
    logits_in_float64,
    probe_batch,
    refuse_or_warn,
    save_converted,
)
from iattention.interop.hf import from_hf, hf_logits
from iattention.interop.load import load_model
from iattention.symmetry import param_count
from iattention.symmetry.conditioning import block_conditioning


def _logits(model, x):
    with torch.no_grad():
        return model(x)[0].double()


@pytest.mark.parametrize("block", ["pivoted", "aligned"])
def test_canonical_and_back_compute_the_source_s_function_and_report_it(block):
    src = make_model()
    before = {k: v.clone() for k, v in src.state_dict().items()}
    x = probe_batch(src)
    canon, rep = convert(src, "canonical", block=block, dtype="float64")
    assert canon.config.attention == "canonical"
    diff = (_logits(canon, x) - _logits(src, x)).abs().max().item()
    assert diff < 1e-9 * _logits(src, x).abs().max().item()
    assert rep.max_abs_logit_diff == pytest.approx(diff, abs=1e-12)
    assert rep.params_before == src.num_params() and rep.params_after == canon.num_params()
    assert rep.params_after == param_count(canon.config) < rep.params_before
    L, H = src.config.n_layer, src.config.n_head
    assert len(rep.layers) == L and all({k: len(v) for k, v in layer.items()} == {  # per head, both blocks
        f"{b} {what}": H for b in ("pivoted", "aligned") for what in ("pass", "output")} for layer in rep.layers)
    assert all(c >= 1 for layer in rep.layers for v in layer.values() for c in v)  # condition numbers
    back, rep2 = convert(canon, "standard", dtype="float64")
    assert back.config.attention == "standard" and rep2.params_after == src.num_params()
    assert (_logits(back, x) - _logits(src, x)).abs().max().item() < 1e-9 * _logits(src, x).abs().max().item()
    assert all(torch.equal(v, before[k]) for k, v in src.state_dict().items())  # the source is untouched


def test_the_report_s_difference_is_the_cast_s_own():
    src = make_model()
    out, rep = convert(src, "canonical", dtype="float32")
    assert next(out.parameters()).dtype == torch.float32
    x = probe_batch(src)
    # the rounded weights, evaluated in float64: what the rounding to float32 costs, not a float32 forward pass
    got = (_logits(copy.deepcopy(out).double(), x) - _logits(src, x)).abs().max().item()
    assert rep.max_abs_logit_diff == pytest.approx(got, rel=1e-6) and got > 0  # float32 rounding, reported
    assert rep.conversion == pytest.approx(got / _logits(src, x).abs().max().item(), rel=1e-6)


@pytest.mark.parametrize("to", ["canonical", "standard"])
def test_the_float64_check_of_an_rmsnorm_model_sees_below_float32_resolution(to):
    """Our RMSNorm computes in float32 for any input, as transformers' does; two float64 models of ours are compared
    with it in float64 (exact_norms), so a float64 conversion reads its own rounding, and an error of 1e-11 reads
    1e-11 (in float32 it read 0 or, across a rounding boundary, about 1e-8: over float64's 1e-9 tolerance)."""
    from helpers import make_llama

    model = make_llama()
    out, rep = convert(model, to, dtype="float64")
    assert rep.conversion <= 1e-13
    with torch.no_grad():
        next(out.attention_layers[0].parameters()).mul_(1 + 1e-11)  # W_Q (canonical), q_proj (standard)
    x = probe_batch(model)
    ref = logits_in_float64(model, x)
    rel = ((logits_in_float64(out, x) - ref).abs().max() / ref.abs().max()).item()
    assert 1e-13 < rel < 1e-10, rel
    assert not any(getattr(m, "exact", False) for m in (*model.modules(), *out.modules()))  # the block leaves them


def test_block_conditioning_of_a_well_and_an_ill_conditioned_key_block():
    model = make_model(n_layer=1)
    well = np.array(block_conditioning(model)["aligned pass"])
    attn = model.attention_layers[0]
    d, hd = model.config.n_embd, model.config.n_embd // model.config.n_head
    with torch.no_grad():  # head 0's W_K: its first hd rows made nearly rank one
        w = attn.c_attn.weight[d: d + hd]
        w[1:, :] = w[0:1, :] + 1e-7 * torch.randn_like(w[1:, :])
    ill = np.array(block_conditioning(model)["aligned pass"])
    assert ill[0, 0] > 1e4 * well[0, 0]
    assert ill[0, 1:].tolist() == pytest.approx(well[0, 1:].tolist())  # the other heads' blocks are as they were


@pytest.mark.parametrize("to, dtype, must", [("canon", "float32", ["'canon'", "canonical", "standard", "hf"]),
                                             ("canonical", "fp16", ["'fp16'", "float32", "bfloat16"])])
def test_an_unknown_target_or_dtype_names_the_choices(to, dtype, must):
    with pytest.raises(UserError) as err:
        convert(make_model(), to, dtype=dtype)
    for m in must:
        assert m in str(err.value)


def test_a_model_whose_logits_are_all_zero_cannot_be_checked_and_says_so():
    model = make_model()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    with pytest.raises(UserError, match="all zero"):
        convert(model, "standard")


def test_a_converted_folder_loads_back_as_the_converted_model_and_is_never_overwritten(tmp_path):
    src = make_model()
    canon, rep = convert(src, "canonical", dtype="float64")
    out = tmp_path / "conv"
    save_converted(canon, out, "canonical", rep, source="src.safetensors", data={"tokenizer": "byte"})
    loaded, meta = load_model(out)
    x = probe_batch(src)
    assert torch.equal(_logits(loaded, x), _logits(canon, x))
    assert meta["conversion"]["to"] == "canonical" and meta["source"] == "src.safetensors"
    assert meta["config"]["data"] == {"tokenizer": "byte"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conv"]  # no temp folder left beside it
    listing = sorted(p.name for p in out.iterdir())
    with pytest.raises(UserError) as err:
        save_converted(canon, out, "canonical", rep, source="again")
    assert str(out) in str(err.value) and "--out" in str(err.value)
    assert sorted(p.name for p in out.iterdir()) == listing and load_model(out)[1]["source"] == "src.safetensors"


@pytest.mark.parametrize("winner", ["folder", "file"])
def test_a_convert_that_loses_the_race_to_its_out_says_it_already_exists(tmp_path, monkeypatch, winner):
    """Two converts to one --out: both pass the up-front check; the other publishes first, while this one
    writes. The loser says the output already exists (not "a non-empty folder where a file is needed"),
    leaves the winner's output as it was and no temp folder behind."""
    from iattention.checkpoint import state as ckpt

    canon, rep = convert(make_model(), "canonical", dtype="float64")
    out = tmp_path / "conv"
    real = ckpt.save_checkpoint

    def save_then_the_other_publishes(path, *args, **kw):  # between this convert's check and its rename
        real(path, *args, **kw)
        if winner == "folder":
            out.mkdir()
            (out / "model.safetensors").write_bytes(b"the winner's")
        else:
            out.write_bytes(b"the winner's")

    monkeypatch.setattr(ckpt, "save_checkpoint", save_then_the_other_publishes)
    with pytest.raises(UserError) as err:
        save_converted(canon, out, "canonical", rep, source="x")
    assert f"output {out} already exists" in str(err.value)
    winner_file = out / "model.safetensors" if winner == "folder" else out
    assert winner_file.read_bytes() == b"the winner's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conv"]


def test_an_hf_source_is_checked_against_its_own_transformers_class(tmp_path):
    """source load: our model of an HF GPT-2 folder against transformers' GPT2LMHeadModel of the same folder, both
    float64 (<= 1e-12); a reference that differs (one bias moved) is named over its tolerance, and refused."""
    pytest.importorskip("transformers")
    hf = hf_gpt2(n_layer=1, n_embd=32, n_head=2)
    hf.save_pretrained(str(tmp_path / "a"))
    src = from_hf(tmp_path / "a")
    _, rep = convert(src, "canonical", dtype="float64", reference=hf_logits(tmp_path / "a", probe_batch(src)))
    assert rep.source_load <= 1e-12 and check_failures(rep.source_load, rep.conversion, torch.float64) == []
    with torch.no_grad():
        hf.transformer.ln_f.bias[3] += 0.5
    hf.save_pretrained(str(tmp_path / "b"))
    _, rep = convert(src, "canonical", dtype="float64", reference=hf_logits(tmp_path / "b", probe_batch(src)))
    bad = check_failures(rep.source_load, rep.conversion, torch.float64)
    assert len(bad) == 1 and bad[0].startswith("source load") and "> 1e-09" in bad[0]
    with pytest.raises(UserError) as err:
        refuse_or_warn(bad, tmp_path / "out", force=False)
    assert "nothing was written" in str(err.value) and "--force" in str(err.value)


def test_a_whole_model_export_s_generation_config_keeps_the_source_s_settings_with_the_export_s_ids(tmp_path):
    """docs/conversion.md ("Special-token ids"): a whole-model --to hf writes the source's generation_config.json
    with the export's special-token ids (those its config.json says): where the two disagree, the ids win; the
    source's sampling defaults are kept. (Merging the other way round passed every test.)"""
    import json

    pytest.importorskip("transformers")
    src = make_model(dtype=torch.float32)
    ids = {"bos_token_id": 3, "eos_token_id": 4}
    hf, rep = convert(src, "hf", dtype="float32", token_ids=ids)
    source = {"do_sample": True, "temperature": 0.7, "top_p": 0.9, "bos_token_id": 90, "eos_token_id": [91, 92]}
    save_converted(hf, tmp_path / "exp", "hf", rep, source="src", generation=source)
    config = json.loads((tmp_path / "exp" / "config.json").read_text())
    written = json.loads((tmp_path / "exp" / "generation_config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"]) == (3, 4)
    assert written == {**source, **ids}  # the export's ids over the source's, its sampling defaults as they were
