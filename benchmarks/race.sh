#!/usr/bin/env bash
# The speed race: every decoder in one run (same process, same token ids, vanilla as the
# paired reference), target Qwen2.5-Coder-1.5B-Instruct / draft 0.5B-Instruct in bfloat16, HumanEval,
# 256 new tokens. Prints one table (summary.md) and writes the paper-style report next to the rows.
#
#   bash benchmarks/race.sh                 # the first 20 problems (57 min on a 2-core AMX CPU; results/reference/race20_cpu)
#   LIMIT=5 bash benchmarks/race.sh         # a shorter race
#   OUT=results/race_gpu bash benchmarks/race.sh decoder.ouroboros.gamma=12   # extra overrides pass through
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
OUT=${OUT:-results/race}
"$PYTHON" run.py "decoder=[vanilla,speculative,lookahead,prompt_lookup,hf_assisted,ouroboros,ouroboros_warm,ouroboros_prompt,ouroboros_prompt_warm]" \
  task=humaneval task.limit="${LIMIT:-20}" runner.max_new_tokens=256 hydra.run.dir="$OUT" "$@"
"$PYTHON" -m harness.report "$OUT" --out "$OUT/report" --plots >/dev/null && echo "report and figures: $OUT/report"
