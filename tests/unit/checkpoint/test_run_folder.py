"""Unit tests of iattention.checkpoint.run_folder."""

import json
import os

import pytest

from helpers import tells
from iattention.checkpoint import RunFolder
from iattention.config import load_config
from iattention.config.identity import config_mismatch
from iattention.errors import UserError
from iattention.utils.lock import LOCK_NAME

SUMMARY = {"config": {"model": {}}, "attention": "standard", "n_head": 1, "seed": 0, "best_val_ppl": 12.5,
           "best_epoch": 1, "epochs_run": 2}


BAD = {
    "summary.json": [b"", b"{not json", b"[1, 2]", json.dumps({**SUMMARY, "n_head": "1"}).encode(),
                     json.dumps({k: v for k, v in SUMMARY.items() if k != "seed"}).encode(), b"\xff\xfe\x00"],
    "arm.json": [b"", b"[]", b'{"arm": 3, "overrides": []}', b'{"arm": "a", "overrides": [1]}', b"\x80"],
    "config.yaml": [b"hello", b"- a\n- b\n", b"model: [1, 2\n", b"model: 3\n", b"\xff\xfe"],
    "metrics.jsonl": [b'garbage\n{"step": 1}\n', b'[1]\n{"step": 2}\n', b'{"step": "x"}\n', b"\xff\n"],
}


def test_a_good_folder_reads_back(tmp_path):
    folder = RunFolder(tmp_path)
    assert folder.read_config() is None and folder.read_summary() is None and folder.read_arm() is None
    cfg = load_config("cpu-quick").to_dict()
    folder.write_config(cfg)
    folder.write_summary(SUMMARY)
    folder.write_arm({"arm": "standard", "overrides": ["model.attention=standard"]})
    folder.write_records("metrics.jsonl", [dict(kind="epoch", step=1, epoch=1, val_ppl=3.0),
                                           dict(kind="epoch", step=5, epoch=2, val_ppl=2.0)])
    assert folder.read_config() == cfg
    assert folder.run_config().to_dict() == cfg
    assert folder.finished(2) == SUMMARY and folder.finished(3) is None
    assert [r["step"] for r in folder.read_records("metrics.jsonl", max_step=4)] == [1]
    assert not folder.check_for(cfg, resume=True)
    with pytest.raises(UserError, match="already holds a run"):
        folder.check_for(cfg, resume=False)


@pytest.mark.parametrize("name,content", [(n, c) for n, cs in BAD.items() for c in cs])
def test_a_corrupt_file_is_one_line_naming_it(tmp_path, name, content):
    folder = RunFolder(tmp_path)
    (tmp_path / name).write_bytes(content)
    read = {"summary.json": folder.read_summary, "arm.json": folder.read_arm, "config.yaml": folder.read_config,
            "metrics.jsonl": folder.read_records}[name]
    with pytest.raises(UserError) as err:
        read()
    message = str(err.value)
    assert name in message and "\n" not in message


def test_a_torn_last_log_line_of_a_finished_run_is_refused_not_read_as_a_shorter_run(tmp_path):
    """metrics.jsonl is appended as a run goes: of a running (or killed) run a torn last line is an append cut
    short and left out; a finished run's log was synced whole before its summary, so there it is damage."""
    first = '{"kind": "epoch", "step": 1, "epoch": 1, "val_ppl": 9.0}\n'
    (tmp_path / "metrics.jsonl").write_text(first + '{"step": 2, "val')
    assert [r["step"] for r in RunFolder(tmp_path).read_records()] == [1]
    with pytest.raises(UserError, match="metrics.jsonl is corrupt \\(line 2"):
        RunFolder(tmp_path).read_records(finished=True)


def test_a_corrupt_config_names_the_fix(tmp_path):
    (tmp_path / "config.yaml").write_text("model: 3\n")
    with pytest.raises(UserError, match=r"config\.yaml is corrupt .*; delete the folder or choose another --out$"):
        RunFolder(tmp_path).read_config()


def test_summary_mismatch_compares_the_finished_run_with_the_wanted_config(tmp_path):
    folder = RunFolder(tmp_path)
    cfg = load_config("cpu-quick").to_dict()
    folder.write_summary({**SUMMARY, "config": cfg})
    assert folder.summary_mismatch(cfg) is None
    other = load_config("cpu-quick", overrides=["optim.lr=0.5"]).to_dict()
    assert "optim.lr" in folder.summary_mismatch(other)


def test_weights_prefer_best_then_an_exported_model_then_last(tmp_path):
    folder = RunFolder(tmp_path)
    assert folder.weights() is None
    for name, want in (("last.safetensors", "last.safetensors"), ("model.safetensors", "model.safetensors"),
                       ("best.safetensors", "best.safetensors")):
        (tmp_path / name).write_bytes(b"x")
        assert folder.weights() == tmp_path / want


def test_check_checkpoint_accepts_its_own_run_and_its_extension_and_refuses_another(tmp_path):
    folder = RunFolder(tmp_path)
    cfg = load_config("cpu-quick").to_dict()
    folder.write_config(cfg)
    folder.check_checkpoint(tmp_path / "best.safetensors", {"config": cfg})
    shorter = load_config("cpu-quick", overrides=["train.epochs=2"]).to_dict()  # the run before it was extended
    folder.check_checkpoint(tmp_path / "best.safetensors", {"config": shorter})
    with pytest.raises(UserError, match=r"best\.safetensors is not this run's: .*optim\.lr"):
        other = load_config("cpu-quick", overrides=["optim.lr=0.5"]).to_dict()
        folder.check_checkpoint(tmp_path / "best.safetensors", {"config": other})


def _finished_run(tmp_path, **summary) -> RunFolder:
    folder = RunFolder(tmp_path)
    folder.write_summary({**SUMMARY, **summary})
    folder.write_records("metrics.jsonl", [dict(kind="epoch", step=1, epoch=1, val_ppl=12.5),
                                           dict(kind="epoch", step=5, epoch=2, val_ppl=13.0)])
    return folder


def test_read_results_checks_test_ppl_and_wants_the_log_of_a_finished_run(tmp_path):
    folder = _finished_run(tmp_path)
    assert folder.read_results()[0]["best_val_ppl"] == 12.5  # no test_ppl: fine
    for bad in (0.5, "9", True):
        folder.write_summary({**SUMMARY, "test_ppl": bad})
        with pytest.raises(UserError, match=rf"summary\.json holds test_ppl {bad!r}, not a perplexity \(>= 1\)"):
            folder.read_results()
    folder.write_summary({**SUMMARY, "test_ppl": 1})
    assert folder.read_results()[0]["test_ppl"] == 1
    (tmp_path / "metrics.jsonl").unlink()
    with pytest.raises(UserError, match=r"metrics\.jsonl is missing: a finished run keeps one record per evaluation"):
        folder.read_results()


def test_an_early_stop_is_finished_before_its_epochs(tmp_path):
    folder = _finished_run(tmp_path)
    assert folder.finished(5) is None
    folder.write_summary({**SUMMARY, "stopped_early": True})
    assert folder.finished(5)["stopped_early"] is True


def test_corrupt_summary_and_arm_messages_name_the_fix(tmp_path):
    folder = RunFolder(tmp_path)
    (tmp_path / "summary.json").write_text("[1]")
    with pytest.raises(UserError, match=r"; rerun that run \(iattn sweep or iattn train --resume finishes it again\)$"):
        folder.read_summary()
    (tmp_path / "arm.json").write_text("[]")
    with pytest.raises(UserError, match=r'; rewrite it as \{"arm": NAME, "overrides": \[\.\.\.\]\}$'):
        folder.read_arm()


def test_a_foreign_folder_lists_what_it_holds(tmp_path):
    for n in range(1, 6):
        (tmp_path / f"f{n}.txt").write_text("x")
        with pytest.raises(UserError) as err:
            RunFolder(tmp_path).check_ours()
        shown = ", ".join(f"f{i}.txt" for i in range(1, min(n, 3) + 1)) + (f" and {n - 3} more" if n > 3 else "")
        tells(err, str(tmp_path), "not an iattn run folder", f"holds {shown};", "--out", "nothing there was touched")


def test_an_old_arm_override_is_renamed_up_to_its_first_equals_sign(tmp_path):
    folder = RunFolder(tmp_path)
    folder.write_arm({"arm": "a", "overrides": ["model.canonical=q=k", "train.init_from=a=b", "flag"]})
    assert folder.read_arm()["overrides"] == ["model.canonical_halves=q=k", "train.init_from=a=b", "flag"]


def test_a_log_line_that_is_not_an_object_is_named_by_its_number_and_type(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"kind": "epoch", "step": 1, "epoch": 1, "val_ppl": 9.0}\n[1]\n')
    with pytest.raises(UserError) as err:
        RunFolder(tmp_path).read_records()
    tells(err, str(path), "line 2", "not a JSON object but list", "delete it and rerun the run")


def test_a_log_that_is_not_text_is_named_as_a_run_log(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"\xff\n")
    with pytest.raises(UserError) as err:
        RunFolder(tmp_path).read_records()
    tells(err, f"a run log {path}", "not UTF-8", "byte 0", "delete it and rerun the run")


@pytest.mark.parametrize("key,value,log_says", [("epochs_run", 3, "2 epoch records"),
                                                ("best_epoch", 2, "epoch 1, where val_ppl is lowest")])
def test_a_summary_that_disagrees_with_its_log_is_refused_by_name(tmp_path, key, value, log_says):
    folder = _finished_run(tmp_path, **{key: value})
    with pytest.raises(UserError) as err:
        folder.read_results()
    tells(err, str(tmp_path), "summary.json", "metrics.jsonl", f"on {key} ({value} there, {log_says}",
          "restore summary.json", "iattn train --resume")


def test_a_config_that_is_not_yaml_is_named_as_a_run_config(tmp_path):
    (tmp_path / "config.yaml").write_text("model: [1, 2\n")
    with pytest.raises(UserError) as err:
        RunFolder(tmp_path).read_config()
    message = str(err.value)
    assert message.startswith(f"a run config {tmp_path / 'config.yaml'} is not valid YAML (")
    assert message.endswith("); delete the folder or choose another --out")


def test_run_config_of_a_folder_without_one_names_the_folder(tmp_path):
    with pytest.raises(UserError) as err:
        RunFolder(tmp_path).run_config()
    tells(err, str(tmp_path), "no config.yaml")


def test_write_config_keeps_the_sections_in_their_order(tmp_path):
    cfg = load_config("cpu-quick").to_dict()
    RunFolder(tmp_path).write_config(cfg)
    lines = (tmp_path / "config.yaml").read_text().splitlines()
    assert [line[:-1] for line in lines if not line.startswith(" ")] == list(cfg) == ["model", "data", "optim", "train"]


def test_check_for_a_new_folder_a_taken_one_and_an_extension(tmp_path):
    folder = RunFolder(tmp_path)
    cfg = load_config("cpu-quick").to_dict()
    assert folder.check_for(cfg, resume=False) is False and folder.check_for(cfg, resume=True) is False
    folder.write_config(cfg)
    with pytest.raises(UserError) as err:
        folder.check_for(cfg, resume=False)
    tells(err, str(tmp_path), "already holds a run", "--resume", "another --out")
    longer = load_config("cpu-quick", overrides=[f"train.epochs={cfg['train']['epochs'] + 2}"]).to_dict()
    assert folder.check_for(longer, resume=True) is True
    other = load_config("cpu-quick", overrides=["optim.lr=0.5"]).to_dict()
    with pytest.raises(UserError) as err:
        folder.check_for(other, resume=True)
    tells(err, str(tmp_path), "another config", config_mismatch(cfg, other), "train.epochs", "train.max_steps",
          "train.max_tokens", "another --out")


def test_a_summary_that_is_not_json_is_named_with_its_fix(tmp_path):
    (tmp_path / "summary.json").write_text("{not json")
    try:
        json.loads("{not json")
    except json.JSONDecodeError as e:
        problem = e.msg
    with pytest.raises(UserError) as err:
        RunFolder(tmp_path).read_summary()
    tells(err, str(tmp_path / "summary.json"), "not valid JSON", problem, "iattn train --resume")


def test_read_results_of_an_unfinished_run_and_of_an_empty_log(tmp_path):
    with pytest.raises(UserError) as err:
        RunFolder(tmp_path).read_results()
    tells(err, str(tmp_path), "no summary.json", "iattn train --resume")
    folder = _finished_run(tmp_path)
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(UserError) as err:
        folder.read_results()
    tells(err, str(tmp_path / "metrics.jsonl"), "holds no record", "delete it and rerun the run")


def test_read_results_takes_a_perplexity_of_one_and_a_best_equal_up_to_rounding(tmp_path):
    folder = RunFolder(tmp_path)
    folder.write_summary({**SUMMARY, "best_val_ppl": 1.0 * (1 + 1e-12), "best_epoch": 2})
    folder.write_records("metrics.jsonl", [dict(kind="epoch", step=1, epoch=1, val_ppl=1.5),
                                           dict(kind="epoch", step=5, epoch=2, val_ppl=1.0)])
    assert folder.read_results()[0]["best_epoch"] == 2
    folder.write_summary({**SUMMARY, "best_val_ppl": 1.25, "best_epoch": 2})
    with pytest.raises(UserError) as err:
        folder.read_results()
    tells(err, str(tmp_path), "best_val_ppl (1.25 there, 1.0", "restore summary.json")


def test_drop_summary_of_a_folder_without_one_is_a_no_op(tmp_path):
    folder = _finished_run(tmp_path)
    folder.drop_summary()
    assert not (tmp_path / "summary.json").exists()
    folder.drop_summary()


def test_discard_unstarted_removes_only_what_a_refused_run_left(tmp_path):
    started = tmp_path / "started"
    RunFolder(started).write_config({"model": {}})
    (started / LOCK_NAME).write_text("1")
    RunFolder(started).discard_unstarted()
    assert sorted(p.name for p in started.iterdir()) == [LOCK_NAME, "config.yaml"]
    for held in ([LOCK_NAME, "tokenizer.json"], [LOCK_NAME], []):
        new = tmp_path / f"new{len(held)}"
        new.mkdir()
        for name in held:
            (new / name).write_text("x")
        RunFolder(new).discard_unstarted()
        assert not new.exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / LOCK_NAME).write_text("1")
    (kept / "notes.txt").write_text("someone's")
    RunFolder(kept).discard_unstarted()
    assert sorted(p.name for p in kept.iterdir()) == ["notes.txt"]


def test_foreign_lists_only_other_peoples_files(tmp_path):
    assert RunFolder(tmp_path / "missing").foreign() == []
    (tmp_path / LOCK_NAME).write_text("1")
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "arm.json").write_text("{}")
    (tmp_path / f".summary.json.iattn-{os.getpid()}.abcd1234.tmp").write_text("")
    assert RunFolder(tmp_path).foreign() == []
    (tmp_path / ".notes.tmp").write_text("")
    assert RunFolder(tmp_path).foreign() == [".notes.tmp"]
    (tmp_path / "config.yaml").write_text("model: {}\n")
    assert RunFolder(tmp_path).foreign() == []


def test_a_run_folder_s_lock_is_the_folder_s_own(tmp_path):
    """RunFolder.lock() takes the run lock (tests/unit/utils/test_lock.py) on the folder itself, creating it."""
    from iattention.utils.lock import holder

    lock = RunFolder(tmp_path / "run").lock()
    try:
        assert (tmp_path / "run" / LOCK_NAME).is_file() and lock.created_folder
        assert holder(tmp_path / "run") == str(os.getpid())
    finally:
        lock.release()


def test_an_arm_whose_overrides_are_not_strings_names_the_form(tmp_path):
    (tmp_path / "arm.json").write_text('{"arm": "a", "overrides": [1]}')
    with pytest.raises(UserError) as err:
        RunFolder(tmp_path).read_arm()
    tells(err, str(tmp_path / "arm.json"), "overrides must be strings", '{"arm": NAME, "overrides": [...]}')


def test_a_log_field_of_the_wrong_type_is_named_with_its_value(tmp_path):
    path = tmp_path / "steps.jsonl"
    path.write_text('{"step": "x", "loss": 1.0, "lr": 0.1}\n')
    with pytest.raises(UserError) as err:
        RunFolder(tmp_path).read_records("steps.jsonl")
    tells(err, str(path), "line 1", "key 'step': str 'x'", "delete it and rerun the run")


def test_an_arm_override_without_an_equals_sign_is_kept_as_written(tmp_path):
    folder = RunFolder(tmp_path)
    folder.write_arm({"arm": "a", "overrides": ["model.canonical", " flag "]})
    assert folder.read_arm()["overrides"] == ["model.canonical", " flag "]


def test_a_log_field_that_is_a_bool_is_refused_by_name(tmp_path):
    path = tmp_path / "steps.jsonl"
    path.write_text('{"step": true, "loss": 1.0, "lr": 0.1}\n')
    with pytest.raises(UserError) as err:
        RunFolder(tmp_path).read_records("steps.jsonl")
    tells(err, str(path), "line 1", "key 'step': bool True", "delete it and rerun the run")


def test_a_metrics_record_without_its_keys_names_the_first_missing_one(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n')
    with pytest.raises(UserError) as err:
        RunFolder(tmp_path).read_records()
    tells(err, str(path), "line 1", "key 'kind': missing", "delete it and rerun the run")


def test_a_long_log_value_is_cut_to_60_characters(tmp_path):
    path = tmp_path / "steps.jsonl"
    path.write_text(json.dumps({"step": "x" * 100, "loss": 1.0, "lr": 0.1}) + "\n")
    with pytest.raises(UserError) as err:
        RunFolder(tmp_path).read_records("steps.jsonl")
    # "str '" and 55 of the 100 characters
    message = tells(err, str(path), f"key 'step': str '{'x' * 55}", "delete it and rerun the run")
    assert "x" * 56 not in message


def test_a_summary_and_an_arm_that_are_not_text_name_what_they_should_be_and_the_fix(tmp_path):
    folder = RunFolder(tmp_path)
    (tmp_path / "summary.json").write_bytes(b"\xff")
    with pytest.raises(UserError) as err:
        folder.read_summary()
    tells(err, f"a run summary {tmp_path / 'summary.json'}", "not UTF-8", "iattn train --resume")
    arm_fix = 'rewrite it as {"arm": NAME, "overrides": [...]}'
    (tmp_path / "arm.json").write_bytes(b"\x80")
    with pytest.raises(UserError) as err:
        folder.read_arm()
    tells(err, f"an arm record {tmp_path / 'arm.json'}", "not UTF-8", arm_fix)
    (tmp_path / "arm.json").write_text("[]")
    with pytest.raises(UserError) as err:
        folder.read_arm()
    tells(err, str(tmp_path / "arm.json"), "not a JSON object but list", arm_fix)


def test_a_log_perplexity_below_one_is_named_with_its_step(tmp_path):
    folder = _finished_run(tmp_path)
    folder.write_records("metrics.jsonl", [dict(kind="epoch", step=1, epoch=1, val_ppl=12.5),
                                           dict(kind="epoch", step=5, epoch=2, val_ppl=0.5)])
    with pytest.raises(UserError) as err:
        folder.read_results()
    tells(err, str(tmp_path), "metrics.jsonl", "val_ppl 0.5 at step 5", "not a perplexity", "rerun")


def test_a_run_whose_every_evaluation_diverged_has_no_best_epoch(tmp_path):
    folder = RunFolder(tmp_path)
    folder.write_summary({**SUMMARY, "best_val_ppl": float("inf"), "best_epoch": 0})
    folder.write_records("metrics.jsonl", [dict(kind="epoch", step=1, epoch=1, val_ppl=float("inf")),
                                           dict(kind="epoch", step=5, epoch=2, val_ppl=float("nan"))])
    summary, records = folder.read_results()
    assert (summary["best_val_ppl"], summary["best_epoch"], len(records)) == (float("inf"), 0, 2)


def test_the_logs_of_an_unfinished_run_may_be_missing_or_empty(tmp_path):
    folder = RunFolder(tmp_path)
    assert folder.read_records() == [] and folder.read_records("steps.jsonl") == []
    (tmp_path / "metrics.jsonl").write_text("")
    assert folder.read_records() == []


def test_a_log_of_another_name_needs_only_an_integer_step(tmp_path):
    path = tmp_path / "other.jsonl"
    path.write_text('{"step": 1, "note": "x"}\n{"step": 7}\n')
    assert RunFolder(tmp_path).read_records("other.jsonl", max_step=5) == [{"step": 1, "note": "x"}]
    path.write_text('{"step": "1"}\n')
    with pytest.raises(UserError) as err:
        RunFolder(tmp_path).read_records("other.jsonl")
    tells(err, str(path), "line 1", "key 'step': str '1'", "delete it and rerun the run")


def test_an_appended_log_is_cut_in_place_to_the_step_given_and_a_torn_last_append_is_left_out(tmp_path):
    """append_records opens steps.jsonl where it is (the same file: a `tail -f` follows it), cut after the
    records up to the step given (what a crash left past them goes, a torn line too), then each append is one
    whole line at once; a last line cut short is left out of an unfinished run's log, refused in a finished
    one's."""
    from iattention.checkpoint.run_folder import STEPS

    folder = RunFolder(tmp_path)
    (tmp_path / STEPS).write_text("".join(json.dumps(dict(step=i, loss=1.0, lr=0.1)) + "\n" for i in (1, 2, 3))
                                  + '{"step": 4, "lo')
    inode = (tmp_path / STEPS).stat().st_ino
    log = folder.append_records(STEPS, 1)
    assert (tmp_path / STEPS).read_text() == json.dumps(dict(step=1, loss=1.0, lr=0.1)) + "\n"
    log.append(dict(step=2, loss=0.5, lr=0.2))
    assert [r["step"] for r in folder.read_records(STEPS)] == [1, 2]  # read while the log is open
    log.close()
    assert (tmp_path / STEPS).stat().st_ino == inode
    with open(tmp_path / STEPS, "a") as f:
        f.write('{"step": 3, "lo')
    assert [r["step"] for r in folder.read_records(STEPS)] == [1, 2]
    with pytest.raises(UserError, match="line 3 is not JSON"):
        folder.read_records(STEPS, finished=True)
    log = folder.append_records(STEPS, -1)  # a fresh run: the log starts empty
    log.close()
    assert (tmp_path / STEPS).read_text() == "" and (tmp_path / STEPS).stat().st_ino == inode
