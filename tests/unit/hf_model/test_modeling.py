"""IAttentionForCausalLM as transformers uses it (issue 66 §2), on a GPT-2, a Llama (grouped-query) and a GPT-NeoX
shape, canonical and standard: left-padded batched greedy generation, gradient checkpointing, save_pretrained /
from_pretrained (one file and sharded), bf16 loading, the state dict iattention reads, the fixed blocks not being
parameters. Loading folders iattention writes, and comparing with `iattn` commands: tests/e2e/test_transformers.py."""

import warnings

import pytest
import torch

pytest.importorskip("transformers")

from iattention.checkpoint.beside import SHIM  # noqa: E402
from iattention.hf_model import IAttentionConfig, IAttentionForCausalLM  # noqa: E402
from iattention.interop.load import load_any  # noqa: E402
from iattention.model.gpt import GPT  # noqa: E402

# three families' shapes (the record's defaults give each its structure); Llama's with 2 key/value heads of 4
SHAPES = {"gpt2": dict(family="gpt2"), "llama": dict(family="llama", n_kv_head=2), "gpt_neox": dict(family="gpt_neox")}
CASES = [(fam, v) for fam in SHAPES for v in ("canonical", "standard")]


def hf_model(family: str, variant: str, dtype=torch.float32, **kw) -> IAttentionForCausalLM:
    """A random model of the family's shape, every bias and norm weight non-zero so that each matters."""
    torch.manual_seed(0)
    cfg = IAttentionConfig(**SHAPES[family], attention=variant, n_layer=2, n_head=4, n_embd=32, vocab_size=100,
                           block_size=64, **kw)
    model = IAttentionForCausalLM(cfg).to(dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.normal_(1.0 if name.endswith(".weight") else 0.0, 0.1)
    return model.eval()


def quiet(fn, *args, **kw):
    with warnings.catch_warnings():  # transformers' deprecation notes (gradient_checkpointing_enable's name)
        warnings.simplefilter("ignore")
        return fn(*args, **kw)


@pytest.mark.slow
@pytest.mark.parametrize("family,variant", CASES)
def test_left_padded_batched_greedy_equals_each_prompt_alone(family, variant):
    model = hf_model(family, variant)
    prompts = [torch.randint(1, 100, (n,), generator=torch.Generator().manual_seed(n)) for n in (3, 8, 5)]
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):], mask[i, width - len(p):] = p, 1
    batched = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0)
    for i, p in enumerate(prompts):
        alone = model.generate(input_ids=p[None], max_new_tokens=12, do_sample=False, pad_token_id=0)
        assert batched[i, width:].tolist() == alone[0, len(p):].tolist(), (family, variant, i)


@pytest.mark.parametrize("family,variant", CASES)
def test_left_padding_changes_no_real_position_s_logits(family, variant):
    """Each padded row's real positions get the logits of the row alone (float64, to rounding: the padded batch
    runs SDPA with a mask, the row alone a plain causal pass)."""
    model = hf_model(family, variant, torch.float64)
    ids = torch.randint(1, 100, (2, 9), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    batched = model(input_ids=ids, attention_mask=mask).logits
    alone = model(input_ids=ids[:1, 4:]).logits
    assert (batched[0, 4:] - alone[0]).abs().max() < 1e-12
    assert torch.equal(batched[1], model(input_ids=ids[1:]).logits[0]) or \
        (batched[1] - model(input_ids=ids[1:]).logits[0]).abs().max() < 1e-12


def saved_count() -> tuple[list, object]:
    saved = []
    return saved, torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t)


@pytest.mark.parametrize("family,variant", CASES)
def test_gradient_checkpointing_gives_the_same_gradients_and_keeps_fewer_activations(family, variant):
    model = hf_model(family, variant, torch.float64).train()
    x = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(4))

    def grads():
        model.zero_grad()
        saved, hooks = saved_count()
        with hooks:
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}, sum(saved)

    plain, kept_plain = grads()
    quiet(model.gradient_checkpointing_enable)
    checkpointed, kept = grads()
    assert kept < kept_plain  # the blocks' activations are recomputed in the backward, not kept
    assert max((plain[n] - checkpointed[n]).abs().max().item() for n in plain) == 0.0
    model.gradient_checkpointing_disable()
    assert grads()[1] == kept_plain


@pytest.mark.slow
@pytest.mark.parametrize("family,variant", CASES)
@pytest.mark.parametrize("shard", [None, "20KB"])
def test_save_pretrained_then_from_pretrained_is_bit_identical(tmp_path, family, variant, shard):
    model = hf_model(family, variant, torch.float64)
    model.save_pretrained(tmp_path, **({"max_shard_size": shard} if shard else {}))
    assert (tmp_path / SHIM).is_file() and len(list(tmp_path.glob("*.safetensors"))) == (1 if shard is None else
                                                                                          len(list(tmp_path.glob(
                                                                                              "model-*"))))
    back = quiet(IAttentionForCausalLM.from_pretrained, tmp_path).eval()
    assert back.dtype == torch.float64
    mine, theirs = model.state_dict(), back.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    x = torch.randint(0, 100, (2, 20), generator=torch.Generator().manual_seed(5))
    assert torch.equal(model(input_ids=x).logits, back(input_ids=x).logits)
    # the folder transformers wrote is read by iattention's loader (iattn eval, load_run) as the same model
    ours, _, _ = load_any(tmp_path)
    assert torch.equal(ours(x)[0], model(input_ids=x).logits)


@pytest.mark.parametrize("family", ["llama", "gpt_neox"])
def test_bf16_loading_keeps_the_rope_frequencies_exact(tmp_path, family):
    model = hf_model(family, "canonical")
    model.save_pretrained(tmp_path)
    half = quiet(IAttentionForCausalLM.from_pretrained, tmp_path, dtype=torch.bfloat16).eval()
    assert half.dtype == torch.bfloat16
    rope = half.transformer.rotary_emb
    assert rope.inv_freq.dtype == torch.float32 and torch.equal(rope.inv_freq, model.transformer.rotary_emb.inv_freq)
    x = torch.randint(0, 100, (1, 40), generator=torch.Generator().manual_seed(6))
    ours = GPT(model.gpt.config)
    ours.load_state_dict(model.gpt.state_dict())
    assert torch.equal(half(input_ids=x).logits, ours.to(torch.bfloat16).eval()(x)[0])


@pytest.mark.parametrize("family", SHAPES)
def test_the_fixed_blocks_are_no_parameters(family):
    """A canonical layer stores its learned entries as parameters and which rows/columns are fixed as integer buffers
    (saved, never trained): the parameters are standard's minus what canonical removes (attention/canonical.py)."""
    canonical, standard = hf_model(family, "canonical"), hf_model(family, "standard")
    fixed = [n for n, b in canonical.named_buffers() if n.endswith(("k_perm", "rot_perm", "o_perm"))]
    assert fixed and all(not b.is_floating_point() for n, b in canonical.named_buffers() if n in fixed)
    assert not any(n.endswith(("k_perm", "rot_perm", "o_perm")) for n, _ in canonical.named_parameters())
    assert set(fixed) <= set(canonical.state_dict())
    removed = type(canonical.gpt.attention_layers[0]).removed_params(canonical.gpt.config)
    assert standard.num_parameters() - canonical.num_parameters() == removed > 0
    assert canonical.num_parameters() == canonical.gpt.num_params()
