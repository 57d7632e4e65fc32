#!/usr/bin/env bash
# The harness on a CUDA machine, in one call, with no network: what decides whether its numbers hold on a GPU.
#
#   bash benchmarks/gpu_check.sh --fetch-wheels .gpu_wheels     # on a machine WITH network (once): the wheels the
#                                                               # project needs beyond torch (gpu_requirements.txt),
#                                                               # for CPython 3.12 on x86_64 Linux, ~42 MB
#   bash benchmarks/gpu_check.sh --wheels .gpu_wheels [OUT]     # on the GPU machine: 5.3 min measured on one H200
#                                                               # (results/reference/gpu_h200), 10 at most
#   bash benchmarks/gpu_check.sh --dry-run [OUT]                # every step on the CPU with tiny shapes and 1 of
#                                                               # the 12 equality prompts (CI, ~1.5 min)
#
# On the GPU machine (Python 3.12, torch with CUDA and an older transformers preinstalled, nothing else of ours):
# a virtual environment that sees the system's torch gets the carried wheels (pip --no-index), then
#   1. env.json: Python, torch, CUDA, transformers, the device and its free memory;
#   2. the CUDA-marked tests (pytest -m gpu);
#   3. float32 whole-sequence equality of every conf/decoder config with vanilla on the device (tiny random
#      models; a difference fails the check);
#   4. the same in bfloat16, with the first divergent token per decoder (reported, not failed; an error fails);
#   5. timing with a randomly initialised target of the real target's shape (Qwen2.5 1.5B, bfloat16, EOS
#      ignored), one config per decoder family: vanilla vs hf_greedy, tokens/s with a copy of the target as the
#      draft (self-draft: every draft accepted), accept length and host overhead per step;
#   6. the host-overhead table of benchmarks/host_overhead.py on the device.
# Each step has its own time limit and its exit status is recorded; a failing step does not stop the others.
# Everything lands under OUT (default results/gpu_check; relative paths, OUT and --wheels, are taken from the
# repository root): the steps' rows and texts, and summary.md (rewritten after each step).
# Python: $PYTHON, else .venv/bin/python when it exists, else python3.
# Exit status: 0 every step passed, 1 some step failed (summary.md says which), 2 usage error.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ -z "${PYTHON:-}" ]; then  # the project's environment when there is one (setup.sh), else the machine's python3
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
MODE=gpu
WHEELS=""
OUT=""
value() {  # value OPTION NEXT: NEXT must be a folder argument, not another option
  if [ -z "${2:-}" ] || [ "${2#-}" != "$2" ]; then echo "error: $1 needs a folder" >&2; exit 2; fi
}
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) MODE=dry ;;
    --wheels) value "$1" "${2:-}"; WHEELS=$2; shift ;;
    --fetch-wheels)
      value "$1" "${2:-}"
      dest=$2
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
    -h|--help) sed -n '2,/^# Exit status/p' "$0"; exit 0 ;;
    -*) echo "error: unknown option $1 (--dry-run, --wheels DIR, --fetch-wheels DIR, -h)" >&2; exit 2 ;;
    *) [ -n "$OUT" ] && { echo "error: two output folders ($OUT, $1); give one" >&2; exit 2; }; OUT=$1 ;;
  esac
  shift
done
OUT=${OUT:-results/gpu_check}
[ -z "$WHEELS" ] || [ -d "$WHEELS" ] || { echo "error: --wheels $WHEELS is not a folder" >&2; exit 2; }
if ! "$PYTHON" -c "import torch" 2>/dev/null; then
  echo "error: $PYTHON cannot import torch; set PYTHON to an interpreter that has it (e.g. PYTHON=.venv/bin/python)" >&2
  exit 2
fi
if [ "$MODE" = gpu ] && ! "$PYTHON" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
  echo "error: $PYTHON's torch sees no CUDA device; on a machine without one run: bash $0 --dry-run" >&2
  exit 2
fi
if [ -e "$OUT" ] && [ ! -d "$OUT" ]; then echo "error: output folder $OUT is a file; give a folder" >&2; exit 2; fi
mkdir -p "$OUT" || { echo "error: cannot create the output folder $OUT" >&2; exit 2; }

if [ -n "$WHEELS" ]; then
  VENV=${GPU_CHECK_VENV:-/tmp/specdec-gpu-venv}
  "$PYTHON" -m venv --system-site-packages "$VENV" || exit 1
  # --system-site-packages reaches only the base interpreter's packages: when $PYTHON is itself a virtual
  # environment (torch installed in one, as on many GPU images), its site-packages go in through a .pth file,
  # after the new environment's own (so the carried versions win)
  "$PYTHON" -c "import sysconfig; p = sysconfig.get_paths(); print(p['purelib']); print(p['platlib'])" \
    > "$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/_gpu_check_parent.pth" \
    || exit 1
  "$VENV/bin/python" -m pip install --quiet --no-index --find-links "$WHEELS" -r benchmarks/gpu_requirements.txt \
    || { echo "error: installing the carried wheels from $WHEELS failed" >&2; exit 1; }
  PYTHON="$VENV/bin/python"
fi

if [ "$MODE" = dry ]; then
  DEV=cpu
  TIMING=(--shapes tiny --dtype float32 --max-new-tokens 16 --prompts 1 --prompt-tokens 48 --repeats 1 --threads 1)
  OVERHEAD=(--rounds 1 --prompts 1 --max-new-tokens 16 --prompt-tokens 48)
  EQ=(--max-new-tokens 16 --equality-prompts 1)   # the script's paths, not the proof: tests/test_lossless.py
  EQ16=("${EQ[@]}")
else
  DEV=cuda
  TIMING=(--shapes qwen2.5-1.5b --dtype bfloat16 --max-new-tokens 64 --prompts 1 --prompt-tokens 128 --repeats 3)
  OVERHEAD=(--rounds 3 --prompts 2 --max-new-tokens 64)
  EQ=(--max-new-tokens 32)
  EQ16=(--max-new-tokens 32 --equality-prompts 4)   # a report, not the contract: bfloat16 ran ~5x slower per config
fi

declare -a SUMMARY=()
worst=0
COMMIT="$(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD 2>/dev/null || echo ' (uncommitted changes)')"
summary() {  # rewritten after every step: a run killed from outside still leaves what it measured
  {
    echo "# gpu_check ($MODE) on $(hostname), $(date -u +%FT%TZ), commit $COMMIT: $1"
    echo
    echo "| step | exit | wall s |"
    echo "|---|---|---|"
    printf '%s\n' "${SUMMARY[@]}"
    echo
    for f in env.json equality_float32.txt equality_bfloat16.txt timing.txt host_overhead.txt; do
      [ -f "$OUT/$f" ] && { echo "## $f"; echo; echo '```'; cat "$OUT/$f"; echo '```'; echo; }
    done
  } > "$OUT/summary.md"
}
step() {  # step NAME LIMIT_S CMD...: run with a time limit, keep its output, record its status and wall time
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "== $name"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 40 "$OUT/$name.log"
  SUMMARY+=("| $name | $rc$( [ $rc = 124 ] && echo ' (time limit)') | $((SECONDS - t0)) |")
  [ "$rc" -ne 0 ] && worst=1
  summary "in progress"
  return 0
}

# Time limits (s): 30 + 60 + 120 + 120 + 150 + 75 = 555, with the wheel install (~30 s) under 10 minutes (a GPU
# machine lent for one 10-minute command). Measured on one H200 in one call (results/reference/gpu_h200/third_call):
# env 5, tests 19, float32 equality 50, bfloat16 equality 69, timing 102, host overhead 37; 318 s with the install.
step env 30 "$PYTHON" benchmarks/gpu_check.py env --out "$OUT" --device $DEV
step cuda_tests 60 "$PYTHON" -m pytest -q -p no:cacheprovider -o addopts=-ra -m gpu tests/test_sampling.py  # no xdist
step equality_float32 120 "$PYTHON" benchmarks/gpu_check.py equality --out "$OUT" --device $DEV --dtype float32 "${EQ[@]}"
step equality_bfloat16 120 "$PYTHON" benchmarks/gpu_check.py equality --out "$OUT" --device $DEV --dtype bfloat16 "${EQ16[@]}"
step timing 150 "$PYTHON" benchmarks/gpu_check.py timing --out "$OUT" --device $DEV "${TIMING[@]}"
step host_overhead 75 "$PYTHON" benchmarks/host_overhead.py --device $DEV --json "$OUT/host_overhead.json" "${OVERHEAD[@]}"
grep -v "Warning\|deprecated" "$OUT/host_overhead.log" > "$OUT/host_overhead.txt"

verdict=$( [ $worst = 0 ] && echo passed || echo 'FAILED (a step did not exit 0; see the table)')
summary "$verdict"
echo "gpu_check ($MODE): $verdict; rows and summary in $OUT"
exit $worst
