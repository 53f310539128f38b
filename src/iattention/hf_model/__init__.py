"""iattention's model inside transformers (issue 66): `IAttentionConfig` and `IAttentionForCausalLM` (every family,
every variant), registered with AutoConfig and AutoModelForCausalLM when this package is imported (`import
iattention` alone imports neither torch nor transformers: cli/__init__.py, the start-up Ctrl-C handling). A folder
iattention writes needs no import at all: its auto_map names a shim beside it (checkpoint/beside.py SHIM), so
`AutoModelForCausalLM.from_pretrained(FOLDER, trust_remote_code=True)` reads it in any process. docs/transformers.md."""

from transformers import AutoConfig, AutoModelForCausalLM

from iattention.hf_model.config import IAttentionConfig
from iattention.hf_model.lora import lora_targets
from iattention.hf_model.modeling import IAttentionForCausalLM

AutoConfig.register(IAttentionConfig.model_type, IAttentionConfig, exist_ok=True)
AutoModelForCausalLM.register(IAttentionConfig, IAttentionForCausalLM, exist_ok=True)

__all__ = ["IAttentionConfig", "IAttentionForCausalLM", "lora_targets"]
