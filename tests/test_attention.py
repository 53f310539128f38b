"""Attention variants: counts, causality, identity blocks, learning."""

import pytest
import torch

from helpers import make_model
from iattention import GPT, GPTConfig
from iattention.attention.canonical import CanonicalAttention
from iattention.attention.registry import variant_names
from iattention.symmetry import expand, param_count, redundancy

VARIANTS = variant_names()


@pytest.mark.parametrize("d,heads,layers,bias", [(48, 3, 2, True), (64, 1, 3, False), (96, 4, 1, True),
                                                 (50, 5, 2, False), (768, 12, 12, True)])
@pytest.mark.parametrize("attention", VARIANTS)
def test_param_count_closed_form(d, heads, layers, bias, attention):
    cfg = GPTConfig(n_layer=layers, n_head=heads, n_embd=d, vocab_size=101, block_size=32, bias=bias,
                    attention=attention)
    model = GPT(cfg)
    assert model.num_params() == param_count(cfg)
    # the oracle is the built models, not a formula: what the variant removes is the difference in stored
    # parameters against a built standard model of the same shape
    standard = GPT(cfg.replace(attention="standard"))
    assert redundancy(cfg) == standard.num_params() - model.num_params()
    if attention == "canonical":
        assert redundancy(cfg) == 2 * (d // heads) ** 2 * heads * layers
        # compact storage: the learned tensors hold no masked dead entries
        std = GPT(cfg.replace(attention="standard"))
        assert sum(p.numel() for p in std.parameters()) - sum(p.numel() for p in model.parameters()) \
            == redundancy(cfg)


def test_gpt2_small_counts():
    expected = {1: 110_284_032, 4: 120_900_864, 8: 122_670_336, 12: 123_260_160}
    for heads, n in expected.items():
        cfg = GPTConfig(n_head=heads, attention="canonical")
        assert param_count(cfg) == n
        assert param_count(cfg.replace(attention="standard")) == 124_439_808
        # the paper's "110M at every head count": W_K = W_O = I_d as whole maps
        assert param_count(cfg.replace(attention="identity_ko")) == 110_284_032


def _identity_ko_and_canonical(heads: int):
    """An identity_ko model and a canonical model (aligned blocks, learned free rows zero) holding
    the same W_Q, W_V, biases and non-attention weights."""
    ko = make_model(attention="identity_ko", n_head=heads)
    can = make_model(attention="canonical", n_head=heads)
    state = {k: v for k, v in ko.state_dict().items() if ".attn." not in k}
    can.load_state_dict(state, strict=False)
    with torch.no_grad():
        for a, b in zip(ko.attention_layers, can.attention_layers):
            a.b_K.normal_()
            a.b_O.normal_()
            hw = a.to_heads()
            b.W_Q.copy_(hw.W_Q)
            b.W_V.copy_(hw.W_V)
            for name in ("b_Q", "b_K", "b_V", "b_O"):
                getattr(b, name).copy_(getattr(hw, name))
    return ko, can


def test_identity_ko_equals_canonical_at_one_head():
    """At one head (r = d) the aligned canonical block is the whole W_K and W_O: the same model."""
    ko, can = _identity_ko_and_canonical(1)
    x = torch.randint(0, 97, (2, 16))
    assert torch.allclose(ko(x)[0], can(x)[0], atol=1e-12)
    assert ko.num_params() == can.num_params()


@pytest.mark.parametrize("heads", [2, 3])
def test_identity_ko_differs_from_canonical_with_more_heads(heads):
    """With H > 1, canonical also learns the d - r free rows of each head's W_K and W_O; identity_ko
    has them at zero. Zero free rows give the same function; nonzero ones (any canonical training)
    give another, which identity_ko cannot represent."""
    ko, can = _identity_ko_and_canonical(heads)
    x = torch.randint(0, 97, (2, 16))
    with torch.no_grad():
        for b in can.attention_layers:
            b.W_K_free.zero_()
            b.W_O_free.zero_()
    assert torch.allclose(ko(x)[0], can(x)[0], atol=1e-12)
    with torch.no_grad():
        for b in can.attention_layers:
            b.W_K_free.normal_(0, 0.3)
            b.W_O_free.normal_(0, 0.3)
    assert not torch.allclose(ko(x)[0], can(x)[0], atol=1e-3)
    assert ko.num_params() < can.num_params()


@pytest.mark.parametrize("heads", [1, 3])
def test_identity_ko_has_no_key_or_output_gemm(heads):
    model = make_model(attention="identity_ko", n_head=heads)
    attn = model.attention_layers[0]
    assert [n for n, p in attn.named_parameters() if p.dim() >= 2] == ["c_qv.weight"]
    x = torch.randn(2, 7, 48, dtype=torch.float64)
    hw = attn.to_heads()
    k = attn.qkv(x)[1].reshape(2, 7, heads, -1)
    for h in range(heads):  # head h's keys: coordinates [h r, (h+1) r) plus b_K
        assert torch.allclose(k[:, :, h], x @ hw.W_K[h] + hw.b_K[h], atol=1e-12)


@pytest.mark.parametrize("attention", VARIANTS)
@pytest.mark.parametrize("heads", [1, 3])
def test_causality(attention, heads):
    model = make_model(attention=attention, n_head=heads)
    x = torch.randint(0, 97, (2, 16))
    y = x.clone()
    y[:, 10:] = (y[:, 10:] + 1) % 97
    a, b = model(x)[0], model(y)[0]
    assert torch.allclose(a[:, :10], b[:, :10], atol=1e-12)
    assert not torch.allclose(a[:, 10:], b[:, 10:])


@pytest.mark.parametrize("heads", [1, 3])
@pytest.mark.parametrize("halves", ["both", "qk", "vo"])
def test_canonical_blocks_are_identity_and_get_no_gradient(heads, halves):
    model = make_model(attention="canonical", n_head=heads, canonical_halves=halves, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randint(0, 97, (4, 16))
    for _ in range(3):
        loss = model(x[:, :-1], x[:, 1:])[1]
        opt.zero_grad()
        loss.backward()
        opt.step()
    r = model.config.d_head
    for attn in model.attention_layers:
        assert isinstance(attn, CanonicalAttention)
        hw = attn.to_heads()
        eye = torch.eye(r)
        for h in range(heads):
            if attn.canonical_qk:
                assert torch.equal(hw.W_K[h][attn.k_perm[h, :r]], eye)
            if attn.canonical_vo:
                assert torch.equal(hw.W_O[h][:, attn.o_perm[h, :r]], eye)
        # no parameter holds the identity entries: every learned tensor got a gradient
        for name, p in attn.named_parameters():
            if p.numel() == 0:  # at one head W_K_free / W_O_free are empty (r = d)
                continue
            assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("blocks", ["aligned", "permuted", "permuted-by-load"])
def test_canonical_one_head_uses_no_key_or_output_gemm(blocks):
    """At one head the key map and output map are permutations (the identity for the aligned
    block, where even the copy is skipped); a forward must still match the generic path that
    builds the full matrices, also after a state dict with another block choice is loaded."""
    model = make_model(attention="canonical", n_head=1)
    attn = model.attention_layers[0]
    with torch.no_grad():  # nonzero biases, so a skipped bias would show
        attn.b_K.normal_()
        attn.b_O.normal_()
    if blocks == "permuted":
        attn.set_blocks(torch.randperm(48)[None], torch.randperm(48)[None])
    elif blocks == "permuted-by-load":
        other = make_model(attention="canonical", n_head=1)
        other.attention_layers[0].set_blocks(torch.randperm(48)[None], torch.randperm(48)[None])
        model.load_state_dict(other.state_dict())
    assert (attn._k_identity, attn._o_identity) == ((True, True) if blocks == "aligned" else (False, False))
    x = torch.randn(2, 7, 48, dtype=torch.float64)
    q, k, v = attn.qkv(x)
    hw = attn.to_heads()
    assert torch.allclose(k, x @ hw.W_K[0] + hw.b_K[0], atol=1e-12)
    y = torch.randn(2, 7, 48, dtype=torch.float64)
    assert torch.allclose(attn.project_out(y), y @ hw.W_O[0] + hw.b_O, atol=1e-12)
    gemm_params = [n for n, p in attn.named_parameters() if p.dim() == 3 and p.numel() > 0]
    assert gemm_params == ["W_Q", "W_V"]


@pytest.mark.parametrize("attention", VARIANTS)
def test_each_variant_learns_a_synthetic_task(attention):
    """Copy task: predict the token seen 4 positions back. Loss must fall well below its start."""
    torch.manual_seed(1)
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=16, block_size=32, attention=attention)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(150):
        x = torch.randint(0, 16, (16, 4)).repeat(1, 5)
        loss = model(x[:, :-1], x[:, 1:])[1]
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_odd_shapes_forward_backward():
    for cfg in [GPTConfig(n_layer=1, n_head=3, n_embd=30, vocab_size=11, block_size=8, bias=False,
                          attention="canonical"),
                GPTConfig(n_layer=1, n_head=5, n_embd=50, vocab_size=11, block_size=8, attention="identity_q")]:
        torch.manual_seed(0)
        model = GPT(cfg).double()
        with torch.no_grad():  # weights large enough that attention shapes the logits
            for p in model.parameters():
                p.normal_(0.0, 0.3)
        x = torch.randint(0, 11, (2, 8))
        logits, loss = model(x, x)
        loss.backward()
        assert logits.shape == (2, 8, 11)
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
        # the odd shape computes the function of its exact standard form (expand), not just some tensor
        with torch.no_grad():
            ref, _ = expand(model).eval()(x)
            assert torch.allclose(model.eval()(x)[0], ref, rtol=1e-9, atol=1e-9)


OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.5),
    "adamw-foreach": lambda ps: torch.optim.AdamW(ps, lr=0.05, foreach=True),
    # fused AdamW (what the trainer uses on CUDA) updates in place without bumping version counters: a memo
    # keyed on versions returned the step-0 weights at every later validation (issue 19, paper grid on a GPU).
    "adamw-fused": lambda ps: torch.optim.AdamW(ps, lr=0.05, fused=True),
}


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("heads", [1, 4])
def test_canonical_evaluation_follows_in_place_weight_updates(heads, opt_name):
    """Evaluation (no_grad, eval mode) after an in-place update (an optimizer step, a copy_) must match a
    freshly built model, never stale assembled weights."""
    from iattention import GPT, GPTConfig

    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2, n_head=heads, n_embd=16, vocab_size=50, block_size=8, attention="canonical")
    model = GPT(cfg)
    x = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(1))
    model.eval()
    with torch.no_grad():
        before = model(x)[0]
    opt = OPTIMIZERS[opt_name](model.parameters())
    model.train()
    _, loss = model(x, x)
    loss.backward()
    opt.step()  # in place
    model.eval()
    with torch.no_grad():
        after = model(x)[0]
        fresh = GPT(cfg).eval()
        fresh.load_state_dict(model.state_dict())
        expected = fresh(x)[0]
        assert not torch.allclose(after, before)
        assert torch.allclose(after, expected, atol=1e-6)
        model.transformer.h[0].attn.W_V.mul_(1.5)  # in place, outside the optimizer
        fresh.load_state_dict(model.state_dict())
        assert torch.allclose(model(x)[0], fresh(x)[0], atol=1e-6)
        if heads > 1:
            model.transformer.h[1].attn.W_K_free.copy_(torch.randn_like(model.transformer.h[1].attn.W_K_free))
            fresh.load_state_dict(model.state_dict())
            assert torch.allclose(model(x)[0], fresh(x)[0], atol=1e-6)


@pytest.mark.parametrize("heads", [1, 4])
def test_canonical_builds_its_weights_once_per_generation(heads, monkeypatch):
    """Inside `frozen_weights` (generation) canonical assembles its full matrices once, not per decoding
    step; after it, an update is seen again (fused AdamW) and nothing is left memoised."""
    from iattention import GPT, GPTConfig
    from iattention.attention import canonical
    from iattention.model.generate import generate

    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2, n_head=heads, n_embd=16, vocab_size=50, block_size=8, attention="canonical")
    model = GPT(cfg)
    calls = []
    real = canonical.merge_heads_in
    monkeypatch.setattr(canonical, "merge_heads_in", lambda w: calls.append(1) or real(w))
    prompt = torch.randint(0, 50, (1, 3), generator=torch.Generator().manual_seed(2))
    generate(model, prompt, max_new_tokens=4, generator=torch.Generator().manual_seed(3))
    assert len(calls) == cfg.n_layer  # one input-side assembly per layer for 4 decoding steps
    assert all("_memo" not in m.__dict__ for m in model.modules())
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, fused=True)
    model(prompt, prompt)[1].backward()
    opt.step()
    with torch.no_grad():
        fresh = GPT(cfg)
        fresh.load_state_dict(model.state_dict())
        a = generate(model, prompt, max_new_tokens=4, temperature=0.0)
        b = generate(fresh, prompt, max_new_tokens=4, temperature=0.0)
    assert torch.equal(a, b)
