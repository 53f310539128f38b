"""Per-module mutation score from mutmut's results (`make mutation` prints it; tests/mutation/SCORES.md
records it). Reads `mutmut results --all true` on stdin and the survivors judged equivalent from
tests/mutation/equivalent.txt (`mutant-name: why`); score = killed / (total - equivalent)."""

from __future__ import annotations

import collections
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
        checked = c["total"] - c["not checked"]
        denom = checked - c["equivalent"]
        score = f"{100 * c['killed'] / denom:.1f}%" if denom and not c["not checked"] else "not run"
        print(f"| {mod} | {c['total']} | {c['killed']} | {c['survived']} | {c['equivalent']} | "
              f"{c['not checked']} | {score} |")
    if survivors:
        print("\nsurvivors not judged equivalent:")
        print("\n".join(survivors))


if __name__ == "__main__":
    main()
