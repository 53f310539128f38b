"""End-to-end: `iattn convert` and `iattn params` on a GPT-NeoX folder, the third family: to canonical and back to a
folder transformers loads, exactly in float64 and within 1e-5 in float32; the counts from its config.json."""

import json

import pytest
import torch

from iattention.cli import main

tf = pytest.importorskip("transformers")
if int(tf.__version__.split(".")[0]) < 5:
    pytest.skip("GPT-NeoX conversion needs transformers 5", allow_module_level=True)
tf.utils.logging.set_verbosity_error()
X = torch.randint(0, 61, (2, 30), generator=torch.Generator().manual_seed(2))


def neox_folder(folder, dtype):
    torch.manual_seed(0)
    cfg = tf.GPTNeoXConfig(vocab_size=61, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=48, max_position_embeddings=64, rotary_pct=0.25)
    hf = tf.GPTNeoXForCausalLM(cfg).to(torch.float64)
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.3)
    hf.to(dtype).save_pretrained(str(folder))
    return tf.GPTNeoXForCausalLM.from_pretrained(str(folder), dtype=torch.float64).eval()


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)], ids=["float64", "float32"])
def test_a_neox_folder_converts_to_canonical_and_back(tmp_path, capsys, dtype, tol):
    ref = neox_folder(tmp_path / "neox", dtype)(X).logits
    assert main(["convert", "--from", str(tmp_path / "neox"), "--to", "canonical", "--out", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "source load (ours vs transformers" in out and "rotary pivot ratio" in out
    assert json.loads((tmp_path / "c" / "config.json").read_text())["family"] == "gpt_neox"
    assert main(["convert", "--from", str(tmp_path / "c"), "--to", "hf", "--out", str(tmp_path / "h")]) == 0
    back = tf.AutoModelForCausalLM.from_pretrained(str(tmp_path / "h"), dtype=torch.float64).eval()
    assert isinstance(back, tf.GPTNeoXForCausalLM)
    got = back(X).logits
    assert ((got - ref).abs().max() / ref.abs().max()).item() <= tol


def test_params_reads_a_neox_folder_and_the_pythia_shape(tmp_path, capsys):
    neox_folder(tmp_path / "neox", torch.float32)
    assert main(["params", "--from", str(tmp_path / "neox"), "--json"]) == 0
    rows = {r["attention"]: r for r in json.loads(capsys.readouterr().out)}
    r, rot, H, L = 8, 2, 4, 2
    assert rows["canonical"]["removed"] == L * H * (rot + (r - rot) ** 2 + r * r)
    assert main(["params", "--preset", "pythia-160m", "--json"]) == 0
    rows = {r["attention"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["standard"]["params"] == rows["standard"]["published"] == 162_322_944
