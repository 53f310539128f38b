"""Made at commit 6cd6bb0 (before the one-family change): tiny checkpoints of each family/variant, and
the logits each gives on fixed tokens, so the loader of later layouts is tested against them."""
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from iattention.checkpoint.state import save_checkpoint
from iattention.config.llama import LlamaConfig
from iattention.config.model import GPTConfig
from iattention.model.gpt import GPT
from iattention.model.llama import Llama
from iattention.symmetry import grouped, transforms

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
torch.manual_seed(0)
idx = torch.randint(0, 32, (2, 12))
logits = {"tokens": idx}
gcfg = GPTConfig(n_layer=2, n_head=2, n_embd=16, vocab_size=32, block_size=16, vocab_pad_multiple=8)
std = GPT(gcfg).double()
transforms.random_gauge(std, seed=1)
models = {"gpt2-standard": std,
          "gpt2-canonical": transforms.canonicalize(std, block="pivoted"),
          "gpt2-canonical-vo-minimal": transforms.canonicalize(std, block="pivoted", halves="vo", minimal=True),
          "gpt2-identity_q": GPT(gcfg.replace(attention="identity_q")).double(),
          "gpt2-identity_ko": GPT(gcfg.replace(attention="identity_ko")).double()}
lcfg = LlamaConfig(n_layer=2, n_head=4, n_kv_head=2, n_embd=32, d_head=8, d_ff=48, vocab_size=32, block_size=16,
                   rot=4, qkv_bias=True, rope_theta=500.0)
lstd = Llama(lcfg).double()
grouped.random_gauge(lstd, seed=2)
models["llama-standard"] = lstd
models["llama-canonical"] = grouped.canonicalize(lstd, block="pivoted")
lt = Llama(lcfg.replace(tie_embeddings=True, family="qwen2", rot=8, qkv_bias=False, rope_layout="interleaved")).double()
models["qwen2-tied-standard"] = lt
for name, m in models.items():
    m.eval()
    with torch.no_grad():
        logits[name] = m(idx)[0]
    save_checkpoint(out / f"{name}.safetensors", m, {"config": {"model": m.config.to_dict()}})
save_file({k: v.contiguous() for k, v in logits.items()}, str(out / "logits.safetensors"))
print(sorted(p.name for p in out.iterdir()))
