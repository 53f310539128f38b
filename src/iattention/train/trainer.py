"""The training loop: AdamW or Muon (train/optim.py), warmup then cosine or linear LR (train/schedule.py),
per-epoch train/validation perplexity (and a step-0 evaluation of the starting function),
best-validation checkpoint, early stopping, exact resume, DDP via torchrun.

What it writes, and how it is read back, is the run folder's (checkpoint/run_folder.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
import platform
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

from iattention.checkpoint import state as ckpt
from iattention.checkpoint.run_folder import BEST, LAST, METRICS, STEPS, TOKENIZER, RunFolder
from iattention.config import RunConfig, config_mismatch, extends, resolve_vocab
from iattention.data.dataset import (
    check_eval_split,
    epoch_order,
    fingerprint,
    load_data,
    n_train_windows,
    scored_text,
    train_batch,
)
from iattention.errors import UserError
from iattention.model.gpt import GPT, check_fits_in_memory
from iattention.train.distributed import DistContext, setup, teardown
from iattention.train.evaluate import exp_loss, per_unit, perplexity, split_nll
from iattention.train.optim import apply_step, build_optimizer, set_lr
from iattention.train.schedule import lr_at
from iattention.train.sinks import Sinks
from iattention.utils.faults import fault_point
from iattention.utils.files import check_out_folder
from iattention.utils.hardware import allow_tf32, hardware


class NonFiniteLoss(UserError):
    pass


@dataclasses.dataclass
class TrainState:
    step: int = 0
    epoch: int = 0  # epochs completed
    batch: int = 0  # next batch index within the current epoch
    best_val_loss: float = math.inf
    best_epoch: int = 0  # 1-based epoch of the best validation loss
    bad_epochs: int = 0
    run_loss_sum: float = 0.0  # running train loss of the current epoch
    run_loss_count: int = 0
    train_time: float = 0.0  # seconds inside training steps
    wall_time: float = 0.0  # seconds, summed over resumed sessions
    tokens_seen: int = 0
    skipped: int = 0
    stopped_early: bool = False


def _config_dict(cfg: RunConfig) -> dict:
    return json.loads(json.dumps(cfg.to_dict()))


class Trainer:
    def __init__(self, cfg: RunConfig, out: str | Path, resume: bool = False, quiet: bool = False):
        from iattention.data.sources import resolved_data_dir

        # The run records the data folder it really reads (an execution key: not part of its identity),
        # on a copy, so the caller's config is left as it was.
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, data_dir=resolved_data_dir(cfg.data)))
        self.cfg, self.out, self.resume, self.quiet = cfg, Path(out), resume, quiet
        self.folder = RunFolder(out)
        self.finished: dict | None = None
        self._lock = None
        self._created = False
        self.extending = False
        self.init_source: dict | None = None
        self.ctx: DistContext = setup(cfg.train.device)
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)

    # ---------------------------------------------------------------- set-up
    def _prepare(self) -> None:
        """Data and model config, the run folder, then (unless the run there is finished) the model,
        its optimizer and state (fresh or resumed), and the runtime around them."""
        check_out_folder(self.out, self.cfg.data.data_dir)
        if self.out.exists() and not self.out.is_dir():
            raise UserError(f"output path {self.out} is a file; choose a folder for --out")
        self.folder.check_ours()  # a user's folder: refused before anything is written into it
        # One process per run folder, from here until the run ends (utils/lock.py); taken before the data
        # loads, so a second sweep sees a run that is still loading as in use and skips it. A refused lock
        # removes only what this process made (never the holder's .lock).
        if self.ctx.is_main:
            self._lock = self.folder.lock()
            self._created = self._lock.created_folder
        self._load_data()
        self.extending = self.folder.check_for(_config_dict(self.cfg), self.resume)
        if self.ctx.is_main and not (self.folder / TOKENIZER).exists():  # the run carries its bpe tokenizer
            from iattention.data.tokenizers import save_tokenizer_file

            save_tokenizer_file(self.data.tokenizer, self.folder / TOKENIZER)
        if self.resume and self.folder.has_summary() and not self.extending:
            self.finished = self.folder.finished(self.cfg.train.epochs)
            if self.finished is not None:
                return
            self.extending = True  # a summary of fewer epochs: an extension that died before dropping it
        self._build()
        self._start_or_resume()
        self.ctx.barrier()
        self._runtime()

    def _load_data(self) -> None:
        cfg, t = self.cfg, self.cfg.train
        if t.batch_size % (t.grad_accum * self.ctx.world):
            raise UserError(f"train.batch_size={t.batch_size} must be divisible by grad_accum x processes "
                            f"({t.grad_accum} x {self.ctx.world})")
        self.data = load_data(cfg.data)
        # What validation and test predict (every token after the first), in words and bytes: constants
        # of the (possibly cut) splits, for the per-word and per-byte metrics.
        self.scored = {s: scored_text(self.data.tokenizer, self.data.splits[s]) for s in ("valid", "test")}
        # The resolved model config, on this trainer's own copy of the run config.
        self.cfg = cfg = dataclasses.replace(cfg, model=resolve_vocab(cfg.model, cfg.data.tokenizer,
                                                                     self.data.vocab_size))
        cfg.model.validate()
        T = cfg.model.block_size
        for split, cap in (("valid", "data.valid_tokens"), ("test", None)):
            check_eval_split(self.data.splits[split], split, T, f"give a longer {split} file"
                             + (f", raise {cap} (0: the whole split)" if cap else "") + " or lower model.block_size")
        # What resume checks it continues on: the token streams this run trains and selects on.
        self.fingerprints = {s: fingerprint(self.data.splits[s]) for s in ("train", "valid")}
        self.n_windows = n_train_windows(self.data.splits["train"], T)
        self.steps_per_epoch = self.n_windows // t.batch_size
        if self.steps_per_epoch == 0:
            raise UserError(f"train split has {len(self.data.splits['train'])} tokens: fewer than one batch of "
                            f"{t.batch_size} x {T + 1}; lower train.batch_size or model.block_size, or use more data")
        self.total_steps = self.steps_per_epoch * t.epochs

    def _build(self) -> None:
        torch.manual_seed(self.cfg.train.seed)
        t = self.cfg.train
        check_fits_in_memory(self.cfg.model, max(1, t.batch_size // (t.grad_accum * self.ctx.world)), self.ctx.device)
        self.model = GPT(self.cfg.model).to(self.ctx.device)
        if self.cfg.train.init_from:
            from iattention.train.init_from import load_initial_weights

            self.init_source = load_initial_weights(self.model, self.cfg.train.init_from, self.cfg)
        self.optimizer = build_optimizer(self.model, self.cfg.optim, self.ctx.device.type)
        self.state = TrainState()
        self.metrics: list[dict] = []
        self.steps: list[dict] = []

    def _start_or_resume(self) -> None:
        if not self.ctx.is_main:
            if self.resume and (self.folder / LAST).exists():
                self._load_last()
            return
        if self.resume and self.out.is_dir():
            self.folder.clean_temp()
        if self.resume and (self.folder / LAST).exists():
            self._load_last()
            if self.extending:  # the longer run's config; its summary comes when it ends
                print(f"iattn: extending {self.out} from {self.state.epoch} to {self.cfg.train.epochs} epochs "
                      f"(train.epochs={self.cfg.train.epochs})", file=sys.stderr)
                self.folder.write_config(_config_dict(self.cfg))
                self.folder.drop_summary()
                self.state.stopped_early = False
            return
        if self.resume:
            print(f"iattn: {self.out} holds no checkpoint to resume; starting a fresh run there", file=sys.stderr)
        self.folder.write_config(_config_dict(self.cfg))

    def _runtime(self) -> None:
        """DDP, compile, autocast, TF32 and TensorBoard around the built model."""
        t, ctx = self.cfg.train, self.ctx
        train_model = self.model
        if ctx.enabled:
            train_model = torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
        self.train_model = torch.compile(train_model) if t.compile else train_model
        use_amp = t.amp and ctx.device.type == "cuda" or t.amp_cpu and ctx.device.type == "cpu"
        kind = ctx.device.type
        self.autocast = (lambda: torch.autocast(kind, dtype=torch.bfloat16)) if use_amp else nullcontext
        allow_tf32(ctx.device)
        self.sinks = Sinks(self.folder.path, t.tensorboard, t.wandb, _config_dict(self.cfg), self.out.name,
                           main=ctx.is_main)

    def _load_last(self) -> None:
        path = self.folder / LAST
        meta = ckpt.read_meta(path)
        diff = config_mismatch(meta.get("config"), _config_dict(self.cfg))
        if diff and not (self.extending and extends(meta.get("config"), _config_dict(self.cfg))):
            raise UserError(f"checkpoint {path} comes from a different config ({diff}); resume with the "
                            "run's own config or choose another --out")
        self._check_fingerprints(path, meta)
        tensors = ckpt.load_tensors(path)
        ckpt.load_model_state(self.model, tensors, path)
        ckpt.load_optimizer_state(self.optimizer, tensors, meta, path)
        self.state = ckpt.read_state(path, meta, TrainState)
        self.metrics = self.folder.read_records(METRICS, self.state.step)
        self.steps = self.folder.read_records(STEPS, self.state.step)
        self._check_logs()

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

    def _check_logs(self) -> None:
        """Logs are saved before each checkpoint, so they hold every step and every epoch-end evaluation
        the checkpoint has run: fewer means a damaged log, refused rather than resumed with a gap."""
        s, fix = self.state, "restore it, or delete the run folder and rerun"
        epochs = [r["epoch"] for r in self.metrics if r["kind"] == "epoch"]
        if epochs != list(range(1, s.epoch + 1)):
            raise UserError(f"{self.folder / METRICS} is corrupt (holds epoch records {epochs[:5]} where the "
                            f"checkpoint has run {s.epoch} epochs); {fix}")
        steps = [r["step"] for r in self.steps]
        if (self.folder / STEPS).exists() and steps != list(range(1, s.step + 1)):
            raise UserError(f"{self.folder / STEPS} is corrupt (holds {len(steps)} records where the checkpoint "
                            f"has run {s.step} steps); {fix}")

    # ---------------------------------------------------------------- persistence
    def _meta(self) -> dict:
        return {"config": _config_dict(self.cfg), "state": dataclasses.asdict(self.state),
                "data_fingerprint": self.fingerprints}

    def _save_logs(self) -> None:
        if self.ctx.is_main:
            self.folder.write_records(METRICS, self.metrics)
            self.folder.write_records(STEPS, self.steps)

    def _save_last(self) -> None:
        self._save_logs()  # logs first: a checkpoint never points past what the logs hold
        if self.ctx.is_main:
            ckpt.save_checkpoint(self.folder / LAST, self.model, self._meta(), self.optimizer)
        self.ctx.barrier()

    # ---------------------------------------------------------------- evaluation
    def _eval_split(self, split: str) -> tuple[float, float]:
        nll, count = split_nll(self.train_model if not self.ctx.enabled else self.model, self.data.splits[split],
                               self.cfg.model.block_size, self.cfg.train.eval_batch_size, self.ctx, self.autocast)
        return nll / max(count, 1), perplexity(nll, count)

    def _per_unit(self, split: str, loss: float) -> dict:
        """Word/byte metrics of a mean loss over `split`'s scored tokens (None each where it has no words)."""
        text = self.scored[split]
        return per_unit(loss * text.tokens, text) or dict(word_ppl=None, byte_ppl=None, bits_per_byte=None)

    def _record(self, kind: str, tokens_per_s: float) -> dict:
        s = self.state
        val_loss, val_ppl = self._eval_split("valid")
        if math.isfinite(val_loss) and math.isinf(val_ppl):  # 709+ nats per token: far worse than uniform, so diverged
            raise NonFiniteLoss(f"validation loss {val_loss:.4g} at step {s.step} (epoch {s.epoch + 1}) overflows "
                                f"perplexity: the run diverged; {self._last_good()}; lower optim.lr")
        train_loss = s.run_loss_sum / s.run_loss_count if s.run_loss_count else None  # None before any step
        rec = dict(kind=kind, step=s.step, epoch=s.epoch + (kind == "epoch"), lr=self._lr(max(0, s.step - 1)),
                   train_loss=train_loss, train_ppl=None if train_loss is None else exp_loss(train_loss),
                   val_loss=val_loss, val_ppl=val_ppl, val_word_ppl=self._per_unit("valid", val_loss)["word_ppl"],
                   tokens_per_s=tokens_per_s, wall_time=s.wall_time + time.time() - self._t0)
        self.metrics.append(rec)
        self.sinks.record(rec)
        return rec

    # ---------------------------------------------------------------- training
    def _lr(self, step: int) -> float:
        o = self.cfg.optim
        return lr_at(step, self.total_steps, o.lr, o.warmup_steps, o.min_lr_ratio, o.schedule)

    def _train_step(self, window_ids: np.ndarray) -> float:
        ctx, t = self.ctx, self.cfg.train
        per_rank = len(window_ids) // ctx.world
        mine = window_ids[ctx.rank * per_rank: (ctx.rank + 1) * per_rank]
        micro = np.array_split(mine, t.grad_accum)
        set_lr(self.optimizer, self._lr(self.state.step))
        loss_sum = torch.zeros((), device=ctx.device)
        for i, ids in enumerate(micro):
            x, y = train_batch(self.data.splits["train"], ids, self.cfg.model.block_size)
            pin = ctx.device.type == "cuda"
            x = (x.pin_memory() if pin else x).to(ctx.device, non_blocking=pin)
            y = (y.pin_memory() if pin else y).to(ctx.device, non_blocking=pin)
            last = i == len(micro) - 1
            sync = nullcontext() if (last or not ctx.enabled) else self.train_model.no_sync()
            with sync, self.autocast():
                _, loss = self.train_model(x, y)
            (loss / t.grad_accum).backward()
            loss_sum += loss.detach() / t.grad_accum
        loss_val = ctx.sum_(loss_sum).item() / ctx.world
        if not math.isfinite(loss_val):
            self.optimizer.zero_grad(set_to_none=True)
            if t.skip_nonfinite:
                self.state.skipped += 1
                return loss_val
            raise NonFiniteLoss(f"non-finite loss ({loss_val}) at step {self.state.step + 1} (epoch "
                                f"{self.state.epoch + 1}); {self._last_good()}; lower optim.lr, or set "
                                "train.skip_nonfinite=true")
        self._grad_norm = apply_step(self.model, self.optimizer, self.cfg.optim.grad_clip)
        fault_point("step")
        return loss_val

    def run(self) -> dict:
        try:
            return self._run()
        except BaseException:
            if self._lock and self._created:  # refused before it started: leave no folder holding only a lock
                self.folder.discard_unstarted()
            raise
        finally:
            if self._lock:
                self._lock.release()
            teardown(self.ctx)

    def _run(self) -> dict:
        self._prepare()
        if self.finished is not None:  # --resume of a finished run: nothing to do
            return self.finished
        self._t0 = time.time()
        from tqdm import tqdm

        s = self.state
        self.bar = tqdm(total=self.total_steps, initial=s.step, disable=None if self.ctx.is_main and not self.quiet
                        else True, dynamic_ncols=True, desc=self.out.name)
        if s.step == 0 and not self.metrics:  # the function it starts from: fresh or given weights
            self._record("start", 0.0)
            self._save_logs()
        self.model.train()
        while s.epoch < self.cfg.train.epochs and not s.stopped_early:
            tokens_per_s = self._epoch()
            self._end_epoch(tokens_per_s)
        self.bar.close()
        return self._finish()

    def _epoch(self) -> float:
        """The rest of the current epoch's steps (with the extra evaluations and checkpoints it asks for);
        returns the epoch's training throughput in tokens/s."""
        cfg, s = self.cfg, self.state
        tokens_per_step = cfg.train.batch_size * cfg.model.block_size
        epoch_tokens, epoch_time = 0, 0.0
        order = epoch_order(self.n_windows, cfg.train.seed, s.epoch)
        while s.batch < self.steps_per_epoch:
            ids = order[s.batch * cfg.train.batch_size: (s.batch + 1) * cfg.train.batch_size]
            t_step = time.time()
            self._grad_norm = None  # stays None for a skipped (non-finite) batch
            loss = self._train_step(ids)
            if self.ctx.device.type == "cuda":
                torch.cuda.synchronize()
            dt = time.time() - t_step
            s.train_time += dt
            epoch_time += dt
            epoch_tokens += tokens_per_step
            s.tokens_seen += tokens_per_step
            s.step += 1
            s.batch += 1
            if math.isfinite(loss):
                s.run_loss_sum += loss
                s.run_loss_count += 1
            lr = self._lr(s.step - 1)
            self.steps.append(dict(step=s.step, loss=loss, lr=lr, grad_norm=self._grad_norm))
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}",
                                 tok_s=f"{epoch_tokens / max(epoch_time, 1e-9):.0f}", refresh=False)
            self.sinks.step(s.step, loss, lr, self._grad_norm)
            inside = s.batch < self.steps_per_epoch
            if cfg.train.eval_every_steps and s.step % cfg.train.eval_every_steps == 0 and inside:
                self._record("step", epoch_tokens / max(epoch_time, 1e-9))
                self._save_logs()
            if cfg.train.ckpt_every_steps and s.step % cfg.train.ckpt_every_steps == 0 and inside:
                self._save_last()
        return epoch_tokens / max(epoch_time, 1e-9)

    def _end_epoch(self, tokens_per_s: float) -> None:
        """Validation, the best checkpoint, early stopping, and a resumable checkpoint."""
        cfg, s = self.cfg, self.state
        rec = self._record("epoch", tokens_per_s)
        s.epoch += 1
        s.batch = 0
        s.run_loss_sum, s.run_loss_count = 0.0, 0
        if rec["val_loss"] < s.best_val_loss:
            s.best_val_loss, s.best_epoch, s.bad_epochs = rec["val_loss"], s.epoch, 0
            if self.ctx.is_main:
                ckpt.save_checkpoint(self.folder / BEST, self.model, self._meta())
        else:
            s.bad_epochs += 1
            if cfg.train.patience and s.bad_epochs >= cfg.train.patience:
                s.stopped_early = True
        if not self.quiet and self.ctx.is_main:
            self.bar.write(f"epoch {s.epoch}/{cfg.train.epochs}  train ppl {rec['train_ppl']:.2f}  "
                           f"val ppl {rec['val_ppl']:.2f}  {rec['tokens_per_s']:.0f} tok/s")
        s.wall_time += time.time() - self._t0
        self._t0 = time.time()
        self._save_last()

    def _last_good(self) -> str:
        last = self.folder / LAST
        return (f"last good checkpoint: {last} (step {ckpt.read_meta(last)['state']['step']})"
                if last.exists() else "no checkpoint was written yet")

    def _finish(self) -> dict:
        s = self.state
        best = self.folder / BEST
        if best.exists():  # absent only if no validation loss was ever finite
            self.folder.check_checkpoint(best, ckpt.read_meta(best))
            ckpt.load_model_state(self.model, ckpt.load_tensors(best), best)
        test_loss, test_ppl = self._eval_split("test")
        s.wall_time += time.time() - self._t0
        units = {}  # tokenizer-free metrics (lm-eval's definitions) of the best validation and of test
        for split, prefix, loss in (("valid", "best_val", s.best_val_loss), ("test", "test", test_loss)):
            text, m, short = self.scored[split], self._per_unit(split, loss), "val" if split == "valid" else split
            units.update({f"{prefix}_word_ppl": m["word_ppl"], f"{prefix}_byte_ppl": m["byte_ppl"],
                          f"{prefix}_bits_per_byte": m["bits_per_byte"], f"{short}_tokens_scored": text.tokens,
                          f"{short}_words": text.words, f"{short}_bytes": text.bytes})
        summary = dict(
            config=_config_dict(self.cfg), attention=self.cfg.model.attention, n_head=self.cfg.model.n_head,
            seed=self.cfg.train.seed, params=self.model.num_params(),
            best_val_loss=s.best_val_loss, best_val_ppl=exp_loss(s.best_val_loss), best_epoch=s.best_epoch,
            test_loss=test_loss, test_ppl=test_ppl, **units, epochs_run=s.epoch, steps=s.step,
            stopped_early=s.stopped_early, skipped_batches=s.skipped, tokens_seen=s.tokens_seen,
            train_tokens_per_s=s.tokens_seen / max(s.train_time, 1e-9), wall_time_s=s.wall_time,
            started_from=self.init_source, device=str(self.ctx.device), hardware=hardware(self.ctx.device),
            world_size=self.ctx.world,
            torch=torch.__version__,
            machine=platform.machine(),
        )
        if self.ctx.is_main:
            self._save_logs()
            self.folder.write_summary(summary)
        self.sinks.close()
        return summary


def train(cfg: RunConfig, out: str | Path, resume: bool = False, quiet: bool = False) -> dict:
    return Trainer(cfg, out, resume=resume, quiet=quiet).run()


def load_run_config(out: str | Path) -> RunConfig:
    return RunFolder(out).run_config()
