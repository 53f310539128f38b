#!/usr/bin/env bash
# cpu-study follow-up of issue 19 §5-6, seeds fixed here before any run (2026-11-22). Resumable like
# run-study.sh; run it after results/cpu-regime/run-study.sh's priorities 1-4 (the CPU is shared).
# Analysis: paired by seed against the arm's control at the same head count (canonical-rmslr and
# identity_ko-rmslr vs standard-rmslr; canonical-ep40 vs standard-ep40; canonical-matched-rmslr-iso vs
# standard-rmslr), ±2% equivalence margin, Holm within each comparison's head counts.
# Not here: §7 (optim.name=muon) — torch.optim.Muon takes 2-D matrices, canonical stores per-head
# (H, d, r) tensors, so which matrix Muon orthogonalizes (each head's d x r block, or the assembled
# d x d projection) must be decided for both arms first; see the issue 19 closing note.
set -uo pipefail
cd "$(dirname "$0")/../.."
IATTN=${1:-.venv/bin/iattn}
OUT=results/cpu-study/runs
COMMON=(--preset cpu-study --arms-file results/cpu-study/arms.yaml --out "$OUT" --jobs 2 --threads 1
        train.eval_every_steps=12 train.tensorboard=false)
sweep() { nice "$IATTN" sweep "${COMMON[@]}" "$@" || echo "sweep $* failed; continuing"; }
sweep --arms canonical-rmslr,identity_ko-rmslr --heads 1,8 --seeds 0,1,2
sweep --arms canonical-matched-rmslr-iso --heads 1 --seeds 0,1,2
sweep --arms standard-ep40,canonical-ep40 --heads 1,8 --seeds 0,1
