"""Fused causal attention for wide heads (head dim up to 1024 and beyond): Triton, forward and backward.

Why this exists. The paper's headline configuration is one head of width d = 768. On CUDA,
`F.scaled_dot_product_attention` has no flash kernel past head dim 256 (FlashAttention-2 and its cuDNN
and FA3 relatives stop there), so it falls back to the memory-efficient (CUTLASS) kernel or to the math
path that materialises the T x T scores; issue 45 measured 1 head at 0.42x the 12-head throughput for the
same FLOPs. FlexAttention (torch 2.13's Triton template, torch/_inductor/template_heuristics/triton.py)
has no hard head-dim limit, but past 256 it drops to fallback tiles (forward 64 x 32, backward
16 x 16 with one stage) and keeps the whole head dim, rounded up to a power of two (768 -> 1024), in
each Q/K/V tile (QK_HEAD_DIM_ROUNDED in torch/_inductor/kernel/flex/common.py); its maintainers call
256 "hard to fit in shared memory" (attention-gym issue 14) and report shared-memory OutOfResources at
large head dims (pytorch issues 132075, 133254). Whether it compiles and how fast it runs at 768 on an
H100 is for the GPU session to measure (benchmarks/wide_attention.py times it beside this kernel).

How. Written for this project (FlashAttention-2's algorithm: online softmax, recomputation in the
backward from the row log-sum-exp), with the head dim handled in chunks so no tile holds a whole row:
  * scores S = Q K^T are accumulated over head-dim chunks of BK columns (Q and K tiles of BM x BK and
    BN x BK), so shared memory does not grow with the head dim;
  * the output, and in the backward dK, dV and dQ, are accumulated in chunks of BDV (BDC) columns: the
    launch grid has one program per (row block, batch x head, head-dim chunk); each program recomputes
    its row block's scores (cheap next to the memory a full-width accumulator would need) and keeps
    only its chunk's fp32 accumulator in registers;
  * online softmax in base 2 (exp2, scores pre-scaled by log2(e)/sqrt(d)); the forward saves the
    row log-sum-exp for the backward, which recomputes P = exp2(S - lse) and never stores it;
  * causal: key blocks past a row block's diagonal are never visited; T need not be a multiple of a
    tile (rows and keys past T are masked), T = 1 works;
  * fp32, bf16 and fp16 inputs, fp32 accumulation; fp32 products are IEEE (not TF32) so the fp32 path
    is exact to ~1e-6, bf16/fp16 products run on tensor cores with P (and dS) rounded to the input
    dtype before the second product, as FlashAttention does.

As torch sees it (issue 52): the torch op `iattention::wide_attention` (a `torch.library.triton_op` whose
launches go through `wrap_triton`, so torch.compile(fullgraph=True) traces them into its graph; the backward,
the op `iattention::wide_attention_bwd`, attached with register_autograd). Inductor types a Python float
argument as fp64, so every kernel casts its scales to fp32 first (without it the forward's running max m_i
turned fp64 inside its loop and the kernel did not compile). Tiles: `triton.autotune` over five configs per
kernel, keyed on the head dim (and, by the autotuner, the dtypes), pruned by a lower bound of their
shared-memory need against the device's limit (`shared_memory_need`: 227 KB on Hopper, 163 KB on an A100), the
last a single-stage one the compiler fits on an A100 at head dim 1024 (figures compiled without a GPU:
`benchmarks/kernel_shared_memory.py`); fixed `Blocks` may be passed instead (the tests do).

Verified on CPU under Triton's interpreter (TRITON_INTERPRET=1) against the math path, and without running
(the Triton IR for an sm_90 target, the autotune pruning, fake shapes, the compiled joint graph) in
tests/unit/kernels/; on the device by tests/gpu/. The interpreter's tl.dot gives wrong results on bf16
operands (triton 3.9: it multiplies the raw bits), so under the interpreter bf16 operands are widened to fp32
before each product (exact: a product of two bf16 numbers fits fp32) -- the GPU path multiplies bf16 on tensor
cores. Under the interpreter the ops are plain custom ops (no tracer can record an interpreted kernel) with
fake implementations, and the tiles default to `default_blocks` (autotuning would time every config in numpy).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from iattention.kernels.math_path import attention_dtype

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def interpreted() -> bool:
    """Triton's interpreter (CPU, numpy) is on."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


INTERPRETED = interpreted()  # triton.jit below builds interpreter functions when this holds at import


@dataclass(frozen=True)
class Blocks:
    """Tile sizes. Forward: BM query rows x BN keys per step, BK head-dim columns per score chunk, BDV
    output columns per program. Backward: the same names for its row / key tiles, BDC gradient columns
    per program. All powers of two, at least 16 (tl.dot's smallest tile)."""

    BM: int = 64
    BN: int = 32
    BK: int = 64
    BDV: int = 256
    bwd_BM: int = 32
    bwd_BN: int = 32
    BDC: int = 256
    num_warps: int = 8
    num_stages: int = 2


def default_blocks(d: int) -> Blocks:
    """First-guess tiles for head dim d (to tune on the device): full-width accumulators up to 128,
    256-column chunks above (768 -> 3 chunks)."""
    width = max(16, triton.next_power_of_2(d))
    if d <= 128:
        return Blocks(BM=64, BN=64, BK=width, BDV=width, bwd_BM=64, bwd_BN=64, BDC=width, num_warps=4)
    return Blocks(BK=64, BDV=min(width, 256), BDC=min(width, 256))


@triton.jit
def _dot(a, b, UPCAST: tl.constexpr, PREC: tl.constexpr):
    if UPCAST:  # the interpreter's bf16 dot is wrong: widen (exactly) to fp32 first
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, input_precision=PREC)


@triton.jit
def _program(H):
    """(row or key block, batch x head, head-dim chunk, batch, head) of this program."""
    bh = tl.program_id(1)
    return tl.program_id(0), bh, tl.program_id(2), bh // H, bh % H


@triton.jit
def _fwd_kernel(Q, K, V, O, LSE,
                sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
                H, T, qk_scale,
                D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BDV: tl.constexpr,
                UPCAST: tl.constexpr, PREC: tl.constexpr):
    pid_m, bh, pid_c, b, h = _program(H)
    qk_scale = tl.cast(qk_scale, tl.float32)  # inductor passes a Python float as fp64: m_i would turn fp64 in the loop
    Q += b * sqb + h * sqh
    K += b * skb + h * skh
    V += b * svb + h * svh
    O += b * sob + h * soh
    rm = pid_m * BM + tl.arange(0, BM)  # query rows
    rk = tl.arange(0, BK)  # head-dim columns of one score chunk
    rc = pid_c * BDV + tl.arange(0, BDV)  # this program's output columns
    m_i = tl.full([BM], float("-inf"), dtype=tl.float32)  # running row max (base-2 units)
    l_i = tl.zeros([BM], dtype=tl.float32)  # running row sum of exp2(s - m_i)
    acc = tl.zeros([BM, BDV], dtype=tl.float32)
    hi = tl.minimum((pid_m + 1) * BM, T)  # causal: no key past the block's last row
    for start_n in range(0, hi, BN):
        rn = start_n + tl.arange(0, BN)
        s = tl.zeros([BM, BN], dtype=tl.float32)
        for k0 in tl.static_range(0, D, BK):
            q = tl.load(Q + rm[:, None] * sqt + (k0 + rk)[None, :],
                        mask=(rm[:, None] < T) & ((k0 + rk)[None, :] < D), other=0.0)
            kt = tl.load(K + rn[None, :] * skt + (k0 + rk)[:, None],
                         mask=(rn[None, :] < T) & ((k0 + rk)[:, None] < D), other=0.0)
            s += _dot(q, kt, UPCAST, PREC)
        s = s * qk_scale
        s = tl.where((rn[None, :] <= rm[:, None]) & (rn[None, :] < T), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)  # rescales what was summed under the old max
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + rn[:, None] * svt + rc[None, :], mask=(rn[:, None] < T) & (rc[None, :] < D), other=0.0)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, UPCAST, PREC)
        m_i = m_new
    acc = acc / l_i[:, None]
    tl.store(O + rm[:, None] * sot + rc[None, :], acc.to(O.dtype.element_ty),
             mask=(rm[:, None] < T) & (rc[None, :] < D))
    if pid_c == 0:
        tl.store(LSE + bh * T + rm, m_i + tl.log2(l_i), mask=rm < T)


@triton.jit
def _scores_and_dp(Q, K, V, DO, rm, rn, sqt, skt, svt, sdot, T,
                   D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                   UPCAST: tl.constexpr, PREC: tl.constexpr):
    """S = Q K^T and dP = dO V^T for query rows rm and keys rn (BM x BN, fp32), over head-dim chunks of BK."""
    rk = tl.arange(0, BK)
    s = tl.zeros([BM, BN], dtype=tl.float32)
    dp = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in tl.static_range(0, D, BK):
        kmask = (k0 + rk) < D
        rows = (rm[:, None] < T) & kmask[None, :]
        cols = (rn[None, :] < T) & kmask[:, None]
        q = tl.load(Q + rm[:, None] * sqt + (k0 + rk)[None, :], mask=rows, other=0.0)
        kt = tl.load(K + rn[None, :] * skt + (k0 + rk)[:, None], mask=cols, other=0.0)
        s += _dot(q, kt, UPCAST, PREC)
        do = tl.load(DO + rm[:, None] * sdot + (k0 + rk)[None, :], mask=rows, other=0.0)
        vt = tl.load(V + rn[None, :] * svt + (k0 + rk)[:, None], mask=cols, other=0.0)
        dp += _dot(do, vt, UPCAST, PREC)
    return s, dp


@triton.jit
def _bwd_dkdv_kernel(Q, K, V, DO, DK, DV, LSE, DELTA,
                     sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdob, sdoh, sdot,
                     sdkb, sdkh, sdkt, sdvb, sdvh, sdvt,
                     H, T, qk_scale, sm_scale,
                     D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BDC: tl.constexpr,
                     UPCAST: tl.constexpr, PREC: tl.constexpr):
    """One key block x one chunk of head-dim columns: dV = P^T dO, dK = scale dS^T Q over the query rows
    at or after the block (causal)."""
    pid_n, bh, pid_c, b, h = _program(H)
    qk_scale, sm_scale = tl.cast(qk_scale, tl.float32), tl.cast(sm_scale, tl.float32)  # fp64 under inductor
    Q += b * sqb + h * sqh
    K += b * skb + h * skh
    V += b * svb + h * svh
    DO += b * sdob + h * sdoh
    DK += b * sdkb + h * sdkh
    DV += b * sdvb + h * sdvh
    rn = pid_n * BN + tl.arange(0, BN)
    rc = pid_c * BDC + tl.arange(0, BDC)
    dk = tl.zeros([BN, BDC], dtype=tl.float32)
    dv = tl.zeros([BN, BDC], dtype=tl.float32)
    lo = (pid_n * BN) // BM * BM  # the first query block holding a row >= the block's first key
    for start_m in range(lo, T, BM):
        rm = start_m + tl.arange(0, BM)
        s, dp = _scores_and_dp(Q, K, V, DO, rm, rn, sqt, skt, svt, sdot, T, D, BM, BN, BK, UPCAST, PREC)
        st = tl.trans(s)  # (BN, BM)
        dpt = tl.trans(dp)
        lse = tl.load(LSE + bh * T + rm, mask=rm < T, other=0.0)
        delta = tl.load(DELTA + bh * T + rm, mask=rm < T, other=0.0)
        valid = (rn[:, None] <= rm[None, :]) & (rm[None, :] < T) & (rn[:, None] < T)
        pt = tl.where(valid, tl.exp2(st * qk_scale - lse[None, :]), 0.0)
        dst = pt * (dpt - delta[None, :])
        cmask = (rm[:, None] < T) & (rc[None, :] < D)
        do_c = tl.load(DO + rm[:, None] * sdot + rc[None, :], mask=cmask, other=0.0)
        dv += _dot(pt.to(do_c.dtype), do_c, UPCAST, PREC)
        q_c = tl.load(Q + rm[:, None] * sqt + rc[None, :], mask=cmask, other=0.0)
        dk += _dot(dst.to(q_c.dtype), q_c, UPCAST, PREC)
    out = (rn[:, None] < T) & (rc[None, :] < D)
    tl.store(DK + rn[:, None] * sdkt + rc[None, :], (dk * sm_scale).to(DK.dtype.element_ty), mask=out)
    tl.store(DV + rn[:, None] * sdvt + rc[None, :], dv.to(DV.dtype.element_ty), mask=out)


@triton.jit
def _bwd_dq_kernel(Q, K, V, DO, DQ, LSE, DELTA,
                   sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdob, sdoh, sdot, sdqb, sdqh, sdqt,
                   H, T, qk_scale, sm_scale,
                   D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BDC: tl.constexpr,
                   UPCAST: tl.constexpr, PREC: tl.constexpr):
    """One query block x one chunk of head-dim columns: dQ = scale dS K over the keys up to the diagonal."""
    pid_m, bh, pid_c, b, h = _program(H)
    qk_scale, sm_scale = tl.cast(qk_scale, tl.float32), tl.cast(sm_scale, tl.float32)  # fp64 under inductor
    Q += b * sqb + h * sqh
    K += b * skb + h * skh
    V += b * svb + h * svh
    DO += b * sdob + h * sdoh
    DQ += b * sdqb + h * sdqh
    rm = pid_m * BM + tl.arange(0, BM)
    rc = pid_c * BDC + tl.arange(0, BDC)
    lse = tl.load(LSE + bh * T + rm, mask=rm < T, other=0.0)
    delta = tl.load(DELTA + bh * T + rm, mask=rm < T, other=0.0)
    dq = tl.zeros([BM, BDC], dtype=tl.float32)
    hi = tl.minimum((pid_m + 1) * BM, T)
    for start_n in range(0, hi, BN):
        rn = start_n + tl.arange(0, BN)
        s, dp = _scores_and_dp(Q, K, V, DO, rm, rn, sqt, skt, svt, sdot, T, D, BM, BN, BK, UPCAST, PREC)
        valid = (rn[None, :] <= rm[:, None]) & (rn[None, :] < T) & (rm[:, None] < T)
        p = tl.where(valid, tl.exp2(s * qk_scale - lse[:, None]), 0.0)
        ds = p * (dp - delta[:, None])
        k_c = tl.load(K + rn[:, None] * skt + rc[None, :], mask=(rn[:, None] < T) & (rc[None, :] < D), other=0.0)
        dq += _dot(ds.to(k_c.dtype), k_c, UPCAST, PREC)
    tl.store(DQ + rm[:, None] * sdqt + rc[None, :], (dq * sm_scale).to(DQ.dtype.element_ty),
             mask=(rm[:, None] < T) & (rc[None, :] < D))


def _strides(t: torch.Tensor) -> tuple[int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2)


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _modes(dtype: torch.dtype) -> tuple[bool, str | None]:
    """(UPCAST, PREC): widen bf16 under the interpreter; IEEE products for fp32 (no TF32)."""
    upcast = INTERPRETED and dtype == torch.bfloat16
    return upcast, ("ieee" if dtype == torch.float32 or upcast else None)


# ---- tiles: triton.autotune over configs pruned by their shared-memory need -------------------------------------

HOPPER_SHARED_MEMORY = 232448  # bytes per block, opt-in maximum (227 KB; H100: the "Hardware limit" it reports)
AMPERE_SHARED_MEMORY = 166912  # A100 (163 KB)
KINDS = ("fwd", "dkdv", "dq")


def shared_memory_need(kind: str, D: int, elem: int, cfg: dict, stages: int = 1) -> int:
    """Bytes of shared memory a config of kernel `kind` needs at head dim D with `elem`-byte inputs and `stages`
    pipeline stages: a model, a lower bound of the compiler's figure. Operands that do not change along a
    program's loop are hoisted out of it whole by Triton's loop-invariant code motion (the forward's Q row block,
    BM x D; the dK/dV kernel's K and V key blocks, 2 BN x D; the dQ kernel's Q and dO row blocks, 2 BM x D), plus
    the one chunk tile each step stages for its second product (V: BN x BDV; Q or dO: BM x BDC; K: BN x BDC).
    At fp32 (IEEE products, not on tensor cores) each stage past the first buffers the loop's whole-head-dim loads
    once more (the forward's K key block, BN x D; the dK/dV kernel's Q and dO row blocks, 2 BM x D; the dQ
    kernel's K and V key blocks, 2 BN x D); at bf16 a second stage adds nothing the model has to count.
    Checked against the compiler (`benchmarks/results/kernel-shared-memory.json`: every config at head dims 768
    and 1024, fp32 and bf16, compiled for sm_90 without a GPU by `benchmarks/kernel_shared_memory.py`; the unit
    tests read it): never above its figure; under it by 0-2,112 bytes single-stage, by 0-4,608 at bf16 and
    1,024-49,664 at fp32 with two stages (60 sm_90 rows, and the safe configs' 6 for sm_80). The second GPU window
    (2026-11-27) spent its steps compiling two-stage fp32 configs that a stage-blind model kept and the compiler
    then refused (each 10-90 s to compile for sm_90 on 2 CPU cores). At fp32, head dim 1024 and the first-guess
    tiles, single-stage, it gives 294912 bytes, the figure an H100 reported for the first kernel (issue 52:
    'Required: 294912')."""
    extra = stages - 1 if elem == 4 else 0
    if kind == "fwd":
        return elem * (cfg["BM"] * D + cfg["BN"] * cfg["BDV"] + extra * cfg["BN"] * D)
    if kind == "dkdv":
        return elem * (2 * cfg["BN"] * D + cfg["BM"] * cfg["BDC"] + extra * 2 * cfg["BM"] * D)
    return elem * (2 * cfg["BM"] * D + cfg["BN"] * cfg["BDC"] + extra * 2 * cfg["BN"] * D)


KERNELS = {"fwd": _fwd_kernel, "dkdv": _bwd_dkdv_kernel, "dq": _bwd_dq_kernel}
_POINTERS = ("Q", "K", "V", "O", "DO", "DQ", "DK", "DV")  # and LSE, DELTA: fp32 always


def ast_source(kind: str, dtype: str, constants: dict, scale: str = "fp32"):
    """Kernel `kind` as Triton's compiler takes it for a named target, no GPU needed (`triton.compile(src,
    target=GPUTarget(...))`, or `src.make_ir` for its IR): pointers of `dtype` ("fp32", "bf16"), the scales
    typed `scale` (inductor types a Python float "fp64"), every other argument an i32; `constants` are the
    constexprs (D, tiles; UPCAST and PREC default to the device's for `dtype`)."""
    from triton.compiler import ASTSource

    kernel = KERNELS[kind]
    constants = dict(UPCAST=False, PREC="ieee" if dtype == "fp32" else None) | constants
    names = kernel.arg_names
    signature = {n: "constexpr" if n in constants else scale if n in ("qk_scale", "sm_scale")
                 else f"*{dtype}" if n in _POINTERS else "*fp32" if n in ("LSE", "DELTA") else "i32" for n in names}
    return ASTSource(fn=kernel, signature=signature,
                     constexprs={(names.index(k),): v for k, v in constants.items() if k in names})


def kernel_source_hash() -> str:
    """sha256 of the three kernels' and their helpers' source (the committed compiler figures are for it)."""
    parts = [f.src for f in (_dot, _program, _fwd_kernel, _scores_and_dp, _bwd_dkdv_kernel, _bwd_dq_kernel)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def fitting(configs: list, kind: str, D: int, elem: int, limit: int) -> list:
    """The configs whose shared_memory_need is within `limit` bytes; if none is, the one that needs least (so
    the launch fails with the compiler's own message, not an empty autotune)."""
    needs = [shared_memory_need(kind, D, elem, c.kwargs, c.num_stages) for c in configs]
    kept = [c for c, n in zip(configs, needs) if n <= limit]
    return kept or [configs[needs.index(min(needs))]]


def device_shared_memory(device: torch.device) -> int:
    """The CUDA device's opt-in shared memory per block, in bytes, as Triton's driver reports it; tensors
    off CUDA (tracing on a CPU machine, the tests) get Hopper's."""
    if device.type != "cuda":
        return HOPPER_SHARED_MEMORY
    index = device.index if device.index is not None else torch.cuda.current_device()
    return triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"]


def _pruner(kind: str):
    def prune(configs, named_args, **kwargs):
        D, q = kwargs.get("D", named_args.get("D")), named_args["Q"]
        return fitting(list(configs), kind, D, q.element_size(), device_shared_memory(q.device))
    return prune


SAFE_TILES = {"fwd": (16, 32, 256), "dkdv": (16, 16, 128), "dq": (16, 16, 128)}  # single-stage, 4 warps


def _configs(kind: str) -> list:
    """Tile candidates per kernel (autotuning compiles and times each once per head dim and dtype, inside a
    short GPU window): (row tile, key tile, chunk of output or gradient columns per program), 8 warps for the
    larger tiles, two pipeline stages; all powers of two >= 16 (tl.dot's smallest). Last, one single-stage
    small-tile config (`SAFE_TILES`) that the compiler fits within an A100's shared memory at head dim 1024 in
    fp32 and bf16 (`benchmarks/results/kernel-shared-memory.json`): the two-stage configs can all be out of
    shared memory at fp32 and head dim 768 (the compiler stages whole-head-dim K, or Q and dO, blocks per
    extra stage), and an autotune where every config fails launches one that fails (the first GPU window
    of 2026-11-27: every fp32 case at head dim 768 failed)."""
    if kind == "fwd":
        tiles, chunk = ((64, 32, 256), (128, 32, 128), (64, 64, 128), (32, 32, 256)), "BDV"
    else:
        tiles, chunk = ((32, 32, 256), (64, 32, 128), (32, 64, 128), (16, 16, 256)), "BDC"
    configs = [triton.Config({"BM": bm, "BN": bn, "BK": 64, chunk: bc}, num_warps=8 if bm * bn >= 2048 else 4,
                             num_stages=2) for bm, bn, bc in tiles]
    bm, bn, bc = SAFE_TILES[kind]
    return configs + [triton.Config({"BM": bm, "BN": bn, "BK": 64, chunk: bc}, num_warps=4, num_stages=1)]


def _tuned(kernel, kind: str):
    return triton.autotune(configs=_configs(kind), key=["D"],  # the autotuner adds the tensors' dtypes to the key
                           prune_configs_by={"early_config_prune": _pruner(kind)})(kernel)


if not INTERPRETED:  # the interpreter would time every config in numpy: there the tests pass explicit tiles
    _fwd_tuned, _dkdv_tuned, _dq_tuned = (_tuned(k, kind) for k, kind in
                                          zip((_fwd_kernel, _bwd_dkdv_kernel, _bwd_dq_kernel), KINDS))


def _fields(blocks: list[int] | None) -> Blocks | None:
    return None if blocks is None else Blocks(*blocks)


def _launch(kernel, grid, *args, **kwargs) -> None:
    """Through wrap_triton, so torch.compile traces the launch into its graph (under the interpreter
    wrap_triton hands back the plain function: the ops are then opaque custom ops, see _op)."""
    torch.library.wrap_triton(kernel)[grid](*args, **kwargs)


def _op(name: str):
    """torch.library.triton_op: torch.compile and AOT tracing see the launches inside (wrap_triton) and derive
    the output shapes from the function itself. Under the interpreter the kernels are plain Python, which no
    tracer can record, so there the same function is an opaque torch.library.custom_op with a fake
    implementation (registered below) that only allocates."""
    register = torch.library.custom_op if INTERPRETED else torch.library.triton_op
    return register(f"iattention::{name}", mutates_args=())


# ---- the torch ops: iattention::wide_attention (forward, with autograd) and iattention::wide_attention_bwd ----

@_op("wide_attention")
def _forward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                blocks: list[int] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, lse): o (B, H, T, D) with (B, T, H, D) memory (the caller's transpose back to (B, T, H D) is free),
    lse the row log-sum-exp in base 2, (B H, T) fp32. blocks: Blocks' fields in order, or None to autotune."""
    B, H, T, D = q.shape
    o = torch.empty(B, T, H, D, device=q.device, dtype=q.dtype).transpose(1, 2)
    lse = torch.empty(B * H, T, device=q.device, dtype=torch.float32)
    sm_scale = 1.0 / math.sqrt(D)
    upcast, prec = _modes(q.dtype)
    args = (q, k, v, o, lse, *_strides(q), *_strides(k), *_strides(v), *_strides(o), H, T, sm_scale * math.log2(math.e))
    chosen = _fields(blocks) or (default_blocks(D) if INTERPRETED else None)
    if chosen is None:
        _launch(_fwd_tuned, lambda m: (triton.cdiv(T, m["BM"]), B * H, triton.cdiv(D, m["BDV"])), *args, D=D,
                UPCAST=upcast, PREC=prec)
    else:
        grid = (triton.cdiv(T, chosen.BM), B * H, triton.cdiv(D, chosen.BDV))
        _launch(_fwd_kernel, grid, *args, D=D, BM=chosen.BM, BN=chosen.BN, BK=chosen.BK, BDV=chosen.BDV,
                UPCAST=upcast, PREC=prec, num_warps=chosen.num_warps, num_stages=chosen.num_stages)
    return o, lse


@_op("wide_attention_bwd")
def _backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                 do: torch.Tensor, blocks: list[int] | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of the forward op for output gradient do."""
    B, H, T, D = q.shape
    do = _unit_last(do)
    delta = (do.float() * o.float()).sum(-1).reshape(B * H, T)  # rowsum(dO o O), (B H, T) fp32
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    sm_scale = 1.0 / math.sqrt(D)
    upcast, prec = _modes(q.dtype)
    scales = (H, T, sm_scale * math.log2(math.e), sm_scale)
    dkdv_args = (q, k, v, do, dk, dv, lse, delta, *_strides(q), *_strides(k), *_strides(v), *_strides(do),
                 *_strides(dk), *_strides(dv), *scales)
    dq_args = (q, k, v, do, dq, lse, delta, *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dq),
               *scales)
    chosen = _fields(blocks) or (default_blocks(D) if INTERPRETED else None)
    if chosen is None:
        def grid(rows: str):
            return lambda m: (triton.cdiv(T, m[rows]), B * H, triton.cdiv(D, m["BDC"]))
        _launch(_dkdv_tuned, grid("BN"), *dkdv_args, D=D, UPCAST=upcast, PREC=prec)
        _launch(_dq_tuned, grid("BM"), *dq_args, D=D, UPCAST=upcast, PREC=prec)
        return dq, dk, dv
    common = dict(D=D, BM=chosen.bwd_BM, BN=chosen.bwd_BN, BK=chosen.BK, BDC=chosen.BDC, UPCAST=upcast, PREC=prec,
                  num_warps=chosen.num_warps, num_stages=chosen.num_stages)
    chunks = triton.cdiv(D, chosen.BDC)
    _launch(_bwd_dkdv_kernel, (triton.cdiv(T, chosen.bwd_BN), B * H, chunks), *dkdv_args, **common)
    _launch(_bwd_dq_kernel, (triton.cdiv(T, chosen.bwd_BM), B * H, chunks), *dq_args, **common)
    return dq, dk, dv


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, blocks = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.blocks = blocks
    ctx.mark_non_differentiable(lse)


def _backward(ctx, do, _dlse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.iattention.wide_attention_bwd(q, k, v, o, lse, do, ctx.blocks)
    return dq, dk, dv, None


_forward_op.register_autograd(_backward, setup_context=_setup_context)

if INTERPRETED:
    @_forward_op.register_fake
    def _(q, k, v, blocks):
        B, H, T, D = q.shape
        return q.new_empty(B, T, H, D).transpose(1, 2), q.new_empty(B * H, T, dtype=torch.float32)

    @_backward_op.register_fake
    def _(q, k, v, o, lse, do, blocks):
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def wide_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocks: Blocks | None = None) -> torch.Tensor:
    """Causal softmax(q k^T / sqrt(d)) v for q, k, v of shape (B, H, T, d) (any strides with a unit last
    one), as F.scaled_dot_product_attention(q, k, v, is_causal=True). Under autocast the inputs are cast
    to its dtype (as SDPA is); otherwise mixed dtypes are promoted. The output has q's (cast) dtype, with
    (B, T, H, d) memory order. blocks: fixed tiles; None: autotuned on CUDA (default_blocks under the
    interpreter)."""
    if not (q.shape == k.shape == v.shape and q.dim() == 4):
        raise ValueError(f"wide_attention needs q, k, v of one shape (B, H, T, d); got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    dtype = attention_dtype(q, k, v)
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"wide_attention takes float32, bfloat16 or float16, got {dtype}")
    q, k, v = (_unit_last(t.to(dtype)) for t in (q, k, v))
    fields = None if blocks is None else [getattr(blocks, f.name) for f in dataclasses.fields(Blocks)]
    return torch.ops.iattention.wide_attention(q, k, v, fields)[0]
