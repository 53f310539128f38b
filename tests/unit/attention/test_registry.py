"""Unit tests of iattention.attention.registry."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest
import torch
from torch import nn

from helpers import make_model, max_rel, measured_projection_flops
from iattention import GPT, GPTConfig
from iattention.attention.base import CausalSelfAttention, column_blocks, row_blocks
from iattention.attention.heads import HeadWeights, eye_heads_in, eye_heads_out, heads_to_fused
from iattention.attention.identity_ko import IdentityKOAttention
from iattention.attention.identity_q import IdentityQAttention
from iattention.attention.registry import ATTENTION_REGISTRY, variant_names
from iattention.attention.standard import StandardAttention
from iattention.errors import UserError
from iattention.symmetry import canonicalize, expand, fully_reduced_count, param_count, redundancy

ROOT = Path(__file__).resolve().parents[3]


SHAPE = dict(n_layer=2, n_embd=6, vocab_size=97, block_size=16)


# Options that only some variants accept; each is tried on every variant and kept where the config accepts it.
OPTIONS = [dict(canonical_halves="qk"), dict(canonical_halves="vo"), dict(minimal_bias=True)]


def contract_configs(name: str) -> list[GPTConfig]:
    """The shapes a variant is checked at: one head (r = d), several, no biases, and each option it accepts."""
    out = []
    for kw in [dict(n_head=1), dict(n_head=3), dict(n_head=2, bias=False)] + [dict(n_head=3, **o) for o in OPTIONS]:
        try:
            out.append(GPTConfig(**SHAPE, attention=name, **kw))
        except UserError:
            pass  # an option of another variant
    return out


def _model(cfg: GPTConfig) -> GPT:
    """A float64 model with every attention weight and bias random, so no term of the function is zero."""
    model = make_model(**{k: getattr(cfg, k) for k in ("n_layer", "n_head", "n_embd", "vocab_size", "block_size",
                                                       "bias", "attention", "canonical_halves", "minimal_bias")})
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".attn." in name and p.dim() < 2 or name.rsplit(".", 1)[-1].startswith("b_"):
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.3)
    return model


def _x() -> torch.Tensor:
    return torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(5))


def _fields(hw: HeadWeights) -> dict[str, torch.Tensor | None]:
    return {f.name: getattr(hw, f.name) for f in fields(hw)}


def _products(hw: HeadWeights) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-head quantities the function depends on: W_Q W_K^T and W_V W_O, each (H, d, d)."""
    return hw.W_Q @ hw.W_K.mT, hw.W_V @ hw.W_O


def _forward_heads(layer) -> HeadWeights:
    """The layer's math form read off its forward path (qkv and project_out on the unit vectors), without
    asking its to_heads: q = x W_Q + b_Q etc., per head."""
    d, H = layer.n_embd, layer.n_head
    with torch.no_grad():
        eye, zero = torch.eye(d, dtype=torch.float64)[None], torch.zeros(1, 1, d, dtype=torch.float64)
        maps = [(a - b)[0] for a, b in zip(layer.qkv(eye), layer.qkv(zero))]
        biases = [b[0, 0] for b in layer.qkv(zero)]
        b_O = layer.project_out(zero)[0, 0]
        W_O = layer.project_out(eye)[0] - b_O
    split_in = [W.reshape(d, H, -1).transpose(0, 1) for W in maps]  # (H, d, r)
    return HeadWeights(*split_in, W_O.reshape(H, -1, d), *(b.reshape(H, -1) for b in biases), b_O)


def _math_jacobian(layer) -> tuple[torch.Tensor, dict[str, slice]]:
    """d(to_heads, flattened) / d(learned parameters): (math-form entries, parameters), and which rows hold
    which HeadWeights field."""
    params = {n: p.detach() for n, p in layer.named_parameters()}

    class Wrapper(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = layer

        def forward(self):
            hw = self.m.to_heads()
            return torch.cat([t.reshape(-1) for t in _fields(hw).values() if t is not None])

    def flat(ps):
        return torch.func.functional_call(Wrapper(), {f"m.{n}": p for n, p in ps.items()}, ())

    jac = torch.func.jacrev(flat)(params)
    J = torch.cat([jac[n].reshape(jac[n].shape[0], -1) for n in params], dim=1)
    rows, start = {}, 0
    for name, t in _fields(layer.to_heads()).items():
        n = 0 if t is None else t.numel()
        rows[name] = slice(start, start + n)
        start += n
    return J, rows


def _layer(cfg: GPTConfig):
    torch.manual_seed(3)
    return ATTENTION_REGISTRY[cfg.attention](cfg).double()


# ------------------------------------------------------------------------------------------ the checks
def check_load_heads_round_trip(cfg: GPTConfig) -> None:
    """load_heads(to_heads()) into a freshly built layer gives back every parameter and buffer exactly."""
    for src in _model(cfg).attention_layers:
        dst = _layer(cfg)
        dst.load_heads(src.to_heads())
        for (name, a), b in zip(src.state_dict().items(), dst.state_dict().values()):
            assert torch.equal(a, b), f"{cfg.attention}: {name} differs after load_heads(to_heads())"


def check_to_heads_is_the_forward(cfg: GPTConfig) -> None:
    """to_heads describes what qkv and project_out compute (heads.py's math form), weights and biases."""
    for layer in _model(cfg).attention_layers:
        seen, said = _fields(_forward_heads(layer)), _fields(layer.to_heads())
        for name, t in said.items():
            if t is None:
                assert seen[name].abs().max() == 0, f"{cfg.attention}: to_heads has no {name}, the forward has one"
            else:
                assert torch.allclose(t, seen[name], rtol=1e-12, atol=1e-12), \
                    f"{cfg.attention}: to_heads' {name} is not what the forward pass computes"


def _same_function(cfg: GPTConfig, model: GPT, moved: GPT, what: str, tol: float) -> None:
    x = _x()
    with torch.no_grad():
        rel = max_rel(moved(x)[0], model(x)[0])
    assert rel <= tol, f"{cfg.attention}: {what} changes the logits (max rel. error {rel:.3g})"
    for a, b in zip(model.attention_layers, moved.attention_layers):
        for mine, theirs, which in zip(_products(_forward_heads(a)), _products(b.to_heads()), ("W_Q W_K^T", "W_V W_O")):
            err = max_rel(theirs, mine)
            assert err <= tol, f"{cfg.attention}: {what} changes the per-head {which} (max rel. error {err:.3g})"


def check_expand_is_exact(cfg: GPTConfig) -> None:
    model = _model(cfg)
    std = expand(model)
    assert std.config.attention == "standard"
    _same_function(cfg, model, std, "expand", 1e-12)


def check_canonicalize_is_exact(cfg: GPTConfig) -> None:
    """Every full-class variant canonicalizes exactly (pivoted blocks; minimal biases too where it has any)."""
    if not ATTENTION_REGISTRY[cfg.attention].full_class:
        return
    model = _model(cfg)
    for minimal in (False, True) if cfg.bias else (False,):
        canon = canonicalize(model, block="pivoted", minimal=minimal)
        _same_function(cfg, model, canon, f"canonicalize(minimal={minimal})", 1e-10)


def check_matched_init(cfg: GPTConfig) -> None:
    """A full-class variant built with init=matched computes what standard GPT-2 built from the same seed does."""
    if not ATTENTION_REGISTRY[cfg.attention].full_class:
        return
    torch.manual_seed(7)
    std = GPT(cfg.replace(attention="standard", canonical_halves="both", minimal_bias=False))
    torch.manual_seed(7)
    matched = GPT(cfg.replace(init="matched"))
    with torch.no_grad():
        err = max_rel(matched(_x())[0], std(_x())[0])
    assert err <= 1e-4, f"{cfg.attention}: init=matched is not the standard start (max rel. error {err:.3g})"


def check_head_blocks(cfg: GPTConfig) -> None:
    """head_blocks names every learned matrix, splits it into non-empty 2-D blocks (none past its end) that cover
    each entry once, and each block feeds exactly one head (so Muon gives every head its own block)."""
    layer = _layer(cfg)
    try:
        blocks = layer.head_blocks()
    except NotImplementedError as e:
        raise AssertionError(f"{cfg.attention}: head_blocks is not stated: {e}") from e
    def maps():
        with torch.no_grad():
            hw = layer.to_heads()
            return [getattr(hw, W).clone() for W in ("W_Q", "W_K", "W_V", "W_O")]

    before = maps()
    for name, p in layer.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if p.dim() < 2 or leaf == "bias" or leaf.startswith("b_"):
            continue
        assert name in blocks, f"{cfg.attention}: head_blocks does not name the learned matrix {name}"
        idxs = blocks[name]
        seen = torch.zeros(p.shape, dtype=torch.long)
        for idx in idxs:
            assert p[idx].dim() == 2, f"{cfg.attention}: a block of {name} is not 2-D"
            # an index past the end of an axis selects nothing (slices clip): such a block is no head's
            assert p[idx].numel() or not p.numel(), f"{cfg.attention}: a block of {name} {tuple(p.shape)} is empty"
            seen[idx] += 1
        assert bool((seen == 1).all()), f"{cfg.attention}: the blocks of {name} do not cover each entry once"
        for idx in idxs:
            if not p[idx].numel():
                continue
            with torch.no_grad():
                keep = p[idx].clone()
                p[idx] += 1.0
            moved = maps()
            with torch.no_grad():
                p[idx] = keep
            heads = {h for a, b in zip(moved, before) for h in range(cfg.n_head) if not torch.equal(a[h], b[h])}
            assert len(heads) == 1, f"{cfg.attention}: a head_blocks block of {name} feeds heads {sorted(heads)}"


def check_removed_params(cfg: GPTConfig) -> None:
    """removed_params equals standard's learned count minus the variant's, both measured as the rank of the
    map from a built layer's parameters to its math form; and that rank is the number of stored parameters
    (none is dead or stored twice)."""
    layer = _layer(cfg)
    J, _ = _math_jacobian(layer)
    rank = int(torch.linalg.matrix_rank(J))
    n_stored = sum(p.numel() for p in layer.parameters())
    assert rank == n_stored, f"{cfg.attention}: {n_stored} stored parameters, but to_heads sees only {rank}"
    std_cfg = cfg.replace(attention="standard", canonical_halves="both", minimal_bias=False)
    std_rank = int(torch.linalg.matrix_rank(_math_jacobian(_layer(std_cfg))[0]))
    measured = cfg.n_layer * (std_rank - rank)
    said = ATTENTION_REGISTRY[cfg.attention].removed_params(cfg)
    assert said == measured, f"{cfg.attention}: removed_params says {said}, the math form shows {measured}"
    assert redundancy(cfg) == said and param_count(cfg) == GPT(cfg).num_params()


def check_redundant_biases(cfg: GPTConfig) -> None:
    """redundant_biases names exactly the b_K and (with a learned b_O to fold into) the b_V that have parameters
    of their own (a b_K tied to b_Q has none: dropping it changes the scores), and fully_reduced_count drops
    exactly those parameters."""
    layer = _layer(cfg)
    J, rows = _math_jacobian(layer)
    rank = int(torch.linalg.matrix_rank(J))

    def own(name):
        """Parameter directions that reach the math form through this field only."""
        others = torch.ones(J.shape[0], dtype=torch.bool)
        others[rows[name]] = False
        return rank - int(torch.linalg.matrix_rank(J[others]))

    learned_b_O = rows["b_O"].stop > rows["b_O"].start and bool(J[rows["b_O"]].any())
    own_params = {"b_K": own("b_K"), "b_V": own("b_V") if learned_b_O else 0}
    expected = {name for name, n in own_params.items() if n}
    try:
        said = ATTENTION_REGISTRY[cfg.attention].redundant_biases(cfg)
    except NotImplementedError as e:
        raise AssertionError(f"{cfg.attention}: redundant_biases is not stated: {e}") from e
    assert set(said) == expected, f"{cfg.attention}: redundant_biases says {sorted(said)}, the math form shows " \
                                  f"{sorted(expected)}"
    reduced = GPT(cfg).num_params() - cfg.n_layer * sum(own_params.values())
    assert fully_reduced_count(cfg) == reduced, \
        f"{cfg.attention}: fully_reduced_count is {fully_reduced_count(cfg)}, the math form shows {reduced}"


def check_projection_flops(cfg: GPTConfig) -> None:
    """projection_flops (bench/flops.py's attention term) is what a built layer's projections execute."""
    said = ATTENTION_REGISTRY[cfg.attention].projection_flops(cfg)
    measured = measured_projection_flops(_layer(cfg))
    assert said == measured, f"{cfg.attention}: projection_flops says {said}, a forward pass runs {measured:g}"


CHECKS = [check_load_heads_round_trip, check_to_heads_is_the_forward, check_expand_is_exact,
          check_canonicalize_is_exact, check_matched_init, check_head_blocks, check_removed_params,
          check_redundant_biases, check_projection_flops]


def run_contract(name: str) -> None:
    for cfg in contract_configs(name):
        for check in CHECKS:
            check(cfg)


# ------------------------------------------------------------------- the checks can tell a broken variant
class DoubledV(StandardAttention):
    """Broken on purpose: its math form says 2 W_V, so expand, canonicalize and convert would be wrong."""
    variant = "doubled_v"

    def to_heads(self):
        hw = super().to_heads()
        hw.W_V = 2 * hw.W_V
        return hw


class StandardCopy(StandardAttention):
    """A correct fifth variant: standard under another name."""
    variant = "standard_copy"


class NoKeyBias(IdentityKOAttention):
    """A correct variant without a key bias (keys = x exactly): only b_V is redundant, so the fully reduced
    count differs from a count that assumes b_K and b_V in every variant."""
    variant = "identity_ko_no_b_k"

    def __init__(self, config):
        super().__init__(config)
        self.b_K = None

    @classmethod
    def redundant_biases(cls, config):
        return ("b_V",) if config.bias else ()

    @classmethod
    def removed_params(cls, config):
        return config.n_layer * (2 * config.n_embd**2 + (config.n_embd if config.bias else 0))

    def to_heads(self):
        hw = super().to_heads()  # its b_K, b_O are None here: the parent sets them only with a key bias
        if self.b_O is not None:
            hw.b_K, hw.b_O = torch.zeros_like(hw.b_Q), self.b_O
        return hw

    @torch.no_grad()
    def load_heads(self, hw):
        H, d = self.n_head, self.n_embd
        if not (torch.equal(hw.W_K, eye_heads_in(d, H, hw.W_K)) and torch.equal(hw.W_O, eye_heads_out(d, H, hw.W_O))) \
                or hw.b_K is not None and hw.b_K.any():
            raise UserError("identity_ko_no_b_k attention holds only W_K = W_O = I and no key bias")
        heads_to_fused(self.c_qv, hw, "QV")
        if self.b_O is not None:
            self.b_O.copy_(hw.b_O)


# ----------------------------------------------------------------------- prose lists name every variant
PROSE = ["README.md", "docs/training.md", "docs/architecture.md", "docs/errors.md"]


def unnamed_variants() -> dict[str, list[str]]:
    """{file: the registered variants it does not name}, for the files that list the variants in prose."""
    out = {}
    for rel in PROSE:
        text = (ROOT / rel).read_text()
        missing = [v for v in variant_names() if not re.search(rf"(?<![\w-]){re.escape(v)}(?![\w-])", text)]
        if missing:
            out[rel] = missing
    return out


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
@pytest.mark.parametrize("name", variant_names())
def test_contract(name, check):
    configs = contract_configs(name)
    assert configs, f"{name}: no config of the contract's shapes is accepted"
    for cfg in configs:
        check(cfg)


def test_the_contract_catches_a_variant_whose_to_heads_doubles_w_v(monkeypatch):
    monkeypatch.setitem(ATTENTION_REGISTRY, DoubledV.variant, DoubledV)
    cfg = GPTConfig(**SHAPE, n_head=3, attention=DoubledV.variant)
    for check in (check_load_heads_round_trip, check_to_heads_is_the_forward, check_expand_is_exact,
                  check_canonicalize_is_exact):
        with pytest.raises(AssertionError, match="doubled_v"):
            check(cfg)
    with pytest.raises(AssertionError):
        run_contract(DoubledV.variant)


@pytest.mark.parametrize("cls", [StandardCopy, NoKeyBias], ids=lambda c: c.variant)
def test_a_correct_extra_variant_passes_the_contract(monkeypatch, cls):
    monkeypatch.setitem(ATTENTION_REGISTRY, cls.variant, cls)
    assert cls.variant in variant_names()
    run_contract(cls.variant)


def test_the_architecture_tests_toy_variant_keeps_the_contract(monkeypatch):
    """tests/test_architecture.py's toy (W_K = W_Q, b_K = b_Q): its tied b_K is not redundant, only b_V."""
    from test_architecture import _toy_class

    monkeypatch.setitem(ATTENTION_REGISTRY, "toy", _toy_class())
    run_contract("toy")


def test_a_variant_must_state_its_redundant_biases_and_its_fused_heads(monkeypatch):
    """A variant written from docs/architecture.md's list alone: without redundant_biases the counts refuse,
    and with a fused matrix but no head_blocks Muon's block split refuses (no silent one-block matrix)."""

    class Fused(StandardAttention):
        variant = "fused_no_blocks"
        head_blocks = CausalSelfAttention.head_blocks  # the base class's default
        redundant_biases = CausalSelfAttention.__dict__["redundant_biases"]

    monkeypatch.setitem(ATTENTION_REGISTRY, Fused.variant, Fused)
    cfg = GPTConfig(**SHAPE, n_head=3, attention=Fused.variant)
    with pytest.raises(NotImplementedError, match="redundant_biases"):
        fully_reduced_count(cfg)
    with pytest.raises(AssertionError, match="redundant_biases|head_blocks"):
        check_redundant_biases(cfg)
    with pytest.raises(AssertionError, match="head_blocks is not stated"):
        check_head_blocks(cfg)


def test_prose_lists_name_every_registered_variant(monkeypatch):
    assert unnamed_variants() == {}
    # and the check can fail: a sixth variant is named nowhere yet
    monkeypatch.setitem(ATTENTION_REGISTRY, StandardCopy.variant, StandardCopy)
    assert unnamed_variants() == {rel: [StandardCopy.variant] for rel in PROSE}


class KVPlusOneBlocks(IdentityQAttention):
    """Broken on purpose: identity_q's fused K,V matrix split as if it held three projections (the third's
    blocks past its end), and standard's FLOP count for a layer without a query GEMM."""
    variant = "kv_plus_one_blocks"

    def head_blocks(self):
        d, r, H = self.n_embd, self.d_head, self.n_head
        return {"c_kv.weight": row_blocks(3, d, r, H), "c_proj.weight": column_blocks(r, H)}

    @classmethod
    def projection_flops(cls, config):
        return 8 * config.n_embd**2


def test_the_contract_catches_blocks_past_the_end_and_a_wrong_flop_count(monkeypatch):
    monkeypatch.setitem(ATTENTION_REGISTRY, KVPlusOneBlocks.variant, KVPlusOneBlocks)
    cfg = GPTConfig(**SHAPE, n_head=3, attention=KVPlusOneBlocks.variant)
    with pytest.raises(AssertionError) as err:
        check_head_blocks(cfg)
    assert str(err.value).splitlines()[0] == "kv_plus_one_blocks: a block of c_kv.weight (12, 6) is empty"
    with pytest.raises(AssertionError) as err:
        check_projection_flops(cfg)
    assert str(err.value).splitlines()[0] == "kv_plus_one_blocks: projection_flops says 288, a forward pass runs 216"


@pytest.mark.parametrize("name", ["standard", "canonical"])
@pytest.mark.parametrize("shape", [dict(n_head=4, n_kv_head=2), dict(n_head=4, n_kv_head=1, d_head=8, rot=4),
                                   dict(n_head=6, n_kv_head=6)])
def test_a_llama_family_variant_s_projection_flops_are_what_its_layer_runs(name, shape):
    """The Llama family's registry (GROUPED_REGISTRY) states projection_flops as GPT's does: Q and O over all
    query heads, K and V over the key/value heads, whatever the head width."""
    from iattention.attention.registry import GROUPED_REGISTRY
    from iattention.config.llama import LlamaConfig

    cfg = LlamaConfig(n_embd=48, **shape)
    layer = GROUPED_REGISTRY[name](cfg).double()
    said = GROUPED_REGISTRY[name].projection_flops(cfg)
    x = torch.randn(1, 5, cfg.n_embd, dtype=torch.float64)
    y = torch.randn(1, 5, cfg.n_head * cfg.d_head, dtype=torch.float64)
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        layer.qkv(x)
        layer.project_out(y)
    assert said == counter.get_total_flops() / 5, f"{name} {shape}: projection_flops says {said}"
