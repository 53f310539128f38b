"""The training loop: AdamW, warmup + cosine LR, per-epoch train/validation perplexity,
best-validation checkpoint, early stopping, exact resume, DDP via torchrun.

Run folder: config.yaml (resolved), metrics.jsonl (one record per evaluation), steps.jsonl
(loss and lr of every optimizer step), last.safetensors (resumable state), best.safetensors
(best-validation weights), summary.json (written last), tb/ (TensorBoard events).
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
import yaml

from iattention.data.dataset import epoch_order, load_data, n_train_windows, train_batch
from iattention.errors import UserError
from iattention.model.gpt import GPT
from iattention.train import checkpoint as ckpt
from iattention.train.config import RunConfig, config_from_dict, config_mismatch, extends
from iattention.train.distributed import DistContext, setup, teardown
from iattention.train.evaluate import perplexity, split_nll
from iattention.train.optim import build_optimizer
from iattention.train.schedule import lr_at
from iattention.utils.atomic import write_json, write_text
from iattention.utils.faults import fault_point
from iattention.utils.hardware import hardware


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


def _check_out_dir(out: Path, resume: bool, cfg: RunConfig) -> bool:
    """Refuse an --out that holds another run; True when --resume extends the run there to more epochs.
    (An --out that is a file is refused before the run folder's lock is taken.)"""
    saved = out / "config.yaml"
    if saved.exists():
        if not resume:
            raise UserError(f"output folder {out} already holds a run; pass --resume to continue it or choose "
                            "another --out")
        try:
            old = yaml.safe_load(saved.read_text())
        except yaml.YAMLError:
            raise UserError(f"{saved} is corrupt; delete the folder or choose another --out") from None
        diff = config_mismatch(old, _config_dict(cfg))
        if diff and extends(old, _config_dict(cfg)):
            return True
        if diff:
            raise UserError(f"output folder {out} holds a run with another config ({diff}); use the same config "
                            "to resume (or the same with more train.epochs to extend it), or choose another --out")
    return False


def _read_jsonl(path: Path, max_step: int) -> list[dict]:
    """Records up to max_step; a torn last line (crash mid-append by older versions) is dropped."""
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec.get("step", 0) <= max_step:
                out.append(rec)
    return out


def _jsonl(records: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


class Trainer:
    def __init__(self, cfg: RunConfig, out: str | Path, resume: bool = False, quiet: bool = False):
        from iattention.data.sources import resolved_data_dir

        # The run records the data folder it really reads (an execution key: not part of its identity),
        # on a copy, so the caller's config is left as it was.
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, data_dir=resolved_data_dir(cfg.data)))
        self.cfg, self.out, self.resume, self.quiet = cfg, Path(out), resume, quiet
        self.finished: dict | None = None
        self._lock = None
        self.extending = False
        self.init_source: dict | None = None
        self.ctx: DistContext = setup(cfg.train.device)
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)

    # ---------------------------------------------------------------- set-up
    def _prepare(self) -> None:
        cfg, ctx = self.cfg, self.ctx
        t = cfg.train
        for name in ("epochs", "batch_size", "grad_accum", "eval_batch_size"):
            if getattr(t, name) < 1:
                raise UserError(f"train.{name} must be >= 1, got {getattr(t, name)}")
        if t.batch_size % (t.grad_accum * ctx.world):
            raise UserError(f"train.batch_size={t.batch_size} must be divisible by grad_accum x processes "
                            f"({t.grad_accum} x {ctx.world})")
        self.data = load_data(cfg.data)
        vocab = self.data.vocab_size
        if cfg.model.vocab_size == 0:
            cfg.model = cfg.model.replace(vocab_size=vocab)
        elif vocab > cfg.model.vocab_size:
            raise UserError(f"tokenizer {cfg.data.tokenizer} has {vocab} tokens but model.vocab_size is "
                            f"{cfg.model.vocab_size}; set model.vocab_size={vocab} (or 0 for automatic)")
        cfg.model.validate()
        T = cfg.model.block_size
        self.n_windows = n_train_windows(self.data.splits["train"], T)
        self.steps_per_epoch = self.n_windows // t.batch_size
        if self.steps_per_epoch == 0:
            raise UserError(f"train split has {len(self.data.splits['train'])} tokens: fewer than one batch of "
                            f"{t.batch_size} x {T + 1}; lower train.batch_size or model.block_size, or use more data")
        self.total_steps = self.steps_per_epoch * t.epochs
        if self.out.exists() and not self.out.is_dir():
            raise UserError(f"output path {self.out} is a file; choose a folder for --out")
        if ctx.is_main:  # one process per run folder, from here until the run ends (utils/lock.py)
            from iattention.utils.lock import RunLock

            self._lock = RunLock(self.out).acquire()
        self.extending = _check_out_dir(self.out, self.resume, cfg)
        if ctx.is_main and not (self.out / "tokenizer.json").exists():  # the run carries its bpe tokenizer
            from iattention.data.tokenizers import save_tokenizer_file

            save_tokenizer_file(self.data.tokenizer, self.out / "tokenizer.json")
        if self.resume and (self.out / "summary.json").exists() and not self.extending:
            summary = json.loads((self.out / "summary.json").read_text())
            if summary.get("epochs_run", 0) >= t.epochs or summary.get("stopped_early"):
                self.finished = summary
                return
            # "Finished" means a summary of the config's epochs. A shorter one is what an extension leaves
            # when it dies after rewriting config.yaml but before dropping the old summary: go on extending.
            self.extending = True
        torch.manual_seed(t.seed)
        self.model = GPT(cfg.model).to(ctx.device)
        if t.init_from:
            from iattention.train.init_from import load_initial_weights

            self.init_source = load_initial_weights(self.model, t.init_from, cfg)
        self.optimizer = build_optimizer(self.model, cfg.optim, ctx.device.type)
        self.state = TrainState()
        self.metrics: list[dict] = []
        self.steps: list[dict] = []
        if self.resume and self.out.is_dir() and ctx.is_main:
            for stale in self.out.glob(".*.tmp"):  # temp files of a write that a crash cut short
                stale.unlink()
        if self.resume and (self.out / "last.safetensors").exists():
            self._load_last()
            if self.extending and ctx.is_main:  # the longer run's config; its summary comes when it ends
                print(f"iattn: extending {self.out} from {self.state.epoch} to {t.epochs} epochs "
                      f"(train.epochs={t.epochs})", file=sys.stderr)
                write_text(self.out / "config.yaml", yaml.safe_dump(_config_dict(cfg), sort_keys=False))
                (self.out / "summary.json").unlink(missing_ok=True)
                self.state.stopped_early = False
        elif ctx.is_main:
            if self.resume:
                print(f"iattn: {self.out} holds no checkpoint to resume; starting a fresh run there", file=sys.stderr)
            write_text(self.out / "config.yaml", yaml.safe_dump(_config_dict(cfg), sort_keys=False))
        ctx.barrier()
        train_model = self.model
        if ctx.enabled:
            train_model = torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
        self.train_model = torch.compile(train_model) if t.compile else train_model
        use_amp = t.amp and ctx.device.type == "cuda" or t.amp_cpu and ctx.device.type == "cpu"
        kind = ctx.device.type
        self.autocast = (lambda: torch.autocast(kind, dtype=torch.bfloat16)) if use_amp else nullcontext
        if ctx.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        self.writer = None
        if t.tensorboard and ctx.is_main:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.out / "tb"))

    def _load_last(self) -> None:
        path = self.out / "last.safetensors"
        meta = ckpt.read_meta(path)
        diff = config_mismatch(meta.get("config"), _config_dict(self.cfg))
        if diff and not (self.extending and extends(meta.get("config"), _config_dict(self.cfg))):
            raise UserError(f"checkpoint {path} comes from a different config ({diff}); resume with the "
                            "run's own config or choose another --out")
        tensors = ckpt.load_tensors(path)
        ckpt.load_model_state(self.model, tensors, path)
        ckpt.load_optimizer_state(self.optimizer, tensors, meta)
        self.state = TrainState(**meta["state"])
        self.metrics = _read_jsonl(self.out / "metrics.jsonl", self.state.step)
        self.steps = _read_jsonl(self.out / "steps.jsonl", self.state.step)

    # ---------------------------------------------------------------- persistence
    def _meta(self) -> dict:
        return {"config": _config_dict(self.cfg), "state": dataclasses.asdict(self.state)}

    def _save_logs(self) -> None:
        if self.ctx.is_main:
            write_text(self.out / "metrics.jsonl", _jsonl(self.metrics))
            write_text(self.out / "steps.jsonl", _jsonl(self.steps))

    def _save_last(self) -> None:
        self._save_logs()  # logs first: a checkpoint never points past what the logs hold
        if self.ctx.is_main:
            ckpt.save_checkpoint(self.out / "last.safetensors", self.model, self._meta(), self.optimizer)
        self.ctx.barrier()

    # ---------------------------------------------------------------- evaluation
    def _eval_split(self, split: str) -> tuple[float, float]:
        nll, count = split_nll(self.train_model if not self.ctx.enabled else self.model, self.data.splits[split],
                               self.cfg.model.block_size, self.cfg.train.eval_batch_size, self.ctx, self.autocast)
        return nll / max(count, 1), perplexity(nll, count)

    def _record(self, kind: str, tokens_per_s: float) -> dict:
        s = self.state
        val_loss, val_ppl = self._eval_split("valid")
        train_loss = s.run_loss_sum / s.run_loss_count if s.run_loss_count else None  # None before any step
        rec = dict(kind=kind, step=s.step, epoch=s.epoch + (kind == "epoch"), lr=self._lr(max(0, s.step - 1)),
                   train_loss=train_loss, train_ppl=None if train_loss is None else math.exp(train_loss),
                   val_loss=val_loss, val_ppl=val_ppl,
                   tokens_per_s=tokens_per_s, wall_time=s.wall_time + time.time() - self._t0)
        self.metrics.append(rec)
        if self.writer:
            for k in ("train_loss", "val_loss", "train_ppl", "val_ppl", "lr", "tokens_per_s"):
                if rec[k] is not None:
                    self.writer.add_scalar(f"{kind}/{k}", rec[k], s.step)
            self.writer.flush()
        return rec

    # ---------------------------------------------------------------- training
    def _lr(self, step: int) -> float:
        o = self.cfg.optim
        return lr_at(step, self.total_steps, o.lr, o.warmup_steps, o.min_lr_ratio)

    def _train_step(self, window_ids: np.ndarray) -> float:
        ctx, t = self.ctx, self.cfg.train
        per_rank = len(window_ids) // ctx.world
        mine = window_ids[ctx.rank * per_rank: (ctx.rank + 1) * per_rank]
        micro = np.array_split(mine, t.grad_accum)
        lr = self._lr(self.state.step)
        for g in self.optimizer.param_groups:
            g["lr"] = lr * g.get("lr_scale", 1.0)
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
            last = self.out / "last.safetensors"
            where = (f"last good checkpoint: {last} (step {ckpt.read_meta(last)['state']['step']})"
                     if last.exists() else "no checkpoint was written yet")
            raise NonFiniteLoss(f"non-finite loss ({loss_val}) at step {self.state.step + 1} (epoch "
                                f"{self.state.epoch + 1}); {where}; lower optim.lr, or set train.skip_nonfinite=true")
        if self.cfg.optim.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optim.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        fault_point("step")
        return loss_val

    def run(self) -> dict:
        try:
            return self._run()
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

        cfg, s, T = self.cfg, self.state, self.cfg.model.block_size
        bar = tqdm(total=self.total_steps, initial=s.step, disable=None if self.ctx.is_main and not self.quiet
                   else True, dynamic_ncols=True, desc=self.out.name)
        tokens_per_step = cfg.train.batch_size * T
        epoch_tokens, epoch_time = 0, 0.0
        if cfg.train.init_from and s.step == 0 and not self.metrics:  # where the given weights start
            self._record("start", 0.0)
            self._save_logs()
        self.model.train()
        while s.epoch < cfg.train.epochs and not s.stopped_early:
            order = epoch_order(self.n_windows, cfg.train.seed, s.epoch)
            while s.batch < self.steps_per_epoch:
                ids = order[s.batch * cfg.train.batch_size: (s.batch + 1) * cfg.train.batch_size]
                t_step = time.time()
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
                self.steps.append(dict(step=s.step, loss=loss, lr=lr))
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}",
                                tok_s=f"{epoch_tokens / max(epoch_time, 1e-9):.0f}", refresh=False)
                if self.writer:
                    self.writer.add_scalar("train/loss_step", loss, s.step)
                if cfg.train.eval_every_steps and s.step % cfg.train.eval_every_steps == 0 \
                        and s.batch < self.steps_per_epoch:
                    self._record("step", epoch_tokens / max(epoch_time, 1e-9))
                    self._save_logs()
                if cfg.train.ckpt_every_steps and s.step % cfg.train.ckpt_every_steps == 0 \
                        and s.batch < self.steps_per_epoch:
                    self._save_last()
            rec = self._record("epoch", epoch_tokens / max(epoch_time, 1e-9))
            epoch_tokens, epoch_time = 0, 0.0
            s.epoch += 1
            s.batch = 0
            s.run_loss_sum, s.run_loss_count = 0.0, 0
            if rec["val_loss"] < s.best_val_loss:
                s.best_val_loss, s.best_epoch, s.bad_epochs = rec["val_loss"], s.epoch, 0
                if self.ctx.is_main:
                    ckpt.save_checkpoint(self.out / "best.safetensors", self.model, self._meta())
            else:
                s.bad_epochs += 1
                if cfg.train.patience and s.bad_epochs >= cfg.train.patience:
                    s.stopped_early = True
            if not self.quiet and self.ctx.is_main:
                bar.write(f"epoch {s.epoch}/{cfg.train.epochs}  train ppl {rec['train_ppl']:.2f}  "
                          f"val ppl {rec['val_ppl']:.2f}  {rec['tokens_per_s']:.0f} tok/s")
            s.wall_time += time.time() - self._t0
            self._t0 = time.time()
            self._save_last()
        bar.close()
        return self._finish()

    def _finish(self) -> dict:
        s = self.state
        best = self.out / "best.safetensors"
        if best.exists():  # absent only if no validation loss was ever finite
            ckpt.load_model_state(self.model, ckpt.load_tensors(best), best)
        test_loss, test_ppl = self._eval_split("test")
        s.wall_time += time.time() - self._t0
        summary = dict(
            config=_config_dict(self.cfg), attention=self.cfg.model.attention, n_head=self.cfg.model.n_head,
            seed=self.cfg.train.seed, params=self.model.num_params(),
            best_val_loss=s.best_val_loss, best_val_ppl=math.exp(s.best_val_loss), best_epoch=s.best_epoch,
            test_loss=test_loss, test_ppl=test_ppl, epochs_run=s.epoch, steps=s.step,
            stopped_early=s.stopped_early, skipped_batches=s.skipped, tokens_seen=s.tokens_seen,
            train_tokens_per_s=s.tokens_seen / max(s.train_time, 1e-9), wall_time_s=s.wall_time,
            started_from=self.init_source, device=str(self.ctx.device), hardware=hardware(self.ctx.device),
            world_size=self.ctx.world,
            torch=torch.__version__,
            machine=platform.machine(),
        )
        if self.ctx.is_main:
            self._save_logs()
            write_json(self.out / "summary.json", summary)
        if self.writer:
            self.writer.close()
        return summary


def train(cfg: RunConfig, out: str | Path, resume: bool = False, quiet: bool = False) -> dict:
    return Trainer(cfg, out, resume=resume, quiet=quiet).run()


def load_run_config(out: str | Path) -> RunConfig:
    path = Path(out) / "config.yaml"
    if not path.exists():
        raise UserError(f"{out} holds no run (no config.yaml); check the folder")
    return config_from_dict(yaml.safe_load(path.read_text()))
