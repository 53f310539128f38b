"""CUDA-only checks (`make test-gpu`; every test here skips without a CUDA device): the wide-head Triton kernel
on the device against the math path, a 1-epoch tiny training on CUDA, `iattn eval` of it on CUDA agreeing
with the CPU, and generation with the KV cache equal to generation without it.
Written without a GPU (issue 45): first run in a GPU session."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from helpers import tiny_overrides, write_corpus
from iattention.cli import main

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def math_attention(q, k, v):
    q, k, v = (t.double() for t in (q, k, v))
    T = q.shape[2]
    s = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(
        ~torch.ones(T, T, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    return s.softmax(-1) @ v


@pytest.mark.parametrize("T", [1, 70, 1027])
@pytest.mark.parametrize("D", [64, 768, 1024])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_on_the_device_matches_the_math_path(T, D, dtype):
    pytest.importorskip("triton")
    from iattention.kernels import load_kernel

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, T, 1, D, device="cuda", generator=g).transpose(1, 2).to(dtype).requires_grad_()
               for _ in range(3))
    out = load_kernel().wide_attention(q, k, v)
    do = torch.randn(out.shape, device="cuda", generator=g).to(dtype)
    grads = torch.autograd.grad(out, (q, k, v), do)
    ref64 = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = math_attention(*ref64)
    ref_grads = torch.autograd.grad(ref, ref64, do.double())
    for name, a, b in zip(("out", "dq", "dk", "dv"), (out, *grads), (ref, *ref_grads)):
        if dtype == torch.float32:
            assert (a.double() - b).abs().max().item() <= 1e-5 * max(1.0, b.abs().max().item()), name
        else:
            assert ((a.double() - b).norm() / b.norm()).item() <= 4 * 2.0 ** -8, name


def test_tiny_train_on_cuda_eval_agrees_with_cpu_and_cached_generation_equals_uncached(tmp_path):
    paths = write_corpus(tmp_path)
    run = tmp_path / "run"
    ov = tiny_overrides(paths, tmp_path / "cache", **{"train.epochs": 1, "train.device": "cuda"})
    assert main(["train", "--preset", "tiny", "--quiet", *ov, "--out", str(run)]) == 0
    assert (run / "summary.json").is_file()

    def eval_ppl(env_extra):
        env = {**os.environ, **env_extra}
        out = subprocess.run([sys.executable, "-m", "iattention", "eval", str(run), "--json"], env=env,
                             capture_output=True, text=True, check=True).stdout
        return json.loads(out.strip().splitlines()[-1])["ppl"]

    gpu, cpu = eval_ppl({}), eval_ppl({"CUDA_VISIBLE_DEVICES": ""})
    assert abs(gpu - cpu) <= 1e-4 * cpu, (gpu, cpu)

    from iattention import load_run
    from iattention.model.generate import generate

    model = load_run(run)[0].to("cuda").eval()
    prompt = torch.randint(0, 50, (1, 5), device="cuda", generator=torch.Generator(device="cuda").manual_seed(0))
    with torch.no_grad():
        a = generate(model, prompt, 30, temperature=0.0, use_cache=True)
        b = generate(model, prompt, 30, temperature=0.0, use_cache=False)
    assert torch.equal(a, b)
