"""CLI errors: a user's mistake is one `iattn: error:` line and exit 2, before anything is written: an --out
that is not a run folder (a user's folder, a symlink, a loop, a name no message can hold), bad values and flags,
absurd model sizes."""


import pytest

from helpers import one_line_error, tiny_overrides, write_corpus
from helpers import refused as _refused
from iattention.cli import main


def _train(corpus, out, *extra):
    return ["train", "--preset", "tiny", "--quiet", "--out", str(out), *corpus["ov"], *extra]


def _error(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("iattn: error: "), err
    return lines[0]


# ------------------------------------------------------------------ --out: folders that are not a run's
@pytest.mark.slow
def test_a_symlink_lock_never_truncates_its_target(corpus, tmp_path, capsys):
    """Before: `os.open(O_RDWR|O_CREAT)` followed the link, `ftruncate` emptied the target, and the run trained."""
    victim = tmp_path / "v"
    victim.write_text("precious\n")
    run = tmp_path / "r"
    run.mkdir()
    (run / ".lock").symlink_to(victim)
    assert main(_train(corpus, run)) == 2
    assert "symbolic link" in _error(capsys)
    assert victim.read_text() == "precious\n"
    assert sorted(p.name for p in run.iterdir()) == [".lock"]  # nothing written beside it


@pytest.mark.slow
def test_a_users_folder_is_not_written_into(corpus, tmp_path, capsys):
    """Before: the run trained into it and overwrote the user's metrics.jsonl (and wrote summary.json, ...)."""
    mine = tmp_path / "m"
    mine.mkdir()
    (mine / "metrics.jsonl").write_text("mine\n")
    assert main(_train(corpus, mine)) == 2
    message = _error(capsys)
    assert "not an iattn run folder" in message and "metrics.jsonl" in message
    assert sorted(p.name for p in mine.iterdir()) == ["metrics.jsonl"]  # not even a .lock
    assert (mine / "metrics.jsonl").read_text() == "mine\n"


@pytest.mark.slow
def test_resume_keeps_a_users_temp_file(corpus, tmp_path, capsys):
    """Before: `--resume` deleted every `.*.tmp` in --out, the user's `.notes.tmp` too, then trained there."""
    folder = tmp_path / "p"
    folder.mkdir()
    (folder / ".notes.tmp").write_text("n\n")
    assert main(_train(corpus, folder, "--resume")) == 2
    assert ".notes.tmp" in _error(capsys)
    assert (folder / ".notes.tmp").read_text() == "n\n"


@pytest.mark.slow
@pytest.mark.parametrize("where", ["home", "data"])
def test_the_home_and_data_folders_are_refused_as_out(corpus, tmp_path, monkeypatch, capsys, where):
    """Before: accepted (and `--out /` as root): a run's files were written into them."""
    folder = tmp_path / where
    folder.mkdir()
    monkeypatch.setenv("HOME" if where == "home" else "IATTN_DATA_DIR", str(folder))
    assert main(_train(corpus, folder)) == 2
    assert ("home folder" if where == "home" else "data folder") in _error(capsys)
    assert list(folder.iterdir()) == []


@pytest.mark.slow
def test_a_symlink_loop_as_out_is_one_line(corpus, tmp_path, capsys):
    """Before: `OSError: [Errno 40] Too many levels of symbolic links` (a traceback)."""
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    assert main(_train(corpus, tmp_path / "loop1")) == 2
    assert "symlink loop" in _error(capsys)


@pytest.mark.slow
@pytest.mark.parametrize("name, says", [("r\udcffun", "UTF-8"), ("r\nun", "control characters")])
def test_an_out_that_no_message_can_name_is_refused_first(corpus, tmp_path, capsys, name, says):
    """Before: a non-UTF-8 --out trained fully, then said best.safetensors was corrupt ("delete it");
    a newline in --out split every error into two lines."""
    with pytest.raises(SystemExit) as e:
        main(_train(corpus, str(tmp_path) + "/" + name))
    assert e.value.code == 2 and says in _error(capsys)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_convert_refuses_an_existing_out_before_reading_the_source(tmp_path, capsys, monkeypatch):
    """Before the source is read at all (not timed: a reader of the source fails the test wherever it is)."""
    import iattention.cli.interop as cli_interop

    def read(*_, **__):
        raise AssertionError("the source was read before the --out check")

    for name in ("load_any", "hf_to_ours", "ours_to_hf", "is_streamed_source", "hf_folder"):
        if hasattr(cli_interop, name):
            monkeypatch.setattr(cli_interop, name, read)
    out = tmp_path / "exists"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    assert main(["convert", "--from", str(tmp_path / "not-read-yet"), "--to", "hf", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "already exists" in err
    assert (out / "mine.txt").read_text() == "keep"


def test_a_file_where_submitit_keeps_its_logs_is_one_line(tmp_path, capsys):
    """A file named <out>/submitit gave FileExistsError from submitit."""
    pytest.importorskip("submitit")
    (tmp_path / "sw").mkdir()
    (tmp_path / "sw" / "submitit").write_text("my notes")
    paths = write_corpus(tmp_path)
    rc = main(["sweep", "--preset", "tiny", "--arms", "standard", "--heads", "2", "--seeds", "0", "--out",
               str(tmp_path / "sw"), "--launcher", "submitit", *tiny_overrides(paths, tmp_path / "cache")])
    one_line_error(capsys, rc, "submitit", "not a folder")
    assert (tmp_path / "sw" / "submitit").read_text() == "my notes"


# ------------------------------------------------------------------ values and flags
@pytest.mark.slow
def test_a_malformed_failpoint_is_one_line_at_start(corpus, tmp_path, monkeypatch, capsys):
    """Before: `IATTN_FAULT=ckpt_write:abc` trained an epoch, then `int('abc')` raised ValueError."""
    monkeypatch.setenv("IATTN_FAULT", "ckpt_write:abc")
    assert main(_train(corpus, tmp_path / "run")) == 2
    assert "IATTN_FAULT" in _error(capsys)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_every_error_is_one_line(tmp_path, capsys):
    """A newline in any path a message names (here a config file) cannot split the message."""
    assert main(["train", "--config", f"{tmp_path}/a\nb.yaml", "--quiet", "--out", str(tmp_path / "run")]) == 2
    assert "a\\nb.yaml" in _error(capsys)


@pytest.mark.slow
def test_a_seed_beyond_int64_is_refused_before_the_sweep_writes(corpus, tmp_path, capsys):
    """Before: `sweep --seeds 100000000000000000000` created the run folder and arm.json, then its child
    refused the seed, nested as "iattn: error: run ... failed (exit 2): iattn: error: ..."."""
    out = tmp_path / "sweep"
    assert main(["sweep", "--preset", "tiny", "--arms", "standard", "--heads", "2", "--seeds",
                 "100000000000000000000", "--out", str(out), *corpus["ov"]]) == 2
    message = _error(capsys)
    assert message.count("iattn: error:") == 1 and "train.seed" in message
    assert not out.exists()


@pytest.mark.parametrize("flag,value", [("--seeds", "0,0"), ("--heads", "2,02"), ("--seeds", "1,2,+1")])
def test_a_value_given_twice_in_a_grid_is_refused_before_anything_runs(tmp_path, capsys, flag, value):
    """`--seeds 0,0` started one run twice (two children on one folder) and printed a table that contradicts
    itself; repeated values are refused as repeated arms are, before a folder is made."""
    with pytest.raises(SystemExit) as refused:  # argparse's refusal (cli.args.Parser): one line, exit 2
        main(["sweep", "--preset", "tiny", "--arms", "standard", "--out", str(tmp_path / "sw"), flag, value])
    line = one_line_error(capsys, refused.value.code, flag, "repeats", "once")
    assert value in line and not (tmp_path / "sw").exists()


@pytest.mark.slow
def test_a_data_dir_that_is_a_file_is_called_a_file(tmp_path, capsys):
    """Before: `IATTN_DATA_DIR=<a file>` said the folder "does not exist"."""
    (tmp_path / "f").write_text("x")
    assert main(["train", "--preset", "tiny", "--quiet", "--out", str(tmp_path / "run"),
                 "--data-dir", str(tmp_path / "f")]) == 2
    assert "is a file, not a folder" in _error(capsys)


@pytest.mark.slow
def test_a_foreign_init_from_file_is_never_called_ours_to_delete(corpus, tmp_path, capsys):
    """Before: `--init-from /etc/passwd` said "corrupt or truncated; delete it"."""
    theirs = tmp_path / "passwd"
    theirs.write_text("root:x:0:0:root:/root:/bin/bash\n")
    assert main(_train(corpus, tmp_path / "run", "--init-from", str(theirs))) == 2
    message = _error(capsys)
    assert "delete" not in message and "not a safetensors file" in message
    assert theirs.exists()


@pytest.mark.slow
@pytest.mark.parametrize("margin", ["nan", "inf", "0", "-2"])
def test_report_refuses_a_margin_that_is_not_a_positive_number(env, tmp_path, capsys, margin):
    _refused(capsys, ["report", env["run"].parent, "--out", tmp_path / "rep", "--margin", margin], "--margin")
    assert not (tmp_path / "rep").exists()


@pytest.mark.slow
@pytest.mark.parametrize("family", ["nope", "standard"])
def test_report_refuses_a_family_without_compared_arms(env, tmp_path, capsys, family):
    _refused(capsys, ["report", env["run"].parent, "--out", tmp_path / "rep", "--family", family], "--family",
             family)
    assert not (tmp_path / "rep" / "report.md").exists()


@pytest.mark.slow
@pytest.mark.parametrize("sizes", [["model.n_layer=200000"], ["model.n_embd=12288", "model.n_head=1"],
                                   ["model.block_size=100000"], ["model.vocab_pad_multiple=1000000000"]])
def test_absurd_sizes_are_refused_before_allocating(tmp_path, capsys, monkeypatch, sizes):
    """These reached MemoryError: the check counted float32 weights of the true vocabulary only. The estimate
    now holds the padded vocabulary, gradients, AdamW's moments and one batch's activations. The machine's
    memory is set here (16 GiB, on the CPU): on a 128 GB / 80 GB GPU machine two of these sizes fit."""
    monkeypatch.setattr("iattention.model.gpt.available_memory", lambda device=None: 16 * 2**30)
    paths = write_corpus(tmp_path)
    if "block_size" in sizes[0]:  # enough tokens for one batch of 8 windows of 100,000, and a window to evaluate
        for split in ("train", "valid", "test"):
            with open(paths[split], "w") as f:
                f.write("the cat sat on the mat. " * (40_000 if split == "train" else 5_000))
    ov = tiny_overrides(paths, tmp_path / "cache", **{"train.epochs": 1, "train.device": "cpu"})
    capsys.readouterr()
    rc = main(["train", "--preset", "tiny", "--quiet", *ov, *sizes, "--out", str(tmp_path / "run")])
    line = one_line_error(capsys, rc, "needs an estimated", "16.0 GiB available on this machine", "AdamW moments")
    assert "activations" in line
