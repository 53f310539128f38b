"""Unit tests of iattention.lab.trained_attention."""

import pytest
import torch


def test_head_colours_differ_for_every_head():
    from iattention.lab.trained_attention import head_colors

    for n in (1, 4, 12, 25):
        assert len({tuple(c) for c in head_colors(n)}) == n


def _run(tmp_path, name, attention, n_head=3):
    """A run folder `load_run` reads (weights, config, a byte tokenizer) of the given attention."""
    from helpers import make_model
    from iattention.interop.convert import convert, save_converted

    model, rep = convert(make_model(dtype=torch.float32, n_head=n_head), attention, dtype="float32")
    save_converted(model, tmp_path / name, attention, rep, source="x", data={"tokenizer": "byte"})
    return model, str(tmp_path / name)


@pytest.mark.parametrize("n_head", [3, 1])  # one head: W is W_QK[0], saved as its own tensor
def test_inspect_canonical_writes_each_head_s_canonical_view_by_name(tmp_path, n_head):
    from safetensors.torch import load_file

    from iattention.cli import main
    from iattention.model.activations import canonical_view

    model, run = _run(tmp_path, "canon", "canonical", n_head)
    assert main(["inspect", run, "--prompt", "the cat", "--out", str(tmp_path / "out"), "--canonical"]) == 0
    got = load_file(str(tmp_path / "out" / "canon-canonical.safetensors"))
    want = canonical_view(model)
    assert sorted(got) == sorted(k[len("blocks."):] for k in want)
    for key, t in want.items():
        assert torch.equal(got[key[len("blocks."):]], t), key
    assert {"0.attn.canonical.W_K_fixed", "0.attn.canonical.W_K_learned", "1.attn.canonical.W_O_fixed",
            "1.attn.canonical.W_QK", "0.attn.canonical.W_Q", "0.attn.canonical.W_V"} <= set(got)
    assert ("0.attn.canonical.W" in got) == (n_head == 1)


def test_inspect_canonical_of_a_standard_run_is_a_one_line_error(tmp_path, capsys):
    from helpers import one_line_error
    from iattention.cli import main

    _, run = _run(tmp_path, "std", "standard")
    rc = main(["inspect", run, "--prompt", "the cat", "--out", str(tmp_path / "out"), "--canonical"])
    one_line_error(capsys, rc, "no canonical view", "convert --to canonical")
    assert not (tmp_path / "out").exists()
