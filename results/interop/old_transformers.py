"""Load an `iattn convert --to hf` export with an old transformers (the oldest we support: 4.40) and
compare its logits with ours. Run it with that transformers first on the path, e.g.

    pip install --target /tmp/tf4lib "transformers==4.40.2"
    iattn convert --from runs/demo/canonical-h4-s0 --to hf --out /tmp/exp-can
    PYTHONPATH=/tmp/tf4lib .venv/bin/python results/interop/old_transformers.py /tmp/exp-can runs/demo/canonical-h4-s0

It prints the transformers version, the tokenizer class, end-of-text ids, the truncation at the block size,
the largest logit difference against our model on a WikiText-like sentence, and greedy text from both.
"""

import subprocess
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

export, run = sys.argv[1], sys.argv[2]
tok = AutoTokenizer.from_pretrained(export)
hf = AutoModelForCausalLM.from_pretrained(export).eval()
text = "The war began in the north , and the army moved south along the river ."
ids = tok(text, return_tensors="pt").input_ids
long = tok(text * 20, truncation=True, return_tensors="pt").input_ids
print(f"transformers {transformers.__version__}; {type(tok).__name__}; eos {tok.eos_token!r} = {tok.eos_token_id}, "
      f"bos = {tok.bos_token_id}, model eos = {hf.config.eos_token_id}; model_max_length {tok.model_max_length}, "
      f"a long text truncates to {long.shape[1]} tokens")
with torch.no_grad():
    hf_logits = hf(ids).logits[0]
    greedy = hf.generate(ids[:, :8], max_new_tokens=12, do_sample=False, pad_token_id=tok.eos_token_id)[0]
hf_text = tok.decode(greedy)
# our side in a clean process (our package, the run folder; the transformers on the path is not used by it)
ours = subprocess.run([sys.executable, "-c", f"""
import torch, json
from iattention.interop.load import load_run
model, t = load_run({run!r})
ids = torch.tensor([t.encode({text!r})])
with torch.no_grad():
    logits = model.eval()(ids)[0][0]
    out = ids[:, :8]
    for _ in range(12):
        nxt = model(out)[0][:, -1].argmax(-1, keepdim=True)
        out = torch.cat([out, nxt], 1)
print(json.dumps(dict(ids=ids[0].tolist(), logits=logits.tolist(), text=t.decode(out[0].tolist()))))
"""], capture_output=True, text=True, env={"PYTHONPATH": ""}, check=True)
import json  # noqa: E402

o = json.loads(ours.stdout.strip().splitlines()[-1])
assert o["ids"] == ids[0].tolist(), "tokenizations differ"
V = len(o["logits"][0])
diff = (hf_logits[:, :V] - torch.tensor(o["logits"])).abs().max().item()
print(f"token ids identical ({len(o['ids'])}); max |logit difference| over our {V} columns: {diff:.2e}; "
      f"end-of-text column max {hf_logits[:, V:].abs().max().item() if hf_logits.shape[1] > V else 'n/a'}")
print(f"greedy, transformers: {hf_text!r}")
print(f"greedy, iattention:   {o['text']!r}")
print("greedy text identical" if hf_text == o["text"] else "greedy text DIFFERS")
