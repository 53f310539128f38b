"""The symmetry of a layer with a query/key norm (GPTConfig.qk_norm; docs/conversion.md, "Query/key norms"), on our
own model in test-only records: what the proof says is exact keeps the logits to float64 rounding (the value/output
GL(r), the rescaling of the two gains constant on each rotary pair, per layer or per KV group, and the discrete
ones), canonical fixes exactly that and no W_K block, and what it says is not a symmetry moves them: a rotation
inside a RoPE pair of W_Q and W_K (a symmetry without the norm), a rescaling not constant on a pair, one query head
of a group rescaled alone, and a positive scale of a head's W_Q (only nearly one, through the norm's eps)."""

import copy
import dataclasses

import pytest
import torch

from helpers import tells
from iattention.attention.rope import pair_dims
from iattention.config.families import FAMILIES, LLAMA_DEFAULTS
from iattention.config.model import GPTConfig
from iattention.errors import UserError
from iattention.model.gpt import GPT, exact_norms
from iattention.symmetry.counts import param_count, removed_split, standard_param_count
from iattention.symmetry.transforms import canonicalize, expand, gauge, pair_constant, random_gauge

X = torch.randint(0, 50, (2, 24), generator=torch.Generator().manual_seed(1))


@pytest.fixture(autouse=True)
def records(monkeypatch):
    """Records like the Llama family's with each query/key norm (the real families come as records of their own)."""
    for kind in ("head", "whole"):
        monkeypatch.setitem(FAMILIES, f"qk_{kind}", dataclasses.replace(
            FAMILIES["llama"], name=f"qk_{kind}", defaults={**LLAMA_DEFAULTS, "qk_norm": kind}))


def _model(kind="head", seed=0, eps=1e-6, **kw):
    cfg = GPTConfig(**{**dict(family=f"qk_{kind}", n_layer=2, n_head=4, n_kv_head=2, n_embd=32, vocab_size=50,
                              block_size=24, norm_eps=eps), **kw})
    torch.manual_seed(seed)
    model = GPT(cfg).double().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            gain = p.dim() == 1 and ("norm" in name or ".ln_" in name)
            p.copy_((1.0 if gain else 0.0) + 0.3 * torch.randn(p.shape, generator=gen, dtype=torch.float64))
    return model


def _logits(model):
    with torch.no_grad(), exact_norms(model):
        return model(X)[0]


def _moved(model, change):
    """A copy of `model` with change(hw, attn) applied to every layer's math form (which it may edit in place)."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        for attn in out.attention_layers:
            hw = attn.to_heads().to(torch.float64)
            hw = change(hw, attn) or hw
            attn.load_heads(hw)
    return out


def _rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


SHAPES = {"gqa": dict(), "mha": dict(n_kv_head=4), "partial-rotary-biases": dict(d_head=12, rot=4, qkv_bias=True,
                                                                                 o_bias=True)}


@pytest.mark.parametrize("shape", SHAPES, ids=list(SHAPES))
@pytest.mark.parametrize("kind", ["head", "whole"])
def test_the_surviving_gauge_keeps_the_function_and_canonical_fixes_the_key_gain_not_a_w_k_block(kind, shape):
    model = _model(kind, **SHAPES[shape])
    ref = _logits(model)
    moved = random_gauge(copy.deepcopy(model), seed=3)  # S per KV group, a random C on the gains, A = I
    assert _rel(_logits(moved), ref) <= 1e-12
    g_was, g_now = (m.attention_layers[0].k_norm.weight for m in (model, moved))
    assert (g_was - g_now).abs().max() > 0.1  # the gains did move
    for block in ("pivoted", "aligned"):
        canon = canonicalize(moved, block=block)
        assert _rel(_logits(canon), ref) <= 1e-12 and _rel(_logits(expand(canon)), ref) <= 1e-12
        c, r, rot, G = canon.config, canon.config.d_head, canon.config.rot, canon.config.n_kv_head
        for src, attn in zip(moved.attention_layers, canon.attention_layers):
            hw = attn.to_heads()
            assert torch.equal(hw.W_K, src.to_heads().W_K)  # W_K as it came: no identity block, no pair pivot fixed
            fixed = attn.k_norm.gain_perm[:, :attn.k_norm.n_fixed]  # rows: 1 (per layer) or G (per KV group)
            assert fixed.shape == (1 if kind == "head" else G, rot // 2 + r - rot)
            assert bool((torch.gather(hw.g_K, 1, fixed) == 1).all())
            first, second = pair_dims(rot, c.rope_layout)  # one dim of every pair, then every pass dim
            assert bool(((fixed[:, :rot // 2] == first) | (fixed[:, :rot // 2] == second)).all())
            assert fixed[:, rot // 2:].tolist() == [list(range(rot, r))] * fixed.shape[0]
        # what canonical removes per layer: the key gain's fixed dims (per layer or per KV group) + G r^2
        per_layer = (rot // 2 + r - rot) * (1 if kind == "head" else G)
        assert removed_split(c)["query_key"] == 2 * per_layer
        assert standard_param_count(model.config) - canon.num_params() == 2 * (per_layer + G * r * r)
        assert canon.num_params() == param_count(c) and model.num_params() == standard_param_count(model.config)


def _pair_rotation(hw, attn, angle=0.7, pair=0):
    """W_Q and W_K (every head) turned by `angle` inside RoPE pair `pair`: a symmetry of a layer without a norm."""
    first, second = (int(t[pair]) for t in pair_dims(attn.rot, attn.rope_layout))
    R = torch.eye(hw.W_Q.shape[-1], dtype=torch.float64)
    c, s = torch.cos(torch.tensor(angle, dtype=torch.float64)), torch.sin(torch.tensor(angle, dtype=torch.float64))
    R[first, first], R[first, second], R[second, first], R[second, second] = c, s, -s, c
    hw.W_Q, hw.W_K = hw.W_Q @ R, hw.W_K @ R
    if hw.b_Q is not None:
        hw.b_Q, hw.b_K = hw.b_Q @ R, hw.b_K @ R


@pytest.mark.parametrize("kind", ["head", "whole"])
def test_a_rotation_inside_a_rope_pair_is_a_symmetry_only_where_the_gains_are_constant_on_it(kind):
    model = _model(kind)
    ref = _logits(model)
    assert _rel(_logits(_moved(model, _pair_rotation)), ref) > 1e-3  # generic gains: not a symmetry
    flat = copy.deepcopy(model)  # both gains made constant on pair 0 of every head: then it is one
    with torch.no_grad():
        for attn in flat.attention_layers:
            first, second = (int(t[0]) for t in pair_dims(attn.rot, attn.rope_layout))
            for g in (attn.q_norm.weight, attn.k_norm.weight):
                g.view(-1, attn.d_head)[:, second] = g.view(-1, attn.d_head)[:, first]
    flat_ref = _logits(flat)
    assert _rel(_logits(_moved(flat, _pair_rotation)), flat_ref) <= 1e-12
    llama = GPT(model.config.replace(family="llama", qk_norm="")).double().eval()  # no norm: the commutant's
    llama.load_state_dict({k: v for k, v in model.state_dict().items() if "_norm." not in k})
    assert _rel(_logits(_moved(llama, _pair_rotation)), _logits(llama)) <= 1e-12


@pytest.mark.parametrize("kind", ["head", "whole"])
def test_a_gain_rescaling_not_constant_on_a_pair_or_not_shared_by_a_group_changes_the_function(kind):
    model = _model(kind)
    ref = _logits(model)

    def scale(values):
        def change(hw, attn):
            C = pair_constant(values(hw, attn).double(), attn.rot, attn.rope_layout)
            return gauge(hw, torch.eye(attn.d_head).expand(attn.n_kv_head, -1, -1).double(),
                         torch.eye(attn.d_head).expand(attn.n_kv_head, -1, -1).double(), C=C)
        return change

    def pair_scales(hw, attn):
        return 1.0 + torch.arange(hw.g_K.shape[0] * attn.d_head // 2, dtype=torch.float64).reshape(-1, attn.d_head // 2)

    assert _rel(_logits(_moved(model, scale(pair_scales))), ref) <= 1e-12  # constant on pairs: exact

    def broken(hw, attn):  # C not constant on pair 0: its second dim scaled once more, on the key gain only
        hw = scale(pair_scales)(hw, attn)
        second = int(pair_dims(attn.rot, attn.rope_layout)[1][0])
        hw.g_K = hw.g_K.clone()
        hw.g_K[:, second] *= 1.5
        return hw

    assert _rel(_logits(_moved(model, broken)), ref) > 1e-3
    if kind == "whole":  # per KV group: one query head of group 0 rescaled without its group's other head
        def one_head(hw, attn):
            hw.g_Q = hw.g_Q.clone()
            hw.g_Q[0] *= 2.0
            hw.g_K = hw.g_K.clone()
            hw.g_K[0] /= 2.0
            return hw
        assert _rel(_logits(_moved(model, one_head)), ref) > 1e-3


@pytest.mark.parametrize("kind", ["head", "whole"])
def test_the_discrete_symmetries_a_quarter_turn_with_the_gains_swapped_and_a_sign_with_its_gain(kind):
    model = _model(kind)
    ref = _logits(model)

    def quarter_turn(hw, attn):  # multiply pair 0 by i in W_Q and W_K of every head; swap the gains on the pair
        _pair_rotation(hw, attn, angle=torch.pi / 2)
        first, second = (int(t[0]) for t in pair_dims(attn.rot, attn.rope_layout))
        hw.g_Q, hw.g_K = hw.g_Q.clone(), hw.g_K.clone()
        for g in (hw.g_Q, hw.g_K):
            g[:, [first, second]] = g[:, [second, first]]

    assert _rel(_logits(_moved(model, quarter_turn)), ref) <= 1e-12

    def sign(hw, attn):  # column 3 of every head's W_Q (and b_Q) negated, and the query gain's dim 3
        hw.W_Q, hw.g_Q = hw.W_Q.clone(), hw.g_Q.clone()
        hw.W_Q[:, :, 3] *= -1
        hw.g_Q[:, 3] *= -1

    assert _rel(_logits(_moved(model, sign)), ref) <= 1e-12


@pytest.mark.parametrize("kind", ["head", "whole"])
def test_a_positive_scale_of_w_q_is_only_nearly_a_symmetry_through_the_norm_s_eps(kind):
    """y -> c y leaves y / sqrt(mean(y^2) + eps) unchanged only at eps = 0: with transformers' eps the logits move,
    by about eps / mean(y^2), so canonical does not reduce it."""
    def doubled(hw, attn):  # "head": one head's W_Q; "whole": every head's (the statistic spans them all)
        heads = slice(0, 1) if kind == "head" else slice(None)
        hw.W_Q = hw.W_Q.clone()
        hw.W_Q[heads] *= 2.0

    moved = {}
    for eps in (1e-6, 1e-2, 1e-30):
        model = _model(kind, eps=eps)
        moved[eps] = _rel(_logits(_moved(model, doubled)), _logits(model))
    assert moved[1e-30] <= 1e-12  # without eps it is a symmetry
    assert 1e-13 < moved[1e-6] < 1e-4 and moved[1e-2] > 100 * moved[1e-6]  # with it, nearly; the more eps the less


def test_the_k_only_cache_reads_the_keys_before_their_norm():
    for kind in ("head", "whole"):
        model = _model(kind, n_kv_head=4)  # multi-head, G r = d: the K-only cache applies
        prompt = X[:1, :5]
        full = model.generate(prompt, 12, temperature=0.0, cache_kind="full")
        assert torch.equal(model.generate(prompt, 12, temperature=0.0, cache_kind="k-only"), full)
        assert torch.equal(model.generate(prompt, 12, temperature=0.0, use_cache=False), full)


def test_what_has_no_form_under_a_query_key_norm_is_refused_in_one_line():
    base = dict(family="qk_head", n_head=4, n_kv_head=4, n_embd=32)
    for variant in ("identity_q", "identity_ko"):
        with pytest.raises(UserError) as err:
            GPTConfig(**base, attention=variant)
        tells(err, f"attention={variant}", "query/key norm", "use standard or canonical")
    with pytest.raises(UserError) as err:
        GPTConfig(**base, attention="canonical", qkv_bias=True, o_bias=True, minimal_bias=True)
    tells(err, "minimal_bias", "inside the key norm", "drop model.minimal_bias")
    with pytest.raises(UserError) as err:
        GPTConfig(family="llama", n_head=4, n_embd=32, qk_norm="head")
    tells(err, "model.qk_norm='head'", "transformers' llama has qk_norm=''", "drop model.qk_norm")


@pytest.mark.parametrize("kind", ["head", "whole"])
def test_a_canonical_model_builds_on_the_meta_device(kind):
    """The streamed converter and the size checks build layers on "meta": the key gain's fixed dims are index
    bookkeeping, made on the CPU there too."""
    with torch.device("meta"):
        model = GPT(GPTConfig(family=f"qk_{kind}", n_layer=1, n_head=4, n_kv_head=2, n_embd=32, attention="canonical"))
    assert model.attention_layers[0].k_norm.free_gain.numel() == (1 if kind == "head" else 2) * 4
