"""`IAttentionForCausalLM`: the one model (model/gpt.py) as a transformers causal LM, for every family and variant.

It holds our `GPT` and shares its modules: `transformer` and `lm_head` are the GPT's own, so the state dict has our
names (`transformer.h.0.attn.W_Q`, ...), a folder save_pretrained writes is read by iattention (interop/load.py) and
one iattention writes is read here. A canonical layer's fixed identity blocks are not stored at all: the layer stores
the learned rest (W_K_free, W_K_rot_free, W_O_free) as parameters and which rows or columns are fixed as integer
buffers (k_perm, rot_perm, o_perm; saved, never trained), and assembles the full maps in its forward pass
(attention/canonical.py). So no optimizer, weight decay or adapter reaches them, and num_parameters() counts the
learned entries alone.

transformers' cache (DynamicCache) holds the keys and values through `_CacheView`, which gives it our cache's
interface (attention/cache.py); a left-padded batch's attention_mask becomes our key mask and each row's own
positions; gradient checkpointing recomputes each block (GPT.forward's `checkpoint`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from iattention.attention.rope import RotaryEmbedding
from iattention.checkpoint.beside import SHIM, SHIM_TEXT
from iattention.checkpoint.state import read_metadata
from iattention.errors import UserError
from iattention.hf_model.config import IAttentionConfig
from iattention.interop.load import load_model
from iattention.model.gpt import GPT
from iattention.model.loss import IGNORE_INDEX, at_least_fp32

# from_pretrained's keywords a folder of ours is read without: what they ask is what it does anyway on the CPU
_HARMLESS = ("trust_remote_code", "revision", "code_revision", "local_files_only", "low_cpu_mem_usage",
             "adapter_kwargs", "_from_auto", "_from_pipeline", "use_safetensors", "attn_implementation", "cache_dir",
             "force_download", "token", "subfolder", "_commit_hash", "key_mapping")


class _CacheView:
    """A transformers Cache with the interface our attention layers call (length, length_of, update)."""

    def __init__(self, cache: Cache):
        self.cache = cache

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    def length_of(self, layer: int) -> int:
        return self.cache.get_seq_length(layer)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cache.update(k, v, layer)


def shifted_loss(logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch=None) -> torch.Tensor:
    """transformers' causal-LM loss: position t predicts labels[t + 1] (-100: not scored), the mean over the scored
    ones (or their sum over num_items_in_batch, as Trainer asks under gradient accumulation), in float32 for bf16
    logits and float64 for float64 ones, as GPT.forward's loss."""
    targets = F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX).to(logits.device)  # (B, T)
    flat = at_least_fp32(logits.reshape(-1, logits.size(-1)))
    if num_items_in_batch is None:
        return F.cross_entropy(flat, targets.reshape(-1), ignore_index=IGNORE_INDEX)
    total = F.cross_entropy(flat, targets.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum")
    return total / torch.as_tensor(num_items_in_batch, device=total.device).to(total.dtype)


class IAttentionForCausalLM(PreTrainedModel, GenerationMixin):
    """Our GPT of any family and variant (config.iattention) as a transformers causal LM; `from_pretrained` reads a
    folder save_pretrained wrote, and one iattention wrote (iattn convert --to canonical, standard), through
    iattention's own loader."""

    config_class = IAttentionConfig
    base_model_prefix = "transformer"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["Block"]
    _supports_sdpa = True
    _tied_weights_keys = {"lm_head.weight": "transformer.wte.weight"}  # where the config ties them (GPT-2's family)
    gradient_checkpointing = False

    def __init__(self, config: IAttentionConfig, gpt: GPT | None = None):
        super().__init__(config)
        gpt = GPT(config.gpt_config()) if gpt is None else gpt
        self.transformer = gpt.transformer
        self.lm_head = gpt.lm_head
        object.__setattr__(self, "gpt", gpt)  # not a submodule: its modules are this model's own
        self.post_init()

    @torch.no_grad()
    def _init_weights(self, module):
        """Only the RoPE frequencies, a buffer no file holds, which transformers' from_pretrained leaves
        uninitialised (it builds the model without memory first): their exact float32 values (attention/rope.py).
        Every weight GPT's constructor initialised its own way (model.init: gpt2, normal, matched)."""
        if isinstance(module, RotaryEmbedding) and not module.inv_freq.is_meta:
            module.inv_freq.copy_(module._exact)

    def train(self, mode: bool = True):
        super().train(mode)
        self.gpt.training = mode
        return self

    def get_input_embeddings(self):
        return self.transformer.wte

    def set_input_embeddings(self, value):
        self.transformer.wte = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def num_parameters(self, only_trainable: bool = False, exclude_embeddings: bool = False) -> int:
        """Learned parameters as `iattn params` counts them: the true vocabulary's rows (the padding rows of a
        padded embedding left out), a tied head once; the fixed identity blocks are no parameters at all."""
        n = super().num_parameters(only_trainable=only_trainable, exclude_embeddings=exclude_embeddings)
        c = self.gpt.config
        padding = (c.padded_vocab_size - c.vocab_size) * c.n_embd
        heads = [] if exclude_embeddings else [self.transformer.wte.weight]
        heads += [] if c.tie_embeddings else [self.lm_head.weight]
        return n - padding * sum(1 for p in heads if p.requires_grad or not only_trainable)

    def forward(self, input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
                position_ids: torch.LongTensor | None = None, cache: Cache | None = None,
                inputs_embeds: torch.Tensor | None = None, labels: torch.LongTensor | None = None,
                use_cache: bool | None = None, past_key_values: Cache | None = None, **kwargs):
        """input_ids (B, T) -> CausalLMOutputWithPast(loss, logits (B, T, vocab_size), cache). attention_mask
        (B, past + T): 0 on padding (left padding: each row's positions count from its first real token unless
        position_ids say them); labels: the loss of predicting labels[t + 1] at t (-100: unscored); a cache
        (transformers' Cache; `cache` or its earlier name `past_key_values`), or use_cache=True for a new one."""
        if inputs_embeds is not None or input_ids is None:
            raise ValueError("IAttentionForCausalLM reads token ids: pass input_ids (inputs_embeds is not supported)")
        cache = cache if cache is not None else past_key_values
        if cache is None and use_cache:
            cache = DynamicCache()
        B, T = input_ids.shape
        past = cache.get_seq_length() if cache is not None else 0
        key_mask = None
        if attention_mask is not None:
            if attention_mask.shape != (B, past + T):
                raise ValueError(f"attention_mask must be (batch, past + new) = ({B}, {past + T}) with 0 on padding, "
                                 f"got {tuple(attention_mask.shape)}")
            if not bool(attention_mask.all()):
                key_mask = attention_mask.bool()
                if position_ids is None:
                    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, past:]
        if position_ids is not None and position_ids.dim() == 1:
            position_ids = position_ids[None].expand(B, T)
        checkpoint = self._gradient_checkpointing_func if (
            self.gradient_checkpointing and self.training and torch.is_grad_enabled()) else None
        logits, _ = self.gpt(input_ids, cache=_CacheView(cache) if cache is not None else None,
                             positions=position_ids, key_mask=key_mask, checkpoint=checkpoint)
        loss = None if labels is None else shifted_loss(logits, labels, kwargs.get("num_items_in_batch"))
        field = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{field: cache})

    def save_pretrained(self, save_directory, *args, **kwargs):
        """transformers' save_pretrained, then the shim config.json's auto_map names (checkpoint/beside.py SHIM), so the
        folder loads with trust_remote_code=True in a process that never imported iattention."""
        super().save_pretrained(save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True):
            (Path(save_directory) / SHIM).write_text(SHIM_TEXT)

    @classmethod
    def register_for_auto_class(cls, auto_class="AutoModel"):
        """Nothing to register (see IAttentionConfig.register_for_auto_class)."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """A folder save_pretrained wrote: transformers' from_pretrained. One iattention wrote (its weights carry our
        metadata: iattn convert --to canonical or standard, whole or streamed, one file or sharded): read by
        iattention's own loader (interop/load.py load_model), then cast to `dtype` (RoPE frequencies kept float32)
        and moved to `device_map` where it names one device."""
        folder = Path(pretrained_model_name_or_path)
        if not written_by_iattention(folder):
            return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        dtype = kwargs.pop("dtype", None) or kwargs.pop("torch_dtype", None)
        device = kwargs.pop("device_map", None)
        config = kwargs.pop("config", None)
        kwargs = {k: v for k, v in kwargs.items() if k not in _HARMLESS and v is not None}  # None asks nothing
        if args or kwargs:
            raise UserError(f"{folder} is an iattention checkpoint, read by iattention's loader, which takes dtype and "
                            f"device_map only; drop {', '.join(sorted(kwargs)) or 'the positional arguments'}")
        gpt, _ = load_model(folder)
        model = cls(IAttentionConfig(iattention=gpt.config.to_dict()) if config is None else config, gpt=gpt)
        if isinstance(dtype, str) and dtype != "auto":
            dtype = getattr(torch, dtype)
        if isinstance(dtype, torch.dtype):
            model = model.to(dtype)
        if isinstance(device, (str, torch.device)) and str(device) != "auto":
            model = model.to(device)
        model.config.dtype = next(model.parameters()).dtype
        return model.eval()


def written_by_iattention(folder: Path) -> bool:
    """Does this folder hold weights with iattention's metadata (a converted folder), not transformers' own? (A
    damaged index or file is transformers' to refuse: False.)"""
    index = folder / "model.safetensors.index.json"
    try:
        first = next(iter(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else \
            "model.safetensors"
        return (folder / first).is_file() and "iattention" in read_metadata(folder / first)
    except (OSError, ValueError, KeyError, TypeError, StopIteration, AttributeError, UserError):
        return False
