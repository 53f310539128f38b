"""A worker process for the kernel tests: Triton's interpreter must be on before triton is first imported
(triton builds its own library functions at import), and turning it on in the pytest process would make
every later Triton kernel of that process (torch.compile's on a GPU machine) run interpreted. So the tests
start this script once per test module (`interpreted_worker` in conftest.py) and send it requests, one JSON
object a line on stdin; it answers one JSON line each. It computes and measures; the tests assert."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton

import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402

import torch  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


def math_attention(q, k, v):
    """softmax(q k^T / sqrt(d) + causal mask) v in float64."""
    q, k, v = (t.double() for t in (q, k, v))
    T = q.shape[2]
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return s.softmax(-1) @ v


def inputs(B, H, T, D, dtype, model_layout=True, seed=0):
    """q, k, v (B, H, T, D); model_layout: as the model passes them, (B, T, H, D) memory seen transposed."""
    g = torch.Generator().manual_seed(seed)
    if model_layout:
        return [torch.randn(B, T, H, D, generator=g).transpose(1, 2).to(dtype).requires_grad_() for _ in range(3)]
    return [torch.randn(B, H, T, D, generator=g).to(dtype).requires_grad_() for _ in range(3)]


def errors(ours, ref) -> dict:
    d = ours.double() - ref
    return dict(max_abs=d.abs().max().item(), ref_max=ref.abs().max().item(),
                rel_norm=(d.norm() / ref.norm()).item() if ref.norm() > 0 else d.norm().item(),
                dtype=str(ours.dtype).removeprefix("torch."), shape=list(ours.shape), ref_shape=list(ref.shape))


def attention(B, H, T, D, dtype, blocks=None, model_layout=True):
    """Output and dQ, dK, dV of the kernel against the float64 math path on the same (rounded) inputs."""
    from iattention.kernels import load_kernel

    kernel = load_kernel()
    dtype = DTYPES[dtype]
    q, k, v = inputs(B, H, T, D, dtype, model_layout)
    out = kernel.wide_attention(q, k, v, kernel.Blocks(**blocks) if blocks else None)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    grads = torch.autograd.grad(out, (q, k, v), g)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = math_attention(q64, k64, v64)
    ref_grads = torch.autograd.grad(ref, (q64, k64, v64), g.double())
    result = {name: errors(a, b) for name, a, b in zip(("out", "dq", "dk", "dv"), (out, *grads), (ref, *ref_grads))}
    result["out_memory_is_BTHD"] = out.transpose(1, 2).is_contiguous()
    return result


def mixed(autocast: bool):
    """q bf16, k float32 (the residual stream, as canonical's keys at one head), v bf16."""
    from iattention.kernels import load_kernel

    q, k, v = (t.detach() for t in inputs(1, 1, 6, 32, torch.float32))
    if autocast:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = load_kernel().wide_attention(q, k, v)
        return errors(out, math_attention(q.bfloat16(), k.bfloat16(), v.bfloat16()))
    out = load_kernel().wide_attention(q.bfloat16(), k, v.bfloat16())
    return errors(out, math_attention(q.bfloat16(), k, v.bfloat16()))


def refuse(kind: str):
    from iattention.kernels import load_kernel

    q = torch.randn(1, 1, 4, 16)
    try:
        if kind == "shape":
            load_kernel().wide_attention(q, q[:, :, :3], q)
        else:
            load_kernel().wide_attention(q.double(), q.double(), q.double())
    except ValueError as e:
        return dict(error=str(e))
    return dict(error=None)


def grouped(H: int, G: int):
    """kernels.attend with mode triton on grouped-query inputs (q: H heads, k and v: G heads) against SDPA's
    enable_gqa: output and gradients (the kernel reads one key/value head per query head)."""
    import torch.nn.functional as F

    from iattention.kernels import attend

    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, H, 11, 32, generator=g).requires_grad_()
    k, v = (torch.randn(2, G, 11, 32, generator=g).requires_grad_() for _ in range(2))
    out = attend(q, k, v, "triton")
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    do = torch.randn(out.shape, generator=g)
    pairs = zip((out, *torch.autograd.grad(out, (q, k, v), do)), (ref, *torch.autograd.grad(ref, (q, k, v), do)))
    return dict(max_abs=max((a - b).abs().max().item() for a, b in pairs))


def registered_op():
    """torch.library.opcheck of the forward op (schema, fake tensors, autograd registration, AOT dispatch), and
    the kernel under torch.compile(fullgraph=True, backend="aot_eager") against eager: output and gradients."""
    from iattention.kernels import load_kernel

    kernel = load_kernel()
    q, k, v = inputs(1, 2, 9, 32, torch.float32)
    torch.library.opcheck(torch.ops.iattention.wide_attention.default, (q, k, v, None))
    torch.library.opcheck(torch.ops.iattention.wide_attention.default, (q, k, v, [16, 16, 16, 16, 16, 16, 16, 4, 1]))
    torch._dynamo.reset()
    compiled = torch.compile(kernel.wide_attention, fullgraph=True, backend="aot_eager")
    g = torch.randn(q.shape, generator=torch.Generator().manual_seed(1))
    eager = [kernel.wide_attention(q, k, v)]
    eager += torch.autograd.grad(eager[0], (q, k, v), g)
    traced = [compiled(q, k, v)]
    traced += torch.autograd.grad(traced[0], (q, k, v), g)
    return dict(max_abs=max((a - b).abs().max().item() for a, b in zip(eager, traced)),
                grad_scale=max(t.abs().max().item() for t in eager))


def model(attention: str, n_head: int, n_embd: int, T: int, amp: bool = False):
    """A GPT's loss and gradients with model.attn_kernel=triton (through the dispatch, interpreted) against
    the same weights with attn_kernel=sdpa."""
    from iattention import GPT, GPTConfig
    from iattention.kernels import wide_attention as wa

    calls = {"sdpa": 0, "triton": 0}
    real = wa.wide_attention
    out = {}
    for kernel in ("sdpa", "triton"):
        def counted(*args, kernel=kernel):  # a spy: counts the kernel's calls, then runs it
            calls[kernel] += 1
            return real(*args)

        wa.wide_attention = counted
        cfg = GPTConfig(n_layer=2, n_head=n_head, n_embd=n_embd, vocab_size=50, block_size=T, attention=attention,
                        attn_kernel=kernel)
        torch.manual_seed(0)
        m = GPT(cfg)
        x = torch.randint(0, 50, (2, T), generator=torch.Generator().manual_seed(2))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            loss = m(x, x)[1]
        loss.backward()
        out[kernel] = (loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
    wa.wide_attention = real
    (l0, g0), (l1, g1) = out["sdpa"], out["triton"]
    return dict(kernel_calls=calls, loss_sdpa=l0.item(), loss_triton=l1.item(),
                grad_max_abs=max((g0[n] - g1[n]).abs().max().item() for n in g0),
                grad_scale=max(g.abs().max().item() for g in g0.values()), same_names=sorted(g0) == sorted(g1))


def main() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        try:
            answer = dict(ok=globals()[request.pop("fn")](**request))
        except Exception:  # noqa: BLE001 -- the test shows it
            answer = dict(error=traceback.format_exc())
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
