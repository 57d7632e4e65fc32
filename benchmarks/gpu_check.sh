#!/usr/bin/env bash
# The harness on a CUDA machine, in one call, with no network: what decides whether its numbers hold on a GPU.
#
#   bash benchmarks/gpu_check.sh --fetch-wheels .gpu_wheels     # on a machine WITH network (once): the wheels the
#                                                               # project needs beyond torch (gpu_requirements.txt),
#                                                               # for CPython 3.12 on x86_64 Linux, ~30 MB
#   bash benchmarks/gpu_check.sh --wheels .gpu_wheels [OUT]     # on the GPU machine: < 8 min on one H200
#   bash benchmarks/gpu_check.sh --dry-run [OUT]                # every step on the CPU with tiny shapes (CI, ~1 min)
#
# On the GPU machine (Python 3.12, torch with CUDA and an older transformers preinstalled, nothing else of ours):
# a virtual environment that sees the system's torch gets the carried wheels (pip --no-index), then
#   1. env.json: Python, torch, CUDA, transformers, the device and its free memory;
#   2. the CUDA-marked tests (pytest -m gpu);
#   3. float32 whole-sequence equality of every conf/decoder config with vanilla on the device (tiny random
#      models; a difference fails the check);
#   4. the same in bfloat16, with the first divergent token per decoder (reported, not failed);
#   5. timing with randomly initialised models of the real pair's shapes (Qwen2.5 1.5B target / 0.5B draft,
#      bfloat16, EOS ignored): vanilla vs hf_greedy, each decoder's tokens/s with a self-draft (the ceiling),
#      accept length and host overhead per step;
#   6. the host-overhead table of benchmarks/host_overhead.py on the device.
# Each step has its own time limit and its exit status is recorded; a failing step does not stop the others.
# Everything lands under OUT (default results/gpu_check): the steps' rows and texts, and summary.md.
# Exit status: 0 every step passed, 1 some step failed (summary.md says which), 2 usage error.
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
MODE=gpu
WHEELS=""
OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) MODE=dry ;;
    --wheels) WHEELS=${2:?--wheels needs a folder}; shift ;;
    --fetch-wheels)
      dest=${2:?--fetch-wheels needs a folder}
      mkdir -p "$dest"
      # antlr4-python3-runtime (omegaconf's parser) is published as a source archive only: build its wheel first
      antlr=$(grep -o -m1 '^antlr4-python3-runtime==[0-9.]*' benchmarks/gpu_requirements.txt)
      "$PYTHON" -m pip wheel --quiet --no-deps -w "$dest" "$antlr" || exit 1
      "$PYTHON" -m pip download --quiet --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform any --find-links "$dest" -d "$dest" -r benchmarks/gpu_requirements.txt || exit 1
      rm -f "$dest"/numpy-*.whl   # the GPU machine's numpy is used (see gpu_requirements.txt)
      du -sh "$dest"; ls "$dest"
      exit 0 ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    -*) echo "error: unknown option $1 (--dry-run, --wheels DIR, --fetch-wheels DIR)" >&2; exit 2 ;;
    *) OUT=$1 ;;
  esac
  shift
done
OUT=${OUT:-results/gpu_check}
mkdir -p "$OUT"
if [ "$MODE" = gpu ] && ! "$PYTHON" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
  echo "error: $PYTHON's torch sees no CUDA device; on a machine without one run: bash $0 --dry-run" >&2
  exit 2
fi

if [ -n "$WHEELS" ]; then
  [ -d "$WHEELS" ] || { echo "error: --wheels $WHEELS is not a folder" >&2; exit 2; }
  VENV=${GPU_CHECK_VENV:-/tmp/specdec-gpu-venv}
  "$PYTHON" -m venv --system-site-packages "$VENV" || exit 1
  "$VENV/bin/python" -m pip install --quiet --no-index --find-links "$WHEELS" -r benchmarks/gpu_requirements.txt \
    || { echo "error: installing the carried wheels from $WHEELS failed" >&2; exit 1; }
  PYTHON="$VENV/bin/python"
fi

if [ "$MODE" = dry ]; then
  DEV=cpu
  TIMING=(--shapes tiny --dtype float32 --max-new-tokens 16 --prompts 1 --prompt-tokens 48 --repeats 1 --threads 1)
  OVERHEAD=(--rounds 1 --prompts 1 --max-new-tokens 16)
  EQ=(--max-new-tokens 16)
else
  DEV=cuda
  TIMING=(--shapes qwen2.5-1.5b --dtype bfloat16 --max-new-tokens 128 --prompts 2 --prompt-tokens 128 --repeats 2)
  OVERHEAD=(--rounds 3 --prompts 2 --max-new-tokens 64)
  EQ=(--max-new-tokens 32)
fi

declare -a SUMMARY=()
worst=0
step() {  # step NAME LIMIT_S CMD...: run with a time limit, keep its output, record its status and wall time
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "== $name"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 40 "$OUT/$name.log"
  SUMMARY+=("| $name | $rc | $((SECONDS - t0)) |")
  [ "$rc" -ne 0 ] && worst=1
  return 0
}

step env 60 "$PYTHON" benchmarks/gpu_check.py env --out "$OUT" --device $DEV
step cuda_tests 150 "$PYTHON" -m pytest -q -p no:cacheprovider -m gpu tests/test_sampling.py
step equality_float32 120 "$PYTHON" benchmarks/gpu_check.py equality --out "$OUT" --device $DEV --dtype float32 "${EQ[@]}"
step equality_bfloat16 120 "$PYTHON" benchmarks/gpu_check.py equality --out "$OUT" --device $DEV --dtype bfloat16 "${EQ[@]}"
step timing 200 "$PYTHON" benchmarks/gpu_check.py timing --out "$OUT" --device $DEV "${TIMING[@]}"
step host_overhead 120 "$PYTHON" benchmarks/host_overhead.py --device $DEV --json "$OUT/host_overhead.json" "${OVERHEAD[@]}"

{
  echo "# gpu_check ($MODE) on $(hostname), $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo
  echo "| step | exit | wall s |"
  echo "|---|---|---|"
  printf '%s\n' "${SUMMARY[@]}"
  echo
  for f in env.json equality_float32.txt equality_bfloat16.txt timing.txt host_overhead.log; do
    [ -f "$OUT/$f" ] && { echo "## $f"; echo; echo '```'; cat "$OUT/$f"; echo '```'; echo; }
  done
} > "$OUT/summary.md"
echo "gpu_check ($MODE): $( [ $worst = 0 ] && echo passed || echo 'FAILED (see summary.md)'); rows and summary in $OUT"
exit $worst
