"""A Phi-3 model trained from scratch (`--preset tiny` with `model.family=phi3`): its fused qkv_proj and gate_up_proj
as our c_attn and gate_up_proj, greedy generation with the full and the K-only cache, `iattn inspect`, and an export
that transformers' Phi3ForCausalLM loads with our logits."""

import pytest
import torch

from helpers import max_rel, tiny_overrides, write_corpus
from iattention.cli import main
from iattention.interop.load import load_model
from iattention.train.trainer import load_run_config

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("phi3")
    ov = tiny_overrides(write_corpus(root), root / "cache", **{"train.epochs": 1}) + \
        ["model.family=phi3", "model.mlp_hidden=48"]
    out = root / "run"
    assert main(["train", "--preset", "tiny", "--quiet", "--out", str(out), *ov]) == 0
    return root, out


def test_a_phi3_run_trains_with_fused_projections(run):
    _, out = run
    cfg = load_run_config(out).model
    assert (cfg.family, cfg.projection, cfg.fused_gate_up, cfg.n_kv_head) == ("phi3", "fused", True, 2)
    model, _ = load_model(out)
    names = set(model.state_dict())
    assert {"transformer.h.0.attn.c_attn.weight", "transformer.h.0.mlp.gate_up_proj.weight"} <= names


def test_generate_with_either_cache_and_inspect(run, capsys):
    root, out = run
    texts = []
    for cache in ("full", "k-only"):
        assert main(["generate", str(out), "--prompt", "the cat", "--temperature", "0", "--max-new-tokens", "12",
                     "--cache", cache]) == 0
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1] and texts[0].strip()
    assert main(["inspect", str(out), "--prompt", "the cat sat", "--out", str(root / "inspect")]) == 0
    assert (root / "inspect" / "run-attention.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_export_loads_in_transformers_with_our_logits(run):
    root, out = run
    assert main(["convert", "--from", str(out), "--to", "hf", "--out", str(root / "hf")]) == 0
    hf = transformers.Phi3ForCausalLM.from_pretrained(str(root / "hf"), dtype=torch.float32).eval()
    ours, _ = load_model(out)
    x = torch.randint(0, 200, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert max_rel(hf(x).logits[..., : ours.config.vocab_size], ours(x)[0]) <= 1e-5
