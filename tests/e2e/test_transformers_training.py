"""The tools people train and score with, on a canonical folder iattention writes (issue 66 §3): transformers'
Trainer (examples/hf_finetune.py, what docs/transformers.md runs) lowers WikiText-2's validation loss and `iattn eval`
of the saved folder gives Trainer's eval loss; a peft LoRA on the learned blocks trains, merges to the unmerged
model's function and still converts exactly to standard (`iattn convert --to hf`); `accelerate launch` on two CPU
processes (gloo) trains as one process does; lm-eval's loglikelihood of a canonical folder is `iattn eval`'s."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fixtures import hf_folder
from helpers import run_cli, shared_data_dir, subprocess_env

tf = pytest.importorskip("transformers")
tf.utils.logging.set_verbosity_error()
if shared_data_dir() is None:
    pytest.skip("needs WikiText-2 (IATTN_DATA_DIR)", allow_module_level=True)

from iattention.data import DataConfig  # noqa: E402
from iattention.data.dataset import load_data  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hf_finetune.py"
BLOCK = 32  # the tiny preset's block_size: windows of 32 tokens, 31 predictions (iattn eval --block-size 31)
VALID = 31 * 96 + 1  # the validation prefix: 96 whole windows


def example():
    spec = importlib.util.spec_from_file_location("hf_finetune", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def canonical(tmp_path_factory):
    """`iattn convert --to canonical` of a tiny canonical run (one step: the fine-tune starts near its init)."""
    root = tmp_path_factory.mktemp("tiny")
    assert run_cli(["train", "--preset", "tiny", "--quiet", "model.attention=canonical", "train.max_steps=1",
                    "train.eval_tokens=2000", "train.final_test=false", "--out", root / "run"]) == 0
    assert run_cli(["convert", "--from", root / "run", "--to", "canonical", "--out", root / "canonical"]) == 0
    return root / "canonical"


def valid_text(tmp_path) -> Path:
    """The validation prefix the example scores (its first VALID byte tokens), as a text file for `iattn eval`."""
    tokens = load_data(DataConfig(tokenizer="byte"), splits=("valid",)).splits["valid"][:VALID]
    text = bytes(int(t) for t in tokens).decode("utf-8")
    (tmp_path / "valid.txt").write_text(text, encoding="utf-8")
    return tmp_path / "valid.txt"


def iattn_eval_loss(capsys, folder, text) -> float:
    assert run_cli(["eval", folder, "--text", text, "--block-size", BLOCK - 1, "--json"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["loss"]


@pytest.mark.slow
def test_trainer_fine_tune_lowers_validation_loss_and_iattn_eval_gives_trainer_s_loss(canonical, tmp_path, capsys):
    done = example().main([str(canonical), "--out", str(tmp_path / "ft"), "--steps", "200", "--train-tokens",
                           "60000", "--valid-tokens", str(VALID)])
    capsys.readouterr()
    assert done["steps"] == 200 and done["valid_windows"] == 96 and done["trainable"] == done["num_parameters"]
    assert done["eval_loss"] < done["eval_loss_before"] - 0.5, done
    ours = iattn_eval_loss(capsys, tmp_path / "ft", valid_text(tmp_path))
    print(f"Trainer eval_loss {done['eval_loss']:.7f} (before {done['eval_loss_before']:.7f}); iattn eval {ours:.7f}")
    assert abs(ours - done["eval_loss"]) <= 1e-6 * ours, (ours, done["eval_loss"])


@pytest.mark.slow
def test_a_lora_on_the_learned_blocks_trains_merges_exactly_and_still_converts_to_standard(canonical, tmp_path,
                                                                                           capsys):
    from peft import PeftModel

    out = tmp_path / "lora"
    done = example().main([str(canonical), "--out", str(out), "--steps", "60", "--lora", "4", "--train-tokens",
                           "60000", "--valid-tokens", str(VALID)])
    capsys.readouterr()
    assert 0 < done["trainable"] < done["num_parameters"] and done["eval_loss"] < done["eval_loss_before"], done
    adapter = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert {"attn.W_Q", "attn.W_V", "attn.W_O_free"} <= set(adapter["target_parameters"])
    base = tf.AutoModelForCausalLM.from_pretrained(canonical, dtype=torch.float64).eval()
    unmerged = PeftModel.from_pretrained(tf.AutoModelForCausalLM.from_pretrained(canonical, dtype=torch.float64),
                                         out / "adapter").eval()
    merged = tf.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float64).eval()
    x = torch.randint(0, 256, (2, BLOCK), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = unmerged(input_ids=x).logits, merged(input_ids=x).logits
        moved = (a - base(input_ids=x).logits).abs().max() / a.abs().max()
    rel = ((a - b).abs().max() / a.abs().max()).item()
    assert moved > 1e-3 and rel < 1e-6
    # the merged model is still canonical (the fixed blocks are no parameters) and converts exactly to standard
    assert run_cli(["convert", "--from", out, "--to", "hf", "--dtype", "float64", "--out", tmp_path / "hf"]) == 0
    report = capsys.readouterr().out
    print(f"LoRA: eval_loss {done['eval_loss_before']:.7f} -> {done['eval_loss']:.7f}, trainable {done['trainable']} "
          f"of "
          f"{done['num_parameters']}; merged vs unmerged {rel:.2e} relative (the merge ran in float32); the adapter "
          f"moved the logits by {moved:.2e}; " + next(ln for ln in report.splitlines() if ln.startswith("conversion")))
    standard = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float64).eval()
    with torch.no_grad():
        c = standard(input_ids=x).logits[..., :256]
    assert ((c - b).abs().max() / b.abs().max()).item() < 1e-12


@pytest.mark.slow
def test_accelerate_two_cpu_processes_train_as_one_does(canonical, tmp_path, capsys):
    """gloo DDP through Trainer: 2 processes x 4 windows against 1 x 8, the same windows per step (sequential
    sampler). accelerate 1.15's `--cpu` launches one process whatever --num_processes says (its simple launcher; more
    only through mpirun), so the two processes are `--multi_gpu` with the script on the CPU (use_cpu=True)."""
    argv = [str(canonical), "--steps", "30", "--train-tokens", "20000", "--valid-tokens", str(VALID)]
    one = example().main([*argv, "--out", str(tmp_path / "one"), "--batch-size", "8"])
    env = subprocess_env(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", str(EXAMPLE), *argv,
           "--out", str(tmp_path / "two"), "--batch-size", "4"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    two = json.loads(done.stdout.strip().splitlines()[-1])
    assert two["processes"] == 2 and two["steps"] == one["steps"] == 30
    a = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "one").state_dict()
    b = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "two").state_dict()
    # against the largest weight, not each tensor's own: b_K (GPT-2's key bias) is redundant (softmax ignores it), so
    # its gradient is rounding noise that AdamW scales to steps of the learning rate's size, different in each run
    scale = max(a[k].abs().max().item() for k in a if a[k].is_floating_point())
    worst = max((a[k] - b[k]).abs().max().item() for k in a if a[k].is_floating_point()) / scale
    print(f"accelerate 2 processes vs 1: eval_loss {two['eval_loss']:.7f} vs {one['eval_loss']:.7f}, "
          f"worst weight difference {worst:.2e} of the largest weight")
    assert abs(two["eval_loss"] - one["eval_loss"]) <= 1e-5 * one["eval_loss"] and worst < 1e-4


TEXTS = ("the cat sat on the mat .", "the dog ran to the park , and the cat saw it .", "= Heading = a naïve café")


@pytest.mark.slow
def test_lm_eval_loglikelihood_of_a_canonical_folder_is_iattn_eval_s(tmp_path, capsys):
    """lm-eval's HFLM (what `lm_eval --model hf --model_args pretrained=FOLDER,trust_remote_code=True` builds):
    loglikelihood(the text's first token, the rest) is minus iattn eval --text's total NLL of it (one window). (lm-eval
    encodes the context alone: its first character alone would be another token than the text's first.)"""
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    src = hf_folder(tmp_path / "neox", "GPTNeoX")  # a byte-level BPE tokenizer that adds no BOS
    assert run_cli(["convert", "--from", src, "--to", "canonical", "--out", tmp_path / "c"]) == 0
    capsys.readouterr()
    lm = HFLM(pretrained=str(tmp_path / "c"), trust_remote_code=True, dtype="float32", device="cpu", batch_size=1)
    heads = [lm.tokenizer.decode(lm.tok_encode(t)[:1]) for t in TEXTS]
    assert all(t.startswith(h) for t, h in zip(TEXTS, heads))
    got = [-r[0] for r in lm.loglikelihood([Instance("loglikelihood", {}, (h, t[len(h):]), i)
                                            for i, (h, t) in enumerate(zip(heads, TEXTS))], disable_tqdm=True)]
    for text, theirs in zip(TEXTS, got):
        (tmp_path / "t.txt").write_text(text)
        n = len(lm.tok_encode(text))
        assert run_cli(["eval", tmp_path / "c", "--text", tmp_path / "t.txt", "--block-size", n - 1, "--json"]) == 0
        r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        ours = r["loss"] * r["tokens"]
        print(f"lm-eval {lm_eval.__version__}: {theirs:.7f}, iattn eval {ours:.7f} ({abs(theirs - ours) / ours:.1e})")
        assert abs(theirs - ours) <= 1e-6 * ours


FSDP = """
import json, sys, torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
import iattention.hf_model as h

def model():
    torch.manual_seed(0)
    return h.IAttentionForCausalLM(h.IAttentionConfig(family=sys.argv[1], n_layer=2, n_head=4, n_embd=32,
                                                      vocab_size=100, block_size=32, attention="canonical"))

def train(m, rows):
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    for step in range(3):
        x = torch.randint(0, 100, (8, 16), generator=torch.Generator().manual_seed(step))[rows]
        m(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach() for k, v in m.state_dict().items()}

dist.init_process_group("gloo")
rank = dist.get_rank()
sharded = model()
for block in sharded.transformer.h:
    fully_shard(block)
fully_shard(sharded)
kinds = {type(p).__name__ for p in sharded.parameters()}
got = train(sharded, slice(4 * rank, 4 * rank + 4))
if rank == 0:
    want = train(model(), slice(None))
    scale = max(want[k].abs().max().item() for k in want if want[k].is_floating_point())
    worst = max((got[k] - want[k]).abs().max().item() for k in want if want[k].is_floating_point()) / scale
    start = model().state_dict()
    moved = max((want[k] - start[k]).abs().max().item() for k in want if want[k].is_floating_point()) / scale
    print(json.dumps({"kinds": sorted(kinds), "worst": worst, "moved": moved}))
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_fsdp_fully_shard_on_two_cpu_processes_trains_as_one_process_does(tmp_path, family):
    """torch's FSDP2 (fully_shard per block and the model) on gloo: the parameters are DTensor shards, and three
    AdamW steps on half the batch each equal one process on the whole batch to float32 rounding (against the largest
    weight: GPT-2's redundant b_K moves by AdamW-scaled rounding noise, as in the accelerate test). (Trainer's
    fsdp="full_shard" under accelerate launch --use_fsdp on the CPU ran unsharded: accelerate 1.15, use_cpu=True.)"""
    (tmp_path / "fsdp.py").write_text(FSDP)
    env = subprocess_env(OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           str(tmp_path / "fsdp.py"), family], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"FSDP2 {family}: 2 processes vs 1 after 3 AdamW steps, worst weight difference {got['worst']:.2e} of the "
          "largest weight")
    assert got["kinds"] == ["DTensor"] and got["worst"] < 1e-4 < 1e-2 < got["moved"]
