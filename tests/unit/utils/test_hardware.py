"""The machine in words (`utils/hardware.py`): the CPU's model from /proc/cpuinfo, with torch's thread count."""

import platform
from pathlib import Path

import torch

from iattention.utils.hardware import cpu_name, device_name, hardware


def test_the_cpu_is_named_by_its_model_and_threads():
    info = Path("/proc/cpuinfo")
    models = [x.split(":", 1)[1].strip() for x in info.read_text().splitlines() if x.startswith("model name")] \
        if info.exists() else []
    assert cpu_name() == (models[0] if models else platform.processor() or platform.machine())
    threads = torch.get_num_threads()
    assert hardware(torch.device("cpu")) == f"{cpu_name()} ({threads} threads)"
    assert device_name(torch.device("cpu")) == f"{platform.machine()} CPU, {threads} threads"
