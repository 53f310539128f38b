"""The training loop: AdamW or Muon (train/optim.py), warmup then cosine or linear LR (train/schedule.py),
per-epoch train/validation perplexity (and a step-0 evaluation of the starting function),
best-validation checkpoint, early stopping, exact resume, DDP via torchrun.

The loop is assembled from parts, each with its own slice of the config: the run's data (`corpus.py`),
where and how the model runs (`runtime.py`: device, DDP, compile, autocast), the run folder's side of it
(`checkpointer.py`: lock, resume/extend policy, checkpoints, summary; what it writes is the run folder's,
checkpoint/run_folder.py), evaluation (`validate.py`) and the numbers it logs (`metrics.py`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

from iattention.checkpoint.run_folder import LAST, RunFolder
from iattention.config import RunConfig
from iattention.data.dataset import epoch_order, train_batch
from iattention.data.sources import resolved_data_dir
from iattention.errors import UserError
from iattention.kernels import prepare as prepare_kernel
from iattention.model import GPT
from iattention.model.gpt import check_fits_in_memory
from iattention.train.checkpointer import Checkpointer
from iattention.train.corpus import load_run_data
from iattention.train.evaluate import exp_loss
from iattention.train.metrics import Metrics, Throughput
from iattention.train.optim import apply_step, build_optimizer, set_lr
from iattention.train.runtime import Runtime
from iattention.train.schedule import budget_steps, lr_at
from iattention.train.validate import Validator
from iattention.utils.faults import fault_point
from iattention.utils.provenance import source_commit, utc_now


class NonFiniteLoss(UserError):
    pass


def _config_dict(cfg: RunConfig) -> dict:
    return json.loads(json.dumps(cfg.to_dict()))


class Trainer:
    def __init__(self, cfg: RunConfig, out: str | Path, resume: bool = False, quiet: bool = False):
        # The run records the data folder it really reads (an execution key: not part of its identity),
        # on a copy, so the caller's config is left as it was.
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, data_dir=resolved_data_dir(cfg.data)))
        self.cfg, self.out, self.quiet = cfg, Path(out), quiet
        self.runtime = Runtime(cfg.train)
        self.ckpt = Checkpointer(out, resume, self.runtime.ctx)
        self.metrics = Metrics(self.ckpt.folder, self.runtime.is_main)

    def run(self) -> dict:
        try:
            summary = self._run()
            # every rank done before any tears the process group down: a rank that left first made a peer abort in
            # gloo's teardown (SIGABRT after its summary, about 1 in 10 two-process runs on a loaded 2-core CPU)
            self.runtime.ctx.barrier()
            return summary
        except KeyboardInterrupt:
            self._interrupted()
            raise
        except BaseException:
            self.ckpt.discard_unstarted()  # refused before it started: leave no folder holding only a lock
            raise
        finally:
            self.metrics.close_log()
            self.ckpt.release()
            self.runtime.close()

    def _interrupted(self) -> None:
        """Ctrl-C: say where --resume takes the run up again, and how to keep mid-epoch progress next time
        (steps.jsonl keeps every step made; the resumed run cuts it to its checkpoint and appends from there)."""
        s = getattr(self, "state", None)
        self.ckpt.discard_unstarted()
        if s is None or not self.runtime.is_main or s.step == 0:
            return
        if self.metrics.bar is not None:
            self.metrics.close_bar()
        t, spe = self.cfg.train, self.data.steps_per_epoch
        where = (f"iattn: interrupted at step {s.step} (epoch {s.epoch + 1}, batch {s.batch}/{spe}); "
                 f"{self.ckpt.last_good()}")
        keep = "to keep mid-epoch progress, train with train.ckpt_every_steps=N (a resumable checkpoint every N steps)"
        if not (self.ckpt.folder / LAST).exists():
            hint = f"--resume starts the run over; {keep}"
        elif s.batch == 0 or t.ckpt_every_steps:
            hint = "--resume goes on from there"
        else:
            hint = f"--resume goes on from there, making this epoch's steps since again; {keep}"
        print(f"{where}; {hint}", file=sys.stderr)  # then the CLI's "iattn: interrupted", exit 130

    def _run(self) -> dict:
        finished = self._prepare()
        if finished is not None:  # --resume of a finished run: nothing to do
            return finished
        s, self._t0 = self.state, time.time()
        # when and on which code this process trains: the start record and the summary say them
        self._began, self._source = utc_now(), source_commit()
        self.metrics.start_bar(self.total_steps, s.step, self.quiet)
        if s.step == 0 and not self.metrics.records:  # the function it starts from: fresh or given weights
            self._record("start", 0.0, started_at=self._began, **self._source)
            self.metrics.save()
        self.model.train()
        while s.step < self.total_steps and not s.stopped_early:
            self._end_epoch(self._epoch())
        self.metrics.close_bar()
        return self._finish()

    def _prepare(self) -> dict | None:
        """The folder (held from here until the run ends), the data, then (unless the run there is finished:
        its summary) the model, its optimizer and state (fresh or resumed), and the runtime around them."""
        self.ckpt.claim(self.cfg.data.data_dir)
        self.cfg, self.data = load_run_data(self.cfg, self.runtime.world)  # the model's vocabulary resolved
        t = self.cfg.train
        self.total_steps = budget_steps(t, self.data.steps_per_epoch, self.cfg.model.block_size)
        self.total_epochs = -(-self.total_steps // self.data.steps_per_epoch)  # the last one partial under a budget
        finished = self.ckpt.check(_config_dict(self.cfg), self.data.fingerprints, self.data.tokenizer,
                                   self.total_steps, t.budget())
        if finished is not None:
            return finished
        warmup = self.cfg.optim.warmup_steps
        if warmup + 1 >= self.total_steps and self.runtime.is_main:  # the last step's lr is then the peak's
            print(f"iattn: warning: optim.warmup_steps={warmup} with a run of {self.total_steps} steps "
                  f"({t.budget()}): the learning rate rises and never decays; lower optim.warmup_steps",
                  file=sys.stderr)
        device = self.runtime.device
        torch.manual_seed(t.seed)
        check_fits_in_memory(self.cfg.model, max(1, t.batch_size // (t.grad_accum * self.runtime.world)), device)
        m = self.cfg.model  # the attention kernel checked (one line), auto's table read and the kernel loaded
        # before compile (either model family)
        prepare_kernel(m.attn_kernel, device.type, m.d_head, m.dropout)
        self.model = GPT(self.cfg.model).to(device)
        self.init_source = self.ckpt.initial_weights(self.model, self.cfg)
        self.optimizer = build_optimizer(self.model, self.cfg.optim, device.type)
        start = self.ckpt.start(self.model, self.optimizer, self.data.steps_per_epoch)
        self.state = start.state
        self.runtime.ctx.barrier()
        self.train_model = self.runtime.wrap(self.model)
        self.metrics.open(t, _config_dict(self.cfg), start)
        self.validator = Validator(self.data.splits, self.data.scored, self.cfg.model.block_size,
                                   t.eval_batch_size, self.runtime, show=not self.quiet)
        return None

    def _lr(self, step: int) -> float:
        o = self.cfg.optim
        return lr_at(step, self.total_steps, o.lr, o.warmup_steps, o.min_lr_ratio, o.schedule)

    def _epoch(self) -> float:
        """The rest of the current epoch's steps (with the extra evaluations and checkpoints it asks for);
        returns the epoch's training throughput in tokens/s."""
        t, s, spe = self.cfg.train, self.state, self.data.steps_per_epoch
        tokens_per_step, speed = t.batch_size * self.cfg.model.block_size, Throughput()
        order = epoch_order(self.data.n_windows, t.seed, s.epoch)
        while s.batch < spe and s.step < self.total_steps:
            t_step = time.time()
            loss, grad_norm = self._train_step(order[s.batch * t.batch_size: (s.batch + 1) * t.batch_size])
            self.runtime.synchronize()
            dt = time.time() - t_step
            s.count_step(loss, tokens_per_step, dt)
            speed.add(tokens_per_step, dt)
            self.metrics.step(s.step, loss, self._lr(s.step - 1), grad_norm, speed.per_s)
            more = s.batch < spe and s.step < self.total_steps  # not the last step of the epoch or the run
            if t.eval_every_steps and s.step % t.eval_every_steps == 0 and more:
                self._record("step", speed.per_s)
                self.metrics.save()
            if t.ckpt_every_steps and s.step % t.ckpt_every_steps == 0 and more:
                self._save_last()
        return speed.per_s

    def _train_step(self, window_ids: np.ndarray) -> tuple[float, float | None]:
        """One optimizer step over this process's share of the batch, in grad_accum micro-batches: (the mean
        loss over all processes, the gradient norm; None for a skipped non-finite batch)."""
        rt, t, s = self.runtime, self.cfg.train, self.state
        per_rank = len(window_ids) // rt.world
        micro = np.array_split(window_ids[rt.ctx.rank * per_rank: (rt.ctx.rank + 1) * per_rank], t.grad_accum)
        set_lr(self.optimizer, self._lr(s.step))
        loss_sum = torch.zeros((), device=rt.device)
        for i, ids in enumerate(micro):
            x, y = (rt.to_device(b) for b in train_batch(self.data.splits["train"], ids, self.cfg.model.block_size))
            rt.step_begin()
            with rt.no_sync(self.train_model, last=i == len(micro) - 1), rt.autocast():
                _, loss = self.train_model(x, y, loss_chunk=t.loss_chunk)
            (loss / t.grad_accum).backward()
            loss_sum += loss.detach() / t.grad_accum
        loss_val = rt.ctx.sum_(loss_sum).item() / rt.world
        if not math.isfinite(loss_val):
            self.optimizer.zero_grad(set_to_none=True)
            if not t.skip_nonfinite:
                raise NonFiniteLoss(f"non-finite loss ({loss_val}) at step {s.step + 1} (epoch {s.epoch + 1}); "
                                    f"{self.ckpt.last_good()}; lower optim.lr, or set train.skip_nonfinite=true")
            s.skipped += 1
            return loss_val, None
        grad_norm = apply_step(self.model, self.optimizer, self.cfg.optim.grad_clip)
        fault_point("step")
        return loss_val, grad_norm

    def _record(self, kind: str, tokens_per_s: float, **extra) -> dict:
        """Validation now, as one metrics record (with `extra`'s keys); a validation loss too large for a perplexity
        stops the run."""
        s = self.state
        what = {"start": "start", "epoch": f"end of epoch {s.epoch + 1}"}.get(kind, f"step {s.step}")
        val_loss, val_ppl = self.validator.loss(self.runtime.eval_model(self.model, self.train_model), "valid", what)
        if math.isfinite(val_loss) and math.isinf(val_ppl):  # 709+ nats per token: far worse than uniform, so diverged
            raise NonFiniteLoss(f"validation loss {val_loss:.4g} at step {s.step} (epoch {s.epoch + 1}) overflows "
                                f"perplexity: the run diverged; {self.ckpt.last_good()}; lower optim.lr")
        train_loss = s.train_loss()
        return self.metrics.record(dict(
            kind=kind, step=s.step, epoch=s.epoch + (kind == "epoch"), lr=self._lr(max(0, s.step - 1)),
            train_loss=train_loss, train_ppl=None if train_loss is None else exp_loss(train_loss), val_loss=val_loss,
            val_ppl=val_ppl, val_word_ppl=self.validator.per_unit("valid", val_loss)["word_ppl"],
            eval_dtype=self.runtime.eval_dtype, tokens_per_s=tokens_per_s,
            wall_time=s.wall_time + time.time() - self._t0, **extra))

    def _end_epoch(self, tokens_per_s: float) -> None:
        """Validation, the best checkpoint, early stopping (in the state), and a resumable checkpoint."""
        t, s = self.cfg.train, self.state
        rec = self._record("epoch", tokens_per_s)
        if s.end_epoch(rec["val_loss"], t.patience):  # the best so far
            self.ckpt.save_best(self.model, s)
        if not self.quiet:
            self.metrics.write(f"epoch {s.epoch}/{self.total_epochs}  train ppl {rec['train_ppl']:.2f}  "
                               f"val ppl {rec['val_ppl']:.2f}  {rec['tokens_per_s']:.0f} tok/s")
        s.wall_time += time.time() - self._t0
        self._t0 = time.time()
        self._save_last()

    def _save_last(self) -> None:
        self.metrics.save()  # logs first: a checkpoint never points past what the logs hold
        self.ckpt.save_last(self.model, self.optimizer, self.state)

    def _finish(self) -> dict:
        """Test perplexity of the best-validation weights, and the summary that marks the run finished."""
        s = self.state
        test_loss = test_ppl = None
        if self.cfg.train.final_test:
            self.ckpt.load_best(self.model)
            test_loss, test_ppl = self.validator.loss(self.runtime.eval_model(self.model, self.train_model), "test",
                                                      "best weights")
        s.wall_time += time.time() - self._t0
        first = next((r for r in self.metrics.records if r["kind"] == "start"), {})
        summary = dict(
            config=_config_dict(self.cfg), attention=self.cfg.model.attention, n_head=self.cfg.model.n_head,
            seed=self.cfg.train.seed, params=self.model.num_params(),
            best_val_loss=s.best_val_loss, best_val_ppl=exp_loss(s.best_val_loss), best_epoch=s.best_epoch,
            test_loss=test_loss, test_ppl=test_ppl, final_test=self.cfg.train.final_test,
            **self.validator.units(s.best_val_loss, test_loss),
            epochs_run=s.epoch, steps=s.step, stopped_early=s.stopped_early, skipped_batches=s.skipped,
            eval_dtype=self.runtime.eval_dtype, tokens_seen=s.tokens_seen,
            train_tokens_per_s=s.tokens_seen / max(s.train_time, 1e-9),
            wall_time_s=s.wall_time, started_from=self.init_source, **self.runtime.describe(),
            torch=torch.__version__, machine=platform.machine(),
            # the run's first start (its start record's; this process's where that record has none), this
            # process's commit (a resumed run's start record keeps the first one's) and its end, UTC
            started_at=first.get("started_at", self._began), finished_at=utc_now(), **self._source)
        self.metrics.save()
        self.ckpt.write_summary(summary)
        self.metrics.close()
        return summary


def train(cfg: RunConfig, out: str | Path, resume: bool = False, quiet: bool = False) -> dict:
    return Trainer(cfg, out, resume=resume, quiet=quiet).run()


def load_run_config(out: str | Path) -> RunConfig:
    return RunFolder(out).run_config()
