"""`model.attn_kernel=auto`: which path a full-sequence causal pass runs, read from a table of measurements.

The table (`auto_table.json` beside this file, package data) holds, per device name (torch.cuda.get_device_name),
rows measured by `benchmarks/wide_paths.py`: head dim `d`, heads `H`, sequence length `T`, batch `B`, and the
milliseconds of one bf16 forward + backward of each path (`sdpa`, `math`, `triton`; null where the path failed
on that device). `benchmarks/wide_paths.py --table` writes it from a committed result file, named in the
table's `source`. Until a device has rows, `auto` keeps its rule without a table (kernels/__init__.py).

The choice (`pick`) for a pass of shape (B, H, T) at head dim d on a listed device:
  * head dims outside the measured range get no answer (the rule without a table decides);
  * otherwise the rows of the measured head dim nearest d, and among them the row nearest in H T^2
    (the score entries per sequence, on a log scale): its fastest path that can run here;
  * the memory guard: the math path keeps B H T^2 probabilities per layer for the backward, and transiently
    holds fp32 scores; it is skipped when B H T^2 * MATH_BYTES_PER_SCORE exceeds the table's
    `math_memory_fraction` of the device's memory (per layer: a model holds one such matrix per layer);
  * triton only where it is installed and without dropout.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

TABLE_PATH = Path(__file__).with_name("auto_table.json")
PATHS = ("sdpa", "math", "triton")
# bytes per score entry the math path holds at its peak in a bf16 training step: fp32 scores and fp32
# probabilities while the softmax runs (eager; fused under compile) and the bf16 probabilities kept for backward
MATH_BYTES_PER_SCORE = 10
DEFAULT_MATH_MEMORY_FRACTION = 1 / 32


@dataclass(frozen=True)
class Device:
    """What `auto` knows of one device: its name, its memory in bytes, and the table's rows for it."""

    name: str
    memory: int
    rows: tuple
    math_memory_fraction: float = DEFAULT_MATH_MEMORY_FRACTION


def load_table(path: Path = TABLE_PATH) -> dict:
    return json.loads(Path(path).read_text())


def device_entry(table: dict, name: str, memory: int) -> Device:
    rows = tuple(table.get("devices", {}).get(name, ()))
    return Device(name, memory, rows, table.get("math_memory_fraction", DEFAULT_MATH_MEMORY_FRACTION))


def math_fits(device: Device, B: int, H: int, T: int) -> bool:
    """The memory guard: one layer's score matrices within the table's share of the device's memory."""
    return B * H * T * T * MATH_BYTES_PER_SCORE <= device.math_memory_fraction * device.memory


def pick(device: Device, head_dim: int, B: int, H: int, T: int, dropout: float = 0.0,
         triton_ok: bool = True) -> str | None:
    """The fastest measured path for this pass (see the module docstring), or None where the table has no
    answer (no rows, a head dim outside the measured range, or no measured path that can run)."""
    dims = sorted({row["d"] for row in device.rows})
    if not dims or not dims[0] <= head_dim <= dims[-1]:
        return None
    d = min(dims, key=lambda x: (abs(x - head_dim), -x))  # ties: the wider one
    rows = [row for row in device.rows if row["d"] == d]
    size = math.log(H * T * T)
    row = min(rows, key=lambda r: (abs(math.log(r["H"] * r["T"] ** 2) - size), -r["T"]))
    usable = {"sdpa": True, "math": math_fits(device, B, H, T), "triton": triton_ok and not dropout}
    timed = sorted((ms, path) for path, ms in row["ms"].items() if ms is not None and usable.get(path))
    return timed[0][1] if timed else None
