"""Made at commit 4507a6a (the last with two checkpoint layouts): folders the streaming converter wrote under their
source family's transformers names (`model/model.layers.0.self_attn.q_proj.weight`), one Qwen2 folder converted to
canonical in one file and one GPT-NeoX folder converted to standard in two shards, with the float64 logits each gave
on fixed tokens (logits.safetensors), so that later loaders (whole and streamed) are tested against them.
Run from the repository root: PYTHONPATH=src python tests/fixtures_data/streamed_layout/make.py OUT"""
import sys
from pathlib import Path

import torch
import transformers as tf
from safetensors.torch import save_file

from iattention.interop.load import load_model
from iattention.interop.stream import hf_to_ours

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
work = out / "hf"
torch.manual_seed(0)
sources = {
    "qwen2-canonical": (tf.Qwen2ForCausalLM(tf.Qwen2Config(
        vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32, bos_token_id=1, eos_token_id=2)), "canonical", 10**9),
    "gpt_neox-standard": (tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(
        vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=32, rotary_pct=0.5)), "standard", 6000),
}
tokens = torch.randint(0, 40, (2, 12))
logits = {"tokens": tokens}
for name, (model, to, shard) in sources.items():
    with torch.no_grad():  # logits far from uniform
        for p in model.parameters():
            p.copy_(torch.randn(p.shape) / p.shape[-1] ** 0.5 if p.dim() > 1 else 1 + 0.3 * torch.randn(p.shape))
    model.save_pretrained(str(work / name))
    hf_to_ours(work / name, out / name, to, shard_bytes=shard, say=lambda *_: None)
    ours, _ = load_model(out / name)
    with torch.no_grad():
        logits[name] = ours.double()(tokens)[0]
save_file({k: v.contiguous() for k, v in logits.items()}, str(out / "logits.safetensors"))
for p in sorted(work.rglob("*"), reverse=True):
    p.unlink() if p.is_file() else p.rmdir()
work.rmdir()
print(sorted(str(p.relative_to(out)) for p in out.rglob("*")))
