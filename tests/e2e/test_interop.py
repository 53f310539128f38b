"""End-to-end tests: interop."""

import os
import subprocess
import sys

import pytest
import torch

from fixtures import HF_SHAPES, hf_gpt2, hf_tokens
from helpers import max_rel
from iattention.interop import from_hf, load_model

tf = pytest.importorskip("transformers")


def _row(card, label):
    return next(line for line in card.splitlines() if line.startswith(f"| {label}"))


def _hf_perplexity(hf, tokens, block, stride):
    """The transformers guide's strided perplexity, computed with the HF model itself; the number of
    scored tokens is counted exactly (labels after the model's internal shift that are not -100)."""
    ids = torch.tensor(tokens, dtype=torch.long)[None]
    n, nll_sum, count, prev_end = ids.shape[1], 0.0, 0, 0
    for begin in range(0, n, stride):
        end = min(begin + block, n)
        trg_len = end - prev_end
        input_ids = ids[:, begin:end]
        target_ids = input_ids.clone()
        target_ids[:, :-trg_len] = -100
        scored = int((target_ids[:, 1:] != -100).sum())
        with torch.no_grad():
            loss = hf(input_ids, labels=target_ids).loss
        if scored:
            nll_sum += loss.item() * scored
            count += scored
        prev_end = end
        if end == n:
            break
    return float(torch.exp(torch.tensor(nll_sum / count, dtype=torch.float64))), count


@pytest.mark.slow
def test_saved_hf_folder_reloads_and_cli_round_trip(tmp_path):
    hf = hf_gpt2(dtype=torch.float32, **HF_SHAPES[0])
    hf.save_pretrained(tmp_path / "src")
    ref = hf(hf_tokens()).logits
    cli = [sys.executable, "-m", "iattention", "convert"]
    r = subprocess.run([*cli, "--from", str(tmp_path / "src"), "--to", "canonical", "--out", str(tmp_path / "canon"),
                        "--per-head"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "max abs logit difference" in r.stdout
    assert "pivoted used" in r.stdout  # the default block is the well-conditioned one
    # per layer the worst head's pass (key) and output block, pivoted | aligned; --per-head: each head's, pivoted
    lines = r.stdout.splitlines()
    assert sum(line.startswith("  layer ") for line in lines) == 2
    for i, line in enumerate(lines):
        if line.startswith("  layer "):
            worst = [float(p.split()[3]) for p in line.split(": ", 1)[1].split("; ")]  # "pass cond max 8.1 | 56"
            heads = [[float(c) for c in lines[i + k].split()[1:]] for k in (1, 2)]
            assert [lines[i + k].split()[0] for k in (1, 2)] == ["pass", "output"] and len(heads[0]) == 3
            assert worst == [max(h) for h in heads] and min(worst) >= 1
    canon, _ = load_model(tmp_path / "canon")
    assert canon.config.attention == "canonical"
    assert max_rel(canon(hf_tokens())[0], ref) <= 1e-4
    r = subprocess.run([*cli, "--from", str(tmp_path / "canon"), "--to", "hf", "--out", str(tmp_path / "back")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    back = tf.GPT2LMHeadModel.from_pretrained(str(tmp_path / "back")).eval()
    assert max_rel(back(hf_tokens()).logits, ref) <= 1e-4
    assert {"config.json", "model.safetensors"} <= {p.name for p in (tmp_path / "back").iterdir()}


@pytest.mark.slow
@pytest.mark.parametrize("stride", [32, 16])
def test_eval_of_hf_folder_and_its_canonical_form_matches_transformers(tmp_path, capsys, stride):
    """`iattn eval` reads an HF folder directly; its strided perplexity equals the transformers
    computation to 1e-4 relative, and so does the same model converted to canonical."""
    import json

    from helpers import write_corpus
    from iattention.cli import main
    from iattention.data import DataConfig, load_data

    paths = write_corpus(tmp_path, n_eval=3000)
    torch.manual_seed(0)
    cfg = tf.GPT2Config(vocab_size=256, n_positions=32, n_embd=32, n_layer=2, n_head=2, bos_token_id=None,
                        eos_token_id=None)
    hf = tf.GPT2LMHeadModel(cfg).eval()
    hf.save_pretrained(tmp_path / "hf")
    spec = dict(dataset="text", tokenizer="byte", cache_dir=str(tmp_path / "cache"), **paths)
    (tmp_path / "hf" / "iattention-data.json").write_text(json.dumps(spec))
    tokens = load_data(DataConfig(**spec), splits=("test",)).splits["test"]
    ref, ref_count = _hf_perplexity(hf, tokens.tolist(), 32, stride)

    assert main(["eval", str(tmp_path / "hf"), "--stride", str(stride), "--json"]) == 0
    ours = json.loads(capsys.readouterr().out)
    assert ours["tokens"] == ref_count and abs(ours["ppl"] - ref) / ref <= 1e-4, (ours, ref)
    assert main(["convert", "--from", str(tmp_path / "hf"), "--to", "canonical", "--out", str(tmp_path / "c")]) == 0
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "c"), "--stride", str(stride), "--json"]) == 0
    canon = json.loads(capsys.readouterr().out)
    assert canon["tokenizer"] == "byte"  # the converted folder carries its tokenizer spec
    assert abs(canon["ppl"] - ref) / ref <= 1e-4


@pytest.mark.slow
def test_init_from_an_hf_folder_converts_to_canonical_exactly(tmp_path):
    """`iattn train --init-from HF_DIR model.attention=canonical`: step-0 validation loss is the HF model's."""
    import json
    import math

    from helpers import tiny_overrides, write_corpus
    from iattention.data import load_data
    from iattention.train import load_config, train
    from iattention.train.distributed import DistContext
    from iattention.train.evaluate import split_nll

    paths = write_corpus(tmp_path)
    torch.manual_seed(0)
    hf = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=256, n_positions=32, n_embd=32, n_layer=1, n_head=2,
                                          bos_token_id=None, eos_token_id=None)).eval()
    hf.save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "iattention-data.json").write_text(json.dumps({"tokenizer": "byte"}))
    cfg = load_config("tiny", None, tiny_overrides(paths, tmp_path / "cache", **{
        "train.epochs": 1, "model.attention": "canonical", "model.vocab_size": 256,
        "train.init_from": str(tmp_path / "hf")}))
    train(cfg, tmp_path / "ft", quiet=True)
    first = json.loads((tmp_path / "ft" / "metrics.jsonl").read_text().splitlines()[0])
    data = load_data(cfg.data, splits=("valid",))
    nll, n = split_nll(from_hf(tmp_path / "hf").float(), data.splits["valid"], 32, 64, DistContext())
    assert first["kind"] == "start" and math.isclose(first["val_loss"], nll / n, rel_tol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("tokenizer", ["byte", "bpe:300"])
def test_exported_folder_works_in_a_transformers_pipeline_like_iattn_generate(tmp_path, capsys, tokenizer):
    """`iattn convert --to hf` writes the run's tokenizer in transformers' form: AutoTokenizer and
    pipeline("text-generation") load the folder offline, and greedy text equals `iattn generate
    --temperature 0` on the run."""
    from helpers import tiny_overrides, write_corpus
    from iattention.cli import main

    ov = tiny_overrides(write_corpus(tmp_path), tmp_path / "cache", **{"data.tokenizer": tokenizer,
                                                                        "train.epochs": 1})
    run, hf = tmp_path / "run", tmp_path / "hf"
    assert main(["train", "--preset", "tiny", "--out", str(run), "--quiet", *ov]) == 0
    assert main(["convert", "--from", str(run), "--to", "hf", "--out", str(hf)]) == 0
    assert (hf / "tokenizer.json").is_file() and (hf / "tokenizer_config.json").is_file()
    capsys.readouterr()
    prompt = "the cat sat"  # 11 tokens + 16 new: within the block of 32 (HF GPT-2 cannot go past it)
    assert main(["generate", str(run), "--prompt", prompt, "--temperature", "0", "--max-new-tokens", "16"]) == 0
    ours = capsys.readouterr().out.rstrip("\n")
    tok = tf.AutoTokenizer.from_pretrained(str(hf))
    from iattention.data import DataConfig
    from iattention.data.dataset import tokenizer_of

    own = tokenizer_of(DataConfig(dataset="text", train=str(tmp_path / "train.txt"), tokenizer=tokenizer,
                                  cache_dir=str(tmp_path / "cache")))
    assert tok(prompt)["input_ids"] == own.encode(prompt).tolist()  # the same ids as the run's tokenizer
    pipe = tf.pipeline("text-generation", model=str(hf))
    theirs = pipe(prompt, max_new_tokens=16, do_sample=False)[0]["generated_text"]
    assert theirs == ours


@pytest.mark.slow
def test_load_run_gives_model_and_tokenizer_without_the_data(tmp_path):
    """iattention.load_run: a run folder (or its checkpoint) -> (model, its tokenizer); a bpe run keeps its
    tokenizer.json, so this works after the train text and the tokenizer cache are gone."""
    import shutil

    from helpers import tiny_overrides, write_corpus
    from iattention import load_run
    from iattention.cli import main

    paths = write_corpus(tmp_path)
    ov = tiny_overrides(paths, tmp_path / "cache", **{"data.tokenizer": "bpe:300", "train.epochs": 1})
    run = tmp_path / "run"
    assert main(["train", "--preset", "tiny", "--out", str(run), "--quiet", *ov]) == 0
    model, tok = load_run(run)
    ids = tok.encode("the cat sat on the mat")
    assert tok.name == "bpe:300" and tok.decode(ids) == "the cat sat on the mat" and len(ids) < 22
    logits, _ = model(torch.as_tensor(ids)[None])
    assert logits.shape == (1, len(ids), model.config.vocab_size) and tok.vocab_size == model.config.vocab_size
    os.remove(paths["train"])
    shutil.rmtree(tmp_path / "cache")
    model2, tok2 = load_run(run / "best.safetensors")
    assert tok2.encode("the cat sat on the mat").tolist() == ids.tolist()
    assert torch.equal(model2(torch.as_tensor(ids)[None])[0], logits)


def test_gpt2_tokenizer_exports_to_transformers_with_the_same_ids(tmp_path):
    from helpers import shared_data_dir
    from iattention.data import DataConfig
    from iattention.data.tokenizers import load_tokenizer
    from iattention.interop.hf_tokenizer import save_hf_tokenizer

    if shared_data_dir() is None:
        pytest.skip("../shared/data not present")
    ours = load_tokenizer(DataConfig(tokenizer="gpt2", data_dir=shared_data_dir()))
    save_hf_tokenizer(ours, tmp_path)
    theirs = tf.AutoTokenizer.from_pretrained(str(tmp_path))
    assert theirs("Hello world")["input_ids"] == [15496, 995]
    text = " = Valkyria Chronicles III = \n Senjō no Valkyria 3 : <unk> Chronicles ( Japanese : 戦場のヴァルキュリア3 )"
    assert theirs(text)["input_ids"] == ours.encode(text).tolist()
    assert theirs.eos_token_id == theirs.bos_token_id == 50256 and len(theirs) == 50257


@pytest.mark.parametrize("kind,kw", [("GPT2", dict(n_layer=2, n_head=4, n_embd=32, vocab_size=67, n_positions=16)),
                                     ("GPT2", dict(n_layer=1, n_head=2, n_embd=32, vocab_size=67, n_positions=16,
                                                   n_inner=48)),
                                     ("Llama", dict(num_key_value_heads=2, tie_word_embeddings=False)),
                                     ("Qwen2", dict(num_key_value_heads=1, tie_word_embeddings=True)),
                                     ("Mistral", dict(num_key_value_heads=2, head_dim=12))])
def test_params_from_an_hf_folder_counts_its_model(tmp_path, capsys, kind, kw):
    """`iattn params --from DIR` reads the folder's config.json (no weights): its standard row is the number of
    parameters transformers builds for that config, and canonical removes what it removes in a converted model."""
    import json

    import transformers

    from iattention.cli import main

    base = {} if kind == "GPT2" else dict(vocab_size=67, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                          num_attention_heads=4, max_position_embeddings=32)
    hf = getattr(transformers, f"{kind}LMHeadModel" if kind == "GPT2" else f"{kind}ForCausalLM")(
        getattr(transformers, f"{kind}Config")(**{**base, **kw}))
    hf.save_pretrained(tmp_path / "hf")
    assert main(["params", "--from", str(tmp_path / "hf"), "--json"]) == 0
    rows = {(r["attention"], r["n_head"]): r for r in json.loads(capsys.readouterr().out)}
    heads = hf.config.num_attention_heads
    assert rows["standard", heads]["params"] == sum(p.numel() for p in hf.parameters())
    from iattention.interop.convert import convert
    from iattention.interop.load import load_any

    src, _, _ = load_any(tmp_path / "hf")
    canonical, _ = convert(src, "canonical", dtype="float64")
    assert rows["canonical", heads]["params"] == sum(p.numel() for p in canonical.parameters()) - (
        canonical.config.padded_vocab_size - canonical.config.vocab_size) * canonical.config.n_embd


def test_a_card_written_from_a_run_in_a_tmp_folder_names_the_run_not_the_path(tmp_path):
    """`iattn convert --to hf` from a run at an absolute local path: the card's source row and its command
    hold the run's name, and the path above it appears nowhere in the card."""
    from helpers import make_model
    from iattention.cli import main
    from iattention.interop.convert import convert, save_converted

    src = make_model(dtype=torch.float32)
    canon, rep = convert(src, "canonical", dtype="float32")
    run = tmp_path / "canonical-h4-s7"
    save_converted(canon, run, "canonical", rep, source="x")
    assert main(["convert", "--from", str(run), "--to", "hf", "--out", str(tmp_path / "hf")]) == 0
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "`canonical-h4-s7`" in _row(card, "source")
    assert "Converted to **canonical** attention" in card and "Trained" not in card  # a random model, converted
    assert "--from canonical-h4-s7" in card and "--out hf" in card
    assert str(tmp_path) not in card
