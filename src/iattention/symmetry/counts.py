"""Parameter counts, for every family: a standard model's in closed form, and what each variant removes from it,
as its class states (`removed_params`, `redundant_biases`). `tests/unit/attention/test_registry.py` checks each
statement against a count made from the built layer."""

from __future__ import annotations

from iattention.attention.base import CausalSelfAttention, qk_gauge
from iattention.attention.registry import attention_class
from iattention.config.families import FAMILIES
from iattention.config.load import model_preset
from iattention.config.model import GPTConfig
from iattention.config.shapes import shape_names, shape_preset


def by_layer(config, count) -> int:
    """A whole-model count whose per-layer part depends on the layer's rotary width: `count(cfg)` (a whole-model
    count, n_layer times the per-layer one) summed over the layers' own configs (GPTConfig.layer: rot 0 on a layer
    without RoPE), in two evaluations."""
    if not config.nope_every:
        return count(config)
    bare = config.n_layer // config.nope_every  # the layers without RoPE
    return (count(config) * (config.n_layer - bare) + count(config.replace(rot=0)) * bare) // config.n_layer


def redundancy(config) -> int:
    """Parameters the variant removes relative to standard (minimal_bias's dropped biases included): its
    class says how many, for each layer's own config."""
    return by_layer(config, lambda c: attention_class(c).removed_params(c))


def standard_param_count(config: GPTConfig) -> int:
    """A standard model's parameter count in closed form (true vocabulary): embeddings, learned positions, per
    layer the attention (CausalSelfAttention.standard_params), the MLP and two norms; the final norm; an untied
    head."""
    d, L, b, m = config.n_embd, config.n_layer, int(config.bias), config.d_mlp
    norm = d * (1 + b) if config.norm == "layernorm" else d
    mlp = 3 * d * m + b * (2 * m + d) if config.mlp == "swiglu" else 2 * d * m + b * (m + d)
    per_layer = 2 * norm + CausalSelfAttention.standard_params(config) + mlp
    positions = config.block_size * d if config.pos == "learned" else 0
    head = 0 if config.tie_embeddings else config.vocab_size * d
    return config.vocab_size * d + positions + L * per_layer + norm + head


def bias_redundancy(config) -> int:
    """Learned biases that change no function, whole model: per layer, each bias the variant's class names in
    `redundant_biases(config)`: G (r - rot) numbers for b_K (its pass dims), G r for b_V (see
    GPTConfig.minimal_bias)."""
    def count(c):
        G, r = c.n_kv_head, c.d_head
        width = {"b_K": G * (r - c.rot), "b_V": G * r}
        return c.n_layer * sum(width[n] for n in attention_class(c).redundant_biases(c))
    return by_layer(config, count)


def param_count(config) -> int:
    """Learned parameters of a model of `config`: the standard count minus what the variant removes."""
    return standard_param_count(config) - redundancy(config)


def fully_reduced_count(config) -> int:
    """Learned parameters once the redundant biases are reduced too (b_K dropped on the pass dims, b_V folded into
    b_O; model.minimal_bias builds such a model where both biases are learned)."""
    return param_count(config) - bias_redundancy(config)


def iso_param_mlp_hidden(config: GPTConfig) -> int:
    """The MLP width at which `config` (a reduced attention) has the parameter count of standard attention
    with the default MLP (4 d): the saved parameters per layer spent on hidden units of 2 d (+1 with biases;
    3 d with SwiGLU) parameters each, rounded to the nearest width."""
    base = config.replace(mlp_hidden=0)
    saved = standard_param_count(base) - param_count(base)
    per_unit = config.n_layer * ((3 if config.mlp == "swiglu" else 2) * config.n_embd + int(config.bias)
                                 * (2 if config.mlp == "swiglu" else 1))
    return 4 * config.n_embd + round(saved / per_unit)


def removed_split(config) -> dict[str, int]:
    """What canonical attention removes, whole model: on the query/key side each layer's exact query/key gauge
    (`attention.base.qk_gauge`, from the config's fields: per KV group rot + (r - rot)^2, a complex scalar per rotary
    pair and GL of the pass dims; under a query/key norm the key gain's rot/2 + r - rot fixed dims, per layer or per
    KV group) and r^2 per layer and KV group on the value/output side."""
    r, LG = config.d_head, config.n_layer * config.n_kv_head
    return {"query_key": by_layer(config, lambda c: c.n_layer * qk_gauge(c)[1]), "value_output": LG * r * r}


def kv_cache_values_per_token(config, kind: str = "full") -> int | None:
    """Numbers a decoding cache holds per token, all layers: keys and values (n_kv_head x d_head each) for
    "full"; the keys alone for "k-only", which exists only where the key map is square (n_kv_head x d_head =
    n_embd; None otherwise)."""
    per_layer = config.n_kv_head * config.d_head
    if kind == "k-only":
        return config.n_layer * per_layer if per_layer == config.n_embd else None
    return 2 * config.n_layer * per_layer


def family_table() -> str:
    """docs/conversion.md's table of the families (between its `family-table` markers), one row per record of
    config/families.py at its published shape (`Family.default_shape`), every number from the count functions
    above (tests/unit/symmetry/test_family_table.py says how to regenerate it)."""
    rows = ["| family | shape | query/key gauge per KV group | value/output gauge per KV group | removed per layer "
            "(canonical; mean over layers) | K-only cache |", "| --- | --- | --- | --- | ---: | --- |"]
    for fam in FAMILIES.values():
        shape = shape_preset(fam.default_shape) if fam.default_shape in shape_names() else \
            model_preset(fam.default_shape)
        c = shape.replace(attention="canonical")
        r, rot, G = c.d_head, c.rot, c.n_kv_head
        kind, numbers = qk_gauge(c)
        scales = f"each of the {rot // 2} rotary pairs" + (f" and {r - rot} pass dims" if rot < r else "")
        qk = f"GL({r}): {r * r:,} numbers" if rot == 0 else \
            f"a complex scalar per rotary pair ({rot // 2} pairs) and GL({r - rot}) on the pass dims: " \
            f"{rot + (r - rot) ** 2:,} numbers" if rot < r else f"a complex scalar per rotary pair ({rot // 2} " \
            f"pairs): {rot} numbers"
        if c.nope_every:  # rotary is per-layer data: on the layers without RoPE the whole GL(r)
            qk += f"; every {c.nope_every}th layer (no RoPE): GL({r}), {r * r:,} numbers"
        if kind == "norm gains per layer":  # qk_norm "head": the q/k norms' gains are shared by the layer's heads
            qk = f"none of W_Q, W_K (QK norm): a scale of the q/k norm gains on {scales}, one for the whole layer " \
                 f"(not per group): {numbers:,} numbers per layer"
        elif kind == "norm gains per KV group":
            qk = f"none of W_Q, W_K (QK norm): a scale of the q/k norm gains on {scales}: " \
                 f"{numbers // G:,} numbers"
        split = removed_split(c)
        per_layer = redundancy(c) // c.n_layer
        k_only = "yes" if kv_cache_values_per_token(c, "k-only") is not None else \
            f"no (G r = {G * r} < d = {c.n_embd})"
        rows.append(f"| {fam.name} | `{fam.default_shape}`: H = {c.n_head}, G = {G}, r = {r}, rot = {rot} | {qk} | "
                    f"GL({r}): {r * r:,} numbers | {per_layer:,} ({split['query_key'] // c.n_layer:,} + "
                    f"{split['value_output'] // c.n_layer:,}) | {k_only} |")
    return "\n".join(rows)
