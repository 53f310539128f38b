#!/usr/bin/env bash
# The paper grid (issue 22 §3) on one GPU, in steps that each fit a 10-minute command and resume across
# commands: each call trains for at most SECONDS, checkpointing every 100 steps, and a later call
# continues where it stopped (finished runs are skipped). Runs land in results/paper/runs/<arm>-h<H>-s0/
# with the GPU's name in summary.json ("hardware").
#
# Time plan (FLOPs from iattention.bench.flops, 6N + attention per token, 2,960 steps x 32 x 1,024 =
# 97.0M tokens a run; H100 bf16 dense peak 989 TFLOP/s): a run is 7.5-8.3e16 FLOP, i.e. 3.1-3.5 min of
# compute at 40% MFU and 4.2-4.7 min at 30%, plus ~4% for the 40 validations, the test split and
# 1-2 min of torch.compile. Against 30 minutes of GPU time (minus ~2 min machine start and ~3 min for
# `iattn bench --device cuda --preset gpt2-small`), the first turn fits the four runs below
# (standard and canonical at 1 and 12 heads, seed 0) at >= 30% MFU. Left for a later turn, in order:
# identity_ko at 1 and 12 heads, then seeds 1 and 2 of everything (9 runs, ~45 min).
#
# Measured 2026-11-22 (results/paper/h100-2026-11-22/): the 1-head pair ran at ~150k tokens/s together
# on one H100, i.e. ~11 min of card time per run, so the four runs need ~45 min, not the plan above;
# results/paper/gpu-session.sh runs them in the background across several 10-minute commands.
#
# Usage (repository root, on the GPU machine; no network needed: torch, numpy, scipy, pyyaml,
# safetensors, tiktoken, tokenizers, tqdm are on the image, and this package runs from src/):
#   bash results/paper/run-grid.sh [SECONDS] [DATA_DIR] [ARMS] [HEADS] [SEEDS]
#   defaults: 540, $IATTN_DATA_DIR or ../shared/data, standard,canonical, 1,12, 0
set -uo pipefail
cd "$(dirname "$0")/../.."
BUDGET=${1:-540}
DATA=${2:-${IATTN_DATA_DIR:-../shared/data}}
ARMS=${3:-standard,canonical}
HEADS=${4:-1,12}
SEEDS=${5:-0}
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
# timeout signals the whole process group (sweep and its training child); the run resumes from its
# last checkpoint (train.ckpt_every_steps) on the next call.
timeout --kill-after=30 "$BUDGET" "$PY" -m iattention sweep --preset paper --arms "$ARMS" --heads "$HEADS" \
    --seeds "$SEEDS" --out results/paper/runs --data-dir "$DATA" train.ckpt_every_steps=100 train.tensorboard=false
rc=$?
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    echo "run-grid: stopped after ${BUDGET}s; call it again to continue (finished runs are skipped)"
    exit 0
fi
exit $rc
