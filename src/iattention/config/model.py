"""Model configuration: a small dataclass. The attention variants it accepts are the registry's
(`attention/registry.py`); presets that build it are `config/load.py`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from iattention.attention.registry import ATTENTION_REGISTRY, variant_names
from iattention.errors import UserError
from iattention.kernels import ATTN_KERNELS

INITS = ("gpt2", "matched")
CANONICAL_HALVES = ("both", "qk", "vo")
# Model keys renamed since runs were first saved: old name -> new name. A saved run (config.yaml, summary.json,
# checkpoint metadata, arm.json) is read under the new name silently; a user's YAML or override gets a note.
RENAMED_MODEL_KEYS = {"canonical": "canonical_halves"}


def upgrade_model_keys(model: dict, note=None) -> dict:
    """A model section with every renamed key under its new name (a new dict; `model` is not changed).
    note(old, new) is called for each old key found. Both names at once is a user error."""
    if not isinstance(model, dict) or not any(old in model for old in RENAMED_MODEL_KEYS):
        return model
    out = dict(model)
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


def upgrade_override_key(key: str, note=None) -> str:
    """'model.canonical' -> 'model.canonical_halves' (an override's SECTION.KEY under its new name)."""
    section, _, name = key.partition(".")
    if section == "model" and name in RENAMED_MODEL_KEYS:
        if note is not None:
            note(name, RENAMED_MODEL_KEYS[name])
        return f"model.{RENAMED_MODEL_KEYS[name]}"
    return key


def check_kernel_and_dropout(attn_kernel, dropout) -> None:
    """model.attn_kernel and model.dropout, for either model family: a known kernel, a dropout in [0, 1), and no
    dropout with the Triton kernel (it has none)."""
    if attn_kernel not in ATTN_KERNELS:
        raise UserError(f"unknown model.attn_kernel {attn_kernel!r}; choose one of {', '.join(ATTN_KERNELS)}")
    if attn_kernel == "triton" and isinstance(dropout, (int, float)) and dropout:
        raise UserError(f"model.attn_kernel=triton has no dropout (model.dropout={dropout!r}); set model.dropout=0 "
                        "or model.attn_kernel=auto")
    if not isinstance(dropout, (int, float)) or isinstance(dropout, bool) or not 0.0 <= dropout < 1.0:
        raise UserError(f"dropout must be in [0, 1), got {dropout!r}")


@dataclass
class GPTConfig:
    """GPT-2 architecture: learned positions, pre-LayerNorm, GELU MLP, tied embeddings.

    attention: a registered variant (`variant_names()`: attention/registry.py; each class's module
        docstring says what it learns), e.g. "standard" or "canonical" (I-Attention).
    canonical_halves: which halves of a canonical head have their r x r block fixed to I: "both", "qk" (the
        query/key half: W_K's block) or "vo" (the value/output half: W_O's block). Saved runs call it `canonical`.
    init: "gpt2": N(0, 0.02) for every learned matrix entry (residual projections scaled), biases 0.
        "matched": draw the standard GPT-2 initialisation from the same RNG stream, then canonicalize
        it exactly (pivoted blocks), so a canonical model starts from the very function that a
        standard model built with the same seed starts from.
    minimal_bias: (canonical) no key bias and no value bias. Both are redundant: b_K adds q_i . b_K to
        every score of query i, which softmax ignores; b_V adds sum_j a_ij b_V W_O = b_V W_O (attention
        rows sum to one), which folds into b_O. `canonicalize(..., minimal=True)` folds them away.
    vocab_pad_multiple: the embedding table is padded to a multiple of this for speed;
        padded rows are never predicted (logits are cut to vocab_size) nor counted.
    mlp_hidden: width of each MLP's hidden layer (0: GPT-2's 4 * n_embd). `symmetry.iso_param_mlp_hidden`
        gives the width that spends the parameters a reduced attention saves on the MLP instead.
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
    bias: bool = True
    attention: str = "standard"
    canonical_halves: str = "both"
    init: str = "gpt2"
    minimal_bias: bool = False
    vocab_pad_multiple: int = 64
    mlp_hidden: int = 0
    attn_kernel: str = "auto"

    def __post_init__(self) -> None:
        self.validate(allow_auto_vocab=True)

    def validate(self, allow_auto_vocab: bool = False) -> None:
        """allow_auto_vocab: vocab_size = 0 means "take it from the tokenizer" (training configs)."""
        for name in ("n_layer", "n_head", "n_embd", "vocab_size", "block_size", "vocab_pad_multiple"):
            value = getattr(self, name)
            low = 0 if (name == "vocab_size" and allow_auto_vocab) else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise UserError(f"model.{name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head:
            raise UserError(
                f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}; "
                f"pick a head count that divides {self.n_embd}"
            )
        if self.attention not in ATTENTION_REGISTRY:
            raise UserError(f"unknown attention {self.attention!r}; choose one of {', '.join(variant_names())}")
        if self.canonical_halves not in CANONICAL_HALVES:
            raise UserError(f"unknown model.canonical_halves {self.canonical_halves!r}; choose one of "
                            f"{', '.join(CANONICAL_HALVES)}")
        if self.canonical_halves != "both" and self.attention != "canonical":
            raise UserError(f"model.canonical_halves={self.canonical_halves} only applies to attention=canonical (got "
                            f"attention={self.attention}); drop it or set model.attention=canonical")
        if self.minimal_bias and (self.attention != "canonical" or not self.bias):
            raise UserError("model.minimal_bias=true applies to attention=canonical with bias=true; drop it or set "
                            "model.attention=canonical")
        if self.init not in INITS:
            raise UserError(f"unknown model.init {self.init!r}; choose one of {', '.join(INITS)}")
        if self.init == "matched" and not ATTENTION_REGISTRY[self.attention].full_class:
            raise UserError(f"model.init=matched is impossible for attention={self.attention}: it is a smaller "
                            "function class than standard, so no equivalent start exists; use model.init=gpt2")
        if not isinstance(self.mlp_hidden, int) or isinstance(self.mlp_hidden, bool) or self.mlp_hidden < 0:
            raise UserError(f"model.mlp_hidden must be an integer >= 0 (0: 4 x n_embd), got {self.mlp_hidden!r}")
        check_kernel_and_dropout(self.attn_kernel, self.dropout)

    @property
    def d_head(self) -> int:
        return self.n_embd // self.n_head

    @property
    def d_mlp(self) -> int:
        return self.mlp_hidden or 4 * self.n_embd

    @property
    def padded_vocab_size(self) -> int:
        m = self.vocab_pad_multiple
        return (self.vocab_size + m - 1) // m * m

    def replace(self, **changes) -> GPTConfig:
        return GPTConfig(**{**asdict(self), **changes})

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> GPTConfig:
        """A saved model section (old key names read under their new ones)."""
        d = upgrade_model_keys(d)
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise UserError(f"unknown model key(s) {unknown}; allowed: {sorted(names)}")
        return cls(**d)

