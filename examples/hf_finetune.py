"""Fine-tune an iattention model folder (canonical, or any variant) with transformers' Trainer on WikiText-2, as a
user's own Trainer script would: optionally a peft LoRA on the learned blocks, and under `accelerate launch` on several
processes. docs/transformers.md runs it; tests/e2e/test_transformers_training.py checks what it prints.

    python examples/hf_finetune.py FOLDER --out OUT [--steps 300] [--lora]
    accelerate launch --multi_gpu --num_processes 2 examples/hf_finetune.py FOLDER --out OUT   (CPU: gloo)

FOLDER is any folder iattention writes (`iattn convert --to canonical`) or a folder this script saved: the model is
read with AutoModelForCausalLM (trust_remote_code=True), the text with the tokenizer the model was trained with and
the data folder iattention finds (IATTN_DATA_DIR, `iattn data remember`). Training and validation windows are
non-overlapping runs of B tokens (the model's block_size; transformers' labels are the input_ids, so B - 1 predictions
each): `iattn eval --block-size B-1`'s windows, the full ones, so the `eval_loss` printed is what `iattn eval OUT
--block-size B-1` prints over the same tokens. The last line is JSON: the validation loss before and after, the steps,
the processes, the learned parameters (num_parameters) and the trainable ones. OUT holds the fine-tuned model (with
--lora: merged, its adapter in OUT/adapter), the shim that lets transformers read it, and the source's tokenizer files
and data spec.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys

import torch


def windows(tokens, block: int) -> list[dict]:
    """Windows of `block` tokens (block - 1 predictions each, transformers' labels = input_ids): `iattn eval
    --block-size block-1`'s non-overlapping windows (data.dataset.eval_windows), the full ones."""
    from iattention.data.dataset import eval_windows

    out = []
    for start, length in eval_windows(len(tokens), block - 1):
        if length == block - 1:
            ids = torch.tensor(tokens[start: start + block], dtype=torch.long)  # a copy: the cache is read-only
            out.append({"input_ids": ids, "labels": ids})
    return out


def text_windows(folder: str, block: int, train_tokens: int, valid_tokens: int) -> tuple[list, list]:
    """(train windows, validation windows) of WikiText-2 in the tokenizer `folder`'s model was trained with."""
    from iattention.data.dataset import load_data
    from iattention.interop.load import data_config_for, kept_tokenizer, load_any

    _, data, _ = load_any(folder)
    cfg = data_config_for(data, folder)
    cfg.train_tokens, cfg.valid_tokens = train_tokens, valid_tokens
    tokens = load_data(cfg, splits=("train", "valid"), tokenizer=kept_tokenizer(folder, data)).splits
    return windows(tokens["train"], block), windows(tokens["valid"], block)


def keep_companions(src: str, out: str) -> None:
    """The source folder's tokenizer files and data spec (iattention-data.json), where OUT has none of its own."""
    import shutil
    from pathlib import Path

    from iattention.interop.folder import companions

    for name in companions(Path(src)):
        if not (Path(out) / name).exists():
            shutil.copyfile(Path(src) / name, Path(out) / name)


def lora(model, rank: int):
    """A peft LoRA of rank `rank` on the model's learned blocks (hf_model.lora_targets: the attention's learned
    matrices as target_parameters, the MLP's linear maps as target_modules); the rest frozen."""
    from peft import LoraConfig, get_peft_model

    from iattention.hf_model import lora_targets

    return get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, **lora_targets(model)))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", help="an iattention model folder (iattn convert --to canonical) or one this script wrote")
    p.add_argument("--out", required=True, help="where the fine-tuned model is saved")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--batch-size", type=int, default=8, help="per process")
    p.add_argument("--block-size", type=int, default=0, help="window length in tokens (default: the model's)")
    p.add_argument("--train-tokens", type=int, default=200_000, help="the train split's first N tokens (0: all)")
    p.add_argument("--valid-tokens", type=int, default=8_192, help="the validation split's first N (0: all)")
    p.add_argument("--lora", type=int, default=0, metavar="RANK", help="train a LoRA of this rank instead")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fsdp", action="store_true", help="shard with FSDP2 (fully_shard), under accelerate launch")
    a = p.parse_args(argv)

    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments, set_seed

    import iattention.hf_model  # noqa: F401  (registers the classes; trust_remote_code=True would do without)

    set_seed(a.seed)
    model = AutoModelForCausalLM.from_pretrained(a.folder, trust_remote_code=True, dtype=torch.float32)
    learned = model.num_parameters()
    if a.lora:
        model = lora(model, a.lora)
    block = a.block_size or model.config.max_position_embeddings
    train, valid = text_windows(a.folder, block, a.train_tokens, a.valid_tokens)
    args = TrainingArguments(
        output_dir=f"{a.out}.trainer", max_steps=a.steps, per_device_train_batch_size=a.batch_size,
        per_device_eval_batch_size=16, learning_rate=a.lr, lr_scheduler_type="cosine", warmup_steps=10,
        weight_decay=0.0, use_cpu=True, seed=a.seed, data_seed=a.seed, train_sampling_strategy="sequential",
        save_strategy="no", eval_strategy="no", logging_strategy="no", report_to="none", disable_tqdm=True,
        dataloader_num_workers=0, **({"fsdp": "full_shard", "fsdp_config": {"fsdp_version": 2}} if a.fsdp else {}))
    # the loss before, of a copy in a Trainer of its own: under DDP (transformers 5.24, accelerate 1.15) a model that
    # was evaluated before train() trains without its processes' gradients synchronised (measured: the first step's
    # gradients differed between the two processes), with the same Trainer or another one
    before = Trainer(model=copy.deepcopy(model), args=args, eval_dataset=valid).evaluate()["eval_loss"]
    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=valid)
    trainer.train()
    after = trainer.evaluate()["eval_loss"]
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if a.lora:  # the adapter alone, then the model with it merged (a canonical model still: lora_targets)
        if trainer.is_world_process_zero():
            model.save_pretrained(f"{a.out}/adapter")
        trainer.model = model = model.merge_and_unload()
    trainer.save_model(a.out)  # on the main process (gathered first under FSDP)
    if trainer.is_world_process_zero():  # its tokenizer and data spec, so that `iattn eval OUT` needs no flag
        keep_companions(a.folder, a.out)
    result = {"eval_loss_before": before, "eval_loss": after, "steps": trainer.state.global_step,
              "processes": args.world_size, "num_parameters": learned, "trainable": trainable,
              "train_windows": len(train), "valid_windows": len(valid)}
    if trainer.is_world_process_zero():
        print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
