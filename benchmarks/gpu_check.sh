#!/usr/bin/env bash
# One prepared GPU check (issue 52 §4) in four parts, one part per 10-minute device window (<= 530 s of steps
# on an H100), each leaving every log and JSON in one folder. Each step runs under `timeout` and the script goes
# on past a failing step; summary.txt lists each step's exit status (124: it ran out of its time) and seconds.
#
#   bash benchmarks/gpu_check.sh paths     §1's table, one whole run per head dim, widest first (each run's JSON
#                                          is rewritten after every row; auto's table takes whole runs only):
#                                          wide_paths.py --dims 768 (<= 270 s), 512 (<= 170 s), 256 (<= 90 s;
#                                          at 256 SDPA's cuDNN backend was fastest in both windows so far)
#   bash benchmarks/gpu_check.sh kernel    tests/gpu: the kernel's 24 device cases (18 at fixed safe tiles, 6
#                                          autotuned; <= 270 s), then the 7 compile and training tests, the
#                                          paper's one-head GPT first (<= 250 s)
#   bash benchmarks/gpu_check.sh train     compile_time.py: the paper model compiled whole against its regions
#                                          (train.compile_scope; <= 220 s: each case's row is kept as it ends),
#                                          iattn bench --preset paper --device cuda --compile --compile-scope
#                                          blocks --heads 1,12 (<= 190 s), the e2e layer under pytest -n 8 with
#                                          what is left (<= 120 s)
#   bash benchmarks/gpu_check.sh mfu       §3's file: iattn bench --preset paper --device cuda --compile
#                                          --compile-scope blocks, every variant at 1, 4, 8 and 12 heads (<= 280 s),
#                                          then transformers' GPT-2 beside standard at 12 heads (<= 150 s), then
#                                          profile_step.py: each kernel's device time in a compiled step (<= 100 s)
#
# Why parts: the second window (2026-11-27, benchmarks/results/gpu-check-2026-11-27b/) ran all five steps in one
# command and every step ran out of its time, most of it compiling (the autotuner compiled configs out of shared
# memory at fp32 and head dim 768, each 10-90 s to compile for sm_90 on 2 CPU cores; the paper preset's compile
# took over 90 s). Windows for the check
# take the parts in this order: paths (its table decides auto and the kernel's fate, §1-§2), kernel, train, mfu.
#
# On the device machine (the device tool runs this in a copy of the working tree; ../shared does not travel, so
# the data and the pytest-xdist wheels go in the git-ignored gpu-check/, named in carry; about 15 MB):
#   mkdir -p gpu-check && cp -r ../shared/data gpu-check/data       # here, once
#   pip download --no-deps -d gpu-check/wheels pytest-xdist execnet   # here, once (the device has no network)
#   run(command="PYTHON=python3 bash benchmarks/gpu_check.sh paths", carry=["gpu-check/data", "gpu-check/wheels"],
#       timeout_s=590)
# Results come back from $OUT (the device tool's output folder). Without $OUT they go to gpu-check/out-<time>/.
# If pytest-xdist is missing there, the train part installs it from gpu-check/wheels (--no-index) first.
#
# Dry run on CPU (what to run before spending GPU time; about two minutes on 2 cores):
#   PRESET=tiny bash benchmarks/gpu_check.sh
# runs every part's steps on CPU, shortened: tests/gpu (they skip without CUDA), wide_paths.py --dry,
# profile_step.py, compile_time.py and iattn bench --compile --compile-scope blocks on the tiny preset, the e2e
# layer collected under -n 2 plus one file run.
#
# Environment: PYTHON (default: .venv/bin/python if present, else python), PRESET (default paper; tiny: the dry
# run), DATA (default gpu-check/data, else $IATTN_DATA_DIR, else ../shared/data), E2E_WORKERS (default 8),
# BENCH_ARGS (the bench step's arguments after --heads, replacing its defaults), BENCH_EXTRA (added to them,
# e.g. "--loss-chunk 2048").
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
PART=${1:-}
PRESET=${PRESET:-paper}
if [ "$PRESET" != tiny ] && [ "$PART" != paths ] && [ "$PART" != kernel ] && [ "$PART" != train ] \
    && [ "$PART" != mfu ]; then
  echo "gpu_check.sh: name a part: paths, kernel, train or mfu (one per GPU window; PRESET=tiny dry-runs them" \
    "all)" >&2
  exit 2
fi
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python; fi
fi
OUT_DIR=${OUT:-$ROOT/gpu-check/out-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT_DIR"
if [ -z "${DATA:-}" ]; then
  if [ -d gpu-check/data ]; then DATA=$ROOT/gpu-check/data; else DATA=${IATTN_DATA_DIR:-$ROOT/../shared/data}; fi
fi
export IATTN_DATA_DIR=$DATA PYTHONPATH=$ROOT/src${PYTHONPATH:+:$PYTHONPATH}
SUMMARY=$OUT_DIR/summary.txt
START=$(date +%s)

step() {  # step NAME LIMIT_SECONDS COMMAND...: runs it under timeout, its output in NAME.log, never stops the script
  local name=$1 limit=$2
  shift 2
  local t0=$(date +%s)
  echo "== $name (limit ${limit}s): $*" | tee -a "$SUMMARY"
  timeout --kill-after=10 "$limit" "$@" >"$OUT_DIR/$name.log" 2>&1
  local rc=$?
  local took=$(( $(date +%s) - t0 ))
  echo "   $name: exit $rc, ${took}s$([ $rc -eq 124 ] && echo ' (timed out)')" | tee -a "$SUMMARY"
  tail -n 5 "$OUT_DIR/$name.log" | sed 's/^/   | /'
}

{
  echo "gpu_check $(date -u +%FT%TZ) part=${PART:-all} preset=$PRESET out=$OUT_DIR data=$DATA"
  echo "git: $(git rev-parse --short HEAD 2>/dev/null || echo '?') $(git status --porcelain 2>/dev/null | wc -l) changed files"
} | tee "$SUMMARY"
"$PYTHON" - >"$OUT_DIR/environment.json" 2>&1 <<'EOF'
import json, platform, torch
info = dict(python=platform.python_version(), torch=torch.__version__, cuda=torch.cuda.is_available())
if torch.cuda.is_available():
    info.update(device=torch.cuda.get_device_name(), capability=torch.cuda.get_device_capability())
try:
    import triton
    info["triton"] = triton.__version__
except ImportError:
    info["triton"] = None
try:
    import xdist
    info["pytest_xdist"] = xdist.__version__
except ImportError:
    info["pytest_xdist"] = None
print(json.dumps(info))
EOF
cat "$OUT_DIR/environment.json" | tee -a "$SUMMARY"
if { [ "$PART" = train ] || [ "$PRESET" = tiny ]; } && ! "$PYTHON" -c "import xdist" 2>/dev/null \
    && ls gpu-check/wheels/*.whl >/dev/null 2>&1; then  # only the e2e step runs under xdist
  step install-xdist 60 "$PYTHON" -m pip install --no-index --no-deps gpu-check/wheels/*.whl
fi

if [ "$PRESET" = tiny ]; then  # the dry run on CPU
  step gpu-tests "${T_GPU:-120}" "$PYTHON" -m pytest tests/gpu -m gpu -rs -p no:cacheprovider \
    --junitxml="$OUT_DIR/gpu-tests.xml"
  step wide-paths "${T_PATHS:-240}" "$PYTHON" benchmarks/wide_paths.py --dry --out "$OUT_DIR/wide-paths-dry.json"
  step profile "${T_BENCH:-300}" "$PYTHON" benchmarks/profile_step.py --preset tiny --heads 2 --steps 2 \
    --compile blocks --json "$OUT_DIR/cpu-profile-tiny-h2.json"
  step compile-time "${T_BENCH:-300}" "$PYTHON" benchmarks/compile_time.py --device cpu --preset tiny --heads 2 \
    --attention standard --scopes model,blocks --tokens 16 --windows 1 --steps 1 \
    --out "$OUT_DIR/compile-time-dry.json"
  step bench "${T_BENCH:-300}" "$PYTHON" -m iattention bench --preset tiny --device cpu --heads 1,2 --windows 1 \
    --steps 1 --rounds 1 --no-reference --compile --compile-scope blocks --json "$OUT_DIR/bench-tiny.json"
  step e2e "${T_E2E:-300}" "$PYTHON" -m pytest tests/e2e -n 2 -p no:cacheprovider -q --co
  step e2e-one-file "${T_E2E:-300}" "$PYTHON" -m pytest tests/e2e/test_names.py -n 2 -p no:cacheprovider -vv \
    --junitxml="$OUT_DIR/e2e-one-file.xml"
elif [ "$PART" = paths ]; then  # one whole run per head dim, widest (the paper's) first
  step wide-paths-d768 270 "$PYTHON" benchmarks/wide_paths.py --dims 768 --out "$OUT_DIR/wide-paths-d768.json"
  step wide-paths-d512 170 "$PYTHON" benchmarks/wide_paths.py --dims 512 --out "$OUT_DIR/wide-paths-d512.json"
  step wide-paths-d256 90 "$PYTHON" benchmarks/wide_paths.py --dims 256 --out "$OUT_DIR/wide-paths-d256.json"
elif [ "$PART" = kernel ]; then  # each test's line (and a failure's error lines, tests/gpu/conftest.py) as it ends
  step gpu-kernel 270 "$PYTHON" -m pytest tests/gpu -m gpu -k matches_the_math_path -vv -rs -p no:cacheprovider \
    --junitxml="$OUT_DIR/gpu-kernel.xml"
  # the compile and training tests in order of what they decide (pytest keeps the command line's order): the
  # paper's one-head GPT through the kernel, the op at 768 in bf16, CUDA training, then the rest (one compile
  # test took 74 s in the second window, so the last may not run)
  T=tests/gpu/test_cuda.py
  step gpu-compile 250 "$PYTHON" -m pytest -m gpu -vv -rs -p no:cacheprovider --junitxml="$OUT_DIR/gpu-compile.xml" \
    "$T::test_a_one_head_gpt_compiles_with_fullgraph_on_each_wide_path[triton]" \
    "$T::test_kernel_compiles_with_fullgraph_and_matches_eager[768-dtype1]" \
    "$T::test_tiny_train_on_cuda_eval_agrees_with_cpu_and_cached_generation_equals_uncached" \
    "$T::test_a_one_head_gpt_compiles_with_fullgraph_on_each_wide_path[math]" \
    "$T::test_kernel_compiles_with_fullgraph_and_matches_eager[768-dtype0]" \
    "$T::test_kernel_compiles_with_fullgraph_and_matches_eager[64-dtype1]" \
    "$T::test_kernel_compiles_with_fullgraph_and_matches_eager[64-dtype0]"
elif [ "$PART" = mfu ]; then  # regional compilation, so 16 compiled models fit one window
  DAY=$(date -u +%F)
  # shellcheck disable=SC2086  # BENCH_EXTRA is a list of words
  step bench-variants 280 "$PYTHON" -m iattention bench --preset "$PRESET" --device cuda --compile \
    --compile-scope blocks --heads 1,4,8,12 --rounds 1 --windows 3 --no-reference ${BENCH_EXTRA:-} \
    --json "$OUT_DIR/cuda-$PRESET-$DAY.json"
  # shellcheck disable=SC2086
  step bench-hf 150 "$PYTHON" -m iattention bench --preset "$PRESET" --device cuda --compile \
    --compile-scope blocks --heads 12 --attention standard --rounds 2 --windows 3 ${BENCH_EXTRA:-} \
    --json "$OUT_DIR/cuda-$PRESET-hf-$DAY.json"
  step profile 100 "$PYTHON" benchmarks/profile_step.py --preset "$PRESET" --heads 12 --device cuda --compile blocks \
    --steps 3 --json "$OUT_DIR/cuda-profile-$PRESET-h12-$DAY.json"
else  # train
  # what compiling costs and gives at the training shape: the whole model against its regions (each case in a
  # fresh process, inductor's caches off); decides train.compile_scope's default
  step compile-time 220 "$PYTHON" benchmarks/compile_time.py --device cuda --preset "$PRESET" --heads 12 \
    --attention standard --scopes model,blocks --batch 16 --tokens 1024 --out "$OUT_DIR/compile-time-cuda.json"
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of words
  step bench 190 "$PYTHON" -m iattention bench --preset "$PRESET" --device cuda --compile --heads 1,12 \
    ${BENCH_ARGS:---compile-scope blocks --attention standard --rounds 1 --windows 3 --no-reference} \
    ${BENCH_EXTRA:-} --json "$OUT_DIR/bench-$PRESET.json"
  step e2e 120 "$PYTHON" -m pytest tests/e2e -n "${E2E_WORKERS:-8}" -p no:cacheprovider -vv --durations=30 \
    --junitxml="$OUT_DIR/e2e.xml"
fi
echo "total $(( $(date +%s) - START ))s; logs and JSON in $OUT_DIR" | tee -a "$SUMMARY"
