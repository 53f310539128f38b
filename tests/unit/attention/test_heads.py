"""Unit tests of iattention.attention.heads."""

import torch

from iattention.attention.heads import eye_heads_in, eye_heads_out


def test_identity_heads_take_the_dtype_and_device_of_like():
    """I_d as per-head maps, made where `like` lives (identity_ko's W_K, W_O and identity_q's W_Q come from
    here). The meta device stands in for an accelerator: no GPU is needed to see a CPU tensor come back."""
    for like in (torch.zeros(1, dtype=torch.bfloat16), torch.empty(0, device="meta", dtype=torch.float64)):
        w_in, w_out = eye_heads_in(6, 2, like), eye_heads_out(6, 2, like)
        assert w_in.shape == (2, 6, 3) and w_out.shape == (2, 3, 6)
        for w in (w_in, w_out):
            assert (w.dtype, w.device) == (like.dtype, like.device)
    w_in, w_out = eye_heads_in(6, 2, torch.zeros(1)), eye_heads_out(6, 2, torch.zeros(1))
    for h in range(2):  # head h reads / writes coordinates [3 h, 3 h + 3)
        assert torch.equal(w_in[h], torch.eye(6)[:, 3 * h:3 * h + 3])
        assert torch.equal(w_out[h], torch.eye(6)[3 * h:3 * h + 3])
