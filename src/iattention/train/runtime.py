"""Where and how the model runs: the device and the process group (`distributed.py`), CPU threads, DDP,
torch.compile, bf16 autocast and TF32. Built from `train.*` alone; the loop asks it for `autocast()`,
`wrap(model)`, `is_main`, and moves its batches with `to_device`; evaluations ask for `eval_precision()`
and `eval_model(...)`: float32 without TF32 unless `train.eval_amp`."""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

import torch

from iattention.config import LoopConfig
from iattention.train.distributed import DistContext, setup, teardown
from iattention.utils.hardware import allow_tf32, hardware


class Runtime:
    def __init__(self, t: LoopConfig):
        self.ctx: DistContext = setup(t.device)
        if t.threads:
            torch.set_num_threads(t.threads)
        self.compile, self.compile_scope, self.compile_mode = t.compile, t.compile_scope, t.compile_mode
        kind = self.device.type
        # bf16 autocast: train.amp on CUDA, train.amp_cpu on CPU
        self.amp = t.amp and kind == "cuda" or t.amp_cpu and kind == "cpu"
        self.eval_amp = self.amp and t.eval_amp

    @property
    def device(self) -> torch.device:
        return self.ctx.device

    @property
    def is_main(self) -> bool:
        return self.ctx.is_main

    @property
    def world(self) -> int:
        return self.ctx.world

    def autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16) if self.amp else nullcontext()

    @property
    def eval_dtype(self) -> str:
        """What an evaluation computes in (recorded with every evaluation in metrics.jsonl)."""
        return "bfloat16" if self.eval_amp else "float32"

    def eval_precision(self):
        """The context of an evaluation: bf16 autocast with `train.eval_amp`, else exact float32 (eager, also where
        train.compile_scope=blocks compiled the model's regions in place)."""
        return self.autocast() if self.eval_amp else float32_exact()

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module the steps run: `model` in DDP (several processes), compiled if asked (train.compile_scope
        "model": the whole of it, DDP included; "blocks": its regions, in place, before DDP wraps it); TF32 on
        from here."""
        ctx, wrapped = self.ctx, model
        if self.compile and self.compile_scope == "blocks":
            model.compile_regions(self.compile_mode)
        if ctx.enabled:
            wrapped = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
        if self.compile and self.compile_scope == "model":
            wrapped = torch.compile(wrapped, mode=self.compile_mode)
        allow_tf32(ctx.device)
        return wrapped

    def step_begin(self) -> None:
        """Before each training forward: tell CUDA graphs (train.compile_mode=reduce-overhead) that a new step
        begins, so the graph may reuse the last step's output memory."""
        if self.compile and self.compile_mode == "reduce-overhead" and self.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()

    def eval_model(self, model: torch.nn.Module, wrapped: torch.nn.Module) -> torch.nn.Module:
        """What an evaluation runs: the bare model, except a compiled one in one process under
        `train.eval_amp` (under DDP the wrapped forward would wait for a backward pass; in float32 the
        eager model is exact and spares torch.compile a second graph)."""
        return wrapped if self.eval_amp and not self.ctx.enabled else model

    def no_sync(self, wrapped: torch.nn.Module, last: bool):
        """DDP's gradient sync only on the last micro-batch of a step."""
        return nullcontext() if (last or not self.ctx.enabled) else wrapped.no_sync()

    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        pin = self.device.type == "cuda"
        return (t.pin_memory() if pin else t).to(self.device, non_blocking=pin)

    def synchronize(self) -> None:
        """Wait for the device, so a step's time is its own."""
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def describe(self) -> dict:
        return dict(device=str(self.device), hardware=hardware(self.device), world_size=self.world)

    def close(self) -> None:
        teardown(self.ctx)


@contextmanager
def float32_exact():
    """float32 matmuls as float32 and eager code: TF32 off on CUDA for the block (restored after), compiled
    functions run eagerly (torch.compiler.set_stance), so an evaluation on a GPU computes what it computes on a CPU
    up to summation order."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        with torch.compiler.set_stance("force_eager"):
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
