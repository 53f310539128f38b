#!/usr/bin/env bash
# The regime-matched study of issue 19 (cpu-regime preset), in priority order. Seeds and arms below were
# fixed before any run started (see results/cpu-regime/PLAN.md for the analysis declared in advance);
# a run added later because of a result goes in the "added" block at the end, with the reason.
# Resumable: finished runs (summary.json) are skipped, so run it again in any sitting, on any machine,
# and commit what lands:  git add results/cpu-regime/runs && git commit -m "cpu-regime: runs"
# Usage: bash results/cpu-regime/run-study.sh [IATTN] [OUT]
#   IATTN: the iattn command (default .venv/bin/iattn); OUT: the runs folder (default results/cpu-regime/runs)
set -uo pipefail
cd "$(dirname "$0")/../.."
IATTN=${1:-.venv/bin/iattn}
OUT=${2:-results/cpu-regime/runs}
COMMON=(--preset cpu-regime --arms-file results/cpu-regime/arms.yaml --out "$OUT" --jobs 2 --threads 1
        train.tensorboard=false)
sweep() { nice "$IATTN" sweep "${COMMON[@]}" "$@" || echo "sweep $* failed; continuing"; }
# 1. standard vs canonical (GPT-2 init, one shared AdamW rate, as the paper trained), 1 head.
sweep --arms standard,canonical --heads 1 --seeds 0,1,2
# 2. learning rate x0.5 and x2 for both at 1 head, seed 0. Where an arm's best seed-0 rate is not x1,
#    its seeds 1 and 2 at that rate are added below (block "added"), and reported as decided on seed 0.
sweep --arms standard-lr0.5x,canonical-lr0.5x,standard-lr2x,canonical-lr2x --heads 1 --seeds 0
# 3. the same pair at 8 heads.
sweep --arms standard,canonical --heads 8 --seeds 0,1,2
# 4. the per-group rule on matched I-Attention and on standard (its control), 1 and 8 heads.
sweep --arms standard-rmslr,canonical-matched-rmslr --heads 1,8 --seeds 0,1,2
# --- added (after a result; each line says which result) ---
