"""The benchmark's tables (markdown) and its sections of BENCHMARKS.md."""

from __future__ import annotations

import re
from pathlib import Path

from iattention.bench.runner import NOISE_SPREAD
from iattention.utils.atomic import write_text


def _ratio(row: dict, key: str) -> str:
    """A ratio cell: median over rounds [min, max], and a flag when the rounds disagree."""
    value = row.get(key)
    if value is None:
        return "–"
    rounds = row.get(f"{key}_rounds") or []
    spread = f" [{min(rounds):.3f}, {max(rounds):.3f}]" if len(rounds) > 1 else ""
    return f"{value:.3f}{spread}" + (" **noisy**" if row.get(f"{key}_noisy") else "")


def table(result: dict) -> str:
    mfu = result["peak_bf16_tflops"] is not None
    head = ("| model | attention | heads | params | train tok/s | × standard [min, max over rounds] | × HF | "
            "forward tok/s | × standard | executed GFLOP/token" + (" | MFU (nanoGPT) |" if mfu else " |"))
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for r in result["rows"]:
        lines.append(
            f"| {r['model']} | {r['attention']} | {r['n_head']} | {r['params']:,} | {r['train_tokens_per_s']:,.0f} | "
            f"{_ratio(r, 'train_tokens_per_s_vs_standard')} | {_ratio(r, 'train_tokens_per_s_vs_hf')} | "
            f"{r['forward_tokens_per_s']:,.0f} | {_ratio(r, 'forward_tokens_per_s_vs_standard')} | "
            f"{r['executed_flops_per_token'] / 1e9:.4g}" + (f" | {r['mfu_nanogpt']:.1%} |" if mfu else " |"))
    noisy = sum(bool(r.get(f"{k}_noisy")) for r in result["rows"] for k in
                ("train_tokens_per_s_vs_standard", "train_tokens_per_s_vs_hf", "forward_tokens_per_s_vs_standard"))
    load = result.get("loadavg_before")
    lines += ["", "Every ratio is the median over rounds of the ratio within a round ([min, max] over rounds); "
              "tok/s columns are medians over all timed windows, so their quotient can differ from a ratio when "
              "rounds drift." + (f" Load average before the run: {load[0]:.2f} (1 min)." if load else "")]
    if noisy:
        threshold = result.get("noise_threshold", NOISE_SPREAD)
        lines.append(f"{noisy} ratio(s) marked **noisy**: their rounds disagree by more than {threshold:.0%}; "
                     "rerun on an idle machine before reading them.")
    return "\n".join(lines)


def bench_label(preset: str, overrides: list[str]) -> str:
    """The benched model's name in a markdown section and its marker: the preset, and its overrides if any (a
    section of `tiny model.family=gpt_neox` is not the plain tiny's)."""
    return " ".join([preset, *overrides]).replace("--", "-")  # inside an HTML comment marker


def update_benchmarks_md(path: Path, result: dict, json_path: Path) -> None:
    name = bench_label(result["preset"], result.get("overrides", []))
    marker = f"<!-- bench:{result['device']}:{name}:{'compiled' if result['compile'] else 'eager'} -->"
    section = (f"{marker}\n## {name} on {result['device_name']} ({result['device']}, "
               f"{'torch.compile' if result['compile'] else 'eager'}, {result['date']})\n\n"
               f"Command: `{result['command']}` — raw numbers: `{json_path.as_posix()}` "
               f"(tok/s: median of {result['rounds']} interleaved rounds × {result['windows']} windows × "
               f"{result['steps_per_window']} steps; ratios: median over rounds of the ratio within a round; torch "
               f"{result['torch']}, {result['threads']} threads).\n\n{table(result)}\n")
    replace_section(path, marker, section)


def replace_section(path: Path, marker: str, section: str) -> None:
    """Put `section` (starting with its `marker` line) into the markdown file at `path`, replacing the
    section with that marker, or appended; atomically."""

    text = path.read_text() if path.exists() else (
        "# Benchmarks\n\nProduced by `iattn bench`; each section is replaced when its benchmark is rerun. "
        "Ratios are measured in one process and one run. FLOPs per token count the matmuls actually executed "
        "(see `iattention/bench/flops.py`).\n\n")
    pattern = re.compile(re.escape(marker) + r".*?(?=\n<!-- bench:|\Z)", re.S)
    text = pattern.sub(lambda _: section.rstrip("\n"), text) if marker in text else text.rstrip("\n") + "\n\n" + section
    write_text(path, text.rstrip("\n") + "\n")


def generation_table(rows: list[dict]) -> str:
    lines = ["| model | attention | heads | cache | cache B/token | new tok/s | × no cache | × full cache | "
             "× HF generate |", "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        same = [x for x in rows if x["n_head"] == r["n_head"]]
        kind = r.get("cache", "full" if r["kv_cache"] else "none")  # results from before the K-only arm

        def of(cache, r=r, same=same):
            return next((x for x in same if x["model"] == r["model"] and x["attention"] == r["attention"]
                         and x.get("cache", "full" if x["kv_cache"] else "none") == cache), None)
        hf = next((x for x in same if x["model"].startswith("hf-")), None)
        ratios = [f"{r['tokens_per_s'] / o['tokens_per_s']:.2f}" if o else "–" for o in (of("none"), of("full"), hf)]
        nbytes = r.get("cache_bytes_per_token")
        lines.append(f"| {r['model']} | {r['attention']} | {r['n_head']} | {kind} | "
                     f"{'–' if nbytes is None else f'{nbytes:,}'} | {r['tokens_per_s']:,.1f} | {' | '.join(ratios)} |")
    return "\n".join(lines)
