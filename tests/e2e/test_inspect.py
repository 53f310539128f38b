"""End-to-end tests: inspect."""

from pathlib import Path

import pytest
import torch

from helpers import tiny_overrides, write_corpus
from iattention.utils.outputs import WRITTEN


@pytest.mark.slow
def test_iattn_inspect_writes_patterns_spectra_and_table(tmp_path, capsys):
    from iattention.cli import main

    ov = tiny_overrides(write_corpus(tmp_path), tmp_path / "cache", **{"train.epochs": 1})
    for attention in ("standard", "canonical"):
        assert main(["train", "--preset", "tiny", "--out", str(tmp_path / attention), "--quiet", *ov,
                     f"model.attention={attention}"]) == 0
    out = tmp_path / "inspect"
    assert main(["inspect", str(tmp_path / "standard"), str(tmp_path / "canonical"), "--prompt", "the cat sat",
                 "--out", str(out)]) == 0
    for name in ("standard-attention.png", "canonical-attention.png", "spectra.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    table = (out / "spectra.md").read_text()
    assert "| standard (standard, 2 heads) | 0 |" in table and "| canonical (canonical, 2 heads) | 0 |" in table
    # A prompt far longer than the block size: cut to it with a notice, and a title that keeps the figure
    # readable (a 600-character prompt once made a 4704-pixel-wide figure).
    import matplotlib.image

    capsys.readouterr()
    long_prompt = "the cat sat on the mat and then the dog ran to the park. " * 11
    assert main(["inspect", str(tmp_path / "standard"), "--prompt", long_prompt, "--out", str(tmp_path / "long")]) == 0
    err = capsys.readouterr().err
    assert f"the prompt has {len(long_prompt)} tokens" in err and "first 32 tokens are inspected" in err
    height, width = matplotlib.image.imread(tmp_path / "long" / "standard-attention.png").shape[:2]
    assert width < 1200 and height < 1200


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


def test_runs_whose_folders_share_a_name_get_distinct_files_and_rows(tmp_path):
    """a/r and b/r: each its own canonical file and figure (named with the folder that tells them apart), and
    spectra.md rows that differ; two runs' checkpoints of one name likewise."""
    from safetensors.torch import load_file

    from iattention.cli import main
    from iattention.model.activations import canonical_view

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    model_a, run_a = _run(tmp_path / "a", "r", "canonical")
    model_b, run_b = _run(tmp_path / "b", "r", "canonical", n_head=2)
    out = tmp_path / "out"
    assert main(["inspect", run_a, run_b, "--prompt", "the cat", "--out", str(out), "--canonical"]) == 0
    for name, model in (("a-r", model_a), ("b-r", model_b)):
        got = load_file(str(out / f"{name}-canonical.safetensors"))
        assert torch.equal(got["0.attn.canonical.W_QK"], canonical_view(model)["blocks.0.attn.canonical.W_QK"])
        assert (out / f"{name}-attention.png").exists()
    table = (out / "spectra.md").read_text()
    assert "| a-r (canonical, 3 heads) | 0 |" in table and "| b-r (canonical, 2 heads) | 0 |" in table


def test_one_run_given_twice_is_refused_before_writing(tmp_path, capsys):
    from helpers import one_line_error
    from iattention.cli import main

    _, run = _run(tmp_path, "canon", "canonical")
    rc = main(["inspect", run, str(Path(run) / ".." / "canon"), "--prompt", "the", "--out", str(tmp_path / "out")])
    one_line_error(capsys, rc, run, "canon-attention.png", "give each run once")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("order", [pytest.param("standard-first", marks=pytest.mark.slow), "canonical-first"])
def test_inspect_canonical_of_a_standard_and_a_canonical_run_writes_the_canonical_one_s_view(tmp_path, capsys, order):
    """The side-by-side example with --canonical: the canonical run's view, both runs' patterns and spectra,
    and one line naming the run that has no view; the order of the runs does not matter."""
    from safetensors.torch import load_file

    from iattention.cli import main
    from iattention.model.activations import canonical_view

    _, std = _run(tmp_path, "std", "standard")
    model, canon = _run(tmp_path, "canon", "canonical")
    runs = [std, canon] if order == "standard-first" else [canon, std]
    out = tmp_path / "out"
    assert main(["inspect", *runs, "--prompt", "the cat", "--out", str(out), "--canonical"]) == 0
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if "canonical view" in line]
    assert len(notes) == 1 and std in notes[0] and "standard" in notes[0] and canon not in notes[0], err
    got = load_file(str(out / "canon-canonical.safetensors"))
    assert torch.equal(got["1.attn.canonical.W_QK"], canonical_view(model)["blocks.1.attn.canonical.W_QK"])
    assert sorted(set(p.name for p in out.iterdir()) - {WRITTEN}) == [
        "canon-attention.png", "canon-canonical.safetensors", "spectra.md", "spectra.png", "std-attention.png"]


def test_inspect_canonical_of_runs_none_of_which_is_canonical_writes_nothing(tmp_path, capsys):
    from helpers import one_line_error
    from iattention.cli import main

    (tmp_path / "x").mkdir()
    _, std = _run(tmp_path, "std", "standard")
    _, other = _run(tmp_path / "x", "std", "standard")
    rc = main(["inspect", std, other, "--prompt", "the cat", "--out", str(tmp_path / "out"), "--canonical"])
    one_line_error(capsys, rc, "no canonical view", "convert --to canonical")
    assert not (tmp_path / "out").exists()


def test_inspect_reads_a_llama_family_run_beside_a_gpt2_one(tmp_path, capsys):
    """Patterns and spectra of a Llama-family run (GQA, RoPE) beside a GPT-2 run: its figure, its spectra.md
    rows (one per layer, its query heads' spectra), and with --canonical its canonical view as GPT-2's (the two-family
    layout had none for a Llama: one line said so)."""
    from safetensors.torch import load_file

    from helpers import make_llama
    from iattention.cli import main
    from iattention.interop.convert import convert, save_converted
    from iattention.model.activations import canonical_view, run_with_cache
    from iattention.symmetry.spectra import head_spectra

    llama, rep = convert(make_llama(dtype=torch.float32, vocab_size=300, n_kv_head=2), "canonical", dtype="float32")
    save_converted(llama, tmp_path / "llama", "canonical", rep, source="x", data={"tokenizer": "byte"})
    model, gpt = _run(tmp_path, "gpt", "canonical")
    out = tmp_path / "out"
    assert main(["inspect", gpt, str(tmp_path / "llama"), "--prompt", "the cat", "--out", str(out), "--canonical"]) == 0
    err = capsys.readouterr().err
    assert "no canonical view" not in err, err
    assert sorted(set(p.name for p in out.iterdir()) - {WRITTEN}) == ["gpt-attention.png", "gpt-canonical.safetensors",
                                                      "llama-attention.png", "llama-canonical.safetensors",
                                                      "spectra.md", "spectra.png"]
    got = load_file(str(out / "llama-canonical.safetensors"))
    assert torch.equal(got["1.attn.canonical.W_QK"], canonical_view(llama)["blocks.1.attn.canonical.W_QK"])
    table = (out / "spectra.md").read_text()
    top = head_spectra(llama.attention_layers[1].to_heads())["qk"][:, 0].mean()
    assert f"| llama (canonical, 4 heads, 2 key/value heads) | 1 | {top:.3g} |" in table, table
    ids = torch.tensor([list(b"the cat")])
    assert run_with_cache(llama, ids)[1]["blocks.1.attn.hook_pattern"].shape == (1, 4, 7, 7)


def test_inspect_rewrites_its_own_files_and_never_a_user_s(tmp_path, capsys):
    """Run again into the same --out, inspect rewrites the files it wrote there; a file of the same name it did
    not write (a user's spectra.md, say) was silently replaced: now one line, before anything is written, and the
    user's file as it was. iattn lab --out keeps the same rule."""
    from helpers import one_line_error
    from iattention.cli import main

    _, run = _run(tmp_path, "std", "standard")
    out = tmp_path / "out"
    for _ in range(2):
        assert main(["inspect", run, "--prompt", "the cat", "--out", str(out)]) == 0
    assert set((out / WRITTEN).read_text().split()) == {"std-attention.png", "spectra.png", "spectra.md"}
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "spectra.md").write_text("MY NOTES")
    one_line_error(capsys, main(["inspect", run, "--prompt", "the cat", "--out", str(mine)]),
                   "spectra.md", "not a file iattention wrote", "choose another --out")
    assert sorted(p.name for p in mine.iterdir()) == ["spectra.md"] and (mine / "spectra.md").read_text() == "MY NOTES"
    (mine / "copy.png").write_text("MY FIGURE")
    one_line_error(capsys, main(["lab", "copy", "--out", str(mine)]), "copy.png", "not a file iattention wrote")
    assert (mine / "copy.png").read_text() == "MY FIGURE"
    # a folder an older iattention wrote has no list: its own outputs are known by their content (inspect's
    # spectra.md, lab's NAME.json record): docs/lab, `iattn lab all --out docs/lab`, runs again
    (out / WRITTEN).unlink()
    assert main(["inspect", run, "--prompt", "the cat", "--out", str(out)]) == 0
    import shutil

    docs_lab = tmp_path / "docs-lab"
    shutil.copytree(Path(__file__).parents[2] / "docs" / "lab", docs_lab)
    (docs_lab / WRITTEN).unlink()  # as it was before its list was committed
    assert main(["lab", "copy", "--out", str(docs_lab)]) == 0
    assert "copy.png" in (docs_lab / WRITTEN).read_text().split()


def test_inspect_reads_a_folder_that_names_no_tokenizer_with_the_one_given(tmp_path, capsys):
    """A converted folder without a tokenizer: the refusal named a Python keyword (load_run(..., tokenizer=SPEC))
    and inspect had no such option; now it names --tokenizer, which inspect takes, as eval and generate do."""
    from helpers import make_model, one_line_error
    from iattention.cli import main
    from iattention.interop.convert import convert, save_converted

    model, rep = convert(make_model(dtype=torch.float32, n_head=2), "canonical", dtype="float32")
    save_converted(model, tmp_path / "bare", "canonical", rep, source="x")
    argv = ["inspect", str(tmp_path / "bare"), "--prompt", "the cat", "--out", str(tmp_path / "out")]
    one_line_error(capsys, main(argv), "--tokenizer")
    assert main([*argv, "--tokenizer", "byte"]) == 0
    assert (tmp_path / "out" / "bare-attention.png").is_file()
