"""End-to-end tests: inspect."""

import pytest

from helpers import tiny_overrides, write_corpus


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
