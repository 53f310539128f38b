"""The machine a run or a benchmark ran on, in words (the GPU's name, or the CPU's model and threads)."""

from __future__ import annotations

import platform
from pathlib import Path

import torch


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.machine()} CPU, {torch.get_num_threads()} threads"


def hardware(device: torch.device) -> str:
    """device_name plus the CPU model: e.g. 'NVIDIA H100 80GB HBM3' or 'Intel(R) Xeon(R) ..., 1 threads'."""
    if device.type == "cuda":
        return device_name(device)
    return f"{cpu_name()} ({torch.get_num_threads()} threads)"


def allow_tf32(device: torch.device) -> None:
    """On CUDA, let fp32 matmuls and convolutions use TF32 tensor cores (training and benchmarks alike)."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
