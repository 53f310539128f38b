"""AdamW with weight decay on weight matrices only (GPT-2 / nanoGPT convention), plus two study knobs.

- `decay_attention=False`: the attention matrices get no weight decay. AdamW's decay is an L2
  pull on the *stored* matrices, so it regularises different functions of the weights in each
  parameterization: standard decays ||W_Q||^2 + ||W_K||^2, canonical at one head decays the score
  matrix W_Q W_K^T = W_Q itself. Turning it off on attention removes that difference.
- `attn_lr_by_init_rms=True`: each attention matrix gets lr * RMS(matrix at step 0) / 0.02. Adam
  moves every entry by about lr per step whatever its scale, so after an exact canonicalization
  (W_Q -> W_Q B^T, free rows of W_K -> W_K B^{-1}: RMS from ~0.002 to ~0.3) the relative step of
  each group changes by orders of magnitude; this gives each group the relative step size that a
  GPT-2-initialised (RMS 0.02) matrix gets.
- `name=muon`: `torch.optim.Muon` (momentum, Newton-Schulz orthogonalised update, lr matched to
  AdamW's update RMS) on the hidden matrices, AdamW on embeddings, biases and LayerNorms, as
  modded-nanogpt splits them. Muon takes 2-D matrices; attention is split into its per-head blocks
  (`CausalSelfAttention.head_blocks`) so that every variant's heads get the same update rule: standard's
  fused c_attn gives each head's W_Q, W_K, W_V block, canonical's (H, d, r) tensors one block per head.
  Each block is a view of its parameter (a leaf with no autograd), so Muon's in-place step writes the
  parameter; its gradient is the same view of the parameter's gradient, bound before every step.
"""

from __future__ import annotations

import torch

from iattention.attention.base import CausalSelfAttention
from iattention.config import OptimConfig

GPT2_INIT_STD = 0.02


def is_matrix(name: str, p: torch.Tensor) -> bool:
    """A weight matrix (decayed), as opposed to a bias or a LayerNorm gain. Canonical attention keeps
    its per-head biases b_Q, b_K, b_V as (H, r) tensors, so the number of dimensions alone would
    wrongly decay them (standard's fused biases are 1-d)."""
    leaf = name.rsplit(".", 1)[-1]
    return p.dim() >= 2 and leaf != "bias" and not leaf.startswith("b_")


def param_groups(model: torch.nn.Module, cfg: OptimConfig) -> list[dict]:
    """Groups keyed by (weight decay, lr scale); the trainer multiplies the scheduled lr by `lr_scale`."""
    groups: dict[tuple[float, float], list] = {}
    # an attention layer's parameters (every family's `attn`; found by class, not by name)
    in_attention = {id(p) for m in model.modules() if isinstance(m, CausalSelfAttention) for p in m.parameters()}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        matrix = is_matrix(name, p)
        attention_matrix = matrix and id(p) in in_attention
        decay = matrix and (cfg.decay_attention or not attention_matrix)
        scale = 1.0
        if cfg.attn_lr_by_init_rms and attention_matrix and p.numel():
            scale = float(p.detach().float().pow(2).mean().sqrt()) / GPT2_INIT_STD
        groups.setdefault((cfg.weight_decay if decay else 0.0, scale), []).append(p)
    return [{"params": ps, "weight_decay": wd, "lr_scale": scale} for (wd, scale), ps in groups.items()]


def _muon_blocks(model: torch.nn.Module) -> dict[torch.nn.Parameter, tuple[list[tuple], bool]]:
    """The matrices Muon updates: {parameter: (its 2-D block indices, whether it is an attention matrix)}.
    Every attention matrix is split per head, every MLP matrix into the maps it holds (one, or a fused gate_up's
    gate and up: SwiGLU.matrix_blocks); embeddings and the LM head stay with AdamW."""
    blocks: dict[torch.nn.Parameter, tuple[list[tuple], bool]] = {}
    for mod_name, module in model.named_modules():
        attention = isinstance(module, CausalSelfAttention)
        if not (attention or mod_name.endswith(".mlp")):
            continue
        split = module.head_blocks() if attention else module.matrix_blocks()  # a fused gate_up: its two maps
        for name, p in module.named_parameters():
            if p.requires_grad and is_matrix(name, p):
                idxs = split.get(name, [()])
                if {p[i].dim() for i in idxs} != {2}:
                    raise ValueError(f"Muon needs 2-D blocks; {mod_name}.{name} {tuple(p.shape)} does not split "
                                     "into them (override head_blocks)")
                blocks[p] = (idxs, attention)
    return blocks


class MuonWithAdamW:
    """Muon on the hidden matrices' 2-D blocks, AdamW on the rest; one optimizer to the trainer (param_groups
    for the schedule, step, zero_grad, and a state_dict in torch's format for checkpoints: AdamW's
    parameters first, then Muon's blocks)."""

    def __init__(self, model: torch.nn.Module, cfg: OptimConfig, device_type: str):
        blocks = _muon_blocks(model)
        groups = param_groups(model, cfg)
        scale = {id(p): g["lr_scale"] for g in groups for p in g["params"]}
        self.sources, self.views, muon_groups = [], [], {}
        for p, (idxs, attention) in blocks.items():
            wd = cfg.weight_decay if (cfg.decay_attention or not attention) else 0.0
            for idx in idxs:
                view = p.detach()[idx]
                if view.numel():  # canonical's W_K_free at one head is (1, 0, d): nothing to learn
                    self.sources.append((p, idx))
                    self.views.append(view)
                    muon_groups.setdefault((wd, scale[id(p)]), []).append(view)
        rest = [dict(g, params=[p for p in g["params"] if p not in blocks]) for g in groups]
        extra = {"fused": True} if device_type == "cuda" else {}
        self.adamw = torch.optim.AdamW([g for g in rest if g["params"]], lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                                       **extra)
        self.muon = torch.optim.Muon([{"params": ps, "weight_decay": wd, "lr_scale": s}
                                      for (wd, s), ps in muon_groups.items()],
                                     lr=cfg.lr, adjust_lr_fn="match_rms_adamw")
        self.muon_params = list(blocks)

    @property
    def param_groups(self) -> list[dict]:
        return self.adamw.param_groups + self.muon.param_groups

    def step(self) -> None:
        for (p, idx), view in zip(self.sources, self.views):
            view.grad = None if p.grad is None else p.grad[idx]
        self.adamw.step()
        self.muon.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.adamw.zero_grad(set_to_none)
        for p in self.muon_params:
            p.grad = None
        for view in self.views:
            view.grad = None

    def state_dict(self) -> dict:
        a, m = self.adamw.state_dict(), self.muon.state_dict()
        n = sum(len(g["params"]) for g in a["param_groups"])
        return {"state": a["state"] | {n + i: v for i, v in m["state"].items()},
                "param_groups": a["param_groups"] + [dict(g, params=[n + i for i in g["params"]])
                                                     for g in m["param_groups"]]}

    def load_state_dict(self, sd: dict) -> None:
        k = len(self.adamw.param_groups)
        n = sum(len(g["params"]) for g in self.adamw.param_groups)
        groups = sd["param_groups"]
        self.adamw.load_state_dict({"state": {i: v for i, v in sd["state"].items() if int(i) < n},
                                    "param_groups": groups[:k]})
        self.muon.load_state_dict({"state": {int(i) - n: v for i, v in sd["state"].items() if int(i) >= n},
                                   "param_groups": [dict(g, params=[i - n for i in g["params"]]) for g in groups[k:]]})


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig, device_type: str):
    """AdamW (`optim.name=adamw`) or Muon with AdamW (`optim.name=muon`)."""
    if cfg.name == "muon":
        return MuonWithAdamW(model, cfg, device_type)
    extra = {"fused": True} if device_type == "cuda" else {}
    return torch.optim.AdamW(param_groups(model, cfg), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), **extra)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """The scheduled rate on every group, times the group's `lr_scale`."""
    for g in optimizer.param_groups:
        g["lr"] = lr * g.get("lr_scale", 1.0)


def apply_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, grad_clip: float) -> float:
    """Clip the gradient norm (grad_clip 0: off), step, drop the gradients: the one training-step tail.
    Returns the gradient's total 2-norm before clipping (logged per step)."""
    if grad_clip > 0:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(norm)
