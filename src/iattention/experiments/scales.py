"""`iattn scales`: how large each attention weight group is, and how far AdamW moves it.

For each attention matrix kind (W_Q, W_K, W_V, W_O, or the learned free rows of a canonical head),
averaged over layers: the RMS of its entries at step 0, and the RMS of one optimizer step's change
over the first N steps, absolute and relative to the weights' RMS. Adam moves each entry by about
lr per step whatever the entry's scale, so a group stored at a much smaller scale changes much
faster in relative terms. The training steps are the trainer's own (same data order, schedule and
optimizer groups), so the numbers describe the study's runs.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch

from iattention.config import RunConfig, resolve_vocab
from iattention.data.dataset import epoch_order, load_data, n_train_windows, train_batch
from iattention.model.gpt import GPT
from iattention.train.optim import apply_step, build_optimizer, is_matrix, set_lr
from iattention.train.schedule import lr_at

FUSED = {"c_attn.weight": ("W_Q", "W_K", "W_V"), "c_kv.weight": ("W_K", "W_V"), "c_qv.weight": ("W_Q", "W_V")}


def _kinds(name: str) -> tuple[str, ...]:
    """The attention map kinds one stored matrix holds (a fused GEMM holds several, stacked by rows)."""
    return FUSED.get(name) or ("W_O" if name == "c_proj.weight" else name.removesuffix(".weight"),)


def attention_matrices(model: GPT):
    """(kinds, parameter) for every attention weight matrix of every layer."""
    for attn in model.attention_layers:
        for name, p in attn.named_parameters():
            if is_matrix(name, p) and p.numel():
                yield _kinds(name), p


def attention_groups(model: GPT) -> dict[str, list[torch.Tensor]]:
    """Attention matrices by kind, one tensor per layer; fused GEMMs are split into their maps.
    The tensors are detached views: they share storage with the parameters and follow their updates."""
    d = model.config.n_embd
    out: dict[str, list[torch.Tensor]] = defaultdict(list)
    for kinds, p in attention_matrices(model):
        for kind, part in zip(kinds, p.detach().split(d, dim=0)):
            out[kind].append(part)
    return dict(out)


def optimizer_settings(model: GPT, opt: torch.optim.Optimizer) -> dict[str, dict[str, float]]:
    """Per kind, what the optimizer really applies to it: weight decay and learning-rate multiplier
    (attn_lr_by_init_rms gives each layer's matrix its own; this is their mean over layers)."""
    group_of = {id(p): g for g in opt.param_groups for p in g["params"]}
    # optim.name=muon: Muon's groups hold per-head views; a parameter takes its blocks' group
    group_of.update({id(src): group_of[id(view)] for (src, _), view in zip(getattr(opt, "sources", ()),
                                                                            getattr(opt, "views", ()))})
    seen: dict[str, list[dict]] = defaultdict(list)
    for kinds, p in attention_matrices(model):
        for kind in kinds:
            seen[kind].append(group_of[id(p)])
    return {kind: dict(weight_decay=sum(g["weight_decay"] for g in gs) / len(gs),
                       lr_scale=sum(g.get("lr_scale", 1.0) for g in gs) / len(gs)) for kind, gs in seen.items()}


def _rms(ts: list[torch.Tensor]) -> float:
    n = sum(t.numel() for t in ts)
    return math.sqrt(sum(float(t.detach().double().pow(2).sum()) for t in ts) / n)


def measure(cfg: RunConfig, steps: int = 20) -> dict[str, dict[str, float]]:
    """Per kind: rms0 (weights at step 0), update (mean over steps of one step's RMS change),
    relative (update / rms0), and the weight decay and lr multiplier its optimizer group applies."""
    data = load_data(cfg.data, splits=("train",))
    model_cfg = resolve_vocab(cfg.model, cfg.data.tokenizer, data.vocab_size)
    torch.manual_seed(cfg.train.seed)
    model = GPT(model_cfg)
    opt = build_optimizer(model, cfg.optim, "cpu")
    T, B = model_cfg.block_size, cfg.train.batch_size
    tokens = data.splits["train"]
    n_windows = n_train_windows(tokens, T)
    total = n_windows // B * cfg.train.epochs
    order = epoch_order(n_windows, cfg.train.seed, 0)
    groups = attention_groups(model)
    settings = optimizer_settings(model, opt)
    rms0 = {k: _rms(v) for k, v in groups.items()}
    updates: dict[str, list[float]] = defaultdict(list)
    for step in range(min(steps, n_windows // B)):
        before = {k: [t.detach().clone() for t in v] for k, v in groups.items()}
        set_lr(opt, lr_at(step, total, cfg.optim.lr, cfg.optim.warmup_steps, cfg.optim.min_lr_ratio,
                         cfg.optim.schedule))
        x, y = train_batch(tokens, order[step * B:(step + 1) * B], T)
        loss = model(x, y)[1]
        loss.backward()
        apply_step(model, opt, cfg.optim.grad_clip)
        for k, v in groups.items():
            updates[k].append(_rms([a - b for a, b in zip(v, before[k])]))
    return {k: dict(rms0=rms0[k], update=sum(updates[k]) / len(updates[k]),
                    relative=sum(updates[k]) / len(updates[k]) / rms0[k], **settings[k]) for k in groups}
