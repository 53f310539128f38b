"""The Llama-family model configuration (model/llama.py): RMSNorm, SwiGLU MLP, RoPE, grouped-query attention.
The attention variants it accepts are `GROUPED_REGISTRY`'s (attention/registry.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from iattention.attention.registry import GROUPED_REGISTRY
from iattention.attention.rope import LAYOUTS
from iattention.config.model import check_kernel_and_dropout
from iattention.errors import UserError

ARCH = "llama"  # the `arch` key a saved Llama config carries (a GPTConfig has none)
ROPE_TYPES = ("default", "llama3")
LLAMA3_SCALING = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
FAMILY_NAMES = ("llama", "qwen2", "mistral")  # transformers' model_type of an export


@dataclass
class LlamaConfig:
    """A Llama / Qwen2 / Mistral / SmolLM2-shaped decoder.

    n_head query heads and n_kv_head key/value heads (n_kv_head divides n_head: MHA n_kv_head = n_head, MQA 1) of
    width d_head (0: n_embd // n_head; Llama-family checkpoints may use any width); d_ff: the SwiGLU hidden width.
    rot: rotary dims per head (even; 0: all d_head); the other d_head - rot dims carry no position. rope_layout:
    "half" (transformers' rotate_half) or "interleaved" (rope.py). rope_theta and rope_scaling (transformers'
    rope_parameters beyond rope_type / rope_theta, for rope_type "llama3") give the frequencies.
    qkv_bias: biases on q, k, v (Qwen2); o_bias: on the output projection (Llama's attention_bias sets both).
    block_size: the longest sequence (transformers' max_position_embeddings, or Mistral's sliding window if shorter).
    family: the transformers class an export writes (FAMILIES: "llama", "qwen2", "mistral"); sliding_window
    (Mistral's, 0: none) and max_positions (max_position_embeddings, 0: block_size) are kept for that export.
    attn_kernel: which attention kernel runs (auto | sdpa | math | triton), as GPTConfig's (kernels/__init__.py).
    """

    n_layer: int = 2
    n_head: int = 4
    n_kv_head: int = 2
    n_embd: int = 64
    d_head: int = 0
    d_ff: int = 128
    vocab_size: int = 256
    block_size: int = 128
    rot: int = 0
    rope_layout: str = "half"
    rope_theta: float = 10000.0
    rope_type: str = "default"
    rope_scaling: dict = field(default_factory=dict)
    rms_eps: float = 1e-6
    qkv_bias: bool = False
    o_bias: bool = False
    tie_embeddings: bool = False
    dropout: float = 0.0
    attention: str = "standard"
    family: str = "llama"
    sliding_window: int = 0
    max_positions: int = 0
    attn_kernel: str = "auto"

    def __post_init__(self) -> None:
        if not self.d_head and isinstance(self.n_embd, int) and isinstance(self.n_head, int) and self.n_head > 0:
            self.d_head = self.n_embd // self.n_head
        if not self.rot and isinstance(self.d_head, int):
            self.rot = self.d_head
        self.validate(allow_auto_vocab=True)

    def validate(self, allow_auto_vocab: bool = False) -> None:
        """allow_auto_vocab: vocab_size = 0 means "take it from the tokenizer" (training configs), as GPTConfig's."""
        for name in ("n_layer", "n_head", "n_kv_head", "n_embd", "d_head", "d_ff", "vocab_size", "block_size"):
            value = getattr(self, name)
            low = 0 if (name == "vocab_size" and allow_auto_vocab) else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise UserError(f"model.{name} must be a positive integer, got {value!r}")
        if self.n_head % self.n_kv_head:
            raise UserError(f"n_head={self.n_head} is not a multiple of n_kv_head={self.n_kv_head}; each key/value "
                            "head serves the same number of query heads")
        if self.d_head > self.n_embd:
            raise UserError(f"d_head={self.d_head} exceeds n_embd={self.n_embd}; a head cannot be wider than the "
                            "residual stream here")
        if not isinstance(self.rot, int) or self.rot < 0 or self.rot % 2 or self.rot > self.d_head:
            raise UserError(f"model.rot must be an even number of rotary dims in [0, d_head={self.d_head}], got "
                            f"{self.rot!r}")
        if self.rope_layout not in LAYOUTS:
            raise UserError(f"unknown model.rope_layout {self.rope_layout!r}; choose one of {', '.join(LAYOUTS)}")
        if self.rope_type not in ROPE_TYPES:
            raise UserError(f"unknown model.rope_type {self.rope_type!r}; choose one of {', '.join(ROPE_TYPES)}")
        if self.attention not in GROUPED_REGISTRY:
            raise UserError(f"unknown attention {self.attention!r} for a Llama-family model; choose one of "
                            f"{', '.join(GROUPED_REGISTRY)}")
        if self.family not in FAMILY_NAMES:
            raise UserError(f"unknown model.family {self.family!r}; choose one of {', '.join(FAMILY_NAMES)}")
        check_kernel_and_dropout(self.attn_kernel, self.dropout)
        for name, example in (("rope_theta", "10000"), ("rms_eps", "1e-6")):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < float("inf"):
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
        # this model attends over its whole block: a shorter Mistral window or position limit would be ignored
        # here and applied by transformers after an export, so a trained model and its export would differ
        for name in ("sliding_window", "max_positions"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise UserError(f"model.{name} must be an integer >= 0 (0: none), got {value!r}")
            if 0 < value < self.block_size:
                raise UserError(f"model.{name}={value} is shorter than model.block_size={self.block_size}; this "
                                f"model attends over its whole block, so set model.block_size={value} or drop "
                                f"model.{name}")

    @property
    def padded_vocab_size(self) -> int:
        """The embedding rows (no padding here: transformers' Llama has none)."""
        return self.vocab_size

    @property
    def group(self) -> int:
        """Query heads per key/value head."""
        return self.n_head // self.n_kv_head

    def replace(self, **changes) -> LlamaConfig:
        return LlamaConfig(**{**asdict(self), **changes})

    def to_dict(self) -> dict:
        return {"arch": ARCH, **asdict(self)}

    @classmethod
    def from_dict(cls, d: dict) -> LlamaConfig:
        d = {k: v for k, v in d.items() if k != "arch"}
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise UserError(f"unknown Llama model key(s) {unknown}; allowed: {sorted(names)}")
        return cls(**d)
