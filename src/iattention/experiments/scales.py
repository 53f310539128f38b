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

from iattention.config import GPTConfig
from iattention.data.dataset import epoch_order, load_data, n_train_windows, train_batch
from iattention.model.gpt import GPT
from iattention.train.config import RunConfig
from iattention.train.optim import build_optimizer, is_matrix
from iattention.train.schedule import lr_at


def attention_groups(model: GPT) -> dict[str, list[torch.Tensor]]:
    """Attention matrices by kind, one tensor per layer; fused GEMMs are split into their maps.
    The tensors are detached views: they share storage with the parameters and follow their updates."""
    d = model.config.n_embd
    out: dict[str, list[torch.Tensor]] = defaultdict(list)
    for attn in model.attention_layers:
        for name, p in attn.named_parameters():
            if not is_matrix(name, p) or not p.numel():
                continue
            p = p.detach()
            if name == "c_attn.weight":
                for kind, part in zip(("W_Q", "W_K", "W_V"), p.split(d, dim=0)):
                    out[kind].append(part)
            elif name == "c_kv.weight":
                for kind, part in zip(("W_K", "W_V"), p.split(d, dim=0)):
                    out[kind].append(part)
            elif name == "c_qv.weight":
                for kind, part in zip(("W_Q", "W_V"), p.split(d, dim=0)):
                    out[kind].append(part)
            else:
                out["W_O" if name == "c_proj.weight" else name.removesuffix(".weight")].append(p)
    return dict(out)


def _rms(ts: list[torch.Tensor]) -> float:
    n = sum(t.numel() for t in ts)
    return math.sqrt(sum(float(t.detach().double().pow(2).sum()) for t in ts) / n)


def measure(cfg: RunConfig, steps: int = 20) -> dict[str, dict[str, float]]:
    """Per kind: rms0 (weights at step 0), update (mean over steps of one step's RMS change) and
    relative (update / rms0)."""
    data = load_data(cfg.data, splits=("train",))
    model_cfg: GPTConfig = cfg.model
    if model_cfg.vocab_size == 0:
        model_cfg = model_cfg.replace(vocab_size=data.vocab_size)
    torch.manual_seed(cfg.train.seed)
    model = GPT(model_cfg)
    opt = build_optimizer(model, cfg.optim, "cpu")
    T, B = model_cfg.block_size, cfg.train.batch_size
    tokens = data.splits["train"]
    n_windows = n_train_windows(tokens, T)
    total = n_windows // B * cfg.train.epochs
    order = epoch_order(n_windows, cfg.train.seed, 0)
    groups = attention_groups(model)
    rms0 = {k: _rms(v) for k, v in groups.items()}
    updates: dict[str, list[float]] = defaultdict(list)
    for step in range(min(steps, n_windows // B)):
        before = {k: [t.detach().clone() for t in v] for k, v in groups.items()}
        lr = lr_at(step, total, cfg.optim.lr, cfg.optim.warmup_steps, cfg.optim.min_lr_ratio)
        for g in opt.param_groups:
            g["lr"] = lr * g.get("lr_scale", 1.0)
        x, y = train_batch(tokens, order[step * B:(step + 1) * B], T)
        loss = model(x, y)[1]
        loss.backward()
        if cfg.optim.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        for k, v in groups.items():
            updates[k].append(_rms([a - b for a, b in zip(v, before[k])]))
    return {k: dict(rms0=rms0[k], update=sum(updates[k]) / len(updates[k]),
                    relative=sum(updates[k]) / len(updates[k]) / rms0[k]) for k in groups}
