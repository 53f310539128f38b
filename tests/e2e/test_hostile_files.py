"""End-to-end tests: hostile_files."""

import json
import os
import random
import re
import shutil

import pytest

from helpers import tiny_overrides, write_corpus
from iattention.cli import main

RUN = "standard-h2-s0"


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished sweep run (with arm.json), a converted canonical model and an HF export of it."""
    root = tmp_path_factory.mktemp("hostile")
    ov = tiny_overrides(write_corpus(root), root / "cache", **{"train.epochs": 1})
    sweep = ["sweep", "--preset", "tiny", "--arms", "standard", "--heads", "2", "--seeds", "0", *ov]
    assert main([*sweep, "--out", str(root / "sw")]) == 0
    run = root / "sw" / RUN
    assert main(["convert", "--from", str(run), "--to", "canonical", "--out", str(root / "canonical")]) == 0
    assert main(["convert", "--from", str(run), "--to", "hf", "--out", str(root / "hf")]) == 0
    return dict(root=root, ov=ov, sweep=sweep, run=run)


def _garbage(original: bytes, kind: str, rng: random.Random) -> dict[str, bytes]:
    """Named corruptions of a file's bytes: each a different way a file goes bad."""
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


def _commands(env, case_root):
    """Every command a user would run on the finished run, each a fresh argv (outputs under case_root)."""
    run, ov = case_root / "sw" / RUN, env["ov"]
    resume = ["train", "--preset", "tiny", "--out", str(run), "--resume", "--quiet", *ov,
              "model.n_head=2", "model.attention=standard", "train.seed=0"]
    return {
        "report": ["report", str(case_root / "sw"), "--out", str(case_root / "report")],
        "sweep": [*env["sweep"], "--out", str(case_root / "sw")],
        "train --resume": resume,
        "train --resume (extend)": [*resume[:-1], "train.epochs=2"],
        "eval": ["eval", str(run)],
        "generate": ["generate", str(run), "--prompt", "the cat", "--max-new-tokens", "2"],
        "convert": ["convert", "--from", str(run), "--to", "canonical", "--out", str(case_root / "conv")],
        "train --init-from": ["train", "--preset", "tiny", "--out", str(case_root / "ft"), "--quiet", *ov,
                              "--init-from", str(run)],
    }


# Which commands read which file of a finished run: these must refuse a corrupted one.
READS = {
    "config.yaml": ("yaml", ["train --resume", "train --resume (extend)"]),
    "summary.json": ("json", ["report", "sweep", "train --resume"]),
    "arm.json": ("json", ["report"]),  # a sweep skips a finished run by its summary alone
    "metrics.jsonl": ("jsonl", ["report", "train --resume (extend)"]),
    "steps.jsonl": ("jsonl", ["report", "train --resume (extend)"]),
    "best.safetensors": ("safetensors", ["eval", "generate", "convert", "train --init-from"]),
    "last.safetensors": ("safetensors", ["train --resume (extend)"]),
}


def _one_line_naming(capsys, code, name, where) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, f"{where}: exit {code}, stderr {err[-3:]}"
    assert len(err) == 1 and err[0].startswith("iattn: error:"), f"{where}: {err}"
    assert name in err[0], f"{where}: the error does not name {name}: {err[0]}"
    return err[0]


def _run(argv) -> int:
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


# A config.yaml cut short that still parses can be harmless: resume compares each identity key with the
# command's own config and takes everything else from the command. Exit 0 is accepted there only when
# the run's results are exactly the intact run's.
HARMLESS_IF_SAME = {("config.yaml", "cut short")}


RESULT_KEYS = ("best_val_ppl", "best_epoch", "test_ppl", "epochs_run", "steps", "params")


def _result(case) -> dict:
    summary = json.loads((case / "sw" / RUN / "summary.json").read_text())
    return {k: summary[k] for k in RESULT_KEYS}


def _intact_result(env, command, tmp_path, capsys) -> dict:
    case = tmp_path / "intact"
    shutil.rmtree(case, ignore_errors=True)
    shutil.copytree(env["run"].parent, case / "sw")
    assert _run(_commands(env, case)[command]) == 0
    capsys.readouterr()
    return _result(case)


MODEL_FILES = {  # folder (from the fixture) -> its files and their kinds
    "canonical": {"model.safetensors": "safetensors", "config.json": "json", "iattention-data.json": "json"},
    "hf": {"model.safetensors": "safetensors", "config.json": "json", "iattention-data.json": "json"},
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(READS))
def test_garbage_in_a_run_file_is_one_line_from_every_command_that_reads_it(finished, name, tmp_path, capsys):
    kind, readers = READS[name]
    original = (finished["run"] / name).read_bytes()
    rng = random.Random(f"hostile:{name}")
    tried = 0
    for label, data in _garbage(original, kind, rng).items():
        for command in readers:
            case = tmp_path / f"{len(label)}-{tried}"
            shutil.copytree(finished["run"].parent, case / "sw")
            (case / "sw" / RUN / name).write_bytes(data)
            code = _run(_commands(finished, case)[command])
            if code == 0 and (name, label) in HARMLESS_IF_SAME:
                capsys.readouterr()
                intact = _intact_result(finished, command, tmp_path, capsys)
                assert _result(case) == intact, f"{name} ({label}) under {command}: another result"
            else:
                _one_line_naming(capsys, code, name, f"{name} ({label}) under {command}")
            assert not (case / "conv").exists() and not (case / "ft").exists()  # nothing half-made
            assert not (case / "report" / "report.md").exists()
            tried += 1
    assert tried >= 6 * len(readers)
    assert not os.path.exists("/tmp/pwned")


@pytest.mark.slow
def test_a_config_cut_inside_a_number_names_config_yaml_on_resume(finished, tmp_path, capsys):
    """A config.yaml cut short inside a value ('eval_batch_size: 64' -> '...: 6') still parses, as
    another config: resume refuses it with one line that names config.yaml (found by CI, where the
    fuzz's cut fell there for one temporary-path length)."""
    original = (finished["run"] / "config.yaml").read_text()
    numbers = list(re.finditer(r": (\d\d+)\n", original))
    assert numbers, "the fixture's config has no value of two digits or more"
    last = numbers[-1]
    shutil.copytree(finished["run"].parent, tmp_path / "sw")
    (tmp_path / "sw" / RUN / "config.yaml").write_text(original[:last.start(1) + 1])
    code = _run(_commands(finished, tmp_path)["train --resume"])
    line = _one_line_naming(capsys, code, "config.yaml", "config.yaml cut inside a number")
    assert "another config" in line


@pytest.mark.slow
def test_a_file_that_only_other_commands_read_does_not_stop_eval(finished, tmp_path, capsys):
    """The refusals above are the file's doing: eval reads only the weights, so garbage in the logs and
    the summary leaves it working (exit 0) with the intact run's number."""
    assert main(["eval", str(finished["run"]), "--json"]) == 0
    intact = json.loads(capsys.readouterr().out)
    shutil.copytree(finished["run"], tmp_path / "run")
    for name in ("summary.json", "metrics.jsonl", "steps.jsonl", "arm.json", "config.yaml"):
        (tmp_path / "run" / name).write_bytes(b"\xff garbage")
    assert main(["eval", str(tmp_path / "run"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ppl"] == intact["ppl"]


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
def test_a_token_cache_overwritten_with_other_ids_is_rebuilt_not_read(finished, capsys):
    """The token cache has no reader to refuse from: a damaged one is rebuilt with a notice, and the
    number is the intact cache's."""
    assert main(["eval", str(finished["run"]), "--json"]) == 0
    intact = json.loads(capsys.readouterr().out)["ppl"]
    caches = sorted((finished["root"] / "cache" / "tokens").glob("*.tok"))
    assert caches
    for path in caches:
        size = path.stat().st_size
        path.write_bytes(b"\xff" * size)  # same length, every id 65535: beyond a byte tokenizer
    assert main(["eval", str(finished["run"]), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["ppl"] == intact
    assert "rebuilding it" in captured.err


@pytest.mark.slow
def test_a_token_cache_whose_ids_change_under_an_intact_header_is_rebuilt_not_read(finished, capsys):
    """Ids the tokenizer has, the count and key as recorded: only the content hash in the header tells."""
    assert main(["eval", str(finished["run"]), "--json"]) == 0
    intact = json.loads(capsys.readouterr().out)["ppl"]
    for entry in (finished["root"] / "cache" / "tokens").glob("*.tok"):
        data = bytearray(entry.read_bytes())
        data[-4:] = b"a\0b\0"  # the last two ids: 'a', 'b' (valid bytes)
        entry.write_bytes(bytes(data))
    assert main(["eval", str(finished["run"]), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["ppl"] == intact and "rebuilding it" in captured.err
