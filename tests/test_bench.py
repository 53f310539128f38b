"""Benchmark: runs on a tiny shape and writes valid JSON; FLOP counter vs hand count; compiled == eager."""

import json

import pytest
import torch

from iattention import GPT, GPTConfig
from iattention.attention.registry import variant_names
from iattention.bench.flops import executed_flops_per_token, nanogpt_flops_per_token
from iattention.cli import main


def test_bench_tiny_writes_json(tmp_path, capsys):
    out = tmp_path / "b.json"
    md = tmp_path / "B.md"
    code = main(["bench", "--preset", "tiny", "--heads", "1,2", "--windows", "1", "--steps", "1", "--rounds", "1",
                 "--json", str(out), "--markdown", str(md)])
    assert code == 0
    data = json.loads(out.read_text())
    rows = data["rows"]
    # the plan comes first (configurations x rounds), so a user knows what the minutes go to
    plan = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("plan:"))
    assert f"plan: {len(rows)} configurations × 1 rounds = {len(rows)} timings" in plan
    assert {(r["model"], r["attention"], r["n_head"]) for r in rows} >= {
        ("iattention", "standard", 1), ("iattention", "canonical", 1), ("iattention", "identity_q", 2),
        ("hf-gpt2", "standard", 2)}
    for r in rows:
        assert r["train_tokens_per_s"] > 0 and r["forward_tokens_per_s"] > 0
        assert "train_tokens_per_s_vs_standard" in r and "train_tokens_per_s_vs_hf" in r
    assert "| iattention | canonical | 1 |" in md.read_text()
    assert len(data["loadavg_before"]) == 3 and len(data["loadavg_after"]) == 3  # the machine's load, recorded
    from iattention.utils.hardware import device_name

    assert data["device_name"] == device_name(torch.device("cpu"))  # not "hf", the last comparison's name
    assert f"on {data['device_name']} (cpu" in md.read_text()
    gflops = [line.split("|")[10].strip() for line in md.read_text().splitlines() if line.startswith("| iattention")]
    assert len(set(gflops)) > 1, gflops  # significant digits: tiny variants' FLOPs are told apart
    main(["bench", "--preset", "tiny", "--heads", "2", "--windows", "1", "--steps", "1", "--rounds", "1",
          "--json", str(out), "--markdown", str(md), "--no-reference"])
    assert md.read_text().count("<!-- bench:cpu:tiny:eager -->") == 1  # the section is replaced, not added


def test_flop_counter_matches_hand_count():
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=8, vocab_size=60, block_size=4, vocab_pad_multiple=64)
    # per layer: QKV 2*8*24=384, out 2*8*8=128, scores+AV 4*4*8=128, MLP 2*8*32*2=1024 -> 1664; head 2*8*64=1024
    assert executed_flops_per_token(cfg, training=False) == 2 * 1664 + 1024
    assert executed_flops_per_token(cfg) == 3 * (2 * 1664 + 1024)
    one = cfg.replace(n_head=1, attention="canonical")  # no key GEMM, no output GEMM: QV 2*8*16=256
    assert executed_flops_per_token(one, training=False) == 2 * (256 + 128 + 1024) + 1024
    four = cfg.replace(n_head=2, attention="canonical")  # full matrices are built: same GEMMs as standard
    assert executed_flops_per_token(four) == executed_flops_per_token(cfg)
    iq = cfg.replace(attention="identity_q")  # KV 256 + out 128
    assert executed_flops_per_token(iq, training=False) == 2 * (384 + 128 + 1024) + 1024
    n = GPT(cfg).num_params() - 4 * 8
    assert nanogpt_flops_per_token(cfg) == 6 * n + 12 * 2 * 2 * 4 * 4


@pytest.mark.parametrize("attention", variant_names())
@pytest.mark.parametrize("heads", [1, 2])
def test_compiled_matches_eager(attention, heads):
    # Every case compiles GPT.forward anew; dynamo keeps one cache per code object, so without a reset the
    # cases pile up against its recompile limit (8) and a fifth registered variant failed this test.
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=heads, n_embd=16, vocab_size=50, block_size=8, attention=attention))
    x = torch.randint(0, 50, (2, 9))
    eager = model(x[:, :-1], x[:, 1:])[1]
    compiled = torch.compile(model, fullgraph=True)(x[:, :-1], x[:, 1:])[1]
    assert torch.allclose(eager, compiled, rtol=1e-4, atol=1e-5)


def test_generation_bench_writes_rows_for_cache_no_cache_and_hf(tmp_path, capsys):
    out, md = tmp_path / "g.json", tmp_path / "B.md"
    assert main(["bench", "--generate", "4", "--preset", "tiny", "--heads", "2", "--attention", "canonical",
                 "--rounds", "1", "--json", str(out), "--markdown", str(md)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert {(r["model"], r["attention"], r["kv_cache"]) for r in rows} == {
        ("iattention", "standard", True), ("iattention", "standard", False), ("hf-gpt2", "standard", True),
        ("iattention", "canonical", True), ("iattention", "canonical", False)}
    assert all(r["tokens_per_s"] > 0 and r["new_tokens"] == 4 for r in rows)
    assert "<!-- bench:generate:tiny -->" in md.read_text() and "| iattention | canonical | 2 | yes |" in md.read_text()


def test_bench_ratios_have_one_definition_and_a_huge_spread_is_flagged():
    from iattention.bench.runner import bench_ratio
    from iattention.bench.tables import table

    steady = bench_ratio([100.0, 105.0, 98.0], [50.0, 51.0, 49.0])  # 2.0, 2.059, 2.0
    assert steady["ratio"] == pytest.approx(2.0) and not steady["noisy"]
    wild = bench_ratio([100.0, 30.0, 200.0], [50.0, 100.0, 60.0])  # a busy machine: 2.0, 0.3, 3.33
    assert wild["ratio"] == pytest.approx(2.0) and wild["noisy"]
    row = dict(model="iattention", attention="canonical", n_head=4, params=10, train_tokens_per_s=110.0,
               forward_tokens_per_s=300.0, executed_flops_per_token=1e6,
               train_tokens_per_s_vs_standard=wild["ratio"], train_tokens_per_s_vs_standard_rounds=wild["rounds"],
               train_tokens_per_s_vs_standard_noisy=wild["noisy"],
               forward_tokens_per_s_vs_standard=steady["ratio"],
               forward_tokens_per_s_vs_standard_rounds=steady["rounds"],
               forward_tokens_per_s_vs_standard_noisy=steady["noisy"])
    text = table(dict(peak_bf16_tflops=None, rows=[row], loadavg_before=(3.5, 2.0, 1.0)))
    line = next(x for x in text.splitlines() if x.startswith("| iattention"))
    assert "| 2.000 [0.300, 3.333] **noisy** |" in line and "| 2.000 [2.000, 2.059] |" in line
    assert "1 ratio(s) marked **noisy**" in text and "Load average before the run: 3.50" in text


def test_bench_times_the_preset_model_as_trained():
    """The benchmarked shape keeps what changes the work of a step: the paper preset's dropout 0.1 too."""
    from iattention.bench.runner import bench_spec
    from iattention.config import model_preset

    shape = bench_spec("paper")["model"]
    want = model_preset("paper")
    assert shape["dropout"] == want.dropout == 0.1
    assert (shape["bias"], shape["mlp_hidden"]) == (want.bias, want.mlp_hidden)
