"""Interop files: converted and exported model folders (damaged, non-finite, of another dtype, an index pointing
outside the folder), an HF config.json against its weights, untied heads, exports that score as their run, load
in transformers and get the umask's modes."""

import json
import math
import os
import random
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from helpers import copy_tree as _copy
from helpers import eval_ppl as _ppl
from helpers import garbage as _garbage
from helpers import one_line_error, tiny_overrides, write_corpus
from helpers import one_line_naming as _one_line_naming
from helpers import plant as _plant
from helpers import refused as _refused
from helpers import rewrite_safetensors as _rewrite
from helpers import run_cli as _run
from iattention.cli import main

# ------------------------------------------------------------------ damaged converted and exported folders
MODEL_FILES = {  # folder (from the fixture) -> its files and their kinds
    "canonical": {"model.safetensors": "safetensors", "config.json": "json", "iattention-data.json": "json"},
    "hf": {"model.safetensors": "safetensors", "config.json": "json", "iattention-data.json": "json"},
}


@pytest.mark.slow
@pytest.mark.parametrize("folder,name", [(f, n) for f, files in MODEL_FILES.items() for n in files])
def test_garbage_in_a_converted_or_exported_model_is_one_line(finished, folder, name, tmp_path, capsys):
    kind = MODEL_FILES[folder][name]
    src = finished["root"] / folder
    rng = random.Random(f"hostile:{folder}/{name}")
    for i, (label, data) in enumerate(_garbage((src / name).read_bytes(), kind, rng).items()):
        case = tmp_path / str(i)
        shutil.copytree(src, case)
        (case / name).write_bytes(data)
        for argv in (["eval", str(case)], ["convert", "--from", str(case), "--to", "standard", "--out",
                                           str(tmp_path / f"out{i}")]):
            code = _run(argv)
            _one_line_naming(capsys, code, name, f"{folder}/{name} ({label}) under {argv[0]}")
            assert not (tmp_path / f"out{i}").exists()


@pytest.mark.slow
@pytest.mark.parametrize("value", [math.nan, -math.inf])
def test_non_finite_weights_in_an_hf_folder_are_refused(env, tmp_path, capsys, value):
    hf = _copy(env["root"] / "hf", tmp_path / "hf")
    key = next(k for k in load_file(str(hf / "model.safetensors")) if k.endswith("h.0.attn.c_proj.weight"))
    _rewrite(hf / "model.safetensors", _plant(value, key))
    _refused(capsys, ["convert", "--from", hf, "--to", "canonical", "--out", tmp_path / "out"],
             "h.0.attn.c_proj.weight", "non-finite")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float16, torch.int64])
def test_an_hf_folder_with_a_tensor_of_another_dtype_is_refused(env, tmp_path, capsys, dtype):
    hf = _copy(env["root"] / "hf", tmp_path / "hf")
    key = next(k for k in load_file(str(hf / "model.safetensors")) if k.endswith("h.0.mlp.c_fc.weight"))

    def cast(tensors):
        tensors[key] = (tensors[key] * 1000).to(dtype)
    _rewrite(hf / "model.safetensors", cast)
    _refused(capsys, ["convert", "--from", hf, "--to", "standard", "--out", tmp_path / "out"],
             "h.0.mlp.c_fc.weight", str(dtype).replace("torch.", ""))


@pytest.mark.slow
def test_an_hf_index_pointing_outside_the_folder_is_refused(env, tmp_path, capsys):
    hf = _copy(env["root"] / "hf", tmp_path / "hf")
    (tmp_path / "outside").mkdir()
    shutil.move(hf / "model.safetensors", tmp_path / "outside" / "w.safetensors")
    keys = list(load_file(str(tmp_path / "outside" / "w.safetensors")))
    (hf / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: "../outside/w.safetensors" for k in keys}}))
    _refused(capsys, ["convert", "--from", hf, "--to", "standard", "--out", tmp_path / "out"],
             "model.safetensors.index.json", "../outside/w.safetensors")


# ------------------------------------------------------------------ HF config.json against its weights
@pytest.mark.slow
@pytest.mark.parametrize("key,value", [("layer_norm_epsilon", "1e-5"), ("n_inner", "big"), ("resid_pdrop", [0.1]),
                                       ("scale_attn_weights", "yes")])
def test_hf_config_of_wrong_types_is_one_line(run, tmp_path, capsys, key, value):
    hf = tmp_path / "hf"
    assert main(["convert", "--from", str(run["run"]), "--to", "hf", "--out", str(hf)]) == 0
    cfg = json.loads((hf / "config.json").read_text())
    cfg[key] = value
    (hf / "config.json").write_text(json.dumps(cfg))
    capsys.readouterr()
    for argv in (["eval", str(hf)], ["convert", "--from", str(hf), "--to", "canonical", "--out", str(tmp_path / "c")]):
        # the message every family's config.json gets (interop/hf.py, _read_config)
        one_line_error(capsys, main(argv), str(hf / "config.json"), f"{key} is ")


def _hf_folder(folder, tie: bool, same_head: bool = False) -> None:
    """A small HF GPT-2 folder (byte tokenizer spec beside it) saved by transformers itself."""
    import torch
    import transformers

    cfg = transformers.GPT2Config(vocab_size=256, n_positions=32, n_embd=32, n_layer=1, n_head=2,
                                  tie_word_embeddings=tie, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg)
    if same_head:
        with torch.no_grad():
            model.lm_head.weight.copy_(model.transformer.wte.weight)
    model.save_pretrained(folder)
    (folder / "iattention-data.json").write_text(json.dumps({"dataset": "text", "tokenizer": "byte"}))


@pytest.mark.parametrize("key,delta", [("vocab_size", 1), ("vocab_size", -7), ("n_positions", 8), ("n_embd", 16)])
def test_an_hf_config_whose_sizes_disagree_with_the_weights_names_the_disagreement(tmp_path, capsys, key, delta):
    """`vocab_size` or `n_positions` in config.json other than the weights' shapes: the message was transformers'
    text cut mid-word ("...look at the above r") with the wrong fix. Now: the key, both sizes, the fix."""
    _hf_folder(tmp_path / "hf", tie=True)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config[key] += delta
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    (tmp_path / "t.txt").write_text("the cat sat on the mat. " * 20)
    for argv in (["eval", str(tmp_path / "hf"), "--text", str(tmp_path / "t.txt")],
                 ["convert", "--from", str(tmp_path / "hf"), "--to", "canonical", "--out", str(tmp_path / "c")]):
        line = one_line_error(capsys, main(argv), f"{key}={config[key]}", "disagree")
        assert str(config[key] - delta) in line


def test_an_hf_folder_s_sampling_defaults_travel_through_whole_model_conversions(tmp_path, capsys):
    """generation_config.json (do_sample, temperature, top_p: a fine-tune's sampling defaults) of a GPT-2 folder:
    --to canonical keeps a copy and says so, and --to hf of that checkpoint, or of the folder itself, writes it
    with the exported end-of-text ids (before: transformers' defaults, the sampling settings lost; the streamed
    conversion of the other families always copied it). An unreadable one is one line and writes nothing."""
    import transformers

    _hf_folder(tmp_path / "hf", tie=True)
    gen = dict(do_sample=True, temperature=0.7, top_p=0.9, max_new_tokens=17)
    transformers.GenerationConfig(**gen).save_pretrained(str(tmp_path / "hf"))
    assert main(["convert", "--from", str(tmp_path / "hf"), "--to", "canonical", "--out", str(tmp_path / "c")]) == 0
    assert "copied generation_config.json" in capsys.readouterr().out
    source = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert json.loads((tmp_path / "c" / "generation_config.json").read_text()) == source
    for src, out in (("c", "back"), ("hf", "direct")):
        assert main(["convert", "--from", str(tmp_path / src), "--to", "hf", "--out", str(tmp_path / out)]) == 0
        got = transformers.GenerationConfig.from_pretrained(str(tmp_path / out))
        assert {k: getattr(got, k) for k in gen} == gen, out
        assert got.eos_token_id == got.bos_token_id == 256  # the byte tokenizer's added end-of-text
    # values transformers only warns about on reading (temperature without sampling, common on the Hub) and
    # would refuse to save: written as they are, as the streamed conversion copies them
    (tmp_path / "hf" / "generation_config.json").write_text('{"do_sample": false, "temperature": 0.7}')
    assert main(["convert", "--from", str(tmp_path / "hf"), "--to", "hf", "--out", str(tmp_path / "odd")]) == 0
    assert json.loads((tmp_path / "odd" / "generation_config.json").read_text()) == dict(
        do_sample=False, temperature=0.7, bos_token_id=256, eos_token_id=256)
    for text, why in (('{"temperature": ', "not valid JSON"), ("[1, 2]", "not a JSON object"),
                      ('{"max_new_tokens": 0}', "refused by transformers (`max_new_tokens` must be greater than 0")):
        (tmp_path / "hf" / "generation_config.json").write_text(text)
        for to in ("canonical", "hf"):
            out = tmp_path / f"bad-{to}"
            one_line_error(capsys, main(["convert", "--from", str(tmp_path / "hf"), "--to", to, "--out", str(out)]),
                           "generation_config.json", why, "fix or remove")
            assert not out.exists()
        (tmp_path / "t.txt").write_text("the cat sat on the mat. " * 20)  # eval reads the folder as transformers
        one_line_error(capsys, main(["eval", str(tmp_path / "hf"), "--text", str(tmp_path / "t.txt")]),
                       "generation_config.json", why)


def test_shard_size_shards_every_hf_export_and_is_refused_where_it_cannot_act(tmp_path, capsys):
    """--shard-size was read only by the streamed routes: a GPT-2 folder's or a run's --to hf wrote one file at
    any size, without a word. Now a whole-model export is sharded as save_pretrained shards (and loads in
    transformers as the unsharded one), and a whole-model conversion to canonical, which writes one file, refuses
    it in one line before any work."""
    import transformers

    _hf_folder(tmp_path / "hf", tie=True)
    assert main(["convert", "--from", str(tmp_path / "hf"), "--to", "hf", "--out", str(tmp_path / "one")]) == 0
    assert main(["convert", "--from", str(tmp_path / "hf"), "--to", "hf", "--shard-size", "20KB",
                 "--out", str(tmp_path / "many")]) == 0
    shards = sorted(p.name for p in (tmp_path / "many").glob("model-*.safetensors"))
    assert len(shards) > 1 and (tmp_path / "many" / "model.safetensors.index.json").is_file()
    assert max(p.stat().st_size for p in (tmp_path / "many").glob("model-*.safetensors")) < 40_000
    x = torch.randint(0, 256, (1, 16))
    logits = [transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / f)).eval()(x).logits
              for f in ("one", "many")]
    assert torch.equal(logits[0], logits[1])
    capsys.readouterr()
    one_line_error(capsys, main(["convert", "--from", str(tmp_path / "hf"), "--to", "canonical", "--shard-size",
                                 "20KB", "--out", str(tmp_path / "c")]), "--shard-size", "drop --shard-size")
    assert not (tmp_path / "c").exists()


# ------------------------------------------------------------------ untied output heads
@pytest.mark.parametrize("command", ["eval", "convert"])
def test_an_untied_hf_head_is_refused_not_evaluated_as_tied(tmp_path, capsys, command):
    """`tie_word_embeddings: false` with its own lm_head.weight: our GPT ties the head to the embedding, so one
    of the two tensors was silently used for both (perplexity 4,957,763 where transformers gives 1,064.5)."""
    _hf_folder(tmp_path / "hf", tie=False)
    (tmp_path / "t.txt").write_text("the cat sat on the mat. " * 20)
    argv = (["eval", str(tmp_path / "hf"), "--text", str(tmp_path / "t.txt")] if command == "eval" else
            ["convert", "--from", str(tmp_path / "hf"), "--to", "canonical", "--out", str(tmp_path / "c")])
    one_line_error(capsys, main(argv), "tie_word_embeddings", "lm_head.weight")
    assert "perplexity" not in capsys.readouterr().out and not (tmp_path / "c").exists()


def test_an_untied_hf_folder_whose_head_equals_its_embedding_scores_as_transformers_does(tmp_path, capsys):
    """Untied in name only (the two tensors are equal): the same function, so it loads, and our logits are
    transformers' own."""
    import torch
    import transformers

    from iattention.interop.hf import from_hf

    _hf_folder(tmp_path / "hf", tie=False, same_head=True)
    ours = from_hf(tmp_path / "hf")
    theirs = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "hf")).eval()
    x = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        assert torch.allclose(ours(x)[0][..., :256], theirs(x).logits, atol=1e-5)


# ------------------------------------------------------------------ exports: scores, end-of-text, clients, modes
@pytest.mark.parametrize("tokenizer,family", [("byte", "gpt2"), ("bpe:300", "gpt2"), ("byte", "gpt_neox")])
def test_an_export_scores_every_text_exactly_as_its_run(tmp_path, capsys, tokenizer, family):
    """The export adds an end-of-text token (lm-eval needs one); its zero row had logit 0 and took probability
    from every real token: the export's perplexity was 0.43% above the run's. Now its logit is far below every
    real one: the export, and the export imported back, score as the run does (1e-6 relative, float32); the
    token is still bos and eos. GPT-NeoX too (untied head, final LayerNorm with a bias): its row was left zero,
    and lm-eval scored its exports 0.16% above iattn eval (benchmarks/interop_check.py)."""
    paths = write_corpus(tmp_path)
    run = tmp_path / "run"
    ov = tiny_overrides(paths, tmp_path / "cache", **{"train.epochs": 1, "data.tokenizer": tokenizer,
                                                      "model.family": family})
    assert main(["train", "--preset", "tiny", "--quiet", *ov, "--out", str(run)]) == 0
    assert main(["convert", "--from", str(run), "--to", "hf", "--out", str(tmp_path / "hf")]) == 0
    assert main(["convert", "--from", str(tmp_path / "hf"), "--to", "standard", "--out", str(tmp_path / "back")]) == 0
    capsys.readouterr()
    ours = _ppl(capsys, run, "--split", "test")
    for exported in (tmp_path / "hf", tmp_path / "back"):
        assert abs(_ppl(capsys, exported, "--split", "test") / ours - 1) < 1e-6, exported
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["eos_token_id"] == config["bos_token_id"] == config["vocab_size"] - 1


def test_an_export_without_biases_says_its_end_of_text_token_takes_probability(tmp_path, capsys):
    """No final LayerNorm bias: no row can have a constant logit, so the token keeps logit 0, and convert
    says so in one warning (never a silently different number)."""
    paths = write_corpus(tmp_path)
    ov = tiny_overrides(paths, tmp_path / "cache", **{"train.epochs": 1, "model.bias": "false"})
    assert main(["train", "--preset", "tiny", "--quiet", *ov, "--out", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    assert main(["convert", "--from", str(tmp_path / "run"), "--to", "hf", "--out", str(tmp_path / "hf")]) == 0
    assert "end-of-text token 256" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("tokenizer", ["byte", "bpe:300"])
def test_export_loads_in_transformers_with_eos_max_length_class_and_card(tmp_path, tokenizer):
    """AutoTokenizer + AutoModelForCausalLM load the export offline: a class transformers 4.x knows, an
    end-of-text token whose logit is far below every real one (every other logit as ours), model_max_length =
    block size, and a model card naming the variant, counts, metrics and command."""
    from iattention import load_run

    paths = write_corpus(tmp_path)
    run, hf = tmp_path / "run", tmp_path / "hf"
    assert main(["train", "--preset", "tiny", "--out", str(run), "--quiet", *tiny_overrides(
        paths, tmp_path / "cache", **{"data.tokenizer": tokenizer, "train.epochs": 1,
                                      "model.attention": "canonical"})]) == 0
    assert main(["convert", "--from", str(run), "--to", "hf", "--out", str(hf)]) == 0
    config = json.loads((hf / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and "backend" not in config
    # BPE merges as "a b" strings: the tokenizers of transformers 4.40-4.44 (0.19) read no other form
    merges = json.loads((hf / "tokenizer.json").read_text())["model"].get("merges")
    assert tokenizer == "byte" or (merges and all(isinstance(m, str) and m.count(" ") == 1 for m in merges))
    model, ours_tok = load_run(run)
    V, T = model.config.vocab_size, model.config.block_size
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    code = f"""
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained({str(hf)!r})
m = AutoModelForCausalLM.from_pretrained({str(hf)!r}).eval()
ids = tok("the cat sat on a mat. a dog")["input_ids"]
long = tok("the cat sat " * 40, truncation=True)["input_ids"]
with torch.no_grad():
    logits = m(torch.tensor([ids])).logits[0]
print(json.dumps(dict(cls=type(tok).__name__, eos=tok.eos_token_id, bos=tok.bos_token_id, eos_tok=tok.eos_token,
                      max_len=tok.model_max_length, n_long=len(long), ids=ids, logits=logits.tolist(),
                      gen_eos=m.generation_config.eos_token_id, cfg_eos=m.config.eos_token_id)))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["eos_tok"] == "<|endoftext|>" and got["eos"] == got["bos"] == V  # added, past our vocabulary
    assert got["gen_eos"] == got["cfg_eos"] == V
    assert got["max_len"] == T and got["n_long"] == T
    assert got["ids"] == ours_tok.encode("the cat sat on a mat. a dog").tolist()
    theirs = torch.tensor(got["logits"], dtype=torch.float64)
    with torch.no_grad():
        mine = model(torch.tensor([got["ids"]]))[0][0].double()
    assert theirs.shape == (len(got["ids"]), V + 1)
    assert (theirs[:, :V] - mine).abs().max() < 1e-4
    assert torch.all(theirs[:, V] <= theirs[:, :V].min(-1).values - 1000)  # the added token takes no probability
    card = (hf / "README.md").read_text()
    summary = json.loads((run / "summary.json").read_text())
    for needed in ("canonical", f"{model.num_params():,}", f"{summary['best_val_ppl']:.3f}", "iattn convert",
                   tokenizer, "AutoModelForCausalLM", "TransformerBridge", "lm-evaluation-harness"):
        assert needed in card, needed


def test_gpt2_export_uses_its_own_end_of_text(tmp_path):
    from helpers import shared_data_dir
    from iattention.data.tokenizers import Tokenizer
    from iattention.interop.hf_tokenizer import save_hf_tokenizer

    if shared_data_dir() is None:
        pytest.skip("../shared/data not present")
    from iattention.data import DataConfig
    from iattention.data.tokenizers import load_tokenizer

    tok: Tokenizer = load_tokenizer(DataConfig(tokenizer="gpt2", data_dir=shared_data_dir()))
    assert save_hf_tokenizer(tok, tmp_path, model_max_length=1024) == 50256
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and config["model_max_length"] == 1024
    assert config["eos_token"] == config["bos_token"] == "<|endoftext|>"


def test_an_export_gets_the_umask_s_modes(tmp_path, run_and_corpus):
    """transformers writes model.safetensors 0600; every file of the export is 0666 & ~umask."""
    old = os.umask(0o022)
    try:
        assert main(["convert", "--from", str(run_and_corpus["run"]), "--to", "hf", "--out", str(tmp_path / "hf")]) == 0
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "hf").iterdir()}
    assert modes["model.safetensors"] == 0o644 and set(modes.values()) == {0o644}, modes


@pytest.mark.slow
def test_a_converted_model_folder_respects_the_umask(corpus, tmp_path, capsys):
    """Before: a converted model's folder kept mkdtemp's 0700 (and its checkpoint mkstemp's 0600)."""
    import torch

    from iattention.checkpoint.state import save_checkpoint
    from iattention.model.gpt import GPT
    from iattention.train import load_config

    cfg = load_config("tiny", None, [*corpus["ov"], "model.vocab_size=256"])
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "m.safetensors", GPT(cfg.model), {"config": cfg.to_dict()})
    old = os.umask(0o022)
    try:
        assert main(["convert", "--from", str(tmp_path / "m.safetensors"), "--to", "canonical",
                     "--out", str(tmp_path / "c")]) == 0
    finally:
        os.umask(old)
    assert (tmp_path / "c").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "c" / "model.safetensors").stat().st_mode & 0o777 == 0o644
