"""The run folder: the one owner of every file a run writes and every command reads back.

    config.yaml      the resolved run config (written first)
    metrics.jsonl    one record per evaluation;  steps.jsonl: loss and lr of every optimizer step
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
from pathlib import Path

import yaml

from iattention.config.identity import config_mismatch, extends
from iattention.config.load import config_from_dict
from iattention.config.run import RunConfig
from iattention.errors import UserError
from iattention.utils.atomic import remove_stale_in, write_json, write_text
from iattention.utils.files import read_text, read_yaml

CONFIG, SUMMARY, METRICS, STEPS = "config.yaml", "summary.json", "metrics.jsonl", "steps.jsonl"
LAST, BEST, ARM, TOKENIZER, TENSORBOARD = "last.safetensors", "best.safetensors", "arm.json", "tokenizer.json", "tb"
# What every reader of summary.json relies on (key: accepted types).
SUMMARY_SCHEMA = {"config": (dict,), "attention": (str,), "n_head": (int,), "seed": (int,),
                  "best_val_ppl": (int, float), "best_epoch": (int,), "epochs_run": (int,)}


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
    bad = _bad_field(obj, schema or {})
    if bad:
        raise UserError(f"{path} is corrupt ({what}: {bad}); {fix}")
    return obj


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
        return loaded

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
                            "use the same config to resume (or the same with more train.epochs to extend it), or "
                            "choose another --out")
        return False

    # ------------------------------------------------------------- summary.json
    def has_summary(self) -> bool:
        return (self / SUMMARY).exists()

    def read_summary(self) -> dict | None:
        """The finished run's summary; None when there is none yet."""
        if not self.has_summary():
            return None
        return read_json_object(self / SUMMARY, "a run summary", "rerun that run (iattn sweep or "
                                "iattn train --resume finishes it again)", SUMMARY_SCHEMA)

    def finished(self, epochs: int) -> dict | None:
        """The summary when it is one of `epochs` epochs (or an early stop); a shorter one is what an
        extension leaves when it dies after rewriting config.yaml: not finished."""
        summary = self.read_summary()
        if summary and (summary["epochs_run"] >= epochs or summary.get("stopped_early")):
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
        """The records of a .jsonl log up to max_step. Logs are rewritten whole and atomically, so any line
        that is not a JSON object with an integer step, a torn last line too, means the file was damaged:
        refused, never read as a shorter run. finished: the run has a summary, so its metrics.jsonl must
        exist, and an existing log must hold records."""
        path = self / name
        if not path.exists():
            if finished and name == METRICS:
                raise UserError(f"{path} is missing: a finished run keeps one record per evaluation; rerun the run")
            return []
        lines = read_text(path, "a run log", "delete it and rerun the run").splitlines()
        if finished and not any(line.strip() for line in lines):  # finished: at least one evaluation or step
            raise UserError(f"{path} is corrupt (a finished run's log holds no record); delete it and rerun the run")
        out = []
        for i, line in enumerate(lines):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                raise UserError(f"{path} is corrupt (line {i + 1} is not JSON); delete it and rerun the run") from None
            bad = _bad_field(rec, LOG_SCHEMAS.get(name, {"step": (int,)}))
            if bad:
                raise UserError(f"{path} is corrupt (line {i + 1}: {bad}); delete it and rerun the run")
            if rec.get("step", 0) <= max_step:
                out.append(rec)
        return out

    def write_records(self, name: str, records: list[dict]) -> None:
        write_text(self / name, "".join(json.dumps(r) + "\n" for r in records))

    # ------------------------------------------------------------- arm.json
    def read_arm(self) -> dict | None:
        if not (self / ARM).exists():
            return None
        arm = read_json_object(self / ARM, "an arm record", 'rewrite it as {"arm": NAME, "overrides": [...]}',
                               {"arm": (str,), "overrides": (list,)})
        if not all(isinstance(o, str) for o in arm["overrides"]):
            raise UserError(f"{self / ARM} is corrupt (overrides must be strings); rewrite it as "
                            '{"arm": NAME, "overrides": [...]}')
        return arm

    def write_arm(self, arm: dict) -> None:
        write_json(self / ARM, arm)

    # ------------------------------------------------------------- checkpoints and housekeeping
    def weights(self) -> Path | None:
        """The file whose weights stand for this folder: best, then an exported model, then last."""
        for name in (BEST, "model.safetensors", LAST):
            if (self / name).is_file():
                return self / name
        return None

    def clean_temp(self) -> None:
        """Our temp files of a write that a crash cut short (named `.NAME.iattn-PID.xxxx.tmp`, writer gone);
        never another file, whatever its name."""
        remove_stale_in(self.path)

    def foreign(self) -> list[str]:
        """What an existing folder without config.yaml holds that a run does not write before its config:
        the names of someone else's files (empty for a new folder, or one a run was refused in)."""
        from iattention.utils.atomic import temp_writer
        from iattention.utils.lock import LOCK_NAME

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
        from iattention.utils.lock import LOCK_NAME

        for name in (LOCK_NAME, TOKENIZER):
            (self / name).unlink(missing_ok=True)
        self.clean_temp()
        try:
            self.path.rmdir()
        except OSError:
            pass

    def lock(self):
        from iattention.utils.lock import RunLock

        return RunLock(self.path).acquire()
