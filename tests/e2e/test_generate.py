"""End-to-end: `iattn generate --cache k-only` prints what the full cache prints, and refuses where keys are
not the layer input (grouped queries)."""

import torch

from helpers import make_llama, make_model, one_line_error
from iattention.checkpoint.state import save_checkpoint
from iattention.cli.app import main


def _checkpoint(tmp_path, model):
    path = tmp_path / "m.safetensors"
    save_checkpoint(path, model, {"config": {"model": model.config.to_dict(), "data": {"tokenizer": "byte"}}})
    return str(path)


def test_iattn_generate_cache_k_only_prints_the_same_text(tmp_path, capsys):
    model = make_model(dtype=torch.float32, n_head=2, n_embd=32, vocab_size=256, block_size=32)
    path = _checkpoint(tmp_path, model)
    outs = []
    for cache in ("full", "k-only"):
        assert main(["generate", path, "--prompt", "The cat", "--max-new-tokens", "12", "--temperature", "0",
                     "--cache", cache]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and outs[0].startswith("The cat")


def test_iattn_generate_refuses_k_only_for_grouped_queries(tmp_path, capsys, monkeypatch):
    import iattention.cli.generate as cli_generate

    gqa = make_llama(dtype=torch.float32)  # 4 query heads, 2 KV heads of 8: 16 < 32 key dims per token
    monkeypatch.setattr(cli_generate, "load_any", lambda path: (gqa, None, {}))
    rc = main(["generate", str(tmp_path), "--prompt", "x", "--cache", "k-only"])
    one_line_error(capsys, rc, "K-only cache", "2 x 8 = 16 < 32")
    rc = main(["generate", str(tmp_path), "--prompt", "x", "--cache", "k-only", "--no-cache"])
    one_line_error(capsys, rc, "contradict")
