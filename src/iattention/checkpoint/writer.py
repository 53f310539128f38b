"""The one writer of safetensors files, ours and Hugging Face's: a checkpoint (`state.save_checkpoint`), a streamed
conversion's output and an export's shards (`interop/stream.py`) are all written here, tensor by tensor, in one file
or in shards with their index as `save_pretrained` names them.

Each file's header is laid out first (the names, dtypes and shapes of a plan, with room to rewrite the metadata at
the end), then each tensor's bytes are appended as it comes, so that peak memory is the largest tensor, not the model:
`safetensors.save_file` takes every tensor of a file at once, so this writes the documented format (8-byte header
length, JSON header, data) itself; safetensors' own reader reads it back in the tests. Atomic as a whole: the caller
writes into a temp file (`utils/atomic.write_with`) or a temp folder (`staged_folder` there) renamed at the
end, and every file is fsynced before that.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

import torch

from iattention.utils.faults import fault_point

FORMAT = "iattention-checkpoint-1"  # a checkpoint of ours: its metadata's "format"
INDEX = "model.safetensors.index.json"
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}
_NAMES = {v: k for k, v in DTYPES.items()}


def checkpoint_metadata(meta: dict) -> dict[str, str]:
    """A checkpoint's safetensors metadata: `meta` (with the format) as JSON under "iattention", what
    checkpoint/state.py reads back."""
    return {"iattention": json.dumps({**meta, "format": FORMAT})}


class ShardWriter:
    """safetensors files written tensor by tensor in a fixed order (`plan`: name -> (shape, dtype)): one file named
    `name` in `folder` (a checkpoint's temp file), or the shards save_pretrained names there (model.safetensors where
    everything fits in `shard_bytes`); each file's header first (`reserve` bytes kept free to rewrite its metadata
    in `finish`), then each tensor's bytes as it is `put`. `fault`: the failpoint hit after each tensor (tests)."""

    def __init__(self, folder: Path, plan: dict[str, tuple[list[int], torch.dtype]], metadata: dict[str, str],
                 shard_bytes: int | None = None, name: str | None = None, reserve: int = 4096, fault: str = ""):
        self.folder, self.plan, self.metadata, self.reserve, self.fault = folder, list(plan.items()), metadata, \
            reserve, fault
        shards: list[list[int]] = [[]]
        size = 0
        for i, (_, (shape, dtype)) in enumerate(self.plan):
            n = math.prod(shape) * dtype.itemsize
            if shards[-1] and shard_bytes is not None and size + n > shard_bytes:
                shards.append([])
                size = 0
            shards[-1].append(i)
            size += n
        self.shards = shards
        self.names = [name or "model.safetensors"] if len(shards) == 1 else [
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
            header[name] = {"dtype": _NAMES[dtype], "shape": shape, "data_offsets": [offset, offset + n]}
            offset += n
        header["__metadata__"] = metadata
        return json.dumps(header, separators=(",", ":")).encode()

    def _path(self, shard: int) -> Path:
        return self.folder / self.names[shard]

    def write(self, tensors, metadata: dict[str, str] | None = None) -> None:
        """Every planned tensor, from `tensors`: (name, the tensor or its row slices in order), in the plan's order,
        each written as it comes; then the files closed and `finish`ed (with the final `metadata`, where given)."""
        with self:
            for name, tensor in tensors:
                self._put(name, [tensor] if torch.is_tensor(tensor) else tensor)
        self.finish(metadata)

    def _put(self, name: str, chunks) -> None:
        want, (shape, dtype) = self.plan[self._next]
        if name != want:
            raise RuntimeError(f"tensor {name} written where {want} was planned")
        shard = next(s for s, idx in enumerate(self.shards) if self._next in idx)
        if self._file is None:
            raw = self._header(shard, self.metadata)
            length = -(-(len(raw) + self.reserve) // 8) * 8
            self._lengths.append(length)
            self._file = open(self._path(shard), "wb")
            self._file.write(struct.pack("<Q", length) + raw + b" " * (length - len(raw)))
        rows = 0
        for chunk in chunks:
            if chunk.dtype != dtype or list(chunk.shape[1:]) != shape[1:]:
                raise RuntimeError(f"a slice of {name} is {list(chunk.shape)} {chunk.dtype}")
            rows += chunk.shape[0] if chunk.dim() else 1
            self._file.write(chunk.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().data)
        if rows != (shape[0] if shape else 1):
            raise RuntimeError(f"{name}: {rows} rows written of {shape}")
        if self.fault:
            fault_point(self.fault, torn=self._path(shard))
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

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *_) -> None:
        self.close()

    def finish(self, metadata: dict[str, str] | None = None, index_metadata: dict | None = None) -> None:
        """Every shard's header rewritten with the final `metadata` (where given); the index when there are several
        shards."""
        if self._next != len(self.plan):
            raise RuntimeError(f"{len(self.plan) - self._next} planned tensors were not written")
        for shard, length in enumerate(self._lengths if metadata is not None else []):
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
