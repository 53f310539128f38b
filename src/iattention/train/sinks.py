"""Where a run's numbers go besides its own files (metrics.jsonl, steps.jsonl): TensorBoard (`<run>/tb/`,
`train.tensorboard`) and, optionally, Weights & Biases (`train.wandb=PROJECT`; offline with
`WANDB_MODE=offline`). One object the trainer hands every number to; only the main rank writes. wandb is
imported only when asked for, so it is no dependency."""

from __future__ import annotations

import hashlib
from pathlib import Path

from iattention.checkpoint.run_folder import TENSORBOARD
from iattention.errors import UserError

RECORD_KEYS = ("train_loss", "val_loss", "train_ppl", "val_ppl", "val_word_ppl", "lr", "tokens_per_s")


class Sinks:
    def __init__(self, folder: Path, tensorboard: bool, wandb_project: str, config: dict, run_name: str,
                 main: bool = True):
        self.tb = self.wandb = None
        if not main:
            return
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # lazy: heavy to import, and only when asked for

            self.tb = SummaryWriter(str(folder / TENSORBOARD))
        if wandb_project:
            try:
                import wandb  # lazy: optional, no dependency of ours
            except ImportError:
                raise UserError(f"train.wandb={wandb_project} needs the wandb package: pip install wandb (or drop "
                                "train.wandb)") from None
            # resume="allow" with the folder's name as id: a resumed run goes on in the same wandb run
            self.wandb = wandb.init(project=wandb_project, name=run_name, id=_wandb_id(folder), resume="allow",
                                    dir=str(folder), config=config)

    def step(self, step: int, loss: float, lr: float, grad_norm: float | None) -> None:
        values = {"train/loss_step": loss, "train/lr_step": lr}
        if grad_norm is not None:
            values["train/grad_norm_step"] = grad_norm
        self._log(values, step)

    def record(self, rec: dict) -> None:
        """One evaluation record of metrics.jsonl (kind start, step or epoch). The start (the function the run
        starts from) is step 0 of the epoch curves (`epoch/val_loss`, ...), with no throughput: no step ran."""
        kind = "epoch" if rec["kind"] == "start" else rec["kind"]
        keys = [k for k in RECORD_KEYS if not (rec["kind"] == "start" and k == "tokens_per_s")]
        self._log({f"{kind}/{k}": rec[k] for k in keys if rec.get(k) is not None}, rec["step"])
        if self.tb:
            self.tb.flush()

    def _log(self, values: dict, step: int) -> None:
        if self.tb:
            for k, v in values.items():
                self.tb.add_scalar(k, v, step)
        if self.wandb:
            self.wandb.log(values, step=step)

    def close(self) -> None:
        if self.tb:
            self.tb.close()
        if self.wandb:
            self.wandb.finish()


def _wandb_id(folder: Path) -> str:
    """A wandb run id stable for a run folder (wandb allows letters, digits, - and _)."""
    return hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:16]
