"""What a model family *is*: one record per family (litgpt's `Config` rows), and nothing about families elsewhere.

A family is a configuration of the one model (`model/gpt.py`), named by the transformers `model_type` its export
writes. Its record holds everything that differs between families: the transformers class, which config.json
dialect its folders speak (`dialect`: the readers and writers in `interop/dialects.py`), the structural defaults of
`GPTConfig`, the tensor-name map (our names, GPT-2's, against transformers'), the names its checkpoint files use,
the bias rule, the sliding-window rule, which tensors transformers stores transposed, the buffers that are not
weights, and how the CLI, the loader and the reports treat it. Code outside this file asks a record (`FAMILIES[f]
.window`, `.bias_rule`, ...), never a family's name.

Adding a family is a record here (and, for a config.json dialect not yet read, its reader in `interop/dialects.py`):
docs/architecture.md, "Adding a model family".
"""

from __future__ import annotations

from dataclasses import dataclass, field

from iattention.errors import UserError

# The Llama layout's tensor names: (ours, theirs), {i} the layer index; a name no rule matches is the same in both.
LLAMA_NAMES = (
    ("transformer.wte.", "model.embed_tokens."),
    ("transformer.h.{i}.ln_1.", "model.layers.{i}.input_layernorm."),
    ("transformer.h.{i}.attn.", "model.layers.{i}.self_attn."),
    ("transformer.h.{i}.ln_2.", "model.layers.{i}.post_attention_layernorm."),
    ("transformer.h.{i}.mlp.", "model.layers.{i}.mlp."),
    ("transformer.ln_f.", "model.norm."),
    ("transformer.rotary_emb.", "model.rotary_emb."),
)
NEOX_NAMES = (
    ("transformer.wte.", "gpt_neox.embed_in."),
    ("transformer.h.{i}.ln_1.", "gpt_neox.layers.{i}.input_layernorm."),
    ("transformer.h.{i}.attn.", "gpt_neox.layers.{i}.attention."),
    ("transformer.h.{i}.ln_2.", "gpt_neox.layers.{i}.post_attention_layernorm."),
    ("transformer.h.{i}.mlp.c_fc.", "gpt_neox.layers.{i}.mlp.dense_h_to_4h."),
    ("transformer.h.{i}.mlp.c_proj.", "gpt_neox.layers.{i}.mlp.dense_4h_to_h."),
    ("transformer.ln_f.", "gpt_neox.final_layer_norm."),
    ("transformer.rotary_emb.", "gpt_neox.rotary_emb."),
)
# Phi-3's: the Llama names, but q, k and v fused (qkv_proj, [H r | G r | G r] outputs: our fused c_attn) and o_proj
PHI3_NAMES = (
    ("transformer.h.{i}.attn.c_attn.", "model.layers.{i}.self_attn.qkv_proj."),
    ("transformer.h.{i}.attn.c_proj.", "model.layers.{i}.self_attn.o_proj."),
    *LLAMA_NAMES,
)
# OLMo 2's: the Llama layout's, with its two norms after attention and after the MLP (ln_1, ln_2: GPTConfig.norm_place)
OLMO2_NAMES = (
    ("transformer.wte.", "model.embed_tokens."),
    ("transformer.h.{i}.ln_1.", "model.layers.{i}.post_attention_layernorm."),
    ("transformer.h.{i}.attn.", "model.layers.{i}.self_attn."),
    ("transformer.h.{i}.ln_2.", "model.layers.{i}.post_feedforward_layernorm."),
    ("transformer.h.{i}.mlp.", "model.layers.{i}.mlp."),
    ("transformer.ln_f.", "model.norm."),
    ("transformer.rotary_emb.", "model.rotary_emb."),
)
# The structural keys of the Llama layout (RoPE, RMSNorm, SwiGLU with separate gate and up maps, separate q/k/v/o,
# an untied head).
LLAMA_DEFAULTS = dict(pos="rope", norm="rmsnorm", norm_eps=1e-6, mlp="swiglu", bias=False, tie_embeddings=False,
                      vocab_pad_multiple=1, init="normal", projection="separate", parallel_residual=False,
                      fused_gate_up=False)

BIAS_RULES = {  # how a family's transformers config holds attention biases -> GPTConfig's qkv_bias / o_bias
    "bias": "one switch for every bias (GPT-2: always on)",
    "attention_bias": "attention_bias sets the query/key/value and the output biases together",
    "qkv_only": "query/key/value biases always, no output bias (Qwen2)",
    "none": "no attention biases",
}
WINDOW_RULES = {  # where a family's transformers class puts a sliding window
    "": "none",
    "every_layer": "sliding_window on every layer (Mistral)",
    "from_layer": "sliding_window on the layers from max_window_layers on (Qwen2)",
}


@dataclass(frozen=True)
class Family:
    """One model family. `name` is `model.family` and the `model_type` of its transformers config."""

    name: str
    label: str  # how a report or a message says it ("Qwen2")
    hf_class: str  # the transformers class an export writes and a folder of this family is read with
    dialect: str  # its config.json's dialect: "gpt2", "llama" or "neox" (interop/dialects.py's readers and writers)
    defaults: dict  # the GPTConfig keys it sets unless given (positions, norm, MLP, biases, head, projection, ...)
    names: tuple[tuple[str, str], ...] = ()  # (ours, theirs) name prefixes, {i}: the layer index
    file_names: dict = field(default_factory=dict)  # transformers name -> the name its checkpoint files hold
    bias_rule: str = "attention_bias"  # BIAS_RULES
    window: str = ""  # WINDOW_RULES
    transposed: tuple[str, ...] = ()  # the weights transformers stores (in, out): GPT-2's Conv1D
    buffers: tuple[str, ...] = ("rotary_emb.inv_freq",)  # the state dict's non-weights, neither read nor written
    tied_only: bool = False  # our model of the family ties its head to the embedding
    v5: bool = True  # needs transformers 5 (rope_parameters in its configs)
    streamed: bool = True  # `iattn convert` converts its folders one layer at a time (interop/stream.py)
    tokenizer: str | None = None  # the tokenizer spec its HF folders are read with (None: the folder's own)
    paper: bool = False  # the paper's model: `iattn params` shows the paper's head counts, a report its table
    grouped: bool = True  # may share key/value heads (GQA): a saved config always names n_kv_head
    old_arch: str | None = None  # what the two-family layout's `model.arch` called it ("gpt" or "llama")
    default_shape: str | None = None  # the published shape `iattn params --family NAME` counts (config/shapes.py)
    nope: bool = False  # its transformers class has layers without RoPE (SmolLM3's no_rope_layers: model.nope_every)
    # its transformers class rotates partial_rotary_factor x d_head of each head's dims (model.rot), read and written
    # (Phi-3's; the Llama classes accept the key and rotate whole heads)
    partial_rotary: bool = False

    def __post_init__(self):
        assert self.bias_rule in BIAS_RULES and self.window in WINDOW_RULES, self


_RECORDS = (
    Family("gpt2", "GPT-2", "GPT2LMHeadModel", "gpt2",
           dict(pos="learned", norm="layernorm", norm_eps=1e-5, mlp="gelu_tanh", bias=True, tie_embeddings=True,
                vocab_pad_multiple=64, init="gpt2", projection="fused", parallel_residual=False, fused_gate_up=False),
           bias_rule="bias", transposed=("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight",
                                         "mlp.c_proj.weight"),
           buffers=(".attn.bias", ".attn.masked_bias"), tied_only=True, v5=False, streamed=False, tokenizer="gpt2",
           paper=True, grouped=False, old_arch="gpt", default_shape="gpt2-small"),
    Family("llama", "Llama", "LlamaForCausalLM", "llama", LLAMA_DEFAULTS, LLAMA_NAMES, old_arch="llama",
           default_shape="llama-3-8b"),
    Family("qwen2", "Qwen2", "Qwen2ForCausalLM", "llama", {**LLAMA_DEFAULTS, "qkv_bias": True, "o_bias": False},
           LLAMA_NAMES, bias_rule="qkv_only", window="from_layer", old_arch="llama", default_shape="qwen2.5-0.5b"),
    Family("mistral", "Mistral", "MistralForCausalLM", "llama", LLAMA_DEFAULTS, LLAMA_NAMES, bias_rule="none",
           window="every_layer", old_arch="llama", default_shape="mistral-7b"),
    # GPT-NeoX (Pythia): LayerNorm with biases, exact GELU, x + attn(ln_1(x)) + mlp(ln_2(x)), per-head interleaved
    # query_key_value, an untied head (`embed_out` in its files); its shapes set rot (rotary_pct x d_head)
    Family("gpt_neox", "GPT-NeoX", "GPTNeoXForCausalLM", "neox",
           dict(pos="rope", norm="layernorm", norm_eps=1e-5, mlp="gelu", bias=True, tie_embeddings=False,
                vocab_pad_multiple=1, init="normal", projection="neox", parallel_residual=True, fused_gate_up=False),
           NEOX_NAMES, file_names={"lm_head.weight": "embed_out.weight"}, grouped=False,
           default_shape="pythia-160m"),
    # Qwen3: the Llama layout with an RMSNorm on each head's query and key before RoPE (q_norm / k_norm, one gain of
    # head_dim for every head of a layer), attention_bias for every bias, Qwen2's sliding window
    Family("qwen3", "Qwen3", "Qwen3ForCausalLM", "llama", {**LLAMA_DEFAULTS, "qk_norm": "head"}, LLAMA_NAMES,
           window="from_layer", default_shape="qwen3-0.6b"),
    # OLMo 2: an RMSNorm over the whole query and key projections before RoPE (q_norm / k_norm of n_head x head_dim,
    # n_kv_head x head_dim: a gain per head and dim), norms after attention and after the MLP and none before
    Family("olmo2", "OLMo 2", "Olmo2ForCausalLM", "llama", {**LLAMA_DEFAULTS, "qk_norm": "whole", "norm_place": "post"},
           OLMO2_NAMES, default_shape="olmo-2-0425-1b"),
    # SmolLM3: the Llama layout with every N-th layer (no_rope_layers; 4 in SmolLM3-3B) without RoPE
    Family("smollm3", "SmolLM3", "SmolLM3ForCausalLM", "llama", LLAMA_DEFAULTS, LLAMA_NAMES, nope=True,
           default_shape="smollm3-3b"),
    # Phi-3: the Llama layout with fused qkv_proj and gate_up_proj ([gate | up]), no biases, a sliding window on every
    # layer, partial_rotary_factor (1 in Phi-3-mini); longrope (the 128k models) is refused where RoPE is read
    Family("phi3", "Phi-3", "Phi3ForCausalLM", "llama",
           {**LLAMA_DEFAULTS, "norm_eps": 1e-5, "projection": "fused", "fused_gate_up": True}, PHI3_NAMES,
           bias_rule="none", window="every_layer", partial_rotary=True, default_shape="phi-3-mini-4k"),
)
FAMILIES: dict[str, Family] = {f.name: f for f in _RECORDS}

# model_types iattention does not convert, each with why (one line)
_QK_NORM = "QK-norm (q_norm/k_norm between the projections and RoPE) changes the attention symmetry"
REFUSED = dict.fromkeys(("gemma3", "gemma3_text"), _QK_NORM)


def family_record(model_type, where) -> Family:
    """The record of a `model_type` (config.json's, or `model.family`), else one line naming what is converted;
    `where` names the file or key that said it."""
    if isinstance(model_type, str) and model_type in FAMILIES:
        return FAMILIES[model_type]
    known = ", ".join(FAMILIES)
    if isinstance(model_type, str) and model_type in REFUSED:
        raise UserError(f"{where}: {model_type} models are out of scope: {REFUSED[model_type]}; iattention converts "
                        f"{known}")
    raise UserError(f"{where} describes a {model_type!r} model; iattention converts {known}")


def families_with(**facts) -> tuple[str, ...]:
    """The families whose records have these facts, e.g. families_with(window="every_layer")."""
    return tuple(f.name for f in _RECORDS if all(getattr(f, k) == v for k, v in facts.items()))
