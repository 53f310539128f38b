#!/usr/bin/env bash
# The paper-regime reconstruction (issue 30): arms, seeds and order fixed in PLAN.md before any run.
# Resumable: finished runs (summary.json) are skipped, so run it again in any sitting, on any machine,
# and commit what lands:  git add results/paper-regime/runs && git commit -m "paper-regime: runs"
# Usage: bash results/paper-regime/run-study.sh [IATTN] [OUT] [STAGE]
#   IATTN: the iattn command (default .venv/bin/iattn); OUT: the runs folder (default results/paper-regime/runs)
#   STAGE: 1 (seed 0, all 12 runs; default) or 2 SCHEDULES (seeds 1-2 at 1 head for the schedules that
#   met R on seed 0, e.g. "2 warm,hf"; PLAN.md says how R is read).
set -uo pipefail
cd "$(dirname "$0")/../.."
IATTN=${1:-.venv/bin/iattn}
OUT=${2:-results/paper-regime/runs}
STAGE=${3:-1}
SCHEDULES=${4:-}
COMMON=(--preset cpu-regime --arms-file results/paper-regime/arms.yaml --out "$OUT" --jobs 2 --threads 1
        train.tensorboard=false)
sweep() { nice "$IATTN" sweep "${COMMON[@]}" "$@" || echo "sweep $* failed; continuing"; }
if [ "$STAGE" = 1 ]; then
  # 1a. standard at 1 head, then 8 heads, under each schedule: these decide R.
  sweep --arms standard-warm,standard-low,standard-hf --heads 1,8 --seeds 0
  # 1b. canonical at 1 head, then at 8 heads.
  sweep --arms canonical-warm,canonical-low,canonical-hf --heads 1,8 --seeds 0
else
  # 2. seeds 1 and 2 at 1 head, both arms, for each schedule that met R on seed 0.
  for s in ${SCHEDULES//,/ }; do sweep --arms "standard-$s,canonical-$s" --heads 1 --seeds 1,2; done
fi
