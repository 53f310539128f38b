"""The run folder's side of training (on top of `checkpoint/RunFolder`): the folder checks and the lock,
the resume/extend policy (a new run, a resume, an extension to more epochs, or a finished run to
return), the checks a resume makes (config, data fingerprints, logs against the checkpoint),
`train.init_from`, and saving last/best checkpoints and the summary."""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path
from typing import NamedTuple

import torch

from iattention.checkpoint import state as ckpt
from iattention.checkpoint.run_folder import BEST, LAST, METRICS, STEPS, TOKENIZER, RunFolder
from iattention.config import RunConfig, config_mismatch, extends
from iattention.data.tokenizers import (
    HFFolderTokenizer,
    Tokenizer,
    hf_tokenizer_changes,
    keep_hf_tokenizer,
    kept_copy,
    save_tokenizer_file,
    tokenizer_identities,
    tokenizer_identity,
)
from iattention.errors import UserError
from iattention.train.distributed import DistContext
from iattention.train.init_from import load_initial_weights
from iattention.train.state import TrainState
from iattention.utils.files import check_out_folder


class Start(NamedTuple):
    """Where the loop starts: a fresh state and empty logs, or those of the checkpoint it resumes."""
    state: TrainState
    records: list[dict]  # metrics.jsonl up to the checkpoint's step
    steps: list[dict]  # steps.jsonl up to it
    resumed: bool = True
    relabel: dict | None = None  # metrics.jsonl's last record, to rewrite so (an epoch a budget ended, reopened)

    @property
    def log_step(self) -> float:
        """The step the logs are kept up to (-1: a fresh run's logs start empty)."""
        return self.state.step if self.resumed else -1


class Checkpointer:
    def __init__(self, out: str | Path, resume: bool, ctx: DistContext):
        self.out, self.folder, self.resume, self.ctx = Path(out), RunFolder(out), resume, ctx
        self.extending = False  # --resume to a larger budget than the run there was made for
        self.total_steps, self.budget = 0, ""  # the run's length in steps, and the key that sets it
        self.config: dict = {}  # the run's resolved config, and the data fingerprints it checks and saves
        self.fingerprints: dict = {}
        self.tokenizer = ""  # what the run's tokenizer maps text to (tokenizer_identity), saved in every checkpoint
        self._tokenizer: Tokenizer | None = None  # the tokenizer itself: an hf:FOLDER one is kept once checked
        self._lock = None
        self._created = False

    # ------------------------------------------------------------- before the data
    def claim(self, data_dir: str) -> None:
        """Refuse a folder that cannot be this run's, then hold it (utils/lock.py) until the run ends."""
        check_out_folder(self.out, data_dir)
        if self.out.exists() and not self.out.is_dir():
            raise UserError(f"output path {self.out} is a file; choose a folder for --out")
        self.folder.check_ours()  # a user's folder: refused before anything is written into it
        # Taken before the data loads, so a second sweep sees a run that is still loading as in use and skips
        # it. A refused lock removes only what this process made (never the holder's .lock).
        if self.ctx.is_main:
            self._lock = self.folder.lock()
            self._created = self._lock.created_folder

    def discard_unstarted(self) -> None:
        """After a failure: leave no folder holding only a lock that this process created."""
        if self._lock and self._created:
            self.folder.discard_unstarted()

    def release(self) -> None:
        if self._lock:
            self._lock.release()

    # ------------------------------------------------------------- the resume/extend policy
    def check(self, config: dict, fingerprints: dict, tokenizer: Tokenizer, total_steps: int = 0,
              budget: str = "") -> dict | None:
        """Is the folder this run's? The summary of a finished run when --resume has nothing to do, else None
        (train); `extending` tells whether the run there goes on longer (`total_steps` in all, as `budget`
        says: train.epochs, train.max_steps or train.max_tokens). A budget that ends where the run already
        is, or before, is refused here, before anything in the folder changes."""
        self.config, self.fingerprints, self.tokenizer = config, fingerprints, tokenizer_identity(tokenizer)
        self._tokenizer = tokenizer
        self.total_steps, self.budget = total_steps, budget
        self.extending = self.folder.check_for(config, self.resume)
        if self.resume:
            self._check_folder_tokenizer()
        if budget and self.extending and (self.folder / LAST).exists():
            reached = ckpt.read_meta(self.folder / LAST).get("state", {}).get("step", 0)
            if isinstance(reached, int) and reached >= total_steps:
                raise UserError(f"{budget} is {total_steps} steps, and the run in {self.out} has made {reached}: "
                                "--resume extends a run, it cannot shorten one; give a larger budget")
        if self.ctx.is_main and not (self.folder / TOKENIZER).exists():  # the run carries its bpe tokenizer
            save_tokenizer_file(tokenizer, self.folder / TOKENIZER)
        if self.resume and self.folder.has_summary() and not self.extending:
            budgeted = bool(budget) and not budget.startswith("train.epochs=")
            finished = self.folder.finished(config["train"]["epochs"], total_steps if budgeted else None)
            if finished is not None:
                if self.ctx.is_main and self._recorded_tokenizer() in tokenizer_identities(tokenizer):
                    self._keep_tokenizer()  # a finished run made before the copy gets one too
                return finished
            self.extending = True  # a summary of fewer epochs: an extension that died before dropping it
        return None

    def initial_weights(self, model: torch.nn.Module, cfg: RunConfig) -> dict | None:
        """`train.init_from` loaded into the fresh model; what was loaded (None: a fresh initialisation)."""
        return load_initial_weights(model, cfg.train.init_from, cfg) if cfg.train.init_from else None

    def start(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps_per_epoch: int = 0) -> Start:
        """last.safetensors loaded into `model` and `optimizer` with the logs it had written, on --resume
        where there is one; else a fresh run (whose config.yaml is written now)."""
        fresh = Start(TrainState(), [], [], resumed=False)
        if not self.ctx.is_main:
            return (self._load_last(model, optimizer, steps_per_epoch) if self.resume and (self.folder / LAST).exists()
                    else fresh)
        if self.resume and self.out.is_dir():
            self.folder.clean_temp()
        if self.resume and (self.folder / LAST).exists():
            resumed = self._load_last(model, optimizer, steps_per_epoch)
            if self.extending:  # the longer run's config; its summary comes when it ends
                s = resumed.state
                epochs = not self.budget or self.budget.startswith("train.epochs=")
                span = (f"{s.epoch} to {self.config['train']['epochs']} epochs" if epochs and not s.batch else
                        f"step {s.step} to " + (f"{self.config['train']['epochs']} epochs" if epochs else
                                                f"{self.total_steps} steps"))
                goes_on = f"; epoch {s.epoch + 1} goes on from batch {s.batch}/{steps_per_epoch}" if s.batch else ""
                print(f"iattn: extending {self.out} from {span} ({self.budget or 'train.epochs'}{goes_on}; the "
                      "schedule is recomputed over the new total)", file=sys.stderr)
                self.folder.write_config(self.config)
                self.folder.drop_summary()
                resumed.state.stopped_early = False
            self._keep_tokenizer()
            return resumed
        if self.resume:
            print(f"iattn: {self.out} holds no checkpoint to resume; starting a fresh run there", file=sys.stderr)
        self.folder.write_config(self.config)
        self._keep_tokenizer()
        return fresh

    def _recorded_tokenizer(self) -> str | None:
        """The tokenizer identity the run's last (else best) checkpoint records; None where it has none or is
        unreadable (the finished run's summary is all --resume returns, as before)."""
        for name in (LAST, BEST):
            if (self.folder / name).exists():
                try:
                    return ckpt.read_meta(self.folder / name).get("tokenizer")
                except UserError:
                    return None
        return None

    def _check_folder_tokenizer(self) -> None:
        """A run on hf:FOLDER keeps the tokenizer it started with (HF_KEPT, never replaced): a resume whose FOLDER
        now holds other tokenizer files (an added_tokens.json, a chat template, ...) would train, and the run be
        scored, with another tokenizer, so it is refused, naming the files, whatever the token cache holds. A run
        without a copy (from before runs kept one, or none could be made) is checked against the identity its
        checkpoint recorded."""
        tok = self._tokenizer
        if tok is None or not isinstance(tok._impl, HFFolderTokenizer) or tok._impl.folder is None:
            return
        folder, fix = tok._impl.folder, "or start a new run in another --out"
        kept = kept_copy(self.folder.path)
        if kept is not None:
            changed = hf_tokenizer_changes(kept, folder)
            if changed:
                raise UserError(f"tokenizer {tok.name}: {', '.join(changed)} in {folder} changed since the run in "
                                f"{self.out} started (it keeps the tokenizer it started with in {kept}); restore "
                                f"{'that file' if len(changed) == 1 else 'those files'} from there, {fix}")
            return
        recorded = self._recorded_tokenizer()
        if recorded and recorded not in tokenizer_identities(tok):
            raise UserError(f"tokenizer {tok.name}: the tokenizer files in {folder} changed since the run in "
                            f"{self.out} started (its checkpoint records tokenizer {recorded}, they read as "
                            f"{self.tokenizer} now); restore them, {fix}")

    def _keep_tokenizer(self) -> None:
        """An hf:FOLDER run keeps a checked copy of FOLDER's tokenizer (data/tokenizers.py, keep_hf_tokenizer):
        written here, once the folder is known to be this run's (a refused resume leaves the folder as it was)."""
        if self._tokenizer is not None and (why := keep_hf_tokenizer(self._tokenizer, self.folder.path)):
            print(f"iattn: warning: {self.out} keeps no copy of its tokenizer ({why}); eval, generate and convert "
                  "of the run read the folder it names", file=sys.stderr)

    def _load_last(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps_per_epoch: int = 0) -> Start:
        path = self.folder / LAST
        meta, tensors = ckpt.read_checkpoint(path)  # one version of the file (another process may be writing it)
        diff = config_mismatch(meta.get("config"), self.config)
        # an extension: this resume's, or one cut off before its first checkpoint (its config.yaml was written,
        # so the folder's config is this one already and check_for sees no extension)
        if diff and not extends(meta.get("config"), self.config):
            raise UserError(f"checkpoint {path} comes from a different config ({diff}); resume with the "
                            "run's own config or choose another --out")
        self.extending = self.extending or bool(diff)
        self._check_fingerprints(path, meta)
        ckpt.load_model_state(model, tensors, path)
        ckpt.load_optimizer_state(optimizer, tensors, meta, path)
        state = ckpt.read_state(path, meta, TrainState)
        resumed = Start(state, self.folder.read_records(METRICS, state.step),
                        self.folder.read_records(STEPS, state.step))
        resumed = self._reopen(resumed, steps_per_epoch)
        self._check_logs(resumed)
        return resumed

    def _reopen(self, resumed: Start, steps_per_epoch: int) -> Start:
        """A budget that ended mid-epoch closed that epoch early (its record, the best weights, patience); a run
        going on past that step (an extension) goes on with the same epoch, from the batch it had reached, as
        an uninterrupted run would: never a new epoch. Its evaluation at the budget's end stays in
        metrics.jsonl as kind "budget" (a candidate for the best weights, as it was), no longer an epoch's."""
        s, records = resumed.state, resumed.records
        last = records[-1] if records else None
        if (s.batch or s.step >= self.total_steps or last is None or last["step"] != s.step
                or last["kind"] not in ("epoch", "budget") or last["epoch"] != s.epoch):
            return resumed
        began = max((r["step"] for r in records if r["kind"] == "epoch" and r["epoch"] < s.epoch), default=0)
        done = s.step - began
        if not 0 < done < steps_per_epoch:
            return resumed
        logged = [r["loss"] for r in resumed.steps if r["step"] > began]
        finite = [x for x in logged if math.isfinite(x)]
        if len(logged) != done:  # no steps.jsonl: the epoch's mean loss as its record has it
            finite = [last["train_loss"] or 0.0] * done if last.get("train_loss") is not None else []
        sum_ = 0.0
        for x in finite:  # in the order the loop added them: the same float
            sum_ += x
        s.reopen_epoch(done, sum_, len(finite))
        budget = {**last, "kind": "budget"}
        return resumed._replace(records=[*records[:-1], budget], relabel=budget if last["kind"] == "epoch" else None)

    def _check_fingerprints(self, path: Path, meta: dict) -> None:
        """The data a checkpoint trained on must be the data it resumes on: an edited file, another tokenizer
        cache or data folder would continue another run. A checkpoint from before fingerprints has none."""
        saved = meta.get("data_fingerprint")
        if not isinstance(saved, dict):
            return
        for split, now in self.fingerprints.items():
            if split in saved and saved[split] != now:
                raise UserError(f"checkpoint {path} was trained on other {split} data than this run reads now "
                                f"(token fingerprint {str(saved[split])[:12]} there vs {now[:12]} here: the {split} "
                                "file, the data folder or the tokenizer changed); restore the data the run was "
                                "trained on, or start a new run in another --out")

    def _check_logs(self, resumed: Start) -> None:
        """Logs are saved before each checkpoint, so they hold every step and every epoch-end evaluation
        the checkpoint has run: fewer means a damaged log, refused rather than resumed with a gap."""
        s, fix = resumed.state, "restore it, or delete the run folder and rerun"
        epochs = [r["epoch"] for r in resumed.records if r["kind"] == "epoch"]
        if epochs != list(range(1, s.epoch + 1)):
            raise UserError(f"{self.folder / METRICS} is corrupt (holds epoch records {epochs[:5]} where the "
                            f"checkpoint has run {s.epoch} epochs); {fix}")
        steps = [r["step"] for r in resumed.steps]
        if (self.folder / STEPS).exists() and steps != list(range(1, s.step + 1)):
            raise UserError(f"{self.folder / STEPS} is corrupt (holds {len(steps)} records where the checkpoint "
                            f"has run {s.step} steps); {fix}")

    # ------------------------------------------------------------- saving
    def _meta(self, state: TrainState) -> dict:
        return {"config": self.config, "state": dataclasses.asdict(state), "data_fingerprint": self.fingerprints,
                "tokenizer": self.tokenizer}

    def save_last(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: TrainState) -> None:
        """The resumable checkpoint (the caller saves the logs first: a checkpoint never points past them)."""
        if self.ctx.is_main:
            ckpt.save_checkpoint(self.folder / LAST, model, self._meta(state), optimizer)
        self.ctx.barrier()

    def save_best(self, model: torch.nn.Module, state: TrainState) -> None:
        if self.ctx.is_main:
            ckpt.save_checkpoint(self.folder / BEST, model, self._meta(state))

    def load_best(self, model: torch.nn.Module) -> None:
        """The best-validation weights into `model` (absent only if no validation loss was ever finite)."""
        best = self.folder / BEST
        if best.exists():
            meta, tensors = ckpt.read_checkpoint(best)
            self.folder.check_checkpoint(best, meta)
            ckpt.load_model_state(model, tensors, best)

    def last_good(self) -> str:
        """Where a stopped run can be taken up again, for its error message."""
        last = self.folder / LAST
        return (f"last good checkpoint: {last} (step {ckpt.read_meta(last)['state']['step']})"
                if last.exists() else "no checkpoint was written yet")

    def write_summary(self, summary: dict) -> None:
        """summary.json, written last: the run is finished."""
        if self.ctx.is_main:
            self.folder.write_summary(summary)
