"""Model configuration: one small dataclass for every family, as litgpt's `Config`. `family` names the family's
record (config/families.py), which gives the structural defaults (positions, norm, MLP, biases, tied head,
projection layout); every other key may override one. The attention
variants it accepts are the registry's (`attention/registry.py`); presets that build it are `config/load.py`
(run presets) and `config/shapes.py` (shape-only presets of published models)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass, field, fields

from iattention.attention.registry import ATTENTION_REGISTRY, variant_names
from iattention.attention.rope import LAYOUTS
from iattention.config.families import FAMILIES, WINDOW_RULES, families_with
from iattention.errors import UserError
from iattention.kernels import ATTN_KERNELS

INITS = ("gpt2", "matched", "normal")
CANONICAL_HALVES = ("both", "qk", "vo")
POSITIONS = ("learned", "rope")
NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu_tanh", "gelu", "swiglu")
PROJECTIONS = ("fused", "separate", "neox")
ROPE_TYPES = ("default", "llama3")
QK_NORMS = ("", "head", "whole")  # no query/key norm; RMSNorm over each head's r dims (Qwen3); over all H r (OLMo 2)
NORM_PLACES = ("pre", "post")  # a block's norms before attention and MLP (ln_1, ln_2 on their input), or after them
LLAMA3_SCALING = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
# Model keys renamed since runs were first saved: old name -> new name. A saved run (config.yaml, summary.json,
# checkpoint metadata, arm.json) is read under the new name silently; a user's YAML or override gets a note.
# The Llama family's own config (LlamaConfig, before the one family) called two keys otherwise.
RENAMED_MODEL_KEYS = {"canonical": "canonical_halves", "d_ff": "mlp_hidden", "rms_eps": "norm_eps"}
# A saved Llama-family config said `arch: llama` (and its family); GPT-2's said nothing. Each record's `old_arch`
# says what arch called it; the first family of each is what an arch alone meant.
OLD_ARCH = {f.old_arch: f.name for f in reversed(FAMILIES.values()) if f.old_arch}


def upgrade_model_keys(model: dict, note=None) -> dict:
    """A model section with every renamed key under its new name (a new dict; `model` is not changed).
    note(old, new) is called for each old key found. Both names at once is a user error."""
    if not isinstance(model, dict) or not any(old in model for old in (*RENAMED_MODEL_KEYS, "arch")):
        return model
    out = dict(model)
    if "arch" in out:  # arch: llama (with its family key) or arch: gpt, the two-family layout's switch
        arch = out.pop("arch")
        if not isinstance(arch, str) or arch not in OLD_ARCH:
            raise UserError(f"unknown model.arch {arch!r}; model.family says the architecture now: one of "
                            f"{', '.join(FAMILIES)}")
        if note is not None:
            note("arch", "family")
        said = FAMILIES[out["family"]].old_arch if isinstance(out.get("family"), str) and \
            out["family"] in FAMILIES else None
        if "family" in out and said != arch:
            raise UserError(f"model.arch={arch} and model.family={out['family']} disagree; model.arch is the old "
                            "name of model.family: keep only model.family")
        out.setdefault("family", OLD_ARCH[arch])
        if arch == "llama":  # its rot was stored resolved, and 0 meant "all dims" there
            if out.get("rot") == 0:
                out.pop("rot")
    for old, new in RENAMED_MODEL_KEYS.items():
        if old in out:
            if new in out:
                raise UserError(f"model.{old} and model.{new} are both set; model.{old} is the old name of "
                                f"model.{new}: keep only model.{new}")
            if note is not None:
                note(old, new)
            out[new] = out.pop(old)
    return out


def upgrade_config(raw, note=None):
    """A whole run config dict (model:, data:, ...) with its model section's renamed keys under their new
    names; anything that is not such a dict is returned as it is (the readers check shapes)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("model"), dict):
        return raw
    model = upgrade_model_keys(raw["model"], note)
    return raw if model is raw["model"] else {**raw, "model": model}


def normal_form(model: dict) -> dict:
    """A saved model section as today's to_dict writes it (old names renamed, a Llama-family one's derived keys
    left out), so two sections describing one model compare equal; one that does not build is returned renamed."""
    model = upgrade_model_keys(model)
    try:
        return GPTConfig.from_dict(model).to_dict()
    except (UserError, TypeError):
        return model


def upgrade_override_key(key: str, note=None) -> str:
    """'model.canonical' -> 'model.canonical_halves' (an override's SECTION.KEY under its new name)."""
    section, _, name = key.partition(".")
    if section == "model" and name in RENAMED_MODEL_KEYS:
        if note is not None:
            note(name, RENAMED_MODEL_KEYS[name])
        return f"model.{RENAMED_MODEL_KEYS[name]}"
    return key


@dataclass
class GPTConfig:
    """One decoder-only transformer: GPT-2, Llama, Qwen2, Mistral as values of these keys (litgpt's `Config`).

    family: the transformers model_type an export writes (a record of config/families.py); it gives the structural
        keys below their defaults (its record's `defaults`): a key left at its "unset" value ("", None, 0.0) takes
        its family's, so GPTConfig(family="llama", ...) is a Llama-shaped model and every one key can still be
        overridden.
    n_head query heads and n_kv_head key/value heads (0: n_head; n_kv_head divides n_head: MHA n_kv_head = n_head,
        MQA 1), each d_head wide (0: n_embd // n_head; a Llama-family checkpoint may use any width).
    pos: "learned" (GPT-2's table, `wpe`) or "rope" (rotary: the first `rot` dims of each head turn with the
        position; -1: all d_head dims, 0: none; rope_layout "half" (transformers' rotate_half) or "interleaved";
        rope_theta, rope_type and rope_scaling give the frequencies as transformers' rope_parameters do).
    parallel_residual: x + attn(ln_1(x)) + mlp(ln_2(x)) (GPT-NeoX) instead of two residual steps.
    norm_place: "pre" (x + attn(ln_1(x)), then x + mlp(ln_2(x)): every family but one) or "post" (x + ln_1(attn(x)),
        then x + ln_2(mlp(x)): OLMo 2's post_attention_layernorm / post_feedforward_layernorm, no norm before them);
        "" (unset): the family's, else "pre". Only where the family's record holds it.
    norm: "layernorm" (with a bias iff `bias`) or "rmsnorm" (statistics in float32, as transformers); norm_eps.
    mlp: "gelu_tanh" (GPT-2: c_fc, GELU tanh, c_proj), "gelu" (the same with exact GELU: GPT-NeoX) or "swiglu"
        (gate_proj, up_proj, down_proj); mlp_hidden its hidden width (0: 4 x n_embd).
        `symmetry.iso_param_mlp_hidden` gives the width that spends the parameters a reduced attention saves on the
        MLP instead. fused_gate_up: a SwiGLU stores its gate and up maps as one `gate_up_proj` with [gate | up]
        outputs (Phi-3's layout; false: separate gate_proj and up_proj), the same function.
    bias: biases on the norms and the MLP, and the default of qkv_bias (query/key/value, Qwen2's) and o_bias
        (the output projection; Llama's attention_bias sets both).
    projection: how a standard layer stores q, k, v: "fused" (one `c_attn`, [H r | G r | G r] outputs, and
        `c_proj`: GPT-2's names), "separate" (`q_proj`, `k_proj`, `v_proj`, `o_proj`: the Llama family's) or
        "neox" (`query_key_value` laid out per head as [q_h k_h v_h], and `dense`: GPT-NeoX's; n_kv_head = n_head).
    tie_embeddings: the head is the embedding table. vocab_pad_multiple: the embedding table is padded to a
        multiple of this for speed; padded rows are never predicted (logits are cut to vocab_size) nor counted.
    block_size: the longest sequence. max_positions (max_position_embeddings, 0: block_size) is kept for an export.
    sliding_window: W > 0: query i attends to keys i - W < j <= i only (Mistral's and Qwen2's sliding window, as
        transformers masks it; 0: the whole block). full_attention_layers: the first this many layers attend over the
        whole block and the rest within the window (Qwen2's max_window_layers; 0: every layer has the window).
    nope_every: N > 0: every N-th layer (indices N-1, 2N-1, ...) has no RoPE (SmolLM3's no_rope_layers): rotary is
        per-layer data, `layer(i)` is layer i's own config (rot 0 there), and its query/key gauge is the whole GL(r).
    qk_norm: "" (none), "head" or "whole": an RMSNorm (eps norm_eps) on the queries and on the keys after the
        projection and before RoPE, over each head's d_head dims with one gain of d_head shared by every head of a
        layer (Qwen3's q_norm / k_norm), or over the whole projection's n_head x d_head (n_kv_head x d_head) dims with
        a gain per dim (OLMo 2's). Only where the family's record holds it. It leaves of the query/key gauge only a
        rescaling of the two gains (docs/conversion.md, "Query/key norms").
    attention: a registered variant (`variant_names()`: attention/registry.py; each class's module docstring says
        what it learns), e.g. "standard" or "canonical" (I-Attention).
    canonical_halves: which halves of a canonical head have their block fixed: "both", "qk" (the query/key half:
        W_K's) or "vo" (the value/output half: W_O's). Saved runs call it `canonical`.
    init: "gpt2": N(0, 0.02) for every learned matrix entry (residual projections scaled), biases 0. "normal": the
        same without the residual scaling (the Llama family's). "matched": draw the standard initialisation from
        the same RNG stream, then canonicalize it exactly (pivoted blocks), so a canonical model starts from the
        very function that a standard model built with the same seed starts from.
    minimal_bias: (canonical) no value bias and no key bias on the pass dims (it keeps b_K's rotary dims). On a pass
        dim b_K adds q_i . b_K to every score of query i, which softmax ignores (on a rotary dim the term depends on
        the key's position); b_V adds sum_j a_ij b_V W_O = b_V W_O (attention rows sum to one), which folds into
        b_O. `canonicalize(..., minimal=True)` folds them away.
    attn_kernel: which attention kernel runs (auto | sdpa | math | triton; `kernels/__init__.py`): auto takes
        what kernels/auto_table.json measured fastest on this device, or without rows for it the Triton kernel
        for wide heads (> 256) on CUDA and SDPA everywhere else; math is two matrix products and a softmax that
        torch.compile fuses. Where a run executes, not what it computes: not part of a run's identity
        (config/identity.py).
    """

    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    vocab_size: int = 50257
    block_size: int = 1024
    dropout: float = 0.0
    bias: bool | None = None
    attention: str = "standard"
    canonical_halves: str = "both"
    init: str = ""
    minimal_bias: bool = False
    vocab_pad_multiple: int = 0
    mlp_hidden: int = 0
    attn_kernel: str = "auto"
    family: str = "gpt2"
    n_kv_head: int = 0
    d_head: int = 0
    pos: str = ""
    rot: int = -1
    rope_layout: str = "half"
    rope_theta: float = 10000.0
    rope_type: str = "default"
    rope_scaling: dict = field(default_factory=dict)
    norm: str = ""
    norm_eps: float = 0.0
    mlp: str = ""
    qkv_bias: bool | None = None
    o_bias: bool | None = None
    parallel_residual: bool | None = None
    projection: str = ""
    fused_gate_up: bool | None = None
    tie_embeddings: bool | None = None
    sliding_window: int = 0
    max_positions: int = 0
    full_attention_layers: int = 0
    nope_every: int = 0
    qk_norm: str = ""
    norm_place: str = ""

    def __post_init__(self) -> None:
        for name, value in self._derived().items():
            setattr(self, name, value)
        self.validate(allow_auto_vocab=True)

    def _derived(self) -> dict:
        """The value each key left unset takes (its family's, or one following from the other keys)."""
        known = isinstance(self.family, str) and self.family in FAMILIES  # else validate refuses it
        fam = FAMILIES[self.family if known else _UNSET["family"]].defaults
        out = {k: v for k, v in fam.items() if _unset(getattr(self, k))}
        bias = out.get("bias", self.bias)
        for name in ("qkv_bias", "o_bias"):  # the family's, else as `bias`
            if getattr(self, name) is None:
                out.setdefault(name, bias)
        if not self.n_kv_head:
            out["n_kv_head"] = self.n_head
        if not self.d_head and _positive(self.n_embd) and _positive(self.n_head):
            out["d_head"] = self.n_embd // self.n_head
        if not out.get("norm_place", self.norm_place):
            out["norm_place"] = "pre"
        if self.rot == -1:
            pos = out.get("pos", self.pos)
            out["rot"] = out.get("d_head", self.d_head) if pos == "rope" else 0
        return out

    def validate(self, allow_auto_vocab: bool = False) -> None:
        """allow_auto_vocab: vocab_size = 0 means "take it from the tokenizer" (training configs)."""
        if not isinstance(self.family, str) or self.family not in FAMILIES:
            raise UserError(f"unknown model.family {self.family!r}; choose one of {', '.join(FAMILIES)}")
        for name in ("n_layer", "n_head", "n_kv_head", "n_embd", "d_head", "vocab_size", "block_size",
                     "vocab_pad_multiple"):
            value = getattr(self, name)
            low = 0 if (name == "vocab_size" and allow_auto_vocab) else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise UserError(f"model.{name} must be a positive integer, got {value!r}")
        if self.n_head * self.d_head != self.n_embd and self.d_head == self.n_embd // self.n_head:
            raise UserError(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}; pick a head count that "
                            f"divides {self.n_embd} (or set model.d_head)")
        if self.n_head % self.n_kv_head:
            raise UserError(f"n_head={self.n_head} is not a multiple of n_kv_head={self.n_kv_head}; each key/value "
                            "head serves the same number of query heads")
        if self.d_head > self.n_embd:
            raise UserError(f"d_head={self.d_head} exceeds n_embd={self.n_embd}; a head cannot be wider than the "
                            "residual stream here")
        for name, allowed in (("pos", POSITIONS), ("norm", NORMS), ("mlp", MLPS), ("projection", PROJECTIONS),
                              ("rope_layout", LAYOUTS), ("rope_type", ROPE_TYPES), ("init", INITS),
                              ("canonical_halves", CANONICAL_HALVES), ("qk_norm", QK_NORMS),
                              ("norm_place", NORM_PLACES)):
            if getattr(self, name) not in allowed:
                raise UserError(f"unknown model.{name} {getattr(self, name)!r}; choose one of {', '.join(allowed)}")
        for name in ("bias", "qkv_bias", "o_bias", "tie_embeddings", "minimal_bias", "parallel_residual",
                     "fused_gate_up"):
            if not isinstance(getattr(self, name), bool):
                raise UserError(f"model.{name} must be true or false, got {getattr(self, name)!r}")
        if not isinstance(self.rot, int) or self.rot < 0 or self.rot % 2 or self.rot > self.d_head:
            raise UserError(f"model.rot must be an even number of rotary dims in [0, d_head={self.d_head}] (-1: all), "
                            f"got {self.rot!r}")
        if self.rot and self.pos != "rope":
            raise UserError(f"model.rot={self.rot} rotates dims but model.pos={self.pos}; set model.pos=rope or drop "
                            "model.rot")
        if self.fused_gate_up and self.mlp != "swiglu":
            raise UserError(f"model.fused_gate_up=true stores a SwiGLU's gate and up maps as one; model.mlp={self.mlp} "
                            "has neither: drop model.fused_gate_up or set model.mlp=swiglu")
        if self.projection == "neox" and self.n_kv_head != self.n_head:
            raise UserError(f"model.projection=neox lays out one key/value head per query head; n_kv_head="
                            f"{self.n_kv_head} of n_head={self.n_head} needs model.projection=separate or fused")
        if self.attention not in ATTENTION_REGISTRY:
            raise UserError(f"unknown attention {self.attention!r}; choose one of {', '.join(variant_names())}")
        cls = ATTENTION_REGISTRY[self.attention]
        if (why := cls.unsupported(self)) is not None:
            raise UserError(f"attention={self.attention} {why}")
        if self.canonical_halves != "both" and self.attention != "canonical":
            raise UserError(f"model.canonical_halves={self.canonical_halves} only applies to attention=canonical (got "
                            f"attention={self.attention}); drop it or set model.attention=canonical")
        if self.minimal_bias and (self.attention != "canonical" or not (self.qkv_bias and self.o_bias)):
            fix = "drop it or set model.attention=canonical" if self.attention != "canonical" else \
                "drop it: this model lacks the query/key/value or the output biases it reduces"
            raise UserError(f"model.minimal_bias=true applies to attention=canonical with query/key/value and output "
                            f"biases; {fix}")
        if self.init == "matched" and not cls.full_class:
            raise UserError(f"model.init=matched is impossible for attention={self.attention}: it is a smaller "
                            "function class than standard, so no equivalent start exists; use model.init=gpt2")
        if not isinstance(self.mlp_hidden, int) or isinstance(self.mlp_hidden, bool) or self.mlp_hidden < 0:
            raise UserError(f"model.mlp_hidden must be an integer >= 0 (0: 4 x n_embd), got {self.mlp_hidden!r}")
        kernel, dropout = self.attn_kernel, self.dropout  # a known kernel, a dropout in [0, 1), none with triton
        if kernel not in ATTN_KERNELS:
            raise UserError(f"unknown model.attn_kernel {kernel!r}; choose one of {', '.join(ATTN_KERNELS)}")
        if kernel == "triton" and isinstance(dropout, (int, float)) and dropout:
            raise UserError(f"model.attn_kernel=triton has no dropout (model.dropout={dropout!r}); set "
                            "model.dropout=0 or model.attn_kernel=auto")
        if not isinstance(dropout, (int, float)) or isinstance(dropout, bool) or not 0.0 <= dropout < 1.0:
            raise UserError(f"dropout must be in [0, 1), got {dropout!r}")
        for name, example in (("rope_theta", "10000"), ("norm_eps", "1e-6")):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < math.inf:
                raise UserError(f"model.{name} must be a finite number > 0, got {value!r}; e.g. model.{name}={example}")
        if self.rope_type == "llama3":
            missing = [k for k in LLAMA3_SCALING if not isinstance(self.rope_scaling.get(k), (int, float))
                       or isinstance(self.rope_scaling.get(k), bool)]
            if missing:
                raise UserError(f"model.rope_type=llama3 needs numbers {', '.join(LLAMA3_SCALING)} in "
                                f"model.rope_scaling; missing or not a number: {', '.join(missing)}")
        elif self.rope_scaling:
            raise UserError(f"model.rope_scaling={self.rope_scaling!r} is read only with model.rope_type=llama3; drop "
                            "it or set model.rope_type=llama3")
        for name in ("sliding_window", "max_positions", "full_attention_layers", "nope_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise UserError(f"model.{name} must be an integer >= 0 (0: none), got {value!r}")
        # a position limit shorter than the block would be ignored here and applied by transformers after an export
        if 0 < self.max_positions < self.block_size:
            raise UserError(f"model.max_positions={self.max_positions} is shorter than model.block_size="
                            f"{self.block_size}; set model.block_size={self.max_positions} or drop model.max_positions")
        # a window only where transformers' class of the family holds one, so a trained model exports as it runs
        window = FAMILIES[self.family].window
        if self.sliding_window and not window:
            windowed = [f for rule in WINDOW_RULES if rule for f in families_with(window=rule)]
            raise UserError(f"model.sliding_window={self.sliding_window} needs model.family "
                            f"{' or '.join(windowed)} (transformers' {self.family} has no sliding window); "
                            f"set model.family={windowed[0]} or drop model.sliding_window")
        if self.full_attention_layers and (window != "from_layer" or not self.sliding_window):
            raise UserError(f"model.full_attention_layers={self.full_attention_layers} applies to model.family="
                            f"{' or '.join(families_with(window='from_layer'))} with a model.sliding_window (its "
                            "max_window_layers); drop it")
        if self.nope_every and not FAMILIES[self.family].nope:
            holds = families_with(nope=True)
            raise UserError(f"model.nope_every={self.nope_every} (layers without RoPE) needs a family whose "
                            f"transformers class has them ({', '.join(holds) or 'none yet'}); transformers' "
                            f"{self.family} rotates every layer: drop model.nope_every")
        held = FAMILIES[self.family].defaults.get("qk_norm", "")
        if self.qk_norm != held:
            holds = [f.name for f in FAMILIES.values() if f.defaults.get("qk_norm", "") == self.qk_norm]
            raise UserError(f"model.qk_norm={self.qk_norm!r} needs a family whose transformers class normalises its "
                            f"queries and keys that way ({', '.join(holds) or 'none yet'}); transformers' "
                            f"{self.family} has qk_norm={held!r}: drop model.qk_norm or set model.family")
        placed = FAMILIES[self.family].defaults.get("norm_place", "pre")
        if self.norm_place != placed:
            where = {"pre": "before", "post": "after"}
            raise UserError(f"model.norm_place={self.norm_place} needs a family whose transformers class puts its "
                            f"norms there; transformers' {self.family} has them {where.get(placed, placed)} attention "
                            "and MLP: drop model.norm_place or set model.family")
        if self.qk_norm and self.minimal_bias:
            raise UserError("model.minimal_bias=true with model.qk_norm: the key bias is inside the key norm there, so "
                            "no part of it is redundant; drop model.minimal_bias")
        if self.sliding_window and self.attn_kernel == "triton":
            raise UserError(f"model.attn_kernel=triton has no sliding-window mask (model.sliding_window="
                            f"{self.sliding_window}); use model.attn_kernel=auto, sdpa or math")

    def layer(self, i: int) -> GPTConfig:
        """Layer i's own config: this one, or without rotary dims (rot 0) on a layer nope_every leaves unrotated."""
        return self.replace(rot=0) if self.nope_every and (i + 1) % self.nope_every == 0 else self

    def window_of(self, layer: int) -> int:
        """Layer `layer`'s sliding window: sliding_window from layer full_attention_layers on, else 0 (none)."""
        return self.sliding_window if layer >= self.full_attention_layers else 0

    @property
    def d_mlp(self) -> int:
        return self.mlp_hidden or 4 * self.n_embd

    @property
    def standard_init(self) -> str:
        """The init a standard model of this config draws: its own, or with init=matched its family's."""
        return FAMILIES[self.family].defaults["init"] if self.init == "matched" else self.init

    @property
    def group(self) -> int:
        """Query heads per key/value head."""
        return self.n_head // self.n_kv_head

    @property
    def padded_vocab_size(self) -> int:
        m = self.vocab_pad_multiple
        return (self.vocab_size + m - 1) // m * m

    def replace(self, **changes) -> GPTConfig:
        return GPTConfig(**{**self.to_dict(), **changes})

    def to_dict(self) -> dict:
        """Every key, except one a newer key-set added (NEW_KEYS) at the value it would take unset: so a GPT-2
        config is written as before the one family, and a config read back derives the same values."""
        raw = asdict(self)

        def derived(key):  # what `key` alone unset derives from the others as set (rot follows d_head and pos)
            unset = GPTConfig.__new__(GPTConfig)
            unset.__dict__.update({**raw, key: _UNSET[key]})
            return {**_UNSET, **unset._derived()}[key]

        # another family's key/value heads are written always, as the two-family layout did: a study of such a
        # model at other head counts keeps them (GPT-2's follow n_head)
        return {k: v for k, v in raw.items() if k not in NEW_KEYS
                or (k == "n_kv_head" and FAMILIES[self.family].grouped and self.projection != "neox")
                or v != (_UNSET[k] if k == "family" else derived(k))}

    @classmethod
    def key_types(cls) -> dict[str, type]:
        """Each key's value type (for readers of saved configs)."""
        hint = {"bool | None": bool, "int": int, "float": float, "str": str, "dict": dict, "bool": bool}
        return {f.name: hint[f.type] for f in fields(cls)}

    @classmethod
    def from_dict(cls, d: dict) -> GPTConfig:
        """A saved model section (old key names read under their new ones, a Llama-family one's too)."""
        d = upgrade_model_keys(d)
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise UserError(f"unknown model key(s) {unknown}; allowed: {sorted(names)}")
        return cls(**d)


def _unset(value) -> bool:
    """A key left at its "unset" value: "", None or a number 0 (not False: false is a setting)."""
    return value is None or value == "" or (isinstance(value, (int, float)) and not isinstance(value, bool)
                                             and value == 0)


def _positive(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


# The keys added since GPT-2 was the only family, each with its "unset" value: to_dict leaves one out where it holds
# what it would derive, so configs of earlier runs and of new ones compare equal (config/identity.py).
_UNSET = {f.name: (f.default_factory() if f.default is dataclasses.MISSING else f.default) for f in fields(GPTConfig)}
NEW_KEYS = ("family", "n_kv_head", "d_head", "pos", "rot", "norm", "norm_eps", "mlp", "qkv_bias", "o_bias",
            "parallel_residual",
            "projection", "fused_gate_up", "tie_embeddings", "rope_layout", "rope_theta", "rope_type", "rope_scaling",
            "sliding_window", "max_positions", "full_attention_layers", "nope_every", "qk_norm", "norm_place")
