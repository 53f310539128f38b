"""Run configuration: typed nested dataclasses (model, data, optim, train). Loading them from presets,
YAML and overrides is `config/load.py`; whether two configs describe the same run is `config/identity.py`."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from iattention.config.model import GPTConfig
from iattention.data.config import DataConfig
from iattention.errors import UserError


@dataclass
class OptimConfig:
    """AdamW with linear warmup then cosine ("GPT-style") or linear decay to min_lr_ratio * lr."""

    lr: float = 6e-4
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1  # on matrices only (dim >= 2); biases, LayerNorms excluded
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # 0 disables
    decay_attention: bool = True  # False: no weight decay on attention matrices (see train/optim.py)
    attn_lr_by_init_rms: bool = False  # True: attention matrix lr x RMS at step 0 / 0.02 (train/optim.py)
    schedule: str = "cosine"  # cosine | linear: the decay after warmup (train/schedule.py)
    name: str = "adamw"  # adamw | muon (Muon on attention matrices per head and on MLP matrices; train/optim.py)


    def __post_init__(self) -> None:
        checks = (("lr", self.lr > 0, "> 0", "optim.lr=6e-4"),
                  ("min_lr_ratio", 0 <= self.min_lr_ratio <= 1, "in [0, 1]", "optim.min_lr_ratio=0.1"),
                  ("warmup_steps", self.warmup_steps >= 0, ">= 0", "optim.warmup_steps=100"),
                  ("weight_decay", self.weight_decay >= 0, ">= 0", "optim.weight_decay=0.1"),
                  ("beta1", 0 <= self.beta1 < 1, "in [0, 1)", "optim.beta1=0.9"),
                  ("beta2", 0 <= self.beta2 < 1, "in [0, 1)", "optim.beta2=0.95"),
                  ("grad_clip", self.grad_clip >= 0, ">= 0 (0 disables clipping)", "optim.grad_clip=1.0"),
                  ("schedule", self.schedule in SCHEDULES, f"one of {', '.join(SCHEDULES)}",
                   "optim.schedule=linear"),
                  ("name", self.name in OPTIMIZERS, f"one of {', '.join(OPTIMIZERS)}", "optim.name=muon"))
        _check("optim", self, checks)


def _check(section: str, obj, checks) -> None:
    for name, ok, rule, example in checks:
        value = getattr(obj, name)
        if isinstance(value, float) and not math.isfinite(value) or not ok:
            raise UserError(f"{section}.{name} must be {rule}, got {value!r}; e.g. {example}")


DEVICES = ("auto", "cpu", "cuda")
SCHEDULES = ("cosine", "linear")  # train/schedule.py
OPTIMIZERS = ("adamw", "muon")
COMPILE_SCOPES = ("model", "blocks")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")  # torch.compile's
MAX_THREADS = 4096  # more than any machine has; torch takes a C int


@dataclass
class LoopConfig:
    epochs: int = 1
    # A budget instead of epochs (nanoGPT's max_iters, Trainer's max_steps): the run ends after this many
    # optimizer steps, or the most steps whose batch_size x block_size tokens fit in max_tokens; the LR
    # schedule runs over it and the last epoch may be partial. 0: off (train.epochs decides). At most one.
    max_steps: int = 0
    max_tokens: int = 0
    batch_size: int = 32  # global batch, in windows of block_size tokens
    grad_accum: int = 1
    seed: int = 0
    eval_every_steps: int = 0  # extra validation evals between epochs (0: only at epoch ends)
    ckpt_every_steps: int = 0  # extra resumable checkpoints between epochs
    eval_batch_size: int = 32
    # The validation a run makes as it trains (each epoch's, each eval_every_steps one, the best checkpoint's
    # choice) on the first this many tokens of the validation split only (0: all of it). data.valid_tokens
    # cuts the split itself, for every command that reads it (iattn eval too); this cuts only training's passes.
    eval_tokens: int = 0
    final_test: bool = True  # False: no test-split evaluation at the end (the summary's test_ppl is null)
    patience: int = 0  # early stopping after this many epochs without improvement (0: off)
    compile: bool = False
    # What train.compile compiles: "model" (the whole model, one graph) or "blocks" (regional compilation: one
    # block's graph serves them all, plus the head and loss: a fraction of the compile time; GPT.compile_regions).
    compile_scope: str = "model"
    # torch.compile's mode: default | reduce-overhead (CUDA graphs) | max-autotune | max-autotune-no-cudagraphs
    compile_mode: str = "default"
    # The training loss this many positions at a time, never holding all the logits (model/loss.py: each chunk's
    # logits recomputed in the backward); 0: all at once. Evaluation always computes them whole.
    loss_chunk: int = 0
    device: str = "auto"  # auto | cpu | cuda
    amp: bool = True  # bf16 autocast on CUDA
    amp_cpu: bool = False  # bf16 autocast on CPU too (AMX: 1.3-1.8x faster here, but other numbers; BENCHMARKS.md)
    # Evaluations under the same bf16 autocast as training. Off (the default): every evaluation runs in
    # float32 with TF32 off, so a checkpoint's perplexity is the same on a GPU and a CPU (docs/evaluation.md).
    eval_amp: bool = False
    threads: int = 0  # torch CPU threads (0: torch default)
    tensorboard: bool = True
    wandb: str = ""  # a Weights & Biases project to log to as well ("" : off; WANDB_MODE=offline works)
    skip_nonfinite: bool = False  # skip batches with a non-finite loss instead of stopping
    init_from: str = ""  # start from these weights (our checkpoint/run folder or an HF folder), not a fresh init

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise UserError(f"train.device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        checks = [(n, getattr(self, n) >= 1, ">= 1", f"train.{n}=32") for n in
                  ("epochs", "batch_size", "grad_accum", "eval_batch_size")]
        checks += [(n, getattr(self, n) >= 0, ">= 0 (0: off)" if n != "threads" else ">= 0 (0: torch's choice)",
                    f"train.{n}=0") for n in ("seed", "eval_every_steps", "ckpt_every_steps", "patience", "threads",
                                              "max_steps", "max_tokens", "eval_tokens", "loss_chunk")]
        # C integers underneath: torch's seed is a 64-bit integer, its thread count a C int.
        checks += [("seed", self.seed < 2**63, "< 2^63 (a 64-bit seed)", "train.seed=0"),
                   ("threads", self.threads <= MAX_THREADS, f"<= {MAX_THREADS}", "train.threads=0")]
        checks += [("compile_scope", self.compile_scope in COMPILE_SCOPES, f"one of {', '.join(COMPILE_SCOPES)}",
                    "train.compile_scope=blocks"),
                   ("compile_mode", self.compile_mode in COMPILE_MODES, f"one of {', '.join(COMPILE_MODES)}",
                    "train.compile_mode=reduce-overhead")]
        _check("train", self, checks)
        if not self.compile and (self.compile_scope != "model" or self.compile_mode != "default"):
            raise UserError(f"train.compile_scope={self.compile_scope} and train.compile_mode={self.compile_mode} say "
                            "how train.compile compiles; set train.compile=true, or leave them out")
        if self.max_steps and self.max_tokens:
            raise UserError(f"train.max_steps={self.max_steps} and train.max_tokens={self.max_tokens} are two "
                            "budgets; give one (the other =0)")

    def budget(self) -> str:
        """What ends the run, as the config says it: `train.max_steps=N`, `train.max_tokens=N` or `train.epochs=N`."""
        for key in BUDGET_KEYS[1:]:
            if getattr(self, key):
                return f"train.{key}={getattr(self, key)}"
        return f"train.epochs={self.epochs}"


BUDGET_KEYS = ("epochs", "max_steps", "max_tokens")  # what ends a run; --resume with a larger one extends it


@dataclass
class RunConfig:
    # GPT-2 (the default), or another family's decoder: a model section with `family: llama` (config/model.py)
    model: GPTConfig = field(default_factory=lambda: GPTConfig(vocab_size=0))
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: LoopConfig = field(default_factory=LoopConfig)

    def to_dict(self) -> dict:
        """Plain dicts (the model section as GPTConfig.to_dict writes it)."""
        return {**dataclasses.asdict(self), "model": self.model.to_dict()}
