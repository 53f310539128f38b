"""End-to-end: `iattn convert` and `iattn params` on a GPT-NeoX folder, the third family: to canonical and back to a
folder transformers loads, exactly in float64 and within 1e-5 in float32; the counts from its config.json."""

import json
import os
import sys

import pytest
import torch

from fixtures import hf_folder
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


# The files a command reads, counted where Python opens them (the "open" audit event: builtins.open, io.open,
# os.open, pathlib), whoever opens them: ours, transformers, huggingface_hub. A hook stays for the process: it counts
# only while a test watches.
_WATCHED: dict[str, list[str]] = {}


def _count_opens(event, args):
    if event != "open" or not _WATCHED or not isinstance(args[0], (str, bytes, os.PathLike)):
        return
    path = os.path.abspath(os.fsdecode(args[0]))
    if path in _WATCHED:
        frame, copied = sys._getframe(1), False
        while frame is not None and not copied:  # a file copied through (shutil) is not parsed
            copied, frame = frame.f_code.co_filename.endswith(f"{os.sep}shutil.py"), frame.f_back
        _WATCHED[path].append("copied" if copied else "read")


sys.addaudithook(_count_opens)


@pytest.mark.parametrize("kind, generation", [("GPT2", True), ("Qwen2", True), ("Llama", False), ("GPTNeoX", True)])
def test_convert_reads_config_json_once_and_the_generation_config_once(tmp_path, capsys, kind, generation):
    """`iattn convert --from HF --to canonical`, whole (GPT-2) or streamed (the rotary families): the folder is read
    once where the command meets it and passed down, so config.json is opened once (it was 4-5 times), the
    generation config once where there is one (and config.json not again in its stead where there is none)."""
    src = hf_folder(tmp_path / "hf", kind)
    if not generation:
        (src / "generation_config.json").unlink()
    config, gen = (str((src / name).absolute()) for name in ("config.json", "generation_config.json"))
    _WATCHED.update({config: [], gen: []})
    try:
        assert main(["convert", "--from", str(src), "--to", "canonical", "--out", str(tmp_path / "c")]) == 0
        opened = {name: list(_WATCHED[path]) for name, path in (("config", config), ("generation", gen))}
    finally:
        _WATCHED.clear()
    assert "conversion (converted vs source" in capsys.readouterr().out
    assert opened["config"] == ["read"]
    assert opened["generation"].count("read") == (1 if generation else 0)
