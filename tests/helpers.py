"""What the tests share: small models, a synthetic corpus, the overrides of a tiny run, the shared data."""

import os

import torch

from iattention import GPT, GPTConfig

SHARED_DATA = os.environ.get("IATTN_DATA_DIR") or os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")


def make_model(dtype=torch.float64, scale=0.3, **kw) -> GPT:
    """A small model with weights large enough that attention visibly shapes the logits."""
    cfg = GPTConfig(**{**dict(n_layer=2, n_head=3, n_embd=48, vocab_size=97, block_size=16), **kw})
    model = GPT(cfg).to(dtype).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2 and "wte" not in name:
                p.normal_(0.0, scale / p.shape[-1] ** 0.5 * 4)
    return model


def max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def measured_projection_flops(layer, seq_len: int = 5) -> float:
    """Matmul FLOPs per token that the layer's projections (qkv, then project_out) really run in a forward
    pass, as torch's FLOP counter sees them (2 per multiply-add; index copies and assembly count nothing)."""
    from torch.utils.flop_counter import FlopCounterMode

    dtype = next(layer.parameters()).dtype
    x = torch.randn(1, seq_len, layer.n_embd, dtype=dtype)
    y = torch.randn(1, seq_len, layer.n_head * layer.d_head, dtype=dtype)  # merged heads: n_embd in GPT
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        layer.qkv(x)
        layer.project_out(y)
    return counter.get_total_flops() / seq_len


def shared_data_dir() -> str | None:
    path = os.path.abspath(SHARED_DATA)
    return path if os.path.isdir(os.path.join(path, "wikitext-2-v1")) else None


def write_corpus(folder, n_train=6000, n_eval=1500, seed=0) -> dict:
    """Small synthetic corpus with learnable structure (byte tokenizer friendly)."""
    import random

    rng = random.Random(seed)
    words = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "to", "park", "and", "then", "slept", "."]

    def text(n):
        out = []
        while sum(len(w) + 1 for w in out) < n:
            out += rng.choice([["the", "cat", "sat", "on", "the", "mat", "."],
                               ["a", "dog", "ran", "to", "the", "park", "."],
                               [rng.choice(words) for _ in range(5)]])
        return " ".join(out)[:n] + "\n"

    paths = {}
    for split, n in (("train", n_train), ("valid", n_eval), ("test", n_eval)):
        p = os.path.join(folder, f"{split}.txt")
        with open(p, "w") as f:
            f.write(text(n))
        paths[split] = p
    return paths


def tiny_overrides(paths: dict, cache_dir, **extra) -> list[str]:
    base = ["data.dataset=text", f"data.train={paths['train']}", f"data.valid={paths['valid']}",
            f"data.test={paths['test']}", "data.tokenizer=byte", "data.train_tokens=0", f"data.cache_dir={cache_dir}"]
    return base + [f"{k}={v}" for k, v in extra.items()]


def write_run(folder, attention, heads, seed, val_curve, test_ppl, config):
    """A finished run folder in the trainer's format (summary.json + metrics.jsonl)."""
    import json

    import numpy as np

    folder.mkdir(parents=True)
    best = int(np.argmin(val_curve))
    with open(folder / "metrics.jsonl", "w") as f:
        for i, v in enumerate(val_curve):
            f.write(json.dumps(dict(kind="epoch", epoch=i + 1, step=10 * (i + 1), train_ppl=v * 0.8, val_ppl=v)) + "\n")
    summary = dict(config=config, attention=attention, n_head=heads, seed=seed, params=1000 - 10 * heads,
                   best_val_ppl=float(val_curve[best]), best_epoch=best + 1, test_ppl=test_ppl,
                   epochs_run=len(val_curve), train_tokens_per_s=1234.0)
    (folder / "summary.json").write_text(json.dumps(summary))


def armed_run(root, arm, overrides, heads, seed, curve, config):
    """A finished run of `arm` (its arm.json as a sweep writes it), named as a sweep names it."""
    import json

    folder = root / f"{arm}-h{heads}-s{seed}"
    write_run(folder, config["model"]["attention"], heads, seed, curve, curve[-1], config)
    (folder / "arm.json").write_text(json.dumps({"arm": arm, "overrides": overrides}))


def one_line_error(capsys, rc, *must) -> str:
    """A refused command: exit 2, no traceback, one `iattn: error:` line holding each of `must`; returns it."""
    err = capsys.readouterr().err
    lines = [x for x in err.strip().splitlines() if x.startswith("iattn: error:")]
    assert rc == 2, err
    assert "Traceback" not in err, err
    assert len(lines) == 1, err
    for m in must:
        assert m in lines[0], err
    return lines[0]


def sparse_checkpoint(run_dir, out, gib=16):
    """A safetensors file with a real checkpoint's metadata and one tensor whose header declares `gib` GiB,
    over a sparse file: the bytes are holes, so it costs no disk."""
    import json
    import struct

    from safetensors import safe_open

    with safe_open(str(run_dir / "last.safetensors"), framework="pt") as f:
        meta = f.metadata()
    n = gib * 2**30 // 4
    header = json.dumps({"__metadata__": meta, "transformer.wte.weight": {
        "dtype": "F32", "shape": [n // 1024, 1024], "data_offsets": [0, n * 4]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + n * 4)


def make_llama(dtype=torch.float64, seed=0, **kw):
    """A small Llama-family model with every weight random, norm gains and biases included (not 1 and 0), so no
    term of the function is trivial."""
    cfg = GPTConfig(**{**dict(family="llama", n_layer=2, n_head=4, n_kv_head=2, n_embd=32, mlp_hidden=48,
                              vocab_size=61, block_size=24), **kw})
    torch.manual_seed(seed)
    model = GPT(cfg).to(dtype).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                gain = ".ln_" in name or "_norm." in name  # a norm's gain (query/key norms: q_norm, k_norm)
                p.copy_((1.0 if gain else 0.0) + 0.3 * torch.randn(p.shape, generator=gen, dtype=dtype))
            else:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=dtype) / p.shape[-1] ** 0.5)
    return model


def streamed_round_trip(tmp_path, capsys, hf, x: torch.Tensor) -> dict:
    """A transformers model saved in `tmp_path/hf`, converted by `iattn convert` (streamed) to canonical (`c`) and back
    to its family's class (`back`): the back folder's float64 logits on `x` against `hf`'s (max relative), and `iattn
    params --from` the source folder's rows by attention. The shared body of the family tests (test_hf_<family>.py)."""
    import json

    from iattention.cli.app import main

    hf.save_pretrained(str(tmp_path / "hf"))
    for to, src, out in (("canonical", "hf", "c"), ("hf", "c", "back")):
        assert main(["convert", "--from", str(tmp_path / src), "--to", to, "--out", str(tmp_path / out)]) == 0
    capsys.readouterr()
    back = type(hf).from_pretrained(str(tmp_path / "back"), dtype=torch.float64).eval()
    with torch.no_grad():
        rel = max_rel(back(x).logits, hf(x).logits)
    assert main(["params", "--from", str(tmp_path / "hf"), "--json"]) == 0
    return {"back": rel, "params": {r["attention"]: r for r in json.loads(capsys.readouterr().out)}}


def float32_round_trip(tmp_path, hf, x: torch.Tensor) -> dict:
    """A transformers model saved in float32 in `tmp_path/hf`, converted whole to a float32 canonical folder and back
    to its family's class: {"conversion": the converter's check, "back": the back model (float64) logits' max relative
    difference on `x` from `hf`'s, "again": that model, "counted": iattention's count of the folder's config.json,
    read without its weights}. The other shared body of the family tests."""
    from iattention.interop.convert import convert, save_converted
    from iattention.interop.folder import HFFolder
    from iattention.interop.load import load_any
    from iattention.symmetry.counts import standard_param_count

    hf.to(torch.float32).save_pretrained(str(tmp_path / "hf"))
    hf.to(torch.float64)
    counted = standard_param_count(HFFolder.at(tmp_path / "hf").shape)
    canon, rep = convert(load_any(tmp_path / "hf")[0], "canonical", block="pivoted", dtype="float32")
    save_converted(canon, tmp_path / "canon", "canonical", rep, source=str(tmp_path / "hf"))
    exported, rep2 = convert(load_any(tmp_path / "canon")[0], "hf", dtype="float32")
    save_converted(exported, tmp_path / "back", "hf", rep2, source=str(tmp_path / "canon"))
    again = type(hf).from_pretrained(str(tmp_path / "back"), dtype=torch.float64).eval()
    with torch.no_grad():
        back = max_rel(again(x).logits, hf(x).logits)
    return {"conversion": rep.conversion, "back": back, "again": again, "counted": counted}


@torch.no_grad()
def turn_rope_pair(hf, pair: int = 0) -> None:
    """Turn W_Q and W_K of every head of every layer of a transformers rotate-half model by 53 degrees inside RoPE
    pair `pair` (in place): a unit complex scalar, a symmetry of a layer without a query/key norm, none with one
    whose gains differ on the pair (docs/conversion.md, "Query/key norms")."""
    r = hf.config.head_dim
    first, second = pair, pair + r // 2  # the rotate_half layout
    R = torch.eye(r, dtype=torch.float64)
    R[first, first] = R[second, second] = 0.6
    R[first, second], R[second, first] = 0.8, -0.8
    for layer in hf.model.layers:
        for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
            W = proj.weight.view(-1, r, proj.weight.shape[1])  # (heads, r, d)
            W.copy_(torch.einsum("ij,hjd->hid", R.T.to(W), W))


def tells(err, *facts: str) -> str:
    """A refusal tells the user each of `facts` (the file, the key or line, the value, the fix): what the
    message must say, not its wording. `err`: a pytest.raises result or the message; returns the message."""
    message = str(getattr(err, "value", err))
    for fact in facts:
        assert fact in message, f"{fact!r} is not in the message: {message}"
    return message


# ------------------------------------------------------------------ the e2e topic files' shared helpers
# (each was written once per campaign file before issue 49; the topic files import them under their old names)
SWEEP_RUN = "standard-h2-s0"  # the one run of `sweep --arms standard --heads 2 --seeds 0`
SRC = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", "src"))


def wait_until(reached, proc=None, what: str = "the moment waited for"):
    """Poll `reached()` until it returns something true, and return that: the way a test synchronises with another
    process on a file it writes or a state it reaches. No deadline (a busy machine is only slower, never a failure:
    CI's own timeout stops a real hang); when `proc` exits first, fail at once, with its stderr if it was piped.
    The poll interval decides nothing but how often to look."""
    import time

    while not (value := reached()):
        if proc is not None and proc.poll() is not None:
            err = proc.stderr.read() if getattr(proc, "stderr", None) else ""
            raise AssertionError(f"the process exited ({proc.returncode}) before {what}: {str(err)[-2000:]}")
        time.sleep(0.01)
    return value


def lines_of(path) -> int:
    """How many whole lines the file at `path` holds (0 if it does not exist): a log's progress."""
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def wait_for_lines(path, n: int, proc) -> None:
    """Until the log at `path` holds `n` lines, or `proc` (the process writing it) has ended: a moment of a run
    counted in its steps, the same on a busy machine as on an idle one."""
    wait_until(lambda: lines_of(path) >= n or proc.poll() is not None)


def subprocess_env(**extra) -> dict:
    """os.environ with src/ first on PYTHONPATH (a child `python -m iattention` imports this checkout)."""
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update(extra)
    return env


def garbage(original: bytes, kind: str, rng) -> dict[str, bytes]:
    """Named corruptions of a file's bytes: each a different way a file goes bad."""
    import json

    cut = rng.randrange(1, max(2, int(len(original) * 0.9)))
    while cut < len(original) and original[cut - 1:cut] in (b"\n", b"}"):  # never a cut that stays valid
        cut += 1
    flip = rng.randrange(len(original))
    out = {
        "empty": b"",
        "random bytes": bytes(rng.randrange(256) for _ in range(rng.randrange(16, 300))),
        "cut short": original[:cut],
        "a non-UTF-8 byte": original[:flip] + b"\xff\xfe" + original[flip:],
    }
    if kind == "json":
        obj = json.loads(original)
        out["a list, not an object"] = b"[1, 2, 3]"
        out["every value of another type"] = json.dumps({k: [v] for k, v in obj.items()}).encode()
    elif kind == "jsonl":
        out["a list per line"] = b"[1]\n[2]\n"
        recs = [json.loads(x) for x in original.splitlines()]
        out["values of another type"] = "".join(json.dumps({k: str(v) for k, v in r.items()}) + "\n"
                                                for r in recs).encode()
    elif kind == "yaml":
        out["a list, not sections"] = b"- model\n- data\n"
        out["a section that is not a mapping"] = b"model: 3\ndata: 4\noptim: 5\ntrain: 6\n"
        out["a repeated section"] = original + b"\ntrain:\n  epochs: 9\n"
    elif kind == "safetensors":
        out["a pickle behind the name"] = b"\x80\x04\x95cos\nsystem\n(S'touch /tmp/pwned'\ntR."
        out["a header length beyond the file"] = (2**40).to_bytes(8, "little") + original[8:]
    return out


def one_line_naming(capsys, code, name, where) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, f"{where}: exit {code}, stderr {err[-3:]}"
    assert len(err) == 1 and err[0].startswith("iattn: error:"), f"{where}: {err}"
    assert name in err[0], f"{where}: the error does not name {name}: {err[0]}"
    return err[0]


def run_cli(argv) -> int:
    """`iattn ARGV` in this process (each argument str()-ed); its exit status, argparse's refusals included."""
    from iattention.cli import main

    try:
        return main([str(a) for a in argv])
    except SystemExit as e:
        return e.code


def refused(capsys, argv, *names) -> str:
    """argv exits 2 with one line `iattn: error: ...` naming each of `names`."""
    code = run_cli(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, f"{argv}: exit {code}, stderr {err[-3:]}"
    assert len(err) == 1 and err[0].startswith("iattn: error:"), err
    for name in names:
        assert str(name) in err[0], f"{name!r} not in {err[0]}"
    return err[0]


def copy_tree(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def rewrite_safetensors(path, change, metadata_change=None) -> None:
    """Rewrite a safetensors file in place with change(tensors) applied (and its metadata changed)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata() or {}
    tensors = load_file(str(path))
    change(tensors)
    if metadata_change:
        metadata = metadata_change(metadata)
    save_file(tensors, str(path), metadata=metadata)


def edit_meta(edit):
    import json

    def change(metadata):
        meta = json.loads(metadata["iattention"])
        edit(meta)
        return {**metadata, "iattention": json.dumps(meta)}
    return change


def plant(value, key):
    def change(tensors):
        tensors[key] = tensors[key].clone()
        tensors[key].view(-1)[3] = value
    return change


def train_argv(out, ov, *extra):
    return ["train", "--preset", "tiny", "--quiet", "--out", out, *ov, *extra]


def eval_ppl(capsys, *argv) -> float:
    import json

    from iattention.cli import main

    assert main(["eval", *map(str, argv), "--json"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["ppl"]


def transformers4_rope(cfg: dict):
    """What transformers 4.x (4.40.2) reads RoPE from in a config.json: rope_theta (default 10000) and rope_scaling
    for the Llama family; GPT-NeoX rotates int(d_head x rotary_pct) dims (default 0.25) with base rotary_emb_base."""
    if cfg["model_type"] == "gpt_neox":
        d_head = cfg["hidden_size"] // cfg["num_attention_heads"]
        return int(d_head * cfg.get("rotary_pct", 0.25)), cfg.get("rotary_emb_base", 10000)
    return cfg.get("rope_theta", 10000.0), cfg.get("rope_scaling")
