#!/usr/bin/env bash
# cpu-study follow-up of issue 19 §5-7, seeds fixed here before any run (2026-11-22). Resumable like
# run-study.sh; run it after results/cpu-regime/run-study.sh's priorities 1-4 (the CPU is shared).
# Analysis: paired by seed against the arm's control at the same head count (canonical-rmslr and
# identity_ko-rmslr vs standard-rmslr; canonical-ep40 vs standard-ep40; canonical-matched-rmslr-iso vs
# standard-rmslr), ±2% equivalence margin, Holm within each comparison's head counts.
# §7 (added 2026-11-22, seeds fixed here before any run): standard-muon vs canonical-matched-muon,
# paired by seed, same margin and Holm over its head counts. Muon updates each head's block of every
# attention matrix (standard's fused c_attn is sliced per head, canonical's (H, d, r) tensors per
# head), so both arms get the same rule per head; canonical's W_K_free / W_O_free blocks are its learned
# (d - r) x r rows, not the assembled W_K (empty at one head): the parameterization is the treatment.
# Usage: bash results/cpu-study/run-followup.sh [IATTN] [OUT]   (defaults: .venv/bin/iattn, results/cpu-study/runs)
set -uo pipefail
cd "$(dirname "$0")/../.."
IATTN=${1:-.venv/bin/iattn}
OUT=${2:-results/cpu-study/runs}
COMMON=(--preset cpu-study --arms-file results/cpu-study/arms.yaml --out "$OUT" --jobs 2 --threads 1
        train.eval_every_steps=12 train.tensorboard=false)
sweep() { nice "$IATTN" sweep "${COMMON[@]}" "$@" || echo "sweep $* failed; continuing"; }
sweep --arms canonical-rmslr,identity_ko-rmslr --heads 1,8 --seeds 0,1,2
sweep --arms canonical-matched-rmslr-iso --heads 1 --seeds 0,1,2
# Order (2026-11-23, before any of these runs): the 40-epoch pairs cost 2.5x a run, so they go last.
sweep --arms standard-muon,canonical-matched-muon --heads 1,8 --seeds 0,1,2
sweep --arms standard-ep40,canonical-ep40 --heads 1,8 --seeds 0,1
