"""The model card (README.md) of an exported Hugging Face folder: what the model is, where it came from,
and how three clients nobody here wrote load it (transformers, TransformerLens, lm-evaluation-harness)."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

from iattention.config.families import FAMILIES
from iattention.config.model import GPTConfig, upgrade_model_keys
from iattention.data.tokenizers import HF_SPEC
from iattention.errors import UserError

_METRICS = (("best_val_ppl", "best validation perplexity"), ("best_epoch", "epoch of best"),
            ("test_ppl", "test perplexity"), ("epochs", "epochs"), ("tokens_seen", "training tokens seen"))


def source_name(src: str | Path) -> str:
    """What the card calls its source: the run's name (its folder's name), with the checkpoint's file name
    when a file was given (`run/best.safetensors`); never the local path above it."""
    path = Path(src).resolve()
    return path.name if path.is_dir() or not path.parent.name else f"{path.parent.name}/{path.name}"


def card_command(argv: list[str], src: str, out: str) -> str:
    """The convert command for the card: as typed, with the source and output paths cut to their names
    (`source_name`, the output folder's name), so that no local path leaves the machine."""
    named = {str(src): source_name(src), str(out): Path(out).name}
    words = []
    for word in argv:
        flag, eq, value = word.partition("=")
        words.append(f"{flag}={named.get(value, value)}" if eq and flag.startswith("--") else named.get(word, word))
    return shlex.join(words)


def _resolved(config: dict) -> dict:
    """A saved model section with every key at its value (family defaults, n_kv_head and d_head from the shape;
    a two-family layout's `arch: llama` section read under today's names); as saved where it does not build."""
    try:
        return dataclasses.asdict(GPTConfig.from_dict(config))
    except (UserError, TypeError):
        return upgrade_model_keys(config)


def model_card(*, source: str, config: dict, params_ours: int, params_exported: int, data: dict | None,
               tokenizer: str | None, eos_id: int | None, summary: dict | None, command: str,
               max_abs_logit_diff: float, eos_silent: bool = True, trained: bool = True) -> str:
    """Markdown text of the card; `config` is the source's model config, `summary` its run's summary.json;
    `trained`: the source is a training run's checkpoint (else a folder `iattn convert` made, or an HF
    folder: the card says converted, not trained)."""
    attention = config.get("attention", "standard")
    own = tokenizer is not None and tokenizer.startswith(HF_SPEC)  # a Hugging Face folder's own, saved as it is
    extra_row = ", plus the end-of-text row" if tokenizer not in (None, "gpt2") and not own else ""
    config = _resolved(config)
    family = config.get("family", GPTConfig.family)
    fam = FAMILIES.get(family) if isinstance(family, str) else None
    llama = fam is None or fam.defaults["pos"] == "rope"  # a rotary family, exported as its family's class
    cls = fam.hf_class if fam is not None else f"{family}ForCausalLM"  # the class an export writes
    name = cls.removesuffix("ForCausalLM") if llama else "GPT-2"
    form = f"{name} form"
    heads = (f"{config.get('n_head')} query heads sharing {config.get('n_kv_head')} key/value heads of "
             f"{config.get('d_head')} dims, RoPE" if llama else f"{config.get('n_head')} heads")
    lines = [
        "---", "library_name: transformers", "pipeline_tag: text-generation",
        f"tags: [{family}, iattention]", "---", "",
        f"# {name} exported by iattention", "",
        f"{'Trained as' if trained else 'Converted to'} **{attention}** attention"
        f"{'' if trained else ' by `iattn convert`'} ({config.get('n_layer')} layers, {heads}, width "
        f"{config.get('n_embd')}, block size {config.get('block_size')}) and exported as a standard Hugging Face "
        f"`{cls}`" + (f" (canonical attention expanded exactly to standard {name} attention)"
                      if attention != "standard" else "") + ".", "",
        "| | |", "| --- | --- |",
        f"| source | `{source}` |",
        f"| learned parameters, ours ({attention}) | {params_ours:,} |",
        f"| parameters as exported ({form}{extra_row}) | {params_exported:,} |",
        f"| max abs logit difference, export vs source (probe batch) | {max_abs_logit_diff:.2e} |",
    ]
    if data:
        part = f", first {data['train_tokens']:,} training tokens" if data.get("train_tokens") else ""
        lines.append(f"| data | {data.get('dataset', '?')}{part} |")
    if tokenizer:
        if tokenizer == "gpt2":
            note = "GPT-2 BPE (r50k); `<|endoftext|>` = 50256 as bos/eos"
        elif own:  # hf:FOLDER by the folder's name: the card holds no local path
            note = (f"hf:{Path(tokenizer[len(HF_SPEC):]).name}: the Hugging Face folder's own tokenizer the run was "
                    "trained with, saved as it is (its own special tokens; no token added)")
        else:
            note = f"{tokenizer}; added `<|endoftext|>` = {eos_id} as bos/eos, not seen in training: " + (
                "its logit is far below every real one, so it takes no probability and texts score as in the run"
                if eos_silent else "its embedding row is zero, so its logit is 0 everywhere")
        lines.append(f"| tokenizer | {note} |")
    else:
        lines.append("| tokenizer | none exported (convert again with --data-dir to include it) |")
    for key, label in _METRICS:
        if summary and summary.get(key) is not None:
            value = summary[key]
            lines.append(f"| {label} | {value:.3f} |" if isinstance(value, float) else f"| {label} | {value:,} |")
    lines += ["", f"Made with: `{command}`", "", "## Loading", "", "transformers (offline, from this folder):", "",
              "```python", "from transformers import AutoModelForCausalLM, AutoTokenizer",
              "tok = AutoTokenizer.from_pretrained(FOLDER)", "model = AutoModelForCausalLM.from_pretrained(FOLDER)",
              "```", "", "TransformerLens 4.x (`pip install \"transformer-lens>=4\"`): "
              "`TransformerBridge.boot_transformers(FOLDER)`" + ("." if llama else
              "; 2.x (`pip install \"transformer-lens<3\"`): "
              "`HookedTransformer(HookedTransformerConfig(...))` from this folder's config, then "
              "`load_and_process_state_dict(convert_gpt2_weights(model, cfg), fold_ln=False, ...)`."), "",
              "lm-evaluation-harness (`pip install \"lm-eval[hf]\"`; plain `lm-eval` has no transformers): "
              "`--model hf --model_args pretrained=FOLDER` with a local `loglikelihood_rolling` task over a "
              "text file.", "",
              "Details and the numbers to expect: docs/interop.md in the iattention repository.", ""]
    return "\n".join(lines)
