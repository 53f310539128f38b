"""The run folder: the one owner of every file a run writes and every command reads back.

    config.yaml      the resolved run config (written first)
    metrics.jsonl    one record per evaluation;  steps.jsonl: loss and lr of every optimizer step (both
                     appended a whole line at a time, cut in place to the checkpoint on --resume)
    last.safetensors resumable state;  best.safetensors: best-validation weights
    tokenizer.json   the run's own bpe tokenizer (bpe:N runs)
    arm.json         the study arm a sweep ran it as
    summary.json     written last: its presence (for the config's epochs) means "finished"
    tb/              TensorBoard events;  .lock: the process that owns the folder now

Each file is read here and only here, checked against its shape: a corrupt, empty or foreign file is a
one-line `UserError` naming the file and the fix, never a traceback. "Is this folder the same run as
this config?" is answered here too (`mismatch`, `check_for`), from `config/identity.py`.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import yaml

from iattention.config.identity import config_mismatch, extends
from iattention.config.load import config_from_dict
from iattention.config.model import upgrade_config, upgrade_override_key
from iattention.config.run import RunConfig
from iattention.errors import UserError
from iattention.utils.atomic import remove_stale_in, temp_writer, write_json, write_text
from iattention.utils.files import os_error_message, read_text, read_yaml
from iattention.utils.lock import LOCK_NAME, RunLock

CONFIG, SUMMARY, METRICS, STEPS = "config.yaml", "summary.json", "metrics.jsonl", "steps.jsonl"
LAST, BEST, ARM, TOKENIZER, TENSORBOARD = "last.safetensors", "best.safetensors", "arm.json", "tokenizer.json", "tb"
# What every reader of summary.json relies on (key: accepted types).
SUMMARY_SCHEMA = {"config": (dict,), "attention": (str,), "n_head": (int,), "seed": (int,),
                  "best_val_ppl": (int, float), "best_epoch": (int,), "epochs_run": (int,)}


def _upgrade_override(text: str) -> str:
    """A saved arm's KEY=VALUE override with a renamed key under its new name."""
    key, eq, value = text.partition("=")
    return f"{upgrade_override_key(key.strip())}{eq}{value}" if eq else text


# What readers of each log rely on in every record (key: accepted types); extra keys are free.
_NUMBER = (int, float)
LOG_SCHEMAS = {METRICS: {"kind": (str,), "step": (int,), "epoch": (int,), "val_ppl": _NUMBER},
               STEPS: {"step": (int,), "loss": _NUMBER, "lr": _NUMBER}}


def _bad_field(obj, schema: dict) -> str | None:
    """What breaks `schema` in `obj` ("not an object", "key 'x': missing", ...), None if nothing does."""
    if not isinstance(obj, dict):
        return f"not a JSON object but {type(obj).__name__}"
    for key, types in schema.items():
        value = obj.get(key)
        if key not in obj or not isinstance(value, types) or isinstance(value, bool) and bool not in types:
            got = "missing" if key not in obj else f"{type(value).__name__} {value!r}"[:60]
            return f"key {key!r}: {got}"
    return None


def read_json_object(path: Path, what: str, fix: str, schema: dict | None = None) -> dict:
    """A JSON file that must hold an object with `schema`'s keys and types; anything else is one line."""
    text = read_text(path, what, fix)
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{path} is corrupt ({what} is not valid JSON: {e.msg}); {fix}") from None
    return check_json_object(obj, path, what, fix, schema)


def check_json_object(obj, path: Path, what: str, fix: str, schema: dict | None = None) -> dict:
    """`obj`, read from `path`, if it is an object with `schema`'s keys and types; else one line."""
    bad = _bad_field(obj, schema or {})
    if bad:
        raise UserError(f"{path} is corrupt ({what}: {bad}); {fix}")
    return obj


class RecordLog:
    """An open .jsonl log (steps.jsonl, metrics.jsonl), appended one record a line. Each line goes to the OS in
    one write() as it is made: a killed process loses none, and a reader (`tail -f`) never sees half a record;
    `sync` puts them on disk (fsync), before a checkpoint that points past them. Opened (`RunFolder.
    append_records`) on the file that is there, cut in place (the same inode: a `tail -f` started before a
    resume follows it) after the last record a resume starts from; a torn last line goes with what is cut."""

    def __init__(self, path: Path, max_step: float):
        self.path = path
        try:
            data = path.read_bytes() if path.exists() else b""
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as e:
            raise UserError(f"cannot append to {os_error_message(e, path) or f'{path}: {e}'}") from None
        self._last, self._end = None, 0  # where the last whole line kept starts, and where the kept text ends
        while self._end < len(data):
            stop = data.find(b"\n", self._end)
            if stop < 0:
                break  # a torn last line: a write a kill cut short (never ours: each line is one write)
            try:
                step = json.loads(data[self._end: stop]).get("step", 0)
            except (ValueError, AttributeError):
                break
            if not isinstance(step, int) or step > max_step:
                break
            self._last, self._end = self._end, stop + 1
        if self._end < len(data):
            os.ftruncate(self._fd, self._end)
        os.lseek(self._fd, self._end, os.SEEK_SET)

    def append(self, record: dict) -> None:
        line = (json.dumps(record) + "\n").encode()
        done = os.write(self._fd, line)
        while done < len(line):  # a regular file writes whole unless the disk is full: then the rest, or OSError
            done += os.write(self._fd, line[done:])
        self._last, self._end = self._end, self._end + len(line)

    def replace_last(self, record: dict) -> None:
        """The last line rewritten in place, at its own length (compact JSON padded with spaces) in one write:
        never torn, nothing after it moves."""
        assert self._last is not None, "no line to replace"
        width = self._end - self._last - 1
        text = json.dumps(record, separators=(",", ":"))
        if len(text) > width:
            raise ValueError(f"record {text[:40]}... does not fit the {width} characters of the line it replaces")
        os.pwrite(self._fd, (text.ljust(width) + "\n").encode(), self._last)

    def sync(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class RunFolder:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    @property
    def name(self) -> str:
        return self.path.name

    # ------------------------------------------------------------- config.yaml
    def read_config(self) -> dict | None:
        """The saved run config as a dict; None when the folder holds none."""
        path = self / CONFIG
        if not path.exists():
            return None
        fix = "delete the folder or choose another --out"
        loaded = read_yaml(path, "a run config", fix)
        if not isinstance(loaded, dict) or not all(isinstance(v, dict) for v in loaded.values()):
            raise UserError(f"{path} is corrupt (a run config is a mapping of sections model:, data:, optim:, "
                            f"train:); {fix}")
        return upgrade_config(loaded)  # a run saved before a key was renamed reads under the new name

    def run_config(self) -> RunConfig:
        raw = self.read_config()
        if raw is None:
            raise UserError(f"{self.path} holds no run (no {CONFIG}); check the folder")
        return config_from_dict(raw)

    def write_config(self, cfg: dict) -> None:
        write_text(self / CONFIG, yaml.safe_dump(cfg, sort_keys=False))

    # ------------------------------------------------------------- identity
    def check_for(self, cfg: dict, resume: bool) -> bool:
        """Refuse a folder that holds another run; True when --resume extends the run there to more epochs."""
        old = self.read_config()
        if old is None:
            return False
        if not resume:
            raise UserError(f"output folder {self.path} already holds a run; pass --resume to continue it or "
                            "choose another --out")
        diff = config_mismatch(old, cfg)
        if diff and extends(old, cfg):
            return True
        if diff:
            raise UserError(f"output folder {self.path} holds a run with another config (its {CONFIG}: {diff}); "
                            "use the same config to resume (or the same with a larger train.epochs, train.max_steps or "
                            "train.max_tokens to extend it), or "
                            "choose another --out")
        return False

    # ------------------------------------------------------------- summary.json
    def has_summary(self) -> bool:
        return (self / SUMMARY).exists()

    def read_summary(self) -> dict | None:
        """The finished run's summary; None when there is none yet."""
        if not self.has_summary():
            return None
        summary = read_json_object(self / SUMMARY, "a run summary", "rerun that run (iattn sweep or "
                                   "iattn train --resume finishes it again)", SUMMARY_SCHEMA)
        return {**summary, "config": upgrade_config(summary["config"])}

    def read_results(self) -> tuple[dict, list[dict]]:
        """(summary, metrics.jsonl records) of a finished run, the summary checked against the log it was
        computed from: the best validation perplexity and its epoch, the epochs run, and perplexities that
        can be (>= 1, the test one too). An edited or damaged summary.json is refused, naming the key,
        never reported."""
        summary = self.read_summary()
        if summary is None:
            raise UserError(f"{self.path} holds no finished run (no {SUMMARY}); finish it with iattn train --resume")
        records = self.read_records(METRICS, finished=True)
        epochs = [r for r in records if r["kind"] == "epoch"]
        fix = f"restore {SUMMARY} (or rerun the run: delete it and iattn train --resume finishes it again)"

        def refuse(key: str, there, expected) -> None:
            raise UserError(f"run {self.path}: {SUMMARY} disagrees with {METRICS} on {key} ({there!r} there, "
                            f"{expected} from the log); {fix}")

        for r in records:
            if r["val_ppl"] < 1:  # exp(mean NLL >= 0); NaN or Inf: a diverged evaluation, never the best
                raise UserError(f"run {self.path}: {METRICS} holds val_ppl {r['val_ppl']!r} at step {r['step']}, "
                                "not a perplexity (>= 1); restore it, or delete the run folder and rerun")
        if summary["epochs_run"] != len(epochs):
            refuse("epochs_run", summary["epochs_run"], f"{len(epochs)} epoch records")
        # the best weights are chosen at epoch ends, and at a budget's end mid-epoch (kind "budget": an epoch
        # record until an extension went on with that epoch, trainer.py)
        finite = [r for r in records if r["kind"] in ("epoch", "budget") and math.isfinite(r["val_ppl"])]
        best = min(finite, key=lambda r: r["val_ppl"]) if finite else None  # the first of equal minima
        want_ppl, want_epoch = (best["val_ppl"], best["epoch"]) if best else (math.inf, 0)
        got = summary["best_val_ppl"]
        if not (got == want_ppl or math.isfinite(got) and math.isclose(got, want_ppl, rel_tol=1e-9)):
            refuse("best_val_ppl", got, f"{want_ppl!r}, the lowest epoch val_ppl")
        if summary["best_epoch"] != want_epoch:
            refuse("best_epoch", summary["best_epoch"], f"epoch {want_epoch}, where val_ppl is lowest")
        test = summary.get("test_ppl")
        if test is not None and not (isinstance(test, (int, float)) and not isinstance(test, bool) and test >= 1):
            raise UserError(f"run {self.path}: {SUMMARY} holds test_ppl {test!r}, not a perplexity (>= 1); {fix}")
        return summary, records

    def finished(self, epochs: int, steps: int | None = None) -> dict | None:
        """The summary when it is one of `epochs` epochs, or of `steps` steps when a step or token budget
        sets the run's length (or an early stop); a shorter one is what an extension leaves when it dies
        after rewriting config.yaml: not finished."""
        summary = self.read_summary()
        done = bool(summary) and (summary["epochs_run"] >= epochs if steps is None
                                  else summary.get("steps", 0) >= steps)
        if summary and (done or summary.get("stopped_early")):
            return summary
        return None

    def summary_mismatch(self, want: dict) -> str | None:
        """None if the finished run here is the run `want` (a resolved config dict) describes."""
        return config_mismatch(self.read_summary()["config"], want)

    def write_summary(self, summary: dict) -> None:
        write_json(self / SUMMARY, summary)

    def drop_summary(self) -> None:
        (self / SUMMARY).unlink(missing_ok=True)

    # ------------------------------------------------------------- metrics.jsonl, steps.jsonl
    def read_records(self, name: str = METRICS, max_step: float = math.inf, finished: bool = False) -> list[dict]:
        """The records of a .jsonl log up to max_step. Any line that is not a JSON object with the log's keys
        means the file was damaged: refused, never read as a shorter run, but for one case: steps.jsonl and
        metrics.jsonl are appended as a run goes (`append_records`), so of an unfinished run, a last line
        without its newline that is not JSON is an append cut short, left out (it lies past the last
        checkpoint: the logs are synced before each). finished: the run has a summary, so its metrics.jsonl
        must exist, and an existing log must hold records."""
        path = self / name
        if not path.exists():
            if finished and name == METRICS:
                raise UserError(f"{path} is missing: a finished run keeps one record per evaluation; rerun the run")
            return []
        lines = read_text(path, "a run log", "delete it and rerun the run").splitlines(keepends=True)
        if finished and not any(line.strip() for line in lines):  # finished: at least one evaluation or step
            raise UserError(f"{path} is corrupt (a finished run's log holds no record); delete it and rerun the run")
        out = []
        text_ends = lines and not lines[-1].endswith("\n")
        for i, line in enumerate(lines):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                if name in (STEPS, METRICS) and i == len(lines) - 1 and text_ends and not finished:
                    break  # an append cut short (the logs grow as a run goes): the record it held is not kept
                raise UserError(f"{path} is corrupt (line {i + 1} is not JSON); delete it and rerun the run") from None
            bad = _bad_field(rec, LOG_SCHEMAS.get(name, {"step": (int,)}))
            if bad:
                raise UserError(f"{path} is corrupt (line {i + 1}: {bad}); delete it and rerun the run")
            if rec.get("step", 0) <= max_step:
                out.append(rec)
        return out

    def write_records(self, name: str, records: list[dict]) -> None:
        write_text(self / name, "".join(json.dumps(r) + "\n" for r in records))

    def append_records(self, name: str, max_step: float) -> RecordLog:
        """A log that grows as the run goes (steps.jsonl and metrics.jsonl: `tail -f` follows them, a killed run
        keeps them), opened to append after its last record up to `max_step` (a resumed run's checkpoint; -1:
        a fresh run, an empty log): what a crash left past it is cut in place, so no step is kept twice and
        the file stays the one a reader has open."""
        return RecordLog(self / name, max_step)

    # ------------------------------------------------------------- arm.json
    def read_arm(self) -> dict | None:
        if not (self / ARM).exists():
            return None
        arm = read_json_object(self / ARM, "an arm record", 'rewrite it as {"arm": NAME, "overrides": [...]}',
                               {"arm": (str,), "overrides": (list,)})
        if not all(isinstance(o, str) for o in arm["overrides"]):
            raise UserError(f"{self / ARM} is corrupt (overrides must be strings); rewrite it as "
                            '{"arm": NAME, "overrides": [...]}')
        return {**arm, "overrides": [_upgrade_override(o) for o in arm["overrides"]]}

    def write_arm(self, arm: dict) -> None:
        write_json(self / ARM, arm)

    # ------------------------------------------------------------- checkpoints and housekeeping
    def weights(self) -> Path | None:
        """The file whose weights stand for this folder: best, then an exported model, then last."""
        for name in (BEST, "model.safetensors", LAST):
            if (self / name).is_file():
                return self / name
        return None

    def check_checkpoint(self, path: Path, meta: dict) -> None:
        """A checkpoint in this folder must be this run's (its config, or the run's before an extension to
        more epochs): one copied in from another run would be evaluated in its place. A damaged config.yaml
        leaves nothing to compare with: the checkpoint carries its own config, and commands that read only
        the weights keep working (train --resume refuses that file itself)."""
        try:
            saved = self.read_config()
        except UserError:
            return
        if saved is None:
            return
        theirs = meta.get("config")
        diff = config_mismatch(theirs, saved)
        if diff and not extends(theirs, saved):
            raise UserError(f"checkpoint {path} is not this run's: it comes from another config than {self / CONFIG} "
                            f"({diff}); use the run's own checkpoint, or evaluate the file from its own run folder")

    def clean_temp(self) -> None:
        """Our temp files of a write that a crash cut short (named `.NAME.iattn-PID.xxxx.tmp`, writer gone);
        never another file, whatever its name."""
        remove_stale_in(self.path)

    def foreign(self) -> list[str]:
        """What an existing folder without config.yaml holds that a run does not write before its config:
        the names of someone else's files (empty for a new folder, or one a run was refused in)."""

        if not self.path.is_dir() or (self / CONFIG).exists():
            return []
        ours = {LOCK_NAME, TOKENIZER, ARM}
        return sorted(p.name for p in self.path.iterdir() if p.name not in ours and temp_writer(p.name) is None)

    def check_ours(self) -> None:
        """Refuse a non-empty folder that is not one of our runs: nothing in it is overwritten or removed."""
        foreign = self.foreign()
        if foreign:
            shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
            raise UserError(f"output folder {self.path} is not an iattn run folder (no {CONFIG}) and holds {shown}; "
                            "choose a new or empty folder for --out (nothing there was touched)")

    def discard_unstarted(self) -> None:
        """Remove a folder this process created and that no run started in (no config.yaml yet): its lock,
        a saved tokenizer and our temp files go; anything else found there keeps the folder."""
        if (self / CONFIG).exists():
            return

        for name in (LOCK_NAME, TOKENIZER):
            (self / name).unlink(missing_ok=True)
        self.clean_temp()
        try:
            self.path.rmdir()
        except OSError:
            pass

    def lock(self):

        return RunLock(self.path).acquire()
