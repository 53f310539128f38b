"""The conditioning of a model's fixed blocks, layer by layer and KV group by KV group, for both block choices
(pivoted, aligned): what `iattn convert` reports and `iattn conditioning` studies (symmetry/transforms.py chooses the
blocks and measures them)."""

from __future__ import annotations

import torch

from iattention.symmetry import transforms
from iattention.symmetry.transforms import expand


@torch.no_grad()
def layer_conditions(model) -> list[dict[str, list]]:
    """Each layer's layer_conditioning (its own rotary width: a layer without RoPE has no 'rotary' keys)."""
    c = model.config
    layers = expand(model).attention_layers if c.attention != "standard" else model.attention_layers
    return [layer_conditioning(attn.to_heads().to(torch.float64), attn.rot, c.rope_layout) for attn in layers]


def block_conditioning(model) -> dict[str, list]:
    """Per layer and KV group (a head, where each has its own keys), for pivoted and aligned blocks: the smallest
    rotary pivot ratio |c_p| / ||c|| ('rotary', with rotary dims), the key pass block's and the output block's
    condition numbers ('pass' where rot < d_head, 'output'); keys '<block> <what>', each (L, G) as lists (a key
    lists the layers that have it)."""
    out: dict[str, list] = {}
    for layer in layer_conditions(model):
        for key, v in layer.items():
            out.setdefault(key, []).append(v)
    return out


def layer_conditioning(hw, rot: int, layout: str, known: dict | None = None) -> dict[str, list]:
    """One layer's block_conditioning: {'<block> <what>': per KV group} for hw (HeadWeights, float64) of a layer
    rotating `rot` dims in `layout`; `known`: {block: select_blocks' answer} already computed (the pivoted QR is the
    slow part)."""
    out = {}
    for block in ("pivoted", "aligned"):
        blocks = (known or {}).get(block) or transforms.select_blocks(hw, rot, layout, block)
        for what, v in transforms.conditioning(hw, rot, layout, blocks).items():
            out[f"{block} {what}"] = v.tolist()
    return out
