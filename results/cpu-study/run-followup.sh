#!/usr/bin/env bash
# cpu-study follow-up of issue 19 §5-6, seeds fixed here before any run (2026-11-22). Resumable like
# run-study.sh; run it after results/cpu-regime/run-study.sh's priorities 1-4 (the CPU is shared).
# Analysis: paired by seed against the arm's control at the same head count (canonical-rmslr and
# identity_ko-rmslr vs standard-rmslr; canonical-ep40 vs standard-ep40; canonical-matched-rmslr-iso vs
# standard-rmslr), ±2% equivalence margin, Holm within each comparison's head counts.
# Not here: §7 (optim.name=muon) — torch.optim.Muon takes 2-D matrices, canonical stores per-head
# (H, d, r) tensors, so which matrix Muon orthogonalizes (each head's d x r block, or the assembled
# d x d projection) must be decided for both arms first; see the issue 19 closing note. Found on
# 2026-11-22: the merged d x d W_Q of canonical is not a view of its (H, d, r) storage (Muon would need
# a 2-D proxy copied in and out every step), and canonical's learned key/output entries (W_K_free,
# (H, d - r, r); empty at one head) are not the assembled W_K, so "Muon on W_K" means a different
# update in each arm whichever is chosen. Per-head blocks in both arms (standard's c_attn sliced per
# head) is the one choice that treats both alike; it is not wired in yet.
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
