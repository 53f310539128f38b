#!/usr/bin/env bash
# The "when" study (PLAN.md, amendment 2026-11-26) on a lent GPU: ONE batch a call. It runs the next unfinished
# batch of three (study.py batches; runs committed under results/when/runs/ are skipped) three at a time, stops
# it SECONDS after the script started (a run still going then is cut, reported as cut, and lost: a fresh machine
# runs it again afresh in a later window), prints where each run stands and packs the runs' small files and logs into
# $OUT/when-runs.tgz. The device command limit is 600 s, so the default 540 leaves time to stop and pack.
# Everything it prints also goes to ROOT/window.log, which starts with the window's UTC start time and the commit
# it runs (git HEAD and how many tracked files differ from it) and ends with its UTC end time; it is packed too.
# Each run's own files say the same (the start record of metrics.jsonl and summary.json: started_at, commit;
# summary.json: finished_at).
#
# Here, before the call (../shared does not travel; data-carry/ is git-ignored and travels by `carry`):
#   mkdir -p data-carry && cp -r /work/shared/data/. data-carry/
# The device call (run tool): command "bash results/when/gpu.sh 540 data-carry", carry ["data-carry"],
#   timeout_s 600. Afterwards, here: python results/when/study.py unpack <files_at>/when-runs.tgz, then
#   python results/when/analyze.py, then commit results/when/runs/, the window's log that unpack wrote
#   (results/when/gpu-session/window-<UTC start>/: window.log, queue.log, logs/) and what analyze.py rewrote.
# Three at a time (JOBS=3, the default) finishes more runs in a window than one at a time (issue 65, measured):
# the first lease's first three runs, three at once on an H100, ended 502-558 s after they started; batch 2, one
# at a time on an H200 (JOBS=1, 2026-11-28), took 272 s and 222 s for two and the third was cut at the deadline
# (each run's compile, start-up, evaluation and checkpoints leave the card idle; three at once fill it).
# A 15-minute lease holds about 770 s of commands after the machine's start: a second call on the still-warm
# machine, "bash results/when/gpu.sh 245 data-carry" (timeout_s 262), resumes from its checkpoint a run the first
# call's deadline cut (ROOT survives there), and its pack's logs extend the window's (study.py unpack).
# A dry run on a CPU (tiny model, a few seconds a run; unpack into a scratch copy, never into runs/):
#   PRESET=tiny EXTRA="model.n_embd=48 train.epochs=1 train.compile=false" PYTHON=.venv/bin/python OUT=/tmp/when-out \
#     ROOT=$(mktemp -d) bash results/when/gpu.sh 120 /work/shared/data
# (a fresh ROOT: runs a dry run left in the default /dev/shm/when count as done, and the next dry run takes the
# batch after; the device machine starts bare)
#
# Usage (repository root; this package runs from src/ with the image's torch):
#   bash results/when/gpu.sh [SECONDS] [DATA_DIR]      defaults: 540, $IATTN_DATA_DIR or data-carry
# Environment: JOBS (3), ROOT (/dev/shm/when), PRESET (paper; tiny for a dry run), EXTRA (overrides for every
# run, e.g. "train.epochs=1" in a dry run), PYTHON (python3), OUT (where when-runs.tgz goes; none: no pack).
set -uo pipefail
start=$SECONDS
cd "$(dirname "$0")/../.."
BUDGET=${1:-540}
DATA=$(realpath "${2:-${IATTN_DATA_DIR:-data-carry}}")
ROOT=${ROOT:-/dev/shm/when}
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" IATTN_CACHE_DIR=$ROOT/cache PYTHONUNBUFFERED=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
mkdir -p "$ROOT"
utc() { date -u +%Y-%m-%dT%H:%M:%SZ; }
window() {
    echo "when window: start $(utc) commit $(git rev-parse HEAD 2>/dev/null || echo '?')" \
        "($(git status --porcelain --untracked-files=no 2>/dev/null | wc -l) tracked files changed)"
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    "$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
    # The runs get what is left of SECONDS now (the set-up above took some); the queue stops them at that deadline.
    "$PY" results/when/study.py queue --root "$ROOT" --data-dir "$DATA" --jobs "${JOBS:-3}" --batch \
        --deadline $((BUDGET - (SECONDS - start))) --preset "${PRESET:-paper}" ${EXTRA:-} 2>&1 | tee -a "$ROOT/queue.log"
    local rc=${PIPESTATUS[0]}
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
    "$PY" results/when/study.py status --root "$ROOT"
    echo "when window: end $(utc), queue exit $rc"
    return "$rc"
}
window 2>&1 | tee -a "$ROOT/window.log"
rc=${PIPESTATUS[0]}
if [ -n "${OUT:-}" ]; then
    "$PY" results/when/study.py pack --root "$ROOT" --out "$OUT/when-runs.tgz" && echo "when: packed $OUT/when-runs.tgz"
fi
echo "when: batch done in $((SECONDS - start)) s, queue exit $rc (non-zero: a run failed or was cut)"
exit "$rc"
