#!/usr/bin/env bash
# The paper grid (issue 19: standard and canonical at 1 and 12 heads, seed 0) on one lent GPU whose
# commands may each run 10 minutes while the machine stays held between them. The first call starts
# one sweep in the background (setsid, so it outlives the command), two runs at a time (--jobs 2: one
# GPU, but the compile, validation and checkpoint pauses of one run overlap the other's steps); every
# call, the first included, then watches it for at most SECONDS, prints a progress table and packs the
# runs' small files (config, arm, metrics, steps, summary; no checkpoints) and the sweep log into
# $OUT/paper-runs.tgz. Call it again (within the machine's idle window) to keep watching.
#
# Differences from `run-grid.sh`: train.grad_accum=2 (16 windows a micro-batch: two runs' activations
# and 50,257-wide logits fit in one 80 GB card; the step is still 32 windows), run folders and
# checkpoints on /dev/shm (a checkpoint with AdamW state is 1.5 GB, written every epoch).
#
# Usage (repository root, on the GPU machine; this package runs from src/ with the image's torch):
#   bash results/paper/gpu-session.sh [SECONDS] [DATA_DIR]     defaults: 540, $IATTN_DATA_DIR or ../shared/data
# Environment: RUNS="canonical:1 standard:12 canonical:12:1" starts one single-run sweep per
# arm:heads[:seed] (seed 0 by default; all at once, each on the card) instead of the 2-at-a-time grid,
# skipping runs already running or finished, so a later call can add runs; EXTRA adds overrides to every run
# (e.g. "train.patience=5": stop after 5 epochs without improvement, the 40-epoch schedule unchanged);
# ACCUM sets train.grad_accum (default 2; use 4 with three runs on one 80 GB card).
set -uo pipefail
cd "$(dirname "$0")/../.."
BUDGET=${1:-540}
DATA=$(realpath "${2:-${IATTN_DATA_DIR:-../shared/data}}")
ROOT=${ROOT:-/dev/shm/paper}
PRESET=${PRESET:-paper}  # PRESET/HEADS/ROOT: for a dry run elsewhere (PRESET=tiny)
HEADS=${HEADS:-1,12}
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" IATTN_CACHE_DIR=$ROOT/cache PYTHONUNBUFFERED=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
mkdir -p "$ROOT/runs"
common=(--preset "$PRESET" --out "$ROOT/runs" --data-dir "$DATA" --threads 4
        train.tensorboard=false train.grad_accum="${ACCUM:-2}" ${EXTRA:-})
if ! pgrep -f "iattention sweep .*--preset $PRESET" >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
    "$PY" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
    if [ -z "${RUNS:-}" ]; then
        setsid nohup "$PY" -m iattention sweep --arms standard,canonical --heads "$HEADS" --seeds 0 --jobs 2 \
            "${common[@]}" > "$ROOT/sweep.log" 2>&1 < /dev/null &
        echo "gpu-session: sweep started (pid $!)"
    fi
fi
for spec in ${RUNS:-}; do
    IFS=: read -r arm heads seed <<< "$spec"
    seed=${seed:-0}
    run=$arm-h$heads-s$seed
    if [ -f "$ROOT/runs/$run/summary.json" ] || pgrep -f "sweep --arms $arm --heads $heads --seeds $seed " >/dev/null; then
        continue
    fi
    setsid nohup "$PY" -m iattention sweep --arms "$arm" --heads "$heads" --seeds "$seed" --jobs 1 "${common[@]}" \
        > "$ROOT/sweep-$run.log" 2>&1 < /dev/null &
    echo "gpu-session: sweep $run started (pid $!)"
done
end=$((SECONDS + BUDGET))
while [ $SECONDS -lt $end ] && pgrep -f "iattention sweep .*--preset $PRESET" >/dev/null; do
    sleep 10
done
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
"$PY" - "$ROOT/runs" <<'EOF'
import json, sys
from pathlib import Path
for run in sorted(Path(sys.argv[1]).iterdir()):
    m = run / "metrics.jsonl"
    recs = [json.loads(line) for line in m.read_text().splitlines()] if m.exists() else []
    ep = [r for r in recs if r["kind"] == "epoch"]
    if not ep:
        print(f"{run.name:<16} no epoch yet")
        continue
    best = min(ep, key=lambda r: r["val_loss"])
    done = "finished" if (run / "summary.json").exists() else "running"
    print(f"{run.name:<16} {done:<8} epoch {ep[-1]['epoch']:>2}  val ppl {ep[-1]['val_ppl']:8.2f}  best {best['val_ppl']:8.2f}"
          f" (epoch {best['epoch']})  {ep[-1]['tokens_per_s']:>9.0f} tok/s  wall {ep[-1]['wall_time']:6.0f}s")
EOF
tail -n 3 "$ROOT"/sweep*.log
if [ -n "${OUT:-}" ]; then
    tar czf "$OUT/paper-runs.tgz" -C "$ROOT" --exclude='*.safetensors' --exclude='.lock' --exclude='*.tmp*' \
        runs $(cd "$ROOT" && ls sweep*.log) && echo "gpu-session: packed $(tar tzf "$OUT/paper-runs.tgz" | wc -l) entries"
fi
