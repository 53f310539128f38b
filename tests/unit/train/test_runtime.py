"""Unit tests of iattention.train.runtime (moved from tests/test_train_parts.py)."""

from __future__ import annotations

import pytest
import torch

from iattention.config import LoopConfig
from iattention.train.runtime import Runtime


@pytest.mark.parametrize("amp, amp_cpu, bf16", [(True, False, False), (False, True, True), (True, True, True)])
def test_runtime_autocast_on_cpu_only_with_amp_cpu(amp, amp_cpu, bf16):
    """train.amp is CUDA's: on CPU only train.amp_cpu turns bf16 autocast on."""
    rt = Runtime(LoopConfig(device="cpu", amp=amp, amp_cpu=amp_cpu))
    assert rt.device.type == "cpu" and rt.is_main and rt.world == 1
    a = torch.ones(4, 4)
    with rt.autocast():
        out = a @ a
    assert out.dtype == (torch.bfloat16 if bf16 else torch.float32)
    model = torch.nn.Linear(4, 4)
    assert rt.wrap(model) is model and rt.eval_model(model, model) is model  # one process, not compiled
    rt.close()
