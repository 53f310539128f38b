"""A Llama-family model (`model.family=llama`) goes through the same pipeline as GPT-2: `iattn compare` trains
standard against canonical and a rerun skips the finished runs; a run's config reads back as a Llama; a finished
run extends with --resume; `train.init_from` moves a Llama checkpoint into either variant exactly; a
checkpoint of the other family is refused in one line; `iattn report` names the Llama shape."""

import json
import math

import pytest
import torch

from helpers import one_line_error, shared_data_dir, tiny_overrides, write_corpus
from iattention.attention.registry import ATTENTION_REGISTRY
from iattention.cli import main
from iattention.config import load_config
from iattention.interop.load import load_model
from iattention.model.gpt import GPT
from iattention.symmetry.counts import standard_param_count
from iattention.train import train
from iattention.train.trainer import load_run_config

pytestmark = pytest.mark.slow

# tiny's GPT keys (1 layer, 2 heads of 16, block 32) read as a Llama; 4 query heads share 2 key/value heads
LLAMA = ["model.family=llama", "model.n_kv_head=2", "model.mlp_hidden=48", "train.epochs=2", "train.batch_size=4"]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("llama")
    ov = tiny_overrides(write_corpus(root), root / "cache") + LLAMA
    out = root / "cmp"
    rc = main(["compare", "--preset", "tiny", "--heads", "4", "--seeds", "0", "--out", str(out), *ov])
    return dict(root=root, ov=ov, out=out, rc=rc)


def _summary(folder):
    return json.loads((folder / "summary.json").read_text())


def test_compare_trains_both_llama_variants_with_their_parameter_counts(study, capsys):
    assert study["rc"] == 0
    cfg = load_run_config(study["out"] / "canonical-h4-s0")
    assert cfg.model.family == "llama" and cfg.model.n_kv_head == 2 and cfg.model.vocab_size == 256
    std = standard_param_count(cfg.model.replace(attention="standard"))
    removed = ATTENTION_REGISTRY["canonical"].removed_params(cfg.model)
    assert removed == 2 * (8 + 8**2)  # one layer, 2 KV groups of width 8: a complex scalar per pair (rot 8) + r^2
    for arm, want in (("standard", std), ("canonical", std - removed)):
        s = _summary(study["out"] / f"{arm}-h4-s0")
        model, _ = load_model(study["out"] / f"{arm}-h4-s0")
        assert isinstance(model, GPT) and model.config.family == "llama" and model.config.attention == arm
        assert s["params"] == model.num_params() == want, arm
        assert s["config"]["model"]["family"] == "llama" and s["epochs_run"] == 2
    # a rerun finds both finished and trains nothing
    assert main(["compare", "--preset", "tiny", "--heads", "4", "--seeds", "0", "--out", str(study["out"]),
                 *study["ov"]]) == 0
    assert "2 already finished, 0 to train" in capsys.readouterr().out


def test_report_names_the_llama_shape_and_leaves_out_the_gpt2_paper_table(study):
    assert main(["report", str(study["out"]), "--out", str(study["root"] / "rep")]) == 0
    text = (study["root"] / "rep" / "report.md").read_text()
    assert "Llama family (4 query heads sharing 2 key/value heads of width 8, full RoPE, SwiGLU 48" in text
    assert "The paper's published numbers" not in text


def test_a_finished_llama_run_extends_with_resume(study):
    src = study["out"] / "standard-h4-s0"
    before = [json.loads(x) for x in open(src / "metrics.jsonl")]
    cfg = load_config(None, None, ["train.epochs=3"], base=load_run_config(src).to_dict())
    assert cfg.model.family == "llama"
    ext = train(cfg, src, resume=True, quiet=True)
    after = [json.loads(x) for x in open(src / "metrics.jsonl")]
    assert ext["epochs_run"] == 3 and after[:len(before)] == before and after[-1]["epoch"] == 3


@pytest.mark.parametrize("target", ["canonical", "standard"])
def test_init_from_a_llama_checkpoint_starts_at_its_validation_loss(study, target):
    src = study["out"] / "standard-h4-s0" if target == "canonical" else study["out"] / "canonical-h4-s0"
    best = min(r["val_loss"] for r in map(json.loads, open(src / "metrics.jsonl")) if r["kind"] == "epoch")
    cfg = load_config("tiny", None, [*study["ov"], "model.n_head=4", f"model.attention={target}", "train.epochs=1",
                                     f"train.init_from={src}"])
    out = study["root"] / f"ft-{target}"
    summary = train(cfg, out, quiet=True)
    first = json.loads(open(out / "metrics.jsonl").readline())
    assert first["kind"] == "start" and math.isclose(first["val_loss"], best, rel_tol=1e-5), (first, best)
    assert summary["started_from"]["to_attention"] == target


def test_init_from_a_llama_checkpoint_takes_another_block_and_names_every_difference_at_once(study, capsys):
    """RoPE has no position weights: a run may start from a Llama source at another block_size (it had to equal
    the source's, 8192 for SmolLM2). Other differences come in one line, all of them, the vocabulary with the
    tokenizer that fixes it (they came one per try, and the vocabulary advice contradicted itself)."""
    src = study["out"] / "standard-h4-s0"
    base = [*study["ov"], "model.n_head=4", "train.epochs=1", f"train.init_from={src}"]
    summary = train(load_config("tiny", None, [*base, "model.block_size=16"]), study["root"] / "ft-block", quiet=True)
    assert summary["config"]["model"]["block_size"] == 16 and summary["started_from"]["source"] == str(src)
    rc = main(["train", "--preset", "tiny", *base, "model.mlp_hidden=64", "model.n_kv_head=1", "data.tokenizer=bpe:300",
               "--out", str(study["root"] / "bad-fit")])
    one_line_error(capsys, rc, "model.n_kv_head (source 2, run 1), model.mlp_hidden (source 48, run 64)",
                   "the tokenizer (source byte, run bpe:300)",
                   "set model.n_kv_head=2 model.mlp_hidden=48; data.tokenizer=byte")
    assert not (study["root"] / "bad-fit" / "summary.json").exists()


def test_init_from_the_other_family_is_refused_in_one_line(study, capsys):
    llama_run = study["out"] / "standard-h4-s0"
    gpt = [o for o in study["ov"] if o not in LLAMA]
    rc = main(["train", "--preset", "tiny", *gpt, f"train.init_from={llama_run}", "--out",
               str(study["root"] / "bad")])
    one_line_error(capsys, rc, "holds a llama model, the run trains a gpt2 one", "set model.family=llama")
    assert not (study["root"] / "bad" / "summary.json").exists()


def test_resume_into_the_other_family_is_refused_in_one_line(study, capsys):
    """`--resume model.family=gpt2` on a Llama run (or the reverse) was "unknown config key model.n_kv_head" (or
    model.bias), naming neither family; now one line naming both, and the run is left as it was."""
    run = study["out"] / "standard-h4-s0"
    before = (run / "metrics.jsonl").read_bytes()
    rc = main(["train", "--out", str(run), "--resume", "model.family=gpt2", "train.epochs=9"])
    one_line_error(capsys, rc, "this run trains a llama model; model.family=gpt2 would make it a gpt2 one",
                   "new --out")
    assert (run / "metrics.jsonl").read_bytes() == before


def test_compare_refuses_head_counts_the_key_value_heads_do_not_divide(study, capsys):
    rc = main(["compare", "--preset", "tiny", "--heads", "4,3", "--out", str(study["root"] / "no"), *study["ov"]])
    one_line_error(capsys, rc, "--heads 3", "n_kv_head=2", "multiples of 2")
    assert not (study["root"] / "no").exists()


def test_an_unknown_family_is_one_line(tmp_path, capsys):
    rc = main(["train", "--preset", "tiny", "model.family=mamba", "--out", str(tmp_path / "x")])
    one_line_error(capsys, rc, "unknown model.family 'mamba'", "gpt2, llama")
    rc = main(["train", "--preset", "tiny", "model.arch=mamba", "--out", str(tmp_path / "x")])  # the old key
    one_line_error(capsys, rc, "unknown model.arch 'mamba'", "model.family")


def test_a_saved_llama_run_config_round_trips(study):
    cfg = load_run_config(study["out"] / "canonical-h4-s0")
    again = load_config(None, None, [], base=cfg.to_dict())
    assert again == cfg and again.to_dict()["model"]["family"] == "llama"


def test_a_trained_llama_exports_to_transformers_with_its_tokenizer_and_card(study):
    """`iattn convert --to hf` of a canonical Llama run: transformers' LlamaForCausalLM from the folder gives our
    logits on the real tokens, its tokenizer encodes as ours, and the card names the Llama class."""
    tf = pytest.importorskip("transformers")
    run, out = study["out"] / "canonical-h4-s0", study["root"] / "hf"
    assert main(["convert", "--from", str(run), "--to", "hf", "--out", str(out)]) == 0
    ours, _ = load_model(run)
    hf = tf.AutoModelForCausalLM.from_pretrained(str(out)).eval()
    tok = tf.AutoTokenizer.from_pretrained(str(out))
    assert type(hf).__name__ == "LlamaForCausalLM" and hf.config.num_key_value_heads == 2
    ids = tok("the cat sat on a mat", return_tensors="pt").input_ids
    with torch.no_grad():
        ref, got = ours(ids)[0], hf(ids).logits
    n = ours.config.vocab_size
    assert (got[..., :n] - ref).abs().max() <= 1e-5 * ref.abs().max()
    assert (got[..., n:] == 0).all()  # the added end-of-text token: a zero row (RMSNorm has no bias to silence it)
    card = (out / "README.md").read_text()
    assert "# Llama exported by iattention" in card and "`LlamaForCausalLM`" in card and "GPT2" not in card
    assert "Trained as **canonical** attention" in card  # a training run's checkpoint, not a conversion


def test_the_tools_read_a_llama_run(study, tmp_path, capsys):
    """scales runs on a Llama-family preset and conditioning on a Llama run (the two-family layout refused both:
    "reads GPT-2 models", "rotary dims")."""
    run = study["out"] / "canonical-h4-s0"
    assert main(["conditioning", "--checkpoint", str(run)]) == 0
    assert "rotary pivot min" in capsys.readouterr().out  # RoPE rotates the whole head: its pairs, no pass block
    if shared_data_dir() is None:
        pytest.skip("../shared/data not present")
    assert main(["scales", "--preset", "llama-cpu", "--arms", "standard", "data.tokenizer=byte",
                 f"data.data_dir={shared_data_dir()}"]) == 0  # this folder, not one set or remembered elsewhere
    rows = [line.split()[2] for line in capsys.readouterr().out.splitlines() if line.startswith("standard ")]
    assert rows == ["q_proj", "k_proj", "v_proj", "o_proj"]  # its own attention matrices, found by name


def test_sweep_s_default_heads_on_a_llama_preset_are_those_its_kv_heads_divide(tmp_path):
    from iattention.cli.app import build_parser
    from iattention.cli.experiments import _check_heads

    args = build_parser().parse_args(["sweep", "--preset", "llama-cpu", "--out", str(tmp_path / "s")])
    _check_heads(args)
    assert args.heads == [2, 4, 8]
    args = build_parser().parse_args(["sweep", "--preset", "cpu-quick", "--out", str(tmp_path / "s")])
    _check_heads(args)
    assert args.heads == [1, 2, 4, 8]


def test_more_heads_than_width_is_named_in_one_line(study, capsys):
    rc = main(["compare", "--preset", "tiny", "--heads", "2,64", "--out", str(study["root"] / "wide"), *study["ov"]])
    one_line_error(capsys, rc, "--heads 64", "n_embd=32", "no head width")


def test_inspect_shows_a_gpt2_and_a_llama_run_side_by_side(study, tmp_path, capsys):
    gpt = [o for o in study["ov"] if o not in LLAMA]
    assert main(["train", "--preset", "tiny", *gpt, "train.epochs=1", "--out", str(tmp_path / "g")]) == 0
    assert main(["inspect", str(tmp_path / "g"), str(study["out"] / "standard-h4-s0"), "--prompt", "the",
                 "--out", str(tmp_path / "i")]) == 0
    table = (tmp_path / "i" / "spectra.md").read_text()
    assert "| g (standard, 2 heads) | 0 |" in table
    assert "| standard-h4-s0 (standard, 4 heads, 2 key/value heads) | 0 |" in table
    assert (tmp_path / "i" / "standard-h4-s0-attention.png").exists()
