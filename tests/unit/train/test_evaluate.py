"""Unit tests of iattention.train.evaluate."""

import io
import math

import numpy as np
import pytest
import torch

from fixtures import byte_tokenizer
from helpers import make_model
from iattention import GPT, GPTConfig
from iattention.data.dataset import scored_text
from iattention.train.distributed import DistContext
from iattention.train.evaluate import per_unit, split_nll, strided_nll


def test_a_uniform_model_gives_eight_bits_per_byte_and_a_hand_computed_word_perplexity():
    """All weights zero: logits are 0, every byte costs ln 256 nats, so bits per byte = 8, byte perplexity
    = 256, and word perplexity = 256 ** (bytes / words), counted by hand on the literal text."""
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, vocab_size=256, block_size=8)).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    tok = byte_tokenizer()
    source = "the cat sat on the mat .\n a dog ran\n"  # 36 bytes; 35 predicted: "he cat ... ran\n"
    ids = tok.encode(source)
    nll, n = split_nll(model, ids, 8, 4, DistContext())  # 5 windows, the last one partial (float32 NLL)
    assert n == 35 and nll == pytest.approx(35 * math.log(256), rel=1e-6)
    m = per_unit(nll, scored_text(tok, ids), scored=n)
    words = 11  # 'he' 'cat' 'sat' 'on' 'the' 'mat' '.' 'a' 'dog' 'ran' ''
    assert m["bits_per_byte"] == pytest.approx(8.0, rel=1e-6)
    assert m["byte_ppl"] == pytest.approx(256.0, rel=1e-5)
    assert m["word_ppl"] == pytest.approx(256.0 ** (35 / words), rel=1e-5)
    assert per_unit(nll, scored_text(tok, ids), scored=n - 1) is None  # not every token scored: no figures


def _by_hand(model, tokens, block, stride):
    """Sliding-window NLL one token at a time: token j (j >= 1) is scored once, by the first window (windows
    start at 0, stride, 2 * stride, ... and hold block tokens) that reaches past it, with that window's
    tokens before it as context; a token that is its window's first has no context there and is unscored."""
    total, count = 0.0, 0
    for j in range(1, len(tokens)):
        begin = 0
        while begin + block <= j:
            begin += stride
        if begin == j:
            continue
        ctx = torch.tensor(tokens[begin:j], dtype=torch.long)[None]
        logits, _ = model(ctx)
        total -= torch.log_softmax(logits[0, -1].double(), -1)[int(tokens[j])].item()
        count += 1
    return total, count


@pytest.mark.parametrize("n, block, stride", [(23, 8, 3), (23, 8, 8), (17, 6, 4), (9, 16, 5), (25, 8, 1)])
def test_strided_nll_is_the_sum_over_tokens_each_scored_once(n, block, stride):
    model = make_model(dtype=torch.float64, block_size=16)
    tokens = np.random.default_rng(n + stride).integers(0, 97, n)
    want, want_count = _by_hand(model, tokens, block, stride)
    got, count = strided_nll(model, tokens, block, stride, batch_size=2)
    assert count == want_count
    if stride < block:
        assert count == n - 1  # every token after the first, once
    assert got == pytest.approx(want, rel=1e-5)  # float32 cross-entropy inside strided_nll


class _Terminal(io.StringIO):
    """A text stream that says it is a terminal (tqdm draws its bar only on one)."""

    def isatty(self) -> bool:
        return True


def _zero_model(block: int = 8):
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, vocab_size=256, block_size=block)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    return model


@pytest.mark.parametrize("strided", [False, True])
def test_an_evaluation_shows_windows_scored_of_windows_a_bar_on_a_terminal_one_line_elsewhere(
        strided, monkeypatch, capsys):
    """36 bytes in windows of 8: 5 non-overlapping windows, or 8 strided ones (stride 4, the last starting at
    28). Not on a terminal (capsys): exactly one line naming the pass and its windows; on one: tqdm's bar
    (windows of the total, rate and ETA; leave=False clears it when done); no
    description: silent."""
    ids = byte_tokenizer().encode("the cat sat on the mat .\n a dog ran\n")
    model, n = _zero_model(), 8 if strided else 5

    def run(progress):
        if strided:
            return strided_nll(model, ids, 8, 4, 2, progress=progress)
        return split_nll(model, ids, 8, 2, DistContext(), progress=progress)

    run(None)
    assert capsys.readouterr().err == ""
    run("eval test")
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"eval test: {n}/{n} windows in "), err
    term = _Terminal()
    monkeypatch.setattr("sys.stderr", term)
    run("eval test")
    shown = term.getvalue()
    assert shown.startswith("\reval test:") and f"/{n} [" in shown and "win/s]" in shown, shown  # count, ETA
    assert "windows in" not in shown  # the bar, not the line


def test_an_evaluation_not_on_a_terminal_prints_a_line_per_tenth_at_the_rate_allowed(monkeypatch):
    """Output to a file or pipe (a StringIO: no terminal): a long pass shows progress lines, not only its last:
    one per tenth of the windows when the least interval allows (0 s here), none between when it does not
    (an hour), and then its final line either way."""
    import io

    from iattention.utils import progress

    for interval, want in ((0.0, 9), (3600.0, 0)):
        monkeypatch.setattr(progress, "LINE_INTERVAL_S", interval)
        out = io.StringIO()
        with progress.EvalProgress("eval valid", 100, file=out) as bar:
            for _ in range(50):
                bar.update(2)
        lines = out.getvalue().splitlines()
        assert [x.split(" windows")[0] for x in lines[:-1]] == [f"eval valid: {10 * i}/100" for i in range(1, want + 1)]
        assert lines[-1].startswith("eval valid: 100/100 windows in ") and len(lines) == want + 1


def test_progress_lines_to_a_file_keep_their_least_interval_after_the_first(monkeypatch):
    """Each progress line waits LINE_INTERVAL_S after the one before it, the second and later ones too (not only
    after the start of the pass): on a clock the test moves, tenths done at 31 s and 32 s give one line, at 62 s
    another, at 63 s none."""
    import io

    from iattention.utils import progress

    clock = [0.0]
    monkeypatch.setattr(progress.time, "time", lambda: clock[0])
    monkeypatch.setattr(progress, "LINE_INTERVAL_S", 30.0)
    out = io.StringIO()
    lines = progress.LineProgress("eval valid", 100, "windows", out)
    for at, done in ((31.0, 10), (32.0, 20), (33.0, 30), (62.0, 40), (63.0, 50), (64.0, 60), (93.5, 70)):
        clock[0] = at
        lines.update(done)
    said = [x.split(" windows")[0] for x in out.getvalue().splitlines()]
    assert said == ["eval valid: 10/100", "eval valid: 40/100", "eval valid: 70/100"], said
