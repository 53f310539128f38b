#!/usr/bin/env bash
# The "when" study (PLAN.md) on a lent GPU, push-button: the first call starts the queue (study.py queue,
# three runs at a time) in the background (setsid: it outlives the command while the machine stays held),
# every call then watches it for at most SECONDS, prints where each run stands and packs the runs' small
# files and logs into $OUT/when-runs.tgz. Call it again within the machine's idle window to keep going;
# on a fresh machine it starts the queue again, skipping the runs committed under results/when/runs/.
# Here, afterwards: python results/when/study.py unpack when-runs.tgz, then commit results/when/runs/.
#
# Usage (repository root, on the GPU machine; this package runs from src/ with the image's torch):
#   bash results/when/gpu.sh [SECONDS] [DATA_DIR]      defaults: 540, $IATTN_DATA_DIR or ../shared/data
# Environment: JOBS (3), ROOT (/dev/shm/when), PRESET (paper; tiny for a dry run), LIMIT (run only the first N
# unfinished runs; 0: all), EXTRA (overrides for
# every run, e.g. "train.epochs=2" in a dry run), PYTHON (python3).
set -uo pipefail
cd "$(dirname "$0")/../.."
BUDGET=${1:-540}
DATA=$(realpath "${2:-${IATTN_DATA_DIR:-../shared/data}}")
ROOT=${ROOT:-/dev/shm/when}
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" IATTN_CACHE_DIR=$ROOT/cache PYTHONUNBUFFERED=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
mkdir -p "$ROOT"
if ! pgrep -f "study.py queue --root $ROOT" >/dev/null; then
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    "$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
    setsid nohup "$PY" results/when/study.py queue --root "$ROOT" --data-dir "$DATA" --jobs "${JOBS:-3}" --limit "${LIMIT:-0}" \
        --preset "${PRESET:-paper}" ${EXTRA:-} >> "$ROOT/queue.log" 2>&1 < /dev/null &
    echo "when: queue started (pid $!)"
fi
end=$((SECONDS + BUDGET))
while [ $SECONDS -lt $end ] && pgrep -f "study.py queue --root $ROOT" >/dev/null; do
    sleep 10
done
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
"$PY" results/when/study.py status --root "$ROOT"
tail -n 5 "$ROOT/queue.log"
if [ -n "${OUT:-}" ]; then
    "$PY" results/when/study.py pack --root "$ROOT" --out "$OUT/when-runs.tgz" && echo "when: packed $OUT/when-runs.tgz"
fi
