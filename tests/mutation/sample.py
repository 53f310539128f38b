"""A seeded random sample of mutmut's mutants per module, for modules too large to run whole on a small
machine (tests/mutation/SCORES.md). Reads `mutmut results --all true` on stdin (after `mutmut run` has
generated the mutants) and prints the chosen names, space-separated, for `make mutation MUTANTS=...`.

    .venv/bin/mutmut results --all true | .venv/bin/python tests/mutation/sample.py --per-module 40 \\
        --modules symmetry,checkpoint,attention,model --seed 0

The sample is drawn from every mutant of the module (checked or not) with `random.Random(seed).sample`
over the names sorted, so the same seed and the same code give the same sample. `--exclude-seeds 0`
first removes what seed 0 would draw: a fresh sample, for scoring tests written against an earlier
sample's survivors without the bias of re-running that same sample. Several excluded seeds are drawn in
the order given, each from what the earlier ones left, which is how each was drawn: `--seed 2
--exclude-seeds 0,1` leaves out seed 0's sample and the sample `--seed 1 --exclude-seeds 0` ran."""

from __future__ import annotations

import argparse
import collections
import random
import re
import sys

from summarize import module_of


def draw(pool: list[str], seed: int, mod: str, k: int) -> list[str]:
    return random.Random(f"{seed}:{mod}").sample(pool, min(k, len(pool)))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--per-module", type=int, required=True)
    p.add_argument("--modules", required=True, help="comma-separated, as summarize.py names them")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--exclude-seeds", default="", help="comma-separated seeds whose samples are left out")
    args = p.parse_args(argv)
    wanted = args.modules.split(",")
    names: dict[str, list[str]] = collections.defaultdict(list)
    for line in sys.stdin:
        m = re.match(r"\s*(iattention\.\S+): ", line)
        if m and module_of(m.group(1)) in wanted:
            names[module_of(m.group(1))].append(m.group(1))
    excluded = [int(x) for x in args.exclude_seeds.split(",") if x.strip()]
    chosen = []
    for mod in wanted:
        pool = sorted(names[mod])
        for seed in excluded:  # in the order given, each from what the ones before it left, as each was drawn
            taken = set(draw(pool, seed, mod, args.per_module))
            pool = [n for n in pool if n not in taken]
        chosen += draw(pool, args.seed, mod, args.per_module)
    print(" ".join(chosen))


if __name__ == "__main__":
    main()
