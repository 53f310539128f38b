"""Which of a model's maps a peft LoRA adapts: `lora_targets(model)` gives LoraConfig's target_modules and
target_parameters for any family and variant, read from the model itself (docs/transformers.md has the table).

A canonical layer's learned blocks are parameters, not nn.Linear modules (attention/canonical.py: W_Q (H, d, r), W_V
(G, d, r), W_K_free (G, d - p, p), W_O_free (G, g d - r, r)), so they are peft's `target_parameters` (one low-rank
update per head or KV group, peft's ParamWrapper: 2-D and 3-D parameters); W_K_rot_free (G, rot/2, d - 1, 2), the
rotary pairs' key rows, is 4-D, which peft does not adapt, so a rotary model's key map stays as it is on the rotary
dims. The fixed identity blocks are no parameters: no adapter reaches them, and a merged model is still canonical.
A standard layer's projections (c_attn, q_proj, query_key_value, ...) and every MLP map are `target_modules`.
"""

from __future__ import annotations

from torch import nn

PEFT_PARAMETER_DIMS = (2, 3)  # what peft's LoRA adapts of a bare nn.Parameter (lora.ParamWrapper)


def lora_targets(model) -> dict[str, list[str]]:
    """{"target_modules": [...], "target_parameters": [...]} naming, as suffixes of the model's names, the learned
    maps of its attention (`attn.<name>`) and MLP (`mlp.<name>`) that LoRA can adapt, over every layer (a layer without
    RoPE, SmolLM3's every 4th, learns W_K_free where the rotary layers learn W_K_rot_free)."""
    gpt = getattr(model, "gpt", model)
    modules, parameters = {}, {}
    for block in gpt.transformer.h:
        for name in block.attn.head_blocks():  # each learned matrix of the attention layer, in any variant
            owner, _, leaf = name.rpartition(".")
            if owner and isinstance(block.attn.get_submodule(owner), nn.Linear):
                modules[f"attn.{owner}"] = True
            elif not owner and block.attn.get_parameter(leaf).dim() in PEFT_PARAMETER_DIMS:
                parameters[f"attn.{leaf}"] = True
        modules.update((f"mlp.{n}", True) for n, m in block.mlp.named_children() if isinstance(m, nn.Linear))
    return {"target_modules": list(modules), "target_parameters": list(parameters)}
