"""Unit tests of iattention.attention.canonical."""

import pytest
import torch

from helpers import make_model, tells
from iattention import GPT, GPTConfig
from iattention.attention.canonical import CanonicalAttention

OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.5),
    "adamw-foreach": lambda ps: torch.optim.AdamW(ps, lr=0.05, foreach=True),
    # fused AdamW (what the trainer uses on CUDA) updates in place without bumping version counters: a memo
    # keyed on versions returned the step-0 weights at every later validation (issue 19, paper grid on a GPU).
    "adamw-fused": lambda ps: torch.optim.AdamW(ps, lr=0.05, fused=True),
}


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
        attn.set_blocks({"pass": torch.randperm(48)[None], "out": torch.randperm(48)[None]})
    elif blocks == "permuted-by-load":
        other = make_model(attention="canonical", n_head=1)
        other.attention_layers[0].set_blocks({"pass": torch.randperm(48)[None], "out": torch.randperm(48)[None]})
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


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("heads", [1, 4])
def test_canonical_evaluation_follows_in_place_weight_updates(heads, opt_name):
    """Evaluation (no_grad, eval mode) after an in-place update (an optimizer step, a copy_) must match a
    freshly built model, never stale assembled weights."""

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


@pytest.mark.parametrize("halves", ["both", "qk", "vo"])
@pytest.mark.parametrize("heads", [1, 2])
def test_a_memoised_weight_follows_a_change_of_any_source(halves, heads):
    """Inside `frozen_weights` the memo is keyed by every tensor the fused weights come from: a change of any
    of them, in place (bumps its version) or by new storage (`.data =`, as `.to()` does), must give the
    same output as a model never memoised."""
    from iattention.attention.base import frozen_weights

    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=1, n_head=heads, n_embd=8, vocab_size=20, block_size=8, attention="canonical",
                    canonical_halves=halves)
    model = GPT(cfg).eval()
    x = torch.randint(0, 20, (1, 5), generator=torch.Generator().manual_seed(1))
    attn = model.transformer.h[0].attn
    with torch.no_grad(), frozen_weights(model):
        for name, p in attn.named_parameters():
            for change in ("in place", "new storage"):
                model(x)  # memoise
                if change == "in place":
                    p.add_(torch.randn_like(p))
                else:
                    p.data = p.detach() + torch.randn_like(p)
                fresh = GPT(cfg).eval()
                fresh.load_state_dict(model.state_dict())
                assert torch.allclose(model(x)[0], fresh(x)[0], atol=1e-6), (name, change)


def test_gpt2_init_scales_canonicals_output_projection_like_a_residual_one():
    """GPT-2 init in canonical form: the learned rows of W_O (into the residual stream) are N(0, 0.02 /
    sqrt(2 L)), every other learned matrix N(0, 0.02); measured as sample stds of wide matrices."""
    torch.manual_seed(0)
    n_layer = 8
    model = GPT(GPTConfig(n_layer=n_layer, n_head=2, n_embd=256, vocab_size=64, block_size=8,
                          attention="canonical"))
    attn = model.transformer.h[0].attn
    assert abs(attn.W_O_free.std().item() / (0.02 / (2 * n_layer) ** 0.5) - 1) < 0.05
    for name in ("W_Q", "W_V", "W_K_free"):
        assert abs(getattr(attn, name).std().item() / 0.02 - 1) < 0.05, name


@pytest.mark.parametrize("family", ["llama", "gpt_neox", "gpt2"])
def test_init_normal_leaves_canonicals_output_map_unscaled_like_standards(family):
    """init=normal (the Llama family's and GPT-NeoX's default; GPT-2's when asked) scales no residual projection:
    canonical's learned W_O entries are N(0, 0.02) like standard's output projection, not 0.02 / sqrt(2 L)."""
    kw = dict(family=family, n_layer=8, n_head=2, n_embd=256, vocab_size=64, block_size=8, init="normal")
    stds = {}
    for attention in ("standard", "canonical"):
        torch.manual_seed(0)
        attn = GPT(GPTConfig(**kw, attention=attention)).transformer.h[0].attn
        out = attn.W_O_free if attention == "canonical" else next(
            m for m in attn.modules() if getattr(m, "residual_scale", False)).weight
        stds[attention] = out.std().item()
    assert abs(stds["standard"] / 0.02 - 1) < 0.05 and abs(stds["canonical"] / 0.02 - 1) < 0.05, stds


@pytest.mark.parametrize("halves", ["both", "qk", "vo"])
@pytest.mark.parametrize("heads", [1, 2])
def test_projection_flops_is_what_the_layer_runs(halves, heads):
    """bench/flops.py's attention term, against torch's FLOP counter on a built layer: at one head a canonical
    half is an index copy (no GEMM), with more heads the full matrices are assembled and every GEMM runs."""
    from helpers import measured_projection_flops

    cfg = GPTConfig(n_layer=1, n_head=heads, n_embd=8, vocab_size=20, block_size=8, attention="canonical",
                    canonical_halves=halves)
    d = cfg.n_embd
    gemms = 4 if heads > 1 else {"both": 2, "qk": 3, "vo": 3}[halves]  # d x d GEMMs: of Q, K, V, O
    assert measured_projection_flops(CanonicalAttention(cfg)) == 2 * gemms * d * d
    assert CanonicalAttention.projection_flops(cfg) == 2 * gemms * d * d


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_the_identity_blocks_take_the_models_dtype(dtype):
    """A canonical model cast to another dtype assembles W_K and W_O in that dtype (the identity block too),
    so its forward runs and its math form holds exact identity blocks of that dtype."""
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=8, vocab_size=20, block_size=8, attention="canonical")
    model = GPT(cfg).to(dtype).eval()
    attn = model.transformer.h[0].attn
    hw = attn.to_heads()
    assert hw.W_K.dtype == hw.W_O.dtype == dtype
    r = cfg.d_head
    for h in range(cfg.n_head):
        assert torch.equal(hw.W_K[h][attn.k_perm[h, :r]], torch.eye(r, dtype=dtype))
        assert torch.equal(hw.W_O[h][:, attn.o_perm[h, :r]], torch.eye(r, dtype=dtype))
    x = torch.randint(0, 20, (1, 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(x)[0]
    assert logits.dtype == dtype and torch.isfinite(logits).all()


def test_the_identity_blocks_are_built_on_the_layers_device():
    """The assembled W_K and W_O live where the learned rows do. The meta device stands in for an
    accelerator here: an identity block made on the CPU cannot be joined to rows on another device."""
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=8, vocab_size=20, block_size=8, attention="canonical")
    attn = CanonicalAttention(cfg).to("meta")
    hw = attn.to_heads()
    assert hw.W_K.device.type == hw.W_O.device.type == "meta"
    assert hw.W_K.shape == (2, 8, 4) and hw.W_O.shape == (2, 4, 8)


@pytest.mark.parametrize("heads", [1, 2])
def test_gradients_inside_frozen_weights_reach_every_learned_tensor(heads):
    """`frozen_weights` memoises only what needs no gradient: a forward with gradients enabled inside it
    builds the weights from the parameters, and backward gives the same gradients as outside it."""
    from iattention.attention.base import frozen_weights

    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=1, n_head=heads, n_embd=8, vocab_size=20, block_size=8, attention="canonical")
    model = GPT(cfg).double().eval()
    x = torch.randint(0, 20, (1, 6), generator=torch.Generator().manual_seed(1))
    model(x, x)[1].backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert {"transformer.h.0.attn.W_Q", "transformer.h.0.attn.W_V"} <= set(want)
    model.zero_grad(set_to_none=True)
    with frozen_weights(model):
        model(x, x)[1].backward()
    got = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert set(got) == set(want)
    for n, g in got.items():
        assert torch.allclose(g, want[n], rtol=1e-12, atol=1e-15), n


@pytest.mark.parametrize("change", ["in place", "new storage"])
@pytest.mark.parametrize("perm", ["k_perm", "o_perm"])
def test_a_memoised_weight_follows_a_new_block_choice(perm, change):
    """The memo inside `frozen_weights` is keyed by the block permutations too (buffers, not parameters): a
    new choice of identity rows (set_blocks, in place) or a new permutation tensor changes the output."""
    from iattention.attention.base import frozen_weights

    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=8, vocab_size=20, block_size=8, attention="canonical")
    model = GPT(cfg).double().eval()
    with torch.no_grad():  # the same free rows under another block choice give another W_K / W_O
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    attn = model.transformer.h[0].attn
    x = torch.randint(0, 20, (1, 5), generator=torch.Generator().manual_seed(1))
    rows = torch.tensor([[7, 1, 2, 0], [3, 4, 6, 5]])
    with torch.no_grad(), frozen_weights(model):
        before = model(x)[0]  # memoise
        if change == "in place":
            kept = {"pass": attn.k_perm[:, :4].clone(), "out": attn.o_perm[:, :4].clone()}  # r = 4
            attn.set_blocks({**kept, ("pass" if perm == "k_perm" else "out"): rows})
        else:
            from iattention.attention.canonical import block_permutation
            setattr(attn, perm, block_permutation(rows, cfg.n_embd))
        fresh = GPT(cfg).double().eval()
        fresh.load_state_dict(model.state_dict())
        after = model(x)[0]
        assert not torch.allclose(after, before)
        assert torch.allclose(after, fresh(x)[0], rtol=1e-12, atol=1e-12)


def test_the_aligned_one_head_key_map_copies_nothing():
    """At one head with the aligned block (the default) the keys are x itself plus b_K: no index copy runs,
    while a permuted block does run one (its keys are a permutation of x)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    cfg = GPTConfig(n_layer=1, n_head=1, n_embd=8, vocab_size=20, block_size=8, attention="canonical", bias=False)
    attn = CanonicalAttention(cfg)
    x = torch.randn(1, 3, 8)
    with torch.no_grad(), Ops() as ops:
        k = attn.qkv(x)[1]
    assert "index_select" not in ops.names and k is x
    attn.set_blocks({"pass": torch.tensor([[1, 0, 2, 3, 4, 5, 6, 7]]), "out": attn.o_perm[:, :8]})
    with torch.no_grad(), Ops() as ops:
        k = attn.qkv(x)[1]
    assert "index_select" in ops.names and torch.equal(k, x[..., [1, 0, 2, 3, 4, 5, 6, 7]])


def test_block_permutation_puts_the_block_first_and_refuses_bad_indices_in_one_message():
    from iattention.attention.canonical import block_permutation

    perm = block_permutation(torch.tensor([[2, 0], [1, 3]]), 4)
    assert perm.tolist() == [[2, 0, 1, 3], [1, 3, 0, 2]] and perm.dtype == torch.long
    for sel in ([1, 1], [0, 4], [-1, 2]):  # a repeated index (in range), one past the end, a negative one
        with pytest.raises(ValueError) as err:
            block_permutation(torch.tensor([sel]), 4)
        tells(err, "2 distinct", "[0, 4)", str(sel))


def test_one_head_without_biases_projects_out_through_its_permutation_alone():
    """canonical at one head skips the output GEMM (W_O is a permutation); without biases there is no b_O to add."""
    from iattention.attention.registry import build_attention

    layer = build_attention(GPTConfig(n_layer=1, n_head=1, n_embd=6, vocab_size=16, block_size=8, bias=False,
                                      attention="canonical"))
    y = torch.randn(2, 3, 6)
    assert layer.b_O is None and torch.equal(layer.project_out(y), y)  # aligned block: the identity
