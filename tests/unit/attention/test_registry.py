"""Unit tests of iattention.attention.registry: every registered variant against one contract, on every family
(GPT-2 shapes and Llama-family shapes: MHA, GQA, MQA, partial rotary, the interleaved layout, biases), and each
shape a variant cannot take refused in one line."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest
import torch
from torch import nn

from helpers import make_llama, make_model, max_rel, measured_projection_flops, tells
from iattention import GPT, GPTConfig
from iattention.attention.base import CausalSelfAttention, column_blocks, row_blocks
from iattention.attention.heads import HeadWeights, eye_heads_in, eye_heads_out, heads_to_fused
from iattention.attention.identity_ko import IdentityKOAttention
from iattention.attention.identity_q import IdentityQAttention
from iattention.attention.registry import ATTENTION_REGISTRY, attention_class, variant_names
from iattention.attention.rope import pair_dims
from iattention.attention.standard import StandardAttention
from iattention.config.families import FAMILIES as RECORDS
from iattention.config.families import LLAMA_DEFAULTS
from iattention.errors import UserError
from iattention.symmetry import canonicalize, expand, fully_reduced_count, param_count, redundancy
from iattention.symmetry.counts import removed_split

ROOT = Path(__file__).resolve().parents[3]

FAMILIES = ("gpt2", "llama", "qk_norm")
GPT2_SHAPE = dict(n_layer=2, n_embd=6, vocab_size=97, block_size=16)
LLAMA_SHAPE = dict(family="llama", n_layer=2, n_embd=8, mlp_hidden=16, vocab_size=97, block_size=16)
# Each family's shapes. GPT-2: one head (r = d), several, no biases. Llama: MHA, GQA, MQA, head width != n_embd /
# n_head, partial rotary, the interleaved layout, a tied head; q/k/v biases without (Qwen2) and with (Llama's
# attention_bias) an output bias, and an output bias alone.
SHAPES = {
    "gpt2": {"one-head": dict(n_head=1), "three-heads": dict(n_head=3), "no-bias": dict(n_head=2, bias=False)},
    "llama": {
        "mha": dict(n_head=2, n_kv_head=2),
        "gqa-qkv-bias": dict(n_head=4, n_kv_head=2, qkv_bias=True),
        "mqa-attention-bias": dict(n_head=4, n_kv_head=1, qkv_bias=True, o_bias=True),
        "wide-heads-tied": dict(n_head=4, n_kv_head=2, d_head=6, qkv_bias=True, o_bias=True, tie_embeddings=True),
        "partial-rotary": dict(n_head=4, n_kv_head=2, d_head=6, rot=2, qkv_bias=True, o_bias=True),
        "interleaved": dict(n_head=2, n_kv_head=1, d_head=6, rot=4, rope_layout="interleaved", qkv_bias=True),
        "o-bias-only": dict(n_head=2, n_kv_head=1, o_bias=True),
    },
    # a query/key norm (GPTConfig.qk_norm) over each head ("head": Qwen3's) or the whole projection ("whole":
    # OLMo 2's), in test-only records (`qk_norm_records`): GQA, MHA with partial rotary and biases, one head without
    # RoPE (r = d: canonical's index-copy output)
    "qk_norm": {
        "head-gqa": dict(family="qk_head_test", n_head=4, n_kv_head=2),
        "head-partial-rotary-biases": dict(family="qk_head_test", n_head=2, n_kv_head=2, d_head=6, rot=2,
                                           qkv_bias=True, o_bias=True),
        "whole-gqa-qkv-bias": dict(family="qk_whole_test", n_head=4, n_kv_head=2, qkv_bias=True),
        "whole-one-head-no-rope": dict(family="qk_whole_test", n_head=1, n_kv_head=1, rot=0),
    },
}
# Options that only some variants accept, each tried on one shape of each family: (family, shape, option)
OPTIONS = [("gpt2", "three-heads", dict(canonical_halves="qk")), ("gpt2", "three-heads", dict(canonical_halves="vo")),
           ("gpt2", "three-heads", dict(minimal_bias=True)),
           ("llama", "partial-rotary", dict(canonical_halves="qk")), ("llama", "partial-rotary",
                                                                       dict(canonical_halves="vo")),
           ("llama", "partial-rotary", dict(minimal_bias=True)),
           ("llama", "mqa-attention-bias", dict(minimal_bias=True)),
           ("qk_norm", "head-partial-rotary-biases", dict(canonical_halves="qk")),
           ("qk_norm", "whole-gqa-qkv-bias", dict(canonical_halves="vo"))]


@pytest.fixture(autouse=True)
def qk_norm_records(monkeypatch):
    """Two records like the Llama family's, one with each query/key norm (no family is needed for the contract)."""
    for kind in ("head", "whole"):
        monkeypatch.setitem(RECORDS, f"qk_{kind}_test", __import__("dataclasses").replace(
            RECORDS["llama"], name=f"qk_{kind}_test", defaults={**LLAMA_DEFAULTS, "qk_norm": kind}))


def family_shapes(family: str) -> list[dict]:
    """Every config (keys) a variant of `family` is tried at: the family's shapes, then its options."""
    base = GPT2_SHAPE if family == "gpt2" else LLAMA_SHAPE
    return [{**base, **kw} for kw in SHAPES[family].values()] + \
        [{**base, **SHAPES[f][shape], **o} for f, shape, o in OPTIONS if f == family]


def contract_configs(name: str, family: str = "gpt2") -> list[GPTConfig]:
    """The configs of `family` that variant `name` accepts (test_unsupported_shapes_are_refused_in_one_line checks
    that the others are refused, and why)."""
    out = []
    for kw in family_shapes(family):
        try:
            out.append(GPTConfig(**kw, attention=name))
        except UserError:
            pass  # a shape the variant cannot take, or an option of another variant
    return out


def expected_refusal(name: str, kw: dict) -> tuple[str, ...]:
    """What a built-in variant's refusal of config keys `kw` must say (empty: it must accept them): written here
    from the variants' definitions, not read from their `unsupported`."""
    H = kw["n_head"]
    G, r = kw.get("n_kv_head") or H, kw.get("d_head") or kw["n_embd"] // H
    if name in ("identity_q", "identity_ko") and kw.get("family", "").startswith("qk_"):  # a W_Q or W_K fixed whole
        return f"attention={name}", "query/key norm", "use standard or canonical"
    if name in ("identity_q", "identity_ko") and not (G == H and H * r == kw["n_embd"]):
        # queries (identity_q) or keys and outputs (identity_ko) are the input split into heads
        return f"attention={name}", "key/value heads", "use standard or canonical"
    if name != "canonical" and kw.get("canonical_halves", "both") != "both":
        return f"attention={name}", "only applies to attention=canonical"
    if name != "canonical" and kw.get("minimal_bias"):
        return "minimal_bias", "attention=canonical"
    return ()


def _build(cfg):
    """A model of `cfg`, as the library builds it (one class for every family)."""
    return GPT(cfg)


def _standard_of(cfg):
    """The standard-attention config of the same shape."""
    return cfg.replace(attention="standard", canonical_halves="both", minimal_bias=False)


def _model(cfg):
    """A float64 model with every attention weight and bias random, so no term of the function is zero (a
    Llama-family one: every weight, bias and norm gain random, helpers.make_llama)."""
    if cfg.family != "gpt2":
        return make_llama(**cfg.to_dict())
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


def _products(hw: HeadWeights, cfg) -> dict[str, torch.Tensor]:
    """The per-head quantities the function depends on, each (H, ...), per query head h and its group's key/value
    head: on each rotary pair k the complex outer product Q_k K_k^H of the pair's columns (first_k + i second_k; a
    complex scalar gauge z multiplies Q_k by z and K_k by 1 / conj(z)), W_Q W_K^T on the pass dims (every dim
    without RoPE), and W_V W_O."""
    W_K, W_V, rot = hw.per_query_head("W_K"), hw.per_query_head("W_V"), cfg.rot  # (H, d, r)
    first, second = pair_dims(rot, cfg.rope_layout)
    Q, K = (torch.complex(W[:, :, first], W[:, :, second]) for W in (hw.W_Q, W_K))  # (H, d, rot/2)
    out = {"rotary Q_k K_k^H": torch.einsum("hak,hbk->hkab", Q, K.conj()),
           "pass W_Q W_K^T": hw.W_Q[:, :, rot:] @ W_K[:, :, rot:].mT, "W_V W_O": W_V @ hw.W_O}
    return {k: v for k, v in out.items() if (k != "pass W_Q W_K^T" or rot < hw.W_Q.shape[-1])
            and (k != "rotary Q_k K_k^H" or rot)}


def _forward_heads(layer) -> HeadWeights:
    """The layer's math form read off its forward path (qkv and project_out on the unit vectors), without
    asking its to_heads: q = x W_Q + b_Q etc., per head (H query heads, G key/value heads; project_out reads the
    H r merged head outputs)."""
    d, r = layer.n_embd, layer.d_head
    width = layer.n_head * r  # merged heads
    with torch.no_grad():
        eye, zero = torch.eye(d, dtype=torch.float64)[None], torch.zeros(1, 1, d, dtype=torch.float64)
        maps = [(a - b)[0] for a, b in zip(layer.qkv(eye), layer.qkv(zero))]
        biases = [b[0, 0] for b in layer.qkv(zero)]
        b_O = layer.project_out(torch.zeros(1, 1, width, dtype=torch.float64))[0, 0]
        W_O = layer.project_out(torch.eye(width, dtype=torch.float64)[None])[0] - b_O  # (H r, d)
    split_in = [W.reshape(d, -1, r).transpose(0, 1) for W in maps]  # (H or G, d, r)
    # a query/key norm's gains: what the forward's norms multiply by (rows of r: one shared, or one per head)
    gains = {f"g_{n}": getattr(layer, f"{n.lower()}_norm").gain().detach().reshape(-1, r) for n in "QK"} \
        if layer.qk_norm else {}
    return HeadWeights(*split_in, W_O.reshape(-1, r, d), *(b.reshape(-1, r) for b in biases), b_O, **gains)


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


def _layer(cfg):
    torch.manual_seed(3)
    return attention_class(cfg)(cfg).double()


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
                assert seen[name] is None or seen[name].abs().max() == 0, \
                    f"{cfg.attention}: to_heads has no {name}, the forward has one"
            else:
                assert torch.allclose(t, seen[name], rtol=1e-12, atol=1e-12), \
                    f"{cfg.attention}: to_heads' {name} is not what the forward pass computes"


def _same_function(cfg, model, moved, what: str, tol: float) -> None:
    x = _x()
    with torch.no_grad():
        rel = max_rel(moved(x)[0], model(x)[0])
    assert rel <= tol, f"{cfg.attention}: {what} changes the logits (max rel. error {rel:.3g})"
    for a, b in zip(model.attention_layers, moved.attention_layers):
        theirs = _products(b.to_heads(), cfg)
        for which, mine in _products(_forward_heads(a), cfg).items():
            err = max_rel(theirs[which], mine)
            assert err <= tol, f"{cfg.attention}: {what} changes the per-head {which} (max rel. error {err:.3g})"


def check_expand_is_exact(cfg) -> None:
    model = _model(cfg)
    std = expand(model)
    assert std.config.attention == "standard"
    _same_function(cfg, model, std, "expand", 1e-12)


def check_canonicalize_is_exact(cfg) -> None:
    """Every full-class variant canonicalizes exactly (pivoted blocks; minimal biases too where it has any)."""
    if not attention_class(cfg).full_class:
        return
    model = _model(cfg)
    # minimal biases: b_V folded away and b_K dropped on the pass dims (on a rotary one it matters), where both are
    # learned
    for minimal in (False, True) if cfg.qkv_bias and cfg.o_bias else (False,):
        canon = canonicalize(model, block="pivoted", minimal=minimal)
        _same_function(cfg, model, canon, f"canonicalize(minimal={minimal})", 1e-10)


def check_matched_init(cfg: GPTConfig) -> None:
    """A full-class variant built with init=matched computes what a standard model of its family built from the same
    seed does."""
    if not ATTENTION_REGISTRY[cfg.attention].full_class:
        return
    torch.manual_seed(7)
    std = GPT(cfg.replace(attention="standard", canonical_halves="both", minimal_bias=False))
    torch.manual_seed(7)
    matched = GPT(cfg.replace(init="matched"))
    with torch.no_grad():
        err = max_rel(matched(_x())[0], std(_x())[0])
    assert err <= 1e-4, f"{cfg.attention}: init=matched is not the standard start (max rel. error {err:.3g})"


def _feeds_one_head(cfg, fed: set[tuple[str, int]]) -> bool:
    """Whether a block that moves these (math-form map, head) pairs is one head's: one map of one head (a query
    head's W_Q or W_O, a key/value head's W_K or W_V); with as many key/value heads as query heads (GPT-2, MHA)
    any maps of one head; and a variant that removes parameters (canonical fixes r columns of each group's
    r x (g d) output map) may give W_O one block per group, feeding that group's query heads only."""
    if not fed:
        return False
    maps, heads = {W for W, _ in fed}, {h for _, h in fed}
    if len(heads) == 1 and (len(maps) == 1 or cfg.n_kv_head == cfg.n_head):
        return True
    one_group = len({h // cfg.group for h in heads}) == 1
    return maps == {"W_O"} and attention_class(cfg).removed_params(cfg) > 0 and one_group



def check_head_blocks(cfg) -> None:
    """head_blocks names every learned matrix, splits it into non-empty 2-D blocks (none past its end) that cover
    each entry once, and each block feeds exactly one head (so Muon gives every head its own block; see
    _feeds_one_head)."""
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
            fed = {(W, h) for W, a, b in zip(("W_Q", "W_K", "W_V", "W_O"), moved, before) for h in range(len(a))
                   if not torch.equal(a[h], b[h])}
            assert _feeds_one_head(cfg, fed), \
                f"{cfg.attention}: a head_blocks block of {name} feeds heads {sorted(h for _, h in fed)} ({fed})"


def check_removed_params(cfg) -> None:
    """removed_params equals standard's learned count minus the variant's, both measured as the rank of the
    map from a built layer's parameters to its math form; and that rank is the number of stored parameters
    (none is dead or stored twice)."""
    layer = _layer(cfg)
    J, _ = _math_jacobian(layer)
    rank = int(torch.linalg.matrix_rank(J))
    n_stored = sum(p.numel() for p in layer.parameters())
    assert rank == n_stored, f"{cfg.attention}: {n_stored} stored parameters, but to_heads sees only {rank}"
    std_rank = int(torch.linalg.matrix_rank(_math_jacobian(_layer(_standard_of(cfg)))[0]))
    measured = cfg.n_layer * (std_rank - rank)
    said = attention_class(cfg).removed_params(cfg)
    assert said == measured, f"{cfg.attention}: removed_params says {said}, the math form shows {measured}"
    assert redundancy(cfg) == said, f"{cfg.attention}: symmetry.redundancy says {redundancy(cfg)}, the class {said}"
    built = _build(cfg).num_params()
    assert param_count(cfg) == built, f"{cfg.attention}: param_count says {param_count(cfg)}, a built model has {built}"


def check_redundant_biases(cfg: GPTConfig) -> None:
    """redundant_biases names exactly the b_K with parameters of its own on a pass dim (a rotary dim's b_K is not
    redundant: check_redundant_biases_keep_the_function) and, with a learned b_O to fold into, the b_V with
    parameters of its own (a b_K tied to b_Q has none: dropping it changes the scores); and fully_reduced_count
    drops exactly those parameters."""
    layer = _layer(cfg)
    J, rows = _math_jacobian(layer)
    rank = int(torch.linalg.matrix_rank(J))

    def own(name, from_dim=0):
        """Parameter directions that reach the math form through this field only (its dims >= from_dim)."""
        idx = torch.arange(rows[name].start, rows[name].stop)
        others = torch.ones(J.shape[0], dtype=torch.bool)
        others[idx[(idx - rows[name].start) % cfg.d_head >= from_dim]] = False
        return rank - int(torch.linalg.matrix_rank(J[others]))

    learned_b_O = rows["b_O"].stop > rows["b_O"].start and bool(J[rows["b_O"]].any())
    # under a query/key norm b_K is inside the key's norm: no dim of it is redundant
    own_params = {"b_K": 0 if cfg.qk_norm else own("b_K", cfg.rot), "b_V": own("b_V") if learned_b_O else 0}
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


def _moved_bias(model, name: str, gen: torch.Generator, dims: slice = slice(None)):
    """A copy of `model` with bias `name` of every layer moved by a random delta on `dims` of each head (math form,
    load_heads); a moved b_V is folded into b_O where the layer learns one: b_O - sum_h delta[j(h)] W_O[h]."""
    out = _build(model.config).double().eval()
    out.load_state_dict(model.state_dict())
    for attn in out.attention_layers:
        hw = attn.to_heads()  # fields are replaced below, never changed in place
        delta = torch.zeros_like(getattr(hw, name))
        delta[:, dims] = 0.3 * torch.randn(delta[:, dims].shape, generator=gen, dtype=torch.float64)
        setattr(hw, name, getattr(hw, name) + delta)
        if name == "b_V" and hw.b_O is not None:
            hw.b_O = hw.b_O - torch.einsum("hr,hrd->d", delta.repeat_interleave(hw.group, 0), hw.W_O)
        attn.load_heads(hw)
    return out


def check_redundant_biases_keep_the_function(cfg: GPTConfig) -> None:
    """Measured on the function: moving what redundant_biases names (b_K on its pass dims, b_V folded into b_O)
    keeps the logits; moving a learned b_K on its rotary dims changes them (under RoPE q_i M(j - i) b_K^T depends
    on the key's position j), which is why only the pass dims of b_K count as redundant."""
    model, gen = _model(cfg), torch.Generator().manual_seed(13)
    said = set(attention_class(cfg).redundant_biases(cfg))
    with torch.no_grad():
        before = model(_x())[0]
        for name in sorted(said):
            # b_K: on its pass dims; with none (every dim rotates), on all of them, so naming it there fails
            dims = slice(cfg.rot, None) if name == "b_K" and cfg.rot < cfg.d_head else slice(None)
            moved = _moved_bias(model, name, gen, dims)

            rel = max_rel(moved(_x())[0], before)
            assert rel <= 1e-10, f"{cfg.attention}: redundant_biases names {name}, but moving it changes the " \
                                 f"logits (max rel. {rel:.3g})"
        b_K = model.attention_layers[0].to_heads().b_K
        if cfg.qk_norm and b_K is not None and cfg.rot < cfg.d_head:
            rel = max_rel(_moved_bias(model, "b_K", gen, slice(cfg.rot, None))(_x())[0], before)
            assert rel > 1e-6, f"{cfg.attention}: moving b_K on its pass dims under a query/key norm keeps the logits"
        if cfg.rot and b_K is not None and bool(b_K.any()):
            rel = max_rel(_moved_bias(model, "b_K", gen, slice(0, cfg.rot))(_x())[0], before)
            assert rel > 1e-6, f"{cfg.attention}: moving b_K on its rotary dims keeps the logits (max rel. {rel:.3g})"


def check_projection_flops(cfg) -> None:
    """projection_flops (bench/flops.py's attention term) is what a built layer's projections execute."""
    said = attention_class(cfg).projection_flops(cfg)
    measured = measured_projection_flops(_layer(cfg))
    assert said == measured, f"{cfg.attention}: projection_flops says {said}, a forward pass runs {measured:g}"


def check_canonical_counts(cfg: GPTConfig) -> None:
    """Canonical's removed_params is symmetry.counts.removed_split's count for its halves (plus, with minimal biases,
    b_V and b_K on the pass dims), whole model."""
    if cfg.attention != "canonical":
        return
    said = attention_class(cfg).removed_params(cfg)
    split = removed_split(cfg)
    halves = {"both": ("query_key", "value_output"), "qk": ("query_key",), "vo": ("value_output",)}[
        cfg.canonical_halves]
    # minimal biases: b_V (r) and b_K's r - rot pass dims per layer and KV group
    want = sum(split[h] for h in halves) + cfg.minimal_bias * cfg.n_layer * cfg.n_kv_head * (2 * cfg.d_head - cfg.rot)
    assert said == want, f"canonical: removed_params {said}, removed_split {split}"


CHECKS = [check_load_heads_round_trip, check_to_heads_is_the_forward, check_expand_is_exact,
          check_canonicalize_is_exact, check_matched_init, check_head_blocks, check_removed_params,
          check_redundant_biases, check_redundant_biases_keep_the_function, check_projection_flops,
          check_canonical_counts]


def run_contract(name: str, family: str = "gpt2", checks=CHECKS) -> None:
    """Every check at every shape of `family` the variant accepts."""
    for cfg in contract_configs(name, family):
        for check in checks:
            check(cfg)


# ------------------------------------------------------------------- the checks can tell a broken variant
def doubled_v(base: type) -> type:
    """Broken on purpose: `base` whose math form says 2 W_V, so expand, canonicalize and convert would be wrong."""

    class DoubledV(base):
        variant = "doubled_v"

        def to_heads(self):
            hw = super().to_heads()
            hw.W_V = 2 * hw.W_V
            return hw
    return DoubledV


DoubledV = doubled_v(StandardAttention)


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
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", variant_names())
def test_contract(name, family, check):
    configs = contract_configs(name, family)
    # a variant with no form for any of the family's shapes (identity_q, identity_ko under a query/key norm) is
    # refused on each (test_unsupported_shapes_are_refused_in_one_line)
    refused = all(expected_refusal(name, kw) for kw in family_shapes(family))
    assert configs or refused, f"{name}: no {family} config of the contract's shapes is accepted"
    for cfg in configs:
        check(cfg)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", variant_names())
def test_unsupported_shapes_are_refused_in_one_line(name, family):
    """Each shape (and option) of the family is accepted by a variant, or refused by GPTConfig in one line that
    names the variant and why (identity_q / identity_ko: queries, or keys and outputs, are the input split into
    heads, so they need n_kv_head = n_head and n_head x d_head = n_embd: GPT-2 and a square MHA only)."""
    accepted = 0
    for kw in family_shapes(family):
        why = expected_refusal(name, kw)
        if not why:
            GPTConfig(**kw, attention=name)
            accepted += 1
            continue
        with pytest.raises(UserError) as err:
            GPTConfig(**kw, attention=name)
        assert "\n" not in str(err.value), str(err.value)
        tells(err, *why)

    assert accepted or all(expected_refusal(name, kw) for kw in family_shapes(family)), \
        f"{name}: refuses every {family} shape"



def test_the_contract_catches_a_variant_whose_to_heads_doubles_w_v(monkeypatch):
    monkeypatch.setitem(ATTENTION_REGISTRY, DoubledV.variant, DoubledV)
    cfg = GPTConfig(**GPT2_SHAPE, n_head=3, attention=DoubledV.variant)
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
    cfg = GPTConfig(**GPT2_SHAPE, n_head=3, attention=Fused.variant)
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
        r, H = self.d_head, self.n_head
        return {"c_kv.weight": row_blocks((H, H, H), r), "c_proj.weight": column_blocks(r, H)}

    @classmethod
    def projection_flops(cls, config):
        return 8 * config.n_embd**2


def test_the_contract_catches_blocks_past_the_end_and_a_wrong_flop_count(monkeypatch):
    monkeypatch.setitem(ATTENTION_REGISTRY, KVPlusOneBlocks.variant, KVPlusOneBlocks)
    cfg = GPTConfig(**GPT2_SHAPE, n_head=3, attention=KVPlusOneBlocks.variant)
    with pytest.raises(AssertionError) as err:
        check_head_blocks(cfg)
    assert str(err.value).splitlines()[0] == "kv_plus_one_blocks: a block of c_kv.weight (12, 6) is empty"
    with pytest.raises(AssertionError) as err:
        check_projection_flops(cfg)
    assert str(err.value).splitlines()[0] == "kv_plus_one_blocks: projection_flops says 288, a forward pass runs 216"


# ------------------------------------------------------- the contract can tell a broken variant of the Llama shapes
class RemovesOneMore(StandardAttention):
    variant = "removes_one_more"

    @classmethod
    def removed_params(cls, config):
        return 1


class NoFoldedValueBias(StandardAttention):
    """The bug this contract found: no redundant bias even with b_O to fold b_V into."""
    variant = "no_folded_b_v"

    @classmethod
    def redundant_biases(cls, config):
        return ()


class GPTRuleBiases(StandardAttention):
    """GPT's rule carried over: b_K named too, which RoPE on every dim makes position-dependent."""
    variant = "gpt_rule_biases"

    @classmethod
    def redundant_biases(cls, config):
        return ("b_K", "b_V") if config.qkv_bias and config.o_bias else ()


class GroupOutputBlocks(StandardAttention):
    """Broken on purpose: o_proj split per KV group (g query heads in one block)."""
    variant = "group_output_blocks"

    def head_blocks(self):
        H, G, r = self.n_head, self.n_kv_head, self.d_head
        return {**super().head_blocks(), "o_proj.weight": column_blocks(H // G * r, G)}


class KeyBlocksPerQueryHead(StandardAttention):
    """Broken on purpose: k_proj split per query head (the blocks past its G r rows are empty)."""
    variant = "key_blocks_per_query_head"

    def head_blocks(self):
        return {**super().head_blocks(), "k_proj.weight": row_blocks((self.n_head,), self.d_head)}


GQA_BIASES = dict(**LLAMA_SHAPE, **SHAPES["llama"]["mqa-attention-bias"])  # MQA, RoPE on every dim, all biases


@pytest.mark.parametrize("cls, checks, message", [
    (doubled_v(StandardAttention), [check_load_heads_round_trip, check_to_heads_is_the_forward, check_expand_is_exact,
                                    check_canonicalize_is_exact], "doubled_v"),
    (RemovesOneMore, [check_removed_params], "removed_params says 1, the math form shows 0"),
    (NoFoldedValueBias, [check_redundant_biases], r"redundant_biases says \[\], the math form shows \['b_V'\]"),
    (GPTRuleBiases, [check_redundant_biases], r"says \['b_K', 'b_V'\], the math form shows \['b_V'\]"),
    (GPTRuleBiases, [check_redundant_biases_keep_the_function], "names b_K, but moving it changes"),
    (GroupOutputBlocks, [check_head_blocks], "a head_blocks block of o_proj.weight feeds heads"),
    (KeyBlocksPerQueryHead, [check_head_blocks], r"a block of k_proj.weight \(2, 8\) is empty"),
], ids=lambda v: getattr(v, "variant", ""))
def test_the_contract_catches_a_broken_variant_on_a_llama_shape(monkeypatch, cls, checks, message):
    monkeypatch.setitem(ATTENTION_REGISTRY, cls.variant, cls)
    cfg = GPTConfig(**GQA_BIASES, attention=cls.variant)
    for check in checks:
        with pytest.raises(AssertionError, match=message):
            check(cfg)
    with pytest.raises(AssertionError):
        run_contract(cls.variant, "llama")


@pytest.mark.slow  # the whole Llama contract (every shape) on a registered toy: 7 s idle, 25 s on a loaded 2-core CPU
def test_a_correct_extra_variant_passes_the_llama_contract(monkeypatch):
    monkeypatch.setitem(ATTENTION_REGISTRY, StandardCopy.variant, StandardCopy)
    run_contract(StandardCopy.variant, "llama")


def test_attention_class_reads_the_one_registry_for_every_family(monkeypatch):
    from iattention.bench.flops import attention_projection_flops

    for family in FAMILIES:
        for attention in variant_names():
            for cfg in contract_configs(attention, family):
                assert attention_class(cfg) is ATTENTION_REGISTRY[attention]
    for attention in ("standard", "canonical"):  # GQA: projections of H query and G key/value heads
        cfg = GPTConfig(**LLAMA_SHAPE, n_head=4, n_kv_head=2, attention=attention)
        cls = ATTENTION_REGISTRY[attention]
        d, r, H, G = 8, 2, 4, 2
        assert attention_projection_flops(cfg) == cls.projection_flops(cfg) == 2 * d * r * (2 * H + 2 * G)
    monkeypatch.setitem(ATTENTION_REGISTRY, StandardCopy.variant, StandardCopy)  # read at call time
    assert attention_class(GPTConfig(**LLAMA_SHAPE, n_head=4, n_kv_head=2, attention=StandardCopy.variant)) \
        is StandardCopy
    source = (ROOT / "src/iattention/attention/registry.py").read_text()
    assert "iattention.config" not in source, "registry.py imports a config module (an import cycle)"
