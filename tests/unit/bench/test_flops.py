"""Unit tests of iattention.bench.flops."""

from iattention import GPT, GPTConfig
from iattention.bench.flops import executed_flops_per_token, nanogpt_flops_per_token


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
