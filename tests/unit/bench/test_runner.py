"""Unit tests of iattention.bench.runner."""

import pytest
import torch


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


@pytest.mark.parametrize("family,cls", [("gpt2", "GPT2LMHeadModel"), ("llama", "LlamaForCausalLM"),
                                        ("qwen2", "Qwen2ForCausalLM"), ("gpt_neox", "GPTNeoXForCausalLM")])
def test_the_reference_is_the_family_s_own_transformers_class_of_the_same_size(family, cls):
    """bench's HF reference for a model of any family: transformers' class of that family, as many parameters."""
    pytest.importorskip("transformers")
    from iattention.bench.runner import hf_reference, iattention_model
    from iattention.config.model import GPTConfig

    kw = dict(n_kv_head=2, mlp_hidden=48) if family in ("llama", "qwen2") else {}
    cfg = GPTConfig(family=family, n_layer=2, n_head=4, n_embd=32, vocab_size=64, block_size=16, **kw)
    ours, _ = iattention_model(cfg, torch.device("cpu"))
    ref, _ = hf_reference(cfg, torch.device("cpu"))
    assert type(ref).__name__ == cls
    assert sum(p.numel() for p in ref.parameters()) - (ref.config.vocab_size - 64) * 32 == ours.num_params()
