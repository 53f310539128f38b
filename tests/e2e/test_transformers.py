"""Folders iattention writes, read by transformers (issue 66 §1-2): `iattn convert --to canonical` (and standard) of a
GPT-2, a Llama (grouped-query) and a GPT-NeoX transformers folder carries an auto_map and a shim, so
AutoModelForCausalLM reads it with trust_remote_code=True in a process that never imported iattention; it is the
model iattention reads, bit for bit in float64; its `labels` loss is `iattn eval`'s, its greedy `generate` (with
transformers' cache) `iattn generate`'s, its bf16 load keeps RoPE exact, its num_parameters() is `iattn params`'.
The model class on its own: tests/unit/hf_model/test_modeling.py."""

import json
import subprocess
import sys

import pytest
import torch

from fixtures import hf_folder
from helpers import run_cli, subprocess_env

tf = pytest.importorskip("transformers")
tf.utils.logging.set_verbosity_error()

from iattention import load_run  # noqa: E402
from iattention.checkpoint.beside import SHIM  # noqa: E402
from iattention.data.dataset import eval_windows  # noqa: E402
from iattention.hf_model import IAttentionForCausalLM  # noqa: E402
from iattention.interop.load import load_any  # noqa: E402

KINDS = {"gpt2": "GPT2", "llama": "Llama", "gpt_neox": "GPTNeoX"}  # fixtures.hf_folder's names
VARIANTS = ("canonical", "standard")
TEXT = "the cat sat on the mat . the dog ran to the park , and the cat saw it . = Heading = \n" * 3


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """{(family, variant): folder}: each family's transformers folder (with its own tokenizer) converted by `iattn
    convert`, and the source folders under (family, "hf")."""
    root = tmp_path_factory.mktemp("folders")
    out = {}
    for family, kind in KINDS.items():
        src = out[family, "hf"] = hf_folder(root / family, kind)
        for variant in VARIANTS:
            out[family, variant] = root / f"{family}-{variant}"
            assert run_cli(["convert", "--from", src, "--to", variant, "--out", out[family, variant]]) == 0
    return out


CASES = [(f, v) for f in KINDS for v in VARIANTS]
FRESH = """
import json, sys, torch
from transformers import AutoModelForCausalLM
assert not any(m.split(".")[0] == "iattention" for m in sys.modules)
out = {}
for folder in sys.argv[2:]:
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, dtype=torch.float64)
    out[folder] = [type(model).__name__, model(torch.tensor(json.loads(sys.argv[1]))).logits.tolist()]
print(json.dumps(out))
"""
IDS = [[5, 9, 14, 3, 22, 7, 11, 2], [1, 17, 4, 30, 8, 12, 6, 19]]


@pytest.mark.slow
def test_a_converted_folder_loads_with_trust_remote_code_in_a_fresh_interpreter(folders, tmp_path):
    """Bit for bit in float64 the model iattention's loader reads from the same folder, for every family and variant;
    and a folder save_pretrained wrote too."""
    saved = tmp_path / "saved"
    AutoModel = tf.AutoModelForCausalLM
    AutoModel.from_pretrained(folders["llama", "canonical"]).save_pretrained(saved)
    paths = [str(folders[c]) for c in CASES] + [str(saved)]
    for p in paths:
        config = json.loads((tmp_path / p / "config.json").read_text())
        assert config["auto_map"]["AutoModelForCausalLM"] == f"{SHIM.removesuffix('.py')}.IAttentionForCausalLM"
    env = subprocess_env(HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, "-c", FRESH, json.dumps(IDS), *paths], env=env, capture_output=True,
                          text=True, check=True)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    for p in paths:
        name, logits = got[p]
        assert name == "IAttentionForCausalLM"
        ours = load_any(p)[0].double()
        assert torch.equal(torch.tensor(logits, dtype=torch.float64), ours(torch.tensor(IDS))[0]), p


NOT_INSTALLED = """
import importlib.abc, sys
class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "iattention":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NotInstalled())
from transformers import AutoModelForCausalLM
AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True)
"""


@pytest.mark.slow
def test_without_iattention_installed_the_shim_says_so_in_one_line(folders, tmp_path):
    env = subprocess_env(HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, "-c", NOT_INSTALLED, str(folders["gpt2", "canonical"])], env=env,
                          capture_output=True, text=True)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: this folder holds an iattention model") and "pip install iattention" in last


@pytest.mark.parametrize("family,variant", CASES)
def test_registered_auto_classes_read_the_folder_as_iattention_does(folders, family, variant):
    """Imported (iattention.hf_model), the classes are registered: no trust_remote_code needed. float64 logits equal
    ours bit for bit; the labels loss equals GPT.forward's loss on the shifted targets."""
    folder = folders[family, variant]
    model = tf.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64)
    assert isinstance(model, IAttentionForCausalLM)
    ours = load_any(folder)[0].double()
    x = torch.tensor(IDS)
    out = model(input_ids=x, labels=x)
    assert torch.equal(out.logits, ours(x)[0])
    assert torch.equal(out.loss, ours(x[:, :-1], x[:, 1:])[1]) or abs(out.loss - ours(x[:, :-1], x[:, 1:])[1]) < 1e-12


@pytest.mark.parametrize("family,variant", CASES)
def test_the_labels_loss_is_iattn_eval_s(folders, tmp_path, capsys, family, variant):
    """float32, as `iattn eval` runs the folder: the mean loss of transformers' labels over iattn eval's windows."""
    folder = folders[family, variant]
    (tmp_path / "t.txt").write_text(TEXT)
    assert run_cli(["eval", folder, "--text", tmp_path / "t.txt", "--block-size", 16, "--json"]) == 0
    theirs = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    _, tok = load_run(folder)
    tokens = tok.encode(TEXT)
    model = tf.AutoModelForCausalLM.from_pretrained(folder).eval()
    nll, n = 0.0, 0
    with torch.no_grad():
        for start, length in eval_windows(len(tokens), 16):
            window = torch.as_tensor(tokens[start: start + length + 1], dtype=torch.long)[None]
            nll += model(input_ids=window, labels=window).loss.double().item() * length
            n += length
    assert n == theirs["tokens"]
    assert abs(nll / n - theirs["loss"]) <= 1e-6 * theirs["loss"], (nll / n, theirs["loss"])


@pytest.mark.parametrize("family,variant", CASES)
def test_generate_with_transformers_cache_is_iattn_generate_greedy(folders, capsys, family, variant):
    folder = folders[family, variant]
    prompt = "the cat sat"
    assert run_cli(["generate", folder, "--prompt", prompt, "--temperature", 0, "--max-new-tokens", 12]) == 0
    printed = capsys.readouterr().out
    model = tf.AutoModelForCausalLM.from_pretrained(folder).eval()
    _, tok = load_run(folder)
    ids = torch.as_tensor(tok.encode(prompt), dtype=torch.long)[None]
    out = model.generate(input_ids=ids, max_new_tokens=12, min_new_tokens=12, do_sample=False, use_cache=True,
                         pad_token_id=0, return_dict_in_generate=True, output_logits=True)
    assert isinstance(out.cache, tf.DynamicCache) and out.cache.get_seq_length() == ids.shape[1] + 11
    new = out.sequences[0, ids.shape[1]:].tolist()
    ours = load_run(folder)[0]
    assert ours.generate(ids, 12, temperature=0)[0, ids.shape[1]:].tolist() == new  # iattn generate's, token for token
    # each cached step's logits are those of the whole sequence's forward pass (argmax alone may hide a cache bug)
    whole = ours(out.sequences[:, :-1])[0][0, ids.shape[1] - 1:]
    assert torch.allclose(torch.cat(out.logits), whole, rtol=0, atol=1e-5 * whole.abs().max().item())
    text = tok.decode_bytes(new).decode("utf-8", errors="replace") if tok.exact_bytes else tok.decode(new)
    assert printed == prompt + text + "\n"  # and what it printed (cli/generate.py's continuation)


@pytest.mark.parametrize("family", ["llama", "gpt_neox"])
def test_bf16_loading_of_a_converted_folder_keeps_rope_exact(folders, family):
    folder = folders[family, "canonical"]
    half = tf.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    assert half.dtype == torch.bfloat16
    rope = half.transformer.rotary_emb
    ours = load_any(folder)[0]
    assert rope.inv_freq.dtype == torch.float32 and torch.equal(rope.inv_freq, ours.transformer.rotary_emb.inv_freq)
    x = torch.tensor(IDS)
    assert torch.equal(half(input_ids=x).logits, ours.to(torch.bfloat16)(x)[0])


@pytest.mark.parametrize("family", KINDS)
def test_num_parameters_is_iattn_params_for_the_variant(folders, capsys, family):
    assert run_cli(["params", "--from", folders[family, "hf"], "--json"]) == 0
    rows = {r["attention"]: r["params"] for r in json.loads(capsys.readouterr().out)}
    for variant in VARIANTS:
        model = tf.AutoModelForCausalLM.from_pretrained(folders[family, variant])
        assert model.num_parameters() == rows[variant], (family, variant)
        assert model.num_parameters(only_trainable=True) == rows[variant]
