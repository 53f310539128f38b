"""Model configuration: a small dataclass. The attention variants it accepts are the registry's
(`attention/registry.py`); presets that build it are `config/load.py`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from iattention.attention.registry import ATTENTION_REGISTRY, variant_names
from iattention.errors import UserError

INITS = ("gpt2", "matched")
CANONICAL_HALVES = ("both", "qk", "vo")


@dataclass
class GPTConfig:
    """GPT-2 architecture: learned positions, pre-LayerNorm, GELU MLP, tied embeddings.

    attention: a registered variant (`variant_names()`: attention/registry.py; each class's module
        docstring says what it learns), e.g. "standard" or "canonical" (I-Attention).
    canonical: which halves of a canonical head have their r x r block fixed to I.
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
    """

    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    vocab_size: int = 50257
    block_size: int = 1024
    dropout: float = 0.0
    bias: bool = True
    attention: str = "standard"
    canonical: str = "both"
    init: str = "gpt2"
    minimal_bias: bool = False
    vocab_pad_multiple: int = 64
    mlp_hidden: int = 0

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
        if self.canonical not in CANONICAL_HALVES:
            raise UserError(f"unknown canonical {self.canonical!r}; choose one of {', '.join(CANONICAL_HALVES)}")
        if self.canonical != "both" and self.attention != "canonical":
            raise UserError(f"model.canonical={self.canonical} only applies to attention=canonical (got "
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
        d = self.dropout
        if not isinstance(d, (int, float)) or isinstance(d, bool) or not 0.0 <= d < 1.0:
            raise UserError(f"dropout must be in [0, 1), got {self.dropout!r}")

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
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise UserError(f"unknown model key(s) {unknown}; allowed: {sorted(names)}")
        return cls(**d)

