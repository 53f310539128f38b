"""Per-module mutation score from mutmut's results (`make mutation` prints it; tests/mutation/SCORES.md
records it). Reads `mutmut results --all true` on stdin and the survivors judged equivalent from
tests/mutation/equivalent.txt (`mutant-name: why`); score = killed / (checked - equivalent).

A module whose mutants were not all run (a random sample, tests/mutation/sample.py) gets its score over
the checked ones with a 95% Wilson interval, marked "sample"; a module with none checked, "not run"."""

from __future__ import annotations

import collections
import math
import pathlib
import re
import sys

MODULES = ("train.schedule", "experiments.stats", "train.optim", "symmetry", "checkpoint", "attention", "model")
KILLED = {"killed", "timeout", "segfault", "caught by type check"}  # a mutant the tests notice


def module_of(name: str) -> str:
    parts = name.split(".")
    return ".".join(parts[1:3]) if parts[1] in ("train", "experiments") else parts[1]


def equivalent(path: pathlib.Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        if line.strip() and not line.startswith("#"):
            name, why = line.split(":", 1)
            out[name.strip()] = why.strip()
    return out


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """95% Wilson score interval for a proportion k/n (better than k/n ± z·se at small n or k near n)."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


def score_cell(c: collections.Counter) -> str:
    checked = c["total"] - c["not checked"]
    denom = checked - c["equivalent"]
    if not denom:
        return "not run"
    if not c["not checked"]:
        return f"{100 * c['killed'] / denom:.1f}%"
    lo, hi = wilson(c["killed"], denom)
    return f"{100 * c['killed'] / denom:.1f}% (sample, 95% CI {100 * lo:.0f}–{100 * hi:.0f}%)"


def main() -> None:
    eq = equivalent(pathlib.Path(__file__).with_name("equivalent.txt"))
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    survivors = []
    for line in sys.stdin:
        m = re.match(r"\s*(iattention\.\S+): (.+)$", line)
        if not m:
            continue
        name, status = m.group(1), m.group(2).strip()
        c = counts[module_of(name)]
        c["total"] += 1
        if status in KILLED:
            c["killed"] += 1
        elif status == "not checked":
            c["not checked"] += 1
        elif name in eq:
            c["equivalent"] += 1
        else:
            c["survived"] += 1
            survivors.append(f"{name}: {status}")
    print("| module | mutants | killed | survived | equivalent | not checked | score |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for mod in MODULES:
        c = counts.get(mod, collections.Counter())
        print(f"| {mod} | {c['total']} | {c['killed']} | {c['survived']} | {c['equivalent']} | "
              f"{c['not checked']} | {score_cell(c)} |")
    if survivors:
        print("\nsurvivors not judged equivalent:")
        print("\n".join(survivors))


if __name__ == "__main__":
    main()
