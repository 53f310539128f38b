"""Streaming conversion of rotary-family models through bounded memory: an HF Llama / Qwen2 / Mistral / GPT-NeoX
folder (one safetensors file or an index's shards) to our canonical or standard checkpoint folder (`--to canonical`,
`--to standard`), and such an iattention folder back to an HF folder (`--to hf`).

Tensors are read lazily (safetensors `safe_open`, one layer's at a time, each file closed again so its pages are
let go); each layer's gauge algebra runs in float64 (`symmetry.transforms.canonicalize_layer`, what the whole-model
`canonicalize` runs per layer); embeddings, norms and MLPs are only cast to the output dtype (by default the
source's, so untouched). The output is written as it is made, by the one writer of checkpoints
(checkpoint/writer.py: headers first, then each tensor's bytes), under the one layout of our checkpoints (our
names under `model/`; a folder written before under its source's names is read through checkpoint.state.upgrade_key);
peak memory is one layer plus the largest tensor (the embedding), not the model. The output lands in a temp sibling
folder renamed at the end (`utils/atomic.staged_folder`).

Exactness: every layer's attention output on a random float64 probe, converted layer against source layer, both in
float64 (the algebra's error) and with the converted weights rounded to the output dtype (what the rounding
costs), the worst layer reported. When the model is small enough (`WHOLE_CHECK_BYTES` of float64 weights), the
whole model's logits too: the source folder's own transformers class in float64 is the reference (`source load`:
ours against it), and the converted model against ours (`conversion`).
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from iattention.attention.registry import build_attention
from iattention.attention.rope import RotaryEmbedding
from iattention.checkpoint import state as ckpt
from iattention.checkpoint.beside import write_beside
from iattention.checkpoint.state import check_finite
from iattention.checkpoint.writer import ShardWriter, checkpoint_metadata
from iattention.config.families import FAMILIES
from iattention.config.model import GPTConfig, upgrade_model_keys
from iattention.errors import UserError
from iattention.interop.convert import (
    DTYPES,
    NO_REFERENCE,
    ConversionReport,
    judge,
    probe_batch,
)
from iattention.interop.dialects import _class, _transformers_v5, dialect_of, rotary_of
from iattention.interop.folder import (
    _IGNORED,
    DATA_SPEC_FILE,
    INDEX,
    HFFolder,
    Source,
    _weight_files,
    copy_companions,
    dtype_name,
    generation_settings,
    hf_folder,
)
from iattention.interop.hf import from_hf_model, hf_config_of, hf_logits, write_transformers4_keys
from iattention.interop.load import load_any
from iattention.model.gpt import GPT, exact_norms, inv_freq_of
from iattention.model.names import to_family, to_file
from iattention.symmetry import transforms
from iattention.symmetry.conditioning import layer_conditioning
from iattention.utils.atomic import staged_folder

SHARD_BYTES = 2 * 10**9  # default --shard-size, as save_pretrained counts it (decimal GB)
WHOLE_CHECK_BYTES = 2**30  # whole-model logits are compared when the float64 model is at most this big
COPY_BYTES = 64 * 2**20  # untouched tensors are copied in slices of this size
PROBE_TOKENS = 32  # the per-layer probe: (1, PROBE_TOKENS, n_embd) float64 normal
_LAYER = re.compile(r"^transformer\.h\.(\d+)\.")  # our name of a layer's tensor; group 1: its index


def shapes_of(cfg: GPTConfig) -> dict[str, tuple[list[int], torch.dtype]]:
    """{our name: (shape, dtype)} of a model of `cfg`, in state-dict order, a tied head once (none allocated)."""
    with torch.device("meta"):
        model = GPT(cfg)
    return {k: (list(v.shape), v.dtype) for k, v in model.state_dict().items()
            if not (cfg.tie_embeddings and k == "lm_head.weight")}


def in_checkpoint(name: str, family: str) -> str:
    """Our name as a checkpoint of ours holds it (every layout written before is read as this: model/names.py)."""
    return ckpt.MODEL + name


def in_hf_files(name: str, family: str) -> str:
    """Our name as an HF folder of the family holds it in its files."""
    return to_file(to_family(name, family), family)


# ---------------------------------------------------------------------------------------------------- checking


def relative(a: torch.Tensor, ref: torch.Tensor) -> float:
    scale = ref.abs().max().item()
    return (a - ref).abs().max().item() / scale if scale else float((a - ref).abs().max().item())


class LayerCheck:
    """A fixed float64 probe through one attention layer: source against converted (exact and rounded)."""

    def __init__(self, cfg: GPTConfig, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        T = min(PROBE_TOKENS, cfg.block_size)
        self.x = torch.randn(1, T, cfg.n_embd, generator=g, dtype=torch.float64)
        self.rope = RotaryEmbedding(inv_freq_of(cfg))(torch.arange(T), torch.float64)

    @torch.no_grad()
    def reference(self, src) -> torch.Tensor:
        """The source layer's output on the probe (float64)."""
        return src(self.x, rope=self.rope)

    @torch.no_grad()
    def __call__(self, ref: torch.Tensor, dst, rounded: dict[str, torch.Tensor]) -> dict[str, float]:
        """`ref`: the source layer's output; `dst`: the converted layer in float64; `rounded`: dst's state as
        written. dst is left holding the rounded weights."""
        algebra = relative(dst(self.x, rope=self.rope), ref)
        dst.load_state_dict({k: v.to(torch.float64) if v.is_floating_point() else v for k, v in rounded.items()})
        return {"algebra": algebra, "rounded": relative(dst(self.x, rope=self.rope), ref)}


def _layer_module(cfg: GPTConfig, state: dict[str, torch.Tensor] | None = None):
    """A float64 attention layer of `cfg`, uninitialised (built on the meta device: no random init to pay for)
    unless `state` is given; its caller loads every weight and buffer (load_heads and set_blocks, or `state`)."""
    with torch.device("meta"):
        attn = build_attention(cfg)
    attn = attn.to_empty(device="cpu").to(torch.float64).eval()
    if state is not None:
        attn.load_state_dict({k: v.to(torch.float64) if v.is_floating_point() else v for k, v in state.items()})
    return attn


def _cast(state: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}


# ---------------------------------------------------------------------------------------------------- the runs


def _groups(plan: dict):
    """The plan's names (ours) in order, cut into runs: (layer index or None, names)."""
    run, layer = [], None
    for name in plan:
        m = _LAYER.match(name)
        this = int(m.group(1)) if m else None
        if run and this != layer:
            yield layer, run
            run = []
        layer = this
        run.append(name)
    if run:
        yield layer, run


def _progress(n: int):
    return tqdm(total=n, desc="converting", unit="layer", file=sys.stderr, disable=None, leave=False)


def _write(tmp: Path, report: ConversionReport, source: Source, plan: dict, out_cfg: GPTConfig, src_name, out_name,
           metadata: dict[str, str], shard_bytes: int) -> ShardWriter:
    """Every tensor of `plan` (our names) converted (`_converted`) and written into `tmp` with `metadata` (final unless
    `finish` rewrites it). Returns the writer, its files closed."""
    writer = ShardWriter(tmp, {out_name(k, out_cfg.family): v for k, v in plan.items()}, metadata, shard_bytes,
                         fault="convert_write")
    writer.write(_converted(report, source, plan, out_cfg, src_name, out_name))
    report.files, report.bytes_written = writer.names, writer.total
    return writer


def _converted(report: ConversionReport, source: Source, plan: dict, out_cfg: GPTConfig, src_name, out_name):
    """Every tensor of `plan` (our names, in order) converted one layer at a time, as (the name `out_name(ours,
    family)` gives it, the tensor or its row slices), read under the name `src_name` gives; each layer's checks in the
    report. Attention layers are converted in float64 (and checked on a probe), the rest (embedding, norms, MLPs) only
    cast to the output dtype, copied in slices of at most COPY_BYTES; every tensor checked finite as read
    (Source.read, Source.chunks) and as written."""
    src_cfg, dtype, block, family = report.config, report.dtype, report.block, report.config.family
    check = LayerCheck(src_cfg)
    with _progress(src_cfg.n_layer) as bar:
        for layer, names in _groups(plan):
            attn, rounded = f"transformer.h.{layer}.attn.", {}
            if layer is not None:
                src_attn = src_name(attn, family)  # model.layers.3.self_attn. (a Llama folder), model/transformer...
                src_attn_names = [k for k in source.where if k.startswith(src_attn) and not k.endswith(_IGNORED)]
                attn_state = {k.removeprefix(src_attn): v for k, v in source.read(src_attn_names, layer).items()}
                src_layer = _layer_module(src_cfg.layer(layer), attn_state)  # the layer's own rotary width
                ref, cond = check.reference(src_layer), {}
                if out_cfg.attention == src_cfg.attention:
                    dst = _layer_module(out_cfg.layer(layer), attn_state)
                elif out_cfg.attention == "canonical":
                    dst = _layer_module(out_cfg.layer(layer))
                    chosen = {block: transforms.canonicalize_layer(src_layer, dst, out_cfg, block, layer)}
                    cond = layer_conditioning(src_layer.to_heads().to(torch.float64), src_layer.rot,
                                              src_cfg.rope_layout, chosen)
                else:  # to standard: the assembled matrices
                    dst = _layer_module(out_cfg.layer(layer))
                    dst.load_heads(src_layer.to_heads())
                del src_layer, attn_state  # one float64 copy of the layer fewer while the converted one is checked
                rounded = _cast(dst.state_dict(), dtype)
                report.layers.append({**check(ref, dst, rounded), **cond})
                del dst
            for name in names:
                written = out_name(name, family)
                if layer is not None and name.startswith(attn):
                    yield written, finite_output(rounded[name.removeprefix(attn)], written, dtype, layer)
                else:
                    yield written, (finite_output(c.to(dtype), written, dtype, layer)
                                    for c in source.chunks(src_name(name, family), COPY_BYTES, layer))
            if layer is not None:
                bar.update(1)


def finite_output(tensor: torch.Tensor, name: str, dtype: torch.dtype, layer: int | None = None) -> torch.Tensor:
    """`tensor` as written (output tensor `name` of `layer`, in `dtype`), refused in one line if the gauge algebra (a
    block near singular) or the cast (a weight past the dtype's range) made a NaN or Inf of finite source weights."""
    where = f"the conversion{f' (layer {layer})' if layer is not None else ''}"
    check_finite({name: tensor}, where, f"a fixed block of this layer is near singular "
                 f"or a weight overflows {dtype_name(dtype)}: try --block pivoted or --dtype float32; nothing was "
                 "written")
    return tensor


def _whole_fits(cfg: GPTConfig) -> tuple[bool, str]:
    n = sum(math.prod(s) for s, _ in shapes_of(cfg).values())
    need = n * 8
    if need <= WHOLE_CHECK_BYTES:
        return True, ""
    return False, (f"the float64 model is {need / 2**30:.3g} GiB, over the {WHOLE_CHECK_BYTES / 2**30:.3g} GiB the "
                   "streaming converter allows itself; the per-layer check above stands for it")


@torch.no_grad()
def hf_to_ours(src: str | Path | HFFolder, out: str | Path, to: str = "canonical", block: str = "pivoted",
               dtype: str | None = None, shard_bytes: int = SHARD_BYTES, force: bool = False,
               say=print, per_head: bool = False) -> ConversionReport:
    """An HF rotary-family folder -> our canonical (or standard) checkpoint folder, streamed. Prints the report
    with `say`; a check over its tolerance is a UserError (nothing written) unless `force`. `src`: the folder's path
    or the HFFolder a command read."""
    _transformers_v5()
    folder, out = HFFolder.at(src), Path(out)
    src, fam = folder.path, folder.family
    family = fam.name
    if not fam.streamed:  # GPT-2: Conv1D weights, learned positions: loaded whole (interop/hf.py)
        raise UserError(f"{src} is a {fam.label} model, which converts whole, not streamed: iattn convert --from "
                        f"{src}")
    source, src_dtype, hf_cfg = folder.read(whole=False).source, folder.dtype, folder.hf_config
    tied = bool(hf_cfg.tie_word_embeddings) and to_file("lm_head.weight", family) not in source.shapes
    cfg = dialect_of(family).config_of(hf_cfg, rotary_of(hf_cfg, family), tied, fam)
    source.check_against({in_hf_files(k, family): s for k, (s, _) in shapes_of(cfg).items()}, f"{folder.where}")
    out_dtype = DTYPES[dtype] if dtype else src_dtype
    out_cfg = cfg.replace(attention=to)
    plan = {k: (s, out_dtype if d.is_floating_point else d) for k, (s, d) in shapes_of(out_cfg).items()}
    meta = {"config": {"model": out_cfg.to_dict()}, "source": str(src),
            "conversion": {"to": to, "max_abs_logit_diff": None}}
    ids = folder.token_ids  # bos/eos/pad as the source's config says them, for an export to write back
    if ids:
        meta["token_ids"] = ids
    report = ConversionReport(to, out_dtype, cfg, source=str(src), out=str(out), block=block)
    report.params_before = sum(math.prod(s) for s, _ in shapes_of(cfg).values())
    report.params_after = sum(math.prod(s) for k, (s, d) in plan.items() if d.is_floating_point)
    with staged_folder(out) as tmp:
        writer = _write(tmp, report, source, plan, out_cfg, in_hf_files, in_checkpoint, checkpoint_metadata(meta),
                        shard_bytes)
        write_beside(tmp, out_cfg.to_dict())
        report.copied = copy_companions(src, tmp, folder.companions)
        fits, report.whole_skipped = _whole_fits(cfg)
        if fits:
            hf = _class(family).from_pretrained(str(src), dtype=torch.float64, **folder.load_options()).eval()
            ours = from_hf_model(hf, family)
            x = probe_batch(ours)
            ref = hf(x).logits
            del hf
            report.source_load = relative(ours(x)[0], ref)  # RMSNorm in float32, as transformers computes it
            with exact_norms(ours):  # ours against ours: float64 throughout
                mine = ours(x)[0]
            writer.finish(checkpoint_metadata(meta))  # readable for the check
            with exact_norms(load_any(tmp)[0].to(torch.float64)) as converted:
                logits = converted(x)[0]
            report.conversion = relative(logits, mine)
            report.max_abs_logit_diff = meta["conversion"]["max_abs_logit_diff"] = (logits - mine).abs().max().item()
        layer, worst = report.worst
        meta["conversion"].update(worst_layer=layer, worst_layer_rel_diff=worst)
        writer.finish(checkpoint_metadata(meta))
        judge(report, force, say, per_head)
    return report


def is_streamed_source(path: str | Path) -> bool:
    """A folder the streaming converter wrote (its checkpoint's metadata holds the per-layer check,
    conversion.worst_layer) of a family that streams, without a data spec: `--to hf` streams it back. One the
    whole-model conversion wrote loads whole."""
    path = Path(path)
    if not path.is_dir() or (path / DATA_SPEC_FILE).exists() or hf_folder(path) is not None:
        return False
    files = _our_files(path)
    if not files:
        return False
    meta = ckpt.read_meta(path / files[0])
    model = (meta.get("config") or {}).get("model") or {}
    family = upgrade_model_keys(model).get("family") if isinstance(model, dict) else None
    conversion = meta.get("conversion")
    return (isinstance(family, str) and family in FAMILIES and FAMILIES[family].streamed
            and "data" not in meta.get("config", {}) and isinstance(conversion, dict) and "worst_layer" in conversion)


def _our_files(path: Path) -> list[str]:
    if (path / INDEX).exists():
        return _weight_files(path)
    return ["model.safetensors"] if (path / "model.safetensors").is_file() else []


@torch.no_grad()
def ours_to_hf(src: str | Path, out: str | Path, dtype: str | None = None, shard_bytes: int = SHARD_BYTES,
               force: bool = False, say=print, per_head: bool = False) -> ConversionReport:
    """Our rotary-family folder (canonical or standard) -> the HF folder of its family, streamed."""
    _transformers_v5()
    src, out = Path(src), Path(out)
    generation_settings(src)  # copied through, and read by transformers for the check: refused here, in one line
    files = _our_files(src)
    meta = ckpt.read_meta(src / files[0])
    cfg = GPTConfig.from_dict(meta["config"]["model"])
    source = Source(src, files, rename=ckpt.upgrade_key)  # every layout written before, read under today's names
    ckpt.check_structure(source.read([k for k in source.shapes if k.endswith(ckpt.STRUCTURAL)]), src)
    src_dtype = source.float_dtype(allowed_ints=ckpt.STRUCTURAL)
    source.check_against({in_checkpoint(k, cfg.family): s for k, (s, _) in shapes_of(cfg).items()},
                         "the config in its checkpoint's metadata")
    out_dtype = DTYPES[dtype] if dtype else src_dtype
    out_cfg = cfg.replace(attention="standard")
    hf_cfg = hf_config_of(out_cfg, meta.get("token_ids"))
    hf_cfg.architectures = [FAMILIES[cfg.family].hf_class]
    hf_cfg.dtype = dtype_name(out_dtype)
    plan = {k: (s, out_dtype) for k, (s, _) in shapes_of(out_cfg).items()}
    report = ConversionReport("hf", out_dtype, cfg, source=str(src), out=str(out))
    report.params_before = sum(math.prod(s) for s, d in shapes_of(cfg).values() if d.is_floating_point)
    report.params_after = sum(math.prod(s) for s, _ in plan.values())
    with staged_folder(out) as tmp:
        _write(tmp, report, source, plan, out_cfg, in_checkpoint, in_hf_files, {"format": "pt"}, shard_bytes)
        hf_cfg.save_pretrained(str(tmp))
        write_transformers4_keys(tmp)
        report.copied = copy_companions(src, tmp)
        if "generation_config.json" not in report.copied:  # as save_pretrained writes it: the config's token ids
            _transformers_v5().GenerationConfig.from_model_config(hf_cfg).save_pretrained(str(tmp))
        fits, report.whole_skipped = _whole_fits(cfg)
        if fits:
            ours = load_any(src)[0].to(torch.float64)
            x = probe_batch(ours)
            mine = ours(x)[0]
            theirs = hf_logits(tmp, x)
            report.conversion, report.max_abs_logit_diff = relative(theirs, mine), (theirs - mine).abs().max().item()
        report.source_note = NO_REFERENCE
        judge(report, force, say, per_head)
    return report
