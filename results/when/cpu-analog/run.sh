#!/usr/bin/env bash
# when/cpu-analog (PLAN.md): resumable (finished runs are skipped); commit results/when/cpu-analog/runs as runs land.
# Usage: bash results/when/cpu-analog/run.sh [IATTN] [OUT] [SEEDS]   (SEEDS: "0" first, then "1,2" unless futile)
set -uo pipefail
cd "$(dirname "$0")/../../.."
IATTN=${1:-.venv/bin/iattn}
OUT=${2:-results/when/cpu-analog/runs}
SEEDS=${3:-0}
nice -n 10 "$IATTN" sweep --preset cpu-study --arms-file results/when/cpu-analog/arms.yaml \
    --arms standard-warm,canonical-warm --heads 16,8 --seeds "$SEEDS" --out "$OUT" --jobs 2 --threads 1 \
    data.train_tokens=26000 data.valid_tokens=40000 train.epochs=40 train.patience=5 train.tensorboard=false
