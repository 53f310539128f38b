"""Write a local lm-eval task over WikiText-2's validation split (docs/transformers.md): DIR/valid.jsonl, one record per
article (as lm-eval's `wikitext` task scores it: loglikelihood_rolling, word and byte perplexity, bits per byte), and
DIR/wikitext_valid_local.yaml naming it, from the data folder iattention finds (IATTN_DATA_DIR, `iattn data
remember`). lm-eval's own `wikitext` task downloads its data; this one runs offline:

    python examples/lm_eval_task.py DIR
    lm_eval --model hf --model_args pretrained=FOLDER,trust_remote_code=True --include_path DIR \
        --tasks wikitext_valid_local
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

TASK = """task: wikitext_valid_local
dataset_path: json
dataset_kwargs:
  data_files:
    validation: {data}
validation_split: validation
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{page}}}}"
should_decontaminate: false
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
"""


def main(folder: str) -> None:
    from iattention.data import DataConfig
    from iattention.data.sources import read_split

    text = read_split(DataConfig(dataset="wikitext-2-v1"), "valid")
    # an article starts at a top-level heading line " = Title = " (lm-eval's wikitext splits its pages the same way)
    pages = [p for p in re.split(r"\n(?= = [^=].* = \n)", text) if p.strip()]
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    (out / "valid.jsonl").write_text("".join(json.dumps({"page": p}) + "\n" for p in pages))
    (out / "wikitext_valid_local.yaml").write_text(TASK.format(data=(out / "valid.jsonl").resolve()))
    print(f"{len(pages)} pages -> {out / 'valid.jsonl'}; task wikitext_valid_local in {out}")


if __name__ == "__main__":
    main(sys.argv[1])
