"""lora_targets: the maps peft's LoRA adapts, per family and variant, read from the model, and the table
docs/transformers.md prints of them (each family's published shape, built without memory)."""

import re
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from iattention.config.families import FAMILIES  # noqa: E402
from iattention.config.load import model_preset  # noqa: E402
from iattention.config.shapes import SHAPES, shape_preset  # noqa: E402
from iattention.hf_model import lora_targets  # noqa: E402
from iattention.model.gpt import GPT  # noqa: E402

DOC = Path(__file__).resolve().parents[3] / "docs" / "transformers.md"


def rows() -> dict[tuple[str, str], tuple[str, str]]:
    """{(family label, variant): (target_modules, target_parameters)} as the docs table writes them."""
    out = {}
    for fam in FAMILIES.values():
        cfg = shape_preset(fam.default_shape) if fam.default_shape in SHAPES else model_preset(fam.default_shape)
        for variant in ("canonical", "standard"):
            with torch.device("meta"):
                t = lora_targets(GPT(cfg.replace(attention=variant)))
            out[fam.label, variant] = (", ".join(f"`{x}`" for x in t["target_modules"]),
                                       ", ".join(f"`{x}`" for x in t["target_parameters"]) or "none")
    return out


@pytest.mark.slow
def test_the_docs_table_is_what_lora_targets_gives_for_every_family():
    block = DOC.read_text().split("<!-- lora-targets -->")[1].split("<!-- /lora-targets -->")[0]
    table = {}
    for line in block.splitlines():
        m = re.match(r"\| (.+?) \([^)]*\) \| (\w+) \| (.*?) \| (.*?) \|$", line)
        if m and m.group(2) != "variant":  # not the header
            table[m.group(1), m.group(2)] = (m.group(3), m.group(4))
    assert table == rows()


def test_a_canonical_model_s_targets_are_its_learned_blocks_and_never_a_fixed_one():
    from iattention.config.model import GPTConfig

    cfg = GPTConfig(family="smollm3", n_layer=4, n_head=4, n_kv_head=2, n_embd=32, vocab_size=50, block_size=16,
                    nope_every=4, attention="canonical")
    t = lora_targets(GPT(cfg))
    # the rotary layers' W_K_rot_free is 4-D (peft adapts 2-D and 3-D parameters); the layer without RoPE has W_K_free
    assert t["target_parameters"] == ["attn.W_Q", "attn.W_V", "attn.W_O_free", "attn.W_K_free"]
    assert t["target_modules"] == ["mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
