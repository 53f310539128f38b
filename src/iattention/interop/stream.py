"""Streaming conversion of rotary-family models through bounded memory: an HF Llama / Qwen2 / Mistral / GPT-NeoX
folder (one safetensors file or an index's shards) to our canonical or standard checkpoint folder (`--to canonical`,
`--to standard`), and such an iattention folder back to an HF folder (`--to hf`).

Tensors are read lazily (safetensors `safe_open`, one layer's at a time, each file closed again so its pages are
let go); each layer's gauge algebra runs in float64 (`symmetry.transforms.canonicalize_layer`, what the whole-model
`canonicalize` runs per layer); embeddings, norms and MLPs are only cast to the output dtype (by default the
source's, so untouched). The output is written as it is made: every shard's safetensors header is laid out first
(the output's names, dtypes and shapes follow from the config), then each tensor's bytes are appended; peak memory
is one layer plus the largest tensor (the embedding), not the model. `safetensors.save_file` takes every tensor
of a file at once, so this module writes the (documented, 8-byte-length + JSON header + data) format itself, read
back by safetensors' own reader in the tests. Shards and index as `save_pretrained` names them; the output lands
in a temp sibling folder renamed at the end (`convert.staged_folder`).

Exactness: every layer's attention output on a random float64 probe, converted layer against source layer, both in
float64 (the algebra's error) and with the converted weights rounded to the output dtype (what the rounding
costs), the worst layer reported. When the model is small enough (`WHOLE_CHECK_BYTES` of float64 weights), the
whole model's logits too: the source folder's own transformers class in float64 is the reference (`source load`:
ours against it), and the converted model against ours (`conversion`).
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

from iattention.attention.registry import build_attention
from iattention.attention.rope import RotaryEmbedding
from iattention.checkpoint import state as ckpt
from iattention.checkpoint.state import check_finite
from iattention.config.families import FAMILIES
from iattention.config.model import GPTConfig, upgrade_model_keys
from iattention.errors import UserError
from iattention.interop.convert import (
    DTYPES,
    NO_REFERENCE,
    ConversionReport,
    copy_companions,
    judge,
    layer_conditioning,
    probe_batch,
    staged_folder,
)
from iattention.interop.hf import (
    _IGNORED,
    _ST,
    FINITE_FIX,
    INDEX,
    Source,
    _class,
    _transformers_v5,
    _weight_files,
    check_sizes,
    dialect_of,
    dtype_name,
    family_of,
    from_hf_model,
    generation_settings,
    hf_config_from_folder,
    hf_config_of,
    hf_logits,
    rotary_of,
    token_ids_of,
    write_transformers4_keys,
)
from iattention.interop.load import DATA_SPEC_FILE, hf_model_type, load_any, write_beside
from iattention.model.gpt import GPT, exact_norms, inv_freq_of
from iattention.model.names import from_file, to_family, to_file
from iattention.symmetry import transforms
from iattention.utils.faults import fault_point

SHARD_BYTES = 2 * 10**9  # default --shard-size, as save_pretrained counts it (decimal GB)
WHOLE_CHECK_BYTES = 2**30  # whole-model logits are compared when the float64 model is at most this big
COPY_BYTES = 64 * 2**20  # untouched tensors are copied in slices of this size
PROBE_TOKENS = 32  # the per-layer probe: (1, PROBE_TOKENS, n_embd) float64 normal
_ST_NAME = {**{v: k for k, v in _ST.items()}, torch.int64: "I64"}
_LAYER = re.compile(r"^(?:model/)?(?:model|gpt_neox)\.layers\.(\d+)\.")


def shapes_of(cfg: GPTConfig, prefix: str = "") -> dict[str, tuple[list[int], torch.dtype]]:
    """{name: (shape, dtype)} of a model of `cfg`, in state-dict order, a tied head once (none allocated), under
    its family's transformers names (model/names.py): a converted folder (`prefix` "model/") keeps the tensor names
    of the HF folder it came from (our loader reads them as ours); an HF folder (no prefix) its files' names."""
    with torch.device("meta"):
        model = GPT(cfg)
    return {_side(to_family(k, cfg.family), prefix, cfg.family): (list(v.shape), v.dtype)
            for k, v in model.state_dict().items() if not (cfg.tie_embeddings and k == "lm_head.weight")}


def _side(name: str, prefix: str, family: str) -> str:
    """A transformers name as one side of a conversion holds it: under our prefix, or as an HF file names it."""
    return prefix + name if prefix else to_file(name, family)


def _unside(name: str, prefix: str, family: str) -> str:
    return name.removeprefix(prefix) if prefix else from_file(name, family)


# ---------------------------------------------------------------------------------------------------- writing


class ShardWriter:
    """safetensors shards written tensor by tensor in a fixed order (`plan`: name -> (shape, dtype)): each file's
    header first (with room to rewrite its metadata at the end), then each tensor's bytes as it is `put`."""

    RESERVE = 4096  # header bytes kept free for the final metadata

    def __init__(self, folder: Path, plan: dict[str, tuple[list[int], torch.dtype]], shard_bytes: int,
                 metadata: dict[str, str]):
        self.folder, self.plan, self.metadata = folder, list(plan.items()), metadata
        shards: list[list[int]] = [[]]
        size = 0
        for i, (_, (shape, dtype)) in enumerate(self.plan):
            n = math.prod(shape) * dtype.itemsize
            if shards[-1] and size + n > shard_bytes:
                shards.append([])
                size = 0
            shards[-1].append(i)
            size += n
        self.shards = shards
        self.names = ["model.safetensors"] if len(shards) == 1 else [
            f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
        self.total = sum(math.prod(s) * d.itemsize for _, (s, d) in self.plan)
        self._lengths: list[int] = []
        self._next = 0
        self._file = None

    def _header(self, shard: int, metadata: dict[str, str]) -> bytes:
        header, offset = {}, 0
        for i in self.shards[shard]:
            name, (shape, dtype) = self.plan[i]
            n = math.prod(shape) * dtype.itemsize
            header[name] = {"dtype": _ST_NAME[dtype], "shape": shape, "data_offsets": [offset, offset + n]}
            offset += n
        header["__metadata__"] = metadata
        return json.dumps(header, separators=(",", ":")).encode()

    def _path(self, shard: int) -> Path:
        return self.folder / self.names[shard]

    def put(self, name: str, tensor: torch.Tensor) -> None:
        self.put_chunks(name, [tensor], list(tensor.shape), tensor.dtype)

    def put_chunks(self, name: str, chunks, shape: list[int], dtype: torch.dtype) -> None:
        """The next planned tensor, given as row slices in order (each written as it comes)."""
        want, (planned, planned_dtype) = self.plan[self._next]
        if name != want or shape != planned or dtype != planned_dtype:
            raise RuntimeError(f"tensor {name} {shape} {dtype} written where {want} {planned} {planned_dtype} was "
                               "planned")
        shard = next(s for s, idx in enumerate(self.shards) if self._next in idx)
        if self._file is None:
            raw = self._header(shard, self.metadata)
            length = -(-(len(raw) + self.RESERVE) // 8) * 8
            self._lengths.append(length)
            self._file = open(self._path(shard), "wb")
            self._file.write(struct.pack("<Q", length) + raw + b" " * (length - len(raw)))
        rows = 0
        for chunk in chunks:
            if chunk.dtype != dtype or list(chunk.shape[1:]) != shape[1:]:
                raise RuntimeError(f"a slice of {name} is {list(chunk.shape)} {chunk.dtype}")
            rows += chunk.shape[0] if chunk.dim() else 1
            self._file.write(chunk.detach().contiguous().reshape(-1).view(torch.uint8).numpy().data)
        if rows != (shape[0] if shape else 1):
            raise RuntimeError(f"{name}: {rows} rows written of {shape}")
        fault_point("convert_write", torn=self._path(shard))
        fault_point("disk_full", torn=self._path(shard))
        self._next += 1
        if self._next == self.shards[shard][-1] + 1:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def finish(self, metadata: dict[str, str], index_metadata: dict | None = None) -> None:
        """Every shard's header rewritten with the final `metadata`; the index when there are several shards."""
        if self._next != len(self.plan):
            raise RuntimeError(f"{len(self.plan) - self._next} planned tensors were not written")
        for shard, length in enumerate(self._lengths):
            raw = self._header(shard, metadata)
            if len(raw) > length:
                raise RuntimeError(f"final metadata of {self.names[shard]} exceeds its reserved header")
            with open(self._path(shard), "r+b") as f:
                f.seek(8)
                f.write(raw + b" " * (length - len(raw)))
                f.flush()
                os.fsync(f.fileno())
        if len(self.shards) > 1:
            weight_map = {self.plan[i][0]: self.names[s] for s, idx in enumerate(self.shards) for i in idx}
            obj = {"metadata": {"total_size": self.total, **(index_metadata or {})}, "weight_map": weight_map}
            (self.folder / INDEX).write_text(json.dumps(obj, indent=2) + "\n")


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


def _groups(plan: dict, prefix: str):
    """The plan's names in order, cut into runs: (layer index or None, names)."""
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


def _convert_layers(source: Source, writer: ShardWriter, plan: dict, src_cfg: GPTConfig, out_cfg: GPTConfig,
                    src_prefix: str, out_prefix: str, dtype: torch.dtype, block: str) -> list[dict]:
    """Write every planned tensor, one layer at a time; the per-layer checks."""
    check = LayerCheck(src_cfg)
    family = src_cfg.family
    results = []
    with _progress(src_cfg.n_layer) as bar:
        for layer, names in _groups(plan, out_prefix):
            src_names = [_side(_unside(n, out_prefix, family), src_prefix, family) for n in names]
            if layer is None:
                for name, src_name in zip(names, src_names):
                    _copy(source, writer, name, src_name, dtype)
                continue
            attn = to_family(f"transformer.h.{layer}.attn.", family)  # model.layers.3.self_attn. (Llama)
            src_attn_names = [k for k in source.where if k.startswith(src_prefix + attn) and not k.endswith(_IGNORED)]
            attn_state = {k.removeprefix(src_prefix + attn): finite_source(v, k, source.folder)
                          for k, v in source.read(src_attn_names).items()}
            src_attn = _layer_module(src_cfg.layer(layer), attn_state)  # the layer's own rotary width
            ref, cond = check.reference(src_attn), {}
            if out_cfg.attention == src_cfg.attention:
                dst = _layer_module(out_cfg.layer(layer), attn_state)
            elif out_cfg.attention == "canonical":
                dst = _layer_module(out_cfg.layer(layer))
                chosen = {block: transforms.canonicalize_layer(src_attn, dst, out_cfg, block, layer)}
                cond = layer_conditioning(src_attn.to_heads().to(torch.float64), src_attn.rot, src_cfg.rope_layout,
                                          chosen)
            else:  # to standard: the assembled matrices
                dst = _layer_module(out_cfg.layer(layer))
                dst.load_heads(src_attn.to_heads())
            del src_attn, attn_state  # one float64 copy of the layer fewer while the converted one is checked
            rounded = _cast(dst.state_dict(), dtype)
            results.append({**check(ref, dst, rounded), **cond})
            for name, src_name in zip(names, src_names):
                if name.startswith(out_prefix + attn):
                    writer.put(name, finite_output(rounded[name.removeprefix(out_prefix + attn)], name, dtype))
                else:
                    _copy(source, writer, name, src_name, dtype)
            del dst, rounded
            bar.update(1)
    return results


def _copy(source: Source, writer: ShardWriter, name: str, src_name: str, dtype: torch.dtype) -> None:
    """An untouched tensor (embedding, norm, MLP), cast to dtype, copied in slices of at most COPY_BYTES, each
    checked finite as read and as cast."""
    chunks = (finite_output(finite_source(c, src_name, source.folder).to(dtype), name, dtype)
              for c in source.chunks(src_name, COPY_BYTES))
    writer.put_chunks(name, chunks, source.shapes[src_name], dtype)


def _layer_of(name: str) -> str:
    m = _LAYER.match(name)
    return f" (layer {m.group(1)})" if m else ""


def finite_source(tensor: torch.Tensor, name: str, folder: Path) -> torch.Tensor:
    """`tensor` (source tensor `name`, or a slice of it), refused in one line naming it and its layer if it holds a
    NaN or Inf (the checkpoint loader's check_finite): a copied NaN was written silently, and the per-layer check
    sees the attention weights only."""
    check_finite({name: tensor}, f"{folder}{_layer_of(name)}", f"{FINITE_FIX}; nothing was written")
    return tensor


def finite_output(tensor: torch.Tensor, name: str, dtype: torch.dtype) -> torch.Tensor:
    """`tensor` as written (output tensor `name`, in `dtype`), refused in one line if the gauge algebra (a block near
    singular) or the cast (a weight past the dtype's range) made a NaN or Inf of finite source weights."""
    check_finite({name: tensor}, f"the conversion{_layer_of(name)}", f"a fixed block of this layer is near singular "
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
def hf_to_ours(src: str | Path, out: str | Path, to: str = "canonical", block: str = "pivoted",
               dtype: str | None = None, shard_bytes: int = SHARD_BYTES, force: bool = False,
               say=print, per_head: bool = False) -> ConversionReport:
    """An HF rotary-family folder -> our canonical (or standard) checkpoint folder, streamed. Prints the report
    with `say`; a check over its tolerance is a UserError (nothing written) unless `force`."""
    _transformers_v5()
    src, out = Path(src), Path(out)
    family = family_of(src)
    fam = FAMILIES[family]
    if not fam.streamed:  # GPT-2: Conv1D weights, learned positions: loaded whole (interop/hf.py)
        raise UserError(f"{src} is a {fam.label} model, which converts whole, not streamed: iattn convert --from "
                        f"{src}")
    dialect = dialect_of(family)
    cfg_json = dialect.read_config(src)
    generation_settings(src)  # copied through, and read by transformers for the check: refused here, in one line
    source = Source(src)
    src_dtype = source.float_dtype()
    check_sizes(src, fam, cfg_json, source.shapes)
    hf_cfg = hf_config_from_folder(src, family)
    tied = bool(hf_cfg.tie_word_embeddings) and to_file("lm_head.weight", family) not in source.shapes
    cfg = dialect.config_of(hf_cfg, rotary_of(hf_cfg, family), tied, fam)
    source.check_against({k: s for k, (s, _) in shapes_of(cfg).items()}, f"{src / 'config.json'}")
    out_dtype = DTYPES[dtype] if dtype else src_dtype
    out_cfg = cfg.replace(attention=to)
    plan = {k: (s, out_dtype if d.is_floating_point else d) for k, (s, d) in shapes_of(out_cfg, "model/").items()}
    meta = {"config": {"model": out_cfg.to_dict()}, "source": str(src),
            "conversion": {"to": to, "max_abs_logit_diff": None}}
    ids = token_ids_of(hf_cfg, src)  # bos/eos/pad as the source's config says them, for an export to write back
    if ids:
        meta["token_ids"] = ids
    report = ConversionReport(to, out_dtype, cfg, source=str(src), out=str(out), block=block)
    report.params_before = sum(math.prod(s) for s, _ in shapes_of(cfg).values())
    report.params_after = sum(math.prod(s) for k, (s, d) in plan.items() if d.is_floating_point)
    with staged_folder(out) as tmp:
        writer = ShardWriter(tmp, plan, shard_bytes, {"iattention": json.dumps({**meta, "format": ckpt.FORMAT})})
        try:
            report.layers = _convert_layers(source, writer, plan, cfg, out_cfg, "", "model/", out_dtype, block)
        finally:
            writer.close()
        write_beside(tmp, out_cfg.to_dict())
        report.copied = copy_companions(src, tmp)
        fits, report.whole_skipped = _whole_fits(cfg)
        if fits:
            hf = _class(family).from_pretrained(str(src), dtype=torch.float64).eval()
            ours = from_hf_model(hf, family)
            x = probe_batch(ours)
            ref = hf(x).logits
            del hf
            report.source_load = relative(ours(x)[0], ref)  # RMSNorm in float32, as transformers computes it
            with exact_norms(ours):  # ours against ours: float64 throughout
                mine = ours(x)[0]
            writer.finish({"iattention": json.dumps({**meta, "format": ckpt.FORMAT})})  # readable for the check
            with exact_norms(load_any(tmp)[0].to(torch.float64)) as converted:
                logits = converted(x)[0]
            report.conversion = relative(logits, mine)
            report.max_abs_logit_diff = meta["conversion"]["max_abs_logit_diff"] = (logits - mine).abs().max().item()
        layer, worst = report.worst
        meta["conversion"].update(worst_layer=layer, worst_layer_rel_diff=worst)
        writer.finish({"iattention": json.dumps({**meta, "format": ckpt.FORMAT})})
        report.files, report.bytes_written = writer.names, writer.total
        judge(report, force, say, per_head)
    return report


def is_streamed_source(path: str | Path) -> bool:
    """A folder of ours holding a rotary-family model without a data spec, under its family's transformers names
    (what the streaming converter writes): `--to hf` streams it. One under our names (a whole-model conversion)
    loads whole."""
    path = Path(path)
    if not path.is_dir() or (path / DATA_SPEC_FILE).exists() or hf_model_type(path) is not None:
        return False
    files = _our_files(path)
    if not files:
        return False
    meta = ckpt.read_meta(path / files[0])
    model = (meta.get("config") or {}).get("model") or {}
    family = upgrade_model_keys(model).get("family") if isinstance(model, dict) else None
    if not isinstance(family, str) or family not in FAMILIES or "data" in meta.get("config", {}):
        return False
    # the first part of a streamed family's transformers names (`model.`, `gpt_neox.`), under the writer's prefix
    theirs = tuple({f"model/{name.split('.')[0]}." for fam in FAMILIES.values() if fam.streamed
                    for _, name in fam.names})
    with safe_open(str(path / files[0]), framework="pt") as f:
        return any(k.startswith(theirs) for k in f.keys())


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
    source = Source(src, files)
    ckpt.check_structure(source.read([k for k in source.shapes if k.endswith(ckpt.STRUCTURAL)]), src)
    src_dtype = source.float_dtype(allowed_ints=ckpt.STRUCTURAL)
    source.check_against({k: s for k, (s, _) in shapes_of(cfg, "model/").items()},
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
        writer = ShardWriter(tmp, plan, shard_bytes, {"format": "pt"})
        try:
            report.layers = _convert_layers(source, writer, plan, cfg, out_cfg, "model/", "", out_dtype, "")
        finally:
            writer.close()
        writer.finish({"format": "pt"})
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
        report.files, report.bytes_written = writer.names, writer.total
        report.source_note = NO_REFERENCE
        judge(report, force, say, per_head)
    return report
