#!/usr/bin/env bash
# The held-out races (and the temperature-0.7 run), after the tuning step has written the
# conf/decoder/tuned/*_tuned.yaml configs (docs/experiments.md, "Tuning protocol"): runs the presets in sequence,
# each into a fixed folder under $OUT, then writes each one's report (tables + figures) and one report over the
# three greedy races (one block of rows per task). Untimed smoke runs: pass overrides, e.g.
#   OUT=/tmp/smoke bash benchmarks/race_heldout.sh model=tiny-random task.limit=1 runner.max_new_tokens=4 runner.repeats=1
# (the tiny-random pair's vocab sizes differ, so hf_assisted refuses to sample there: smoke the sampled preset
#  with RACES=sampled ... 'decoder=[vanilla,hf_greedy,tuned/speculative_tuned,tuned/prompt_lookup_tuned]').
#
#   bash benchmarks/race_heldout.sh                 # all four, ~8.6 h on the 2-core CPU (docs/experiments.md, "Cost")
#   RACES="humaneval" bash benchmarks/race_heldout.sh
#   RACES="mbpp gsm8k" bash benchmarks/race_heldout.sh runner.repeats=1   # extra overrides go to every preset
#
# Interrupted? Run the same command again: every preset resumes in its folder (cells already done are skipped;
# a different commit or config is refused, exit 2, naming what changed). A preset that ends with failed cells
# (exit 1) does not stop the others; rerunning retries the failed cells. Exit status: the worst of the runs.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
OUT=${OUT:-results/heldout}
RACES=${RACES:-"humaneval mbpp gsm8k sampled"}
worst=0
greedy=()
for race in $RACES; do
  case "$race" in
    humaneval|mbpp|gsm8k) preset="race_heldout_$race"; greedy+=("$OUT/$preset") ;;
    sampled) preset="sampled_heldout_humaneval" ;;
    *) echo "error: unknown race '$race' (humaneval, mbpp, gsm8k, sampled)" >&2; exit 2 ;;
  esac
  echo "== $preset -> $OUT/$preset"
  "$PYTHON" run.py "experiment=$preset" "hydra.sweep.dir=$OUT/$preset" "$@"
  rc=$?
  if [ "$rc" -eq 2 ]; then
    echo "error: $preset refused (exit 2: configuration, missing tuned configs, or a folder of another run); stopping" >&2
    exit 2
  fi
  [ "$rc" -gt "$worst" ] && worst=$rc
  if ls "$OUT/$preset"/*/results.jsonl >/dev/null 2>&1; then
    "$PYTHON" -m harness.report "$OUT/$preset" --out "$OUT/$preset/report" --plots >/dev/null \
      && echo "report and figures: $OUT/$preset/report" || worst=1
  fi
done
present=()
for d in "${greedy[@]}"; do ls "$d"/*/results.jsonl >/dev/null 2>&1 && present+=("$d"); done
if [ "${#present[@]}" -gt 1 ]; then
  "$PYTHON" -m harness.report "${present[@]}" --out "$OUT/report" --plots >/dev/null \
    && echo "report over the greedy races: $OUT/report" || worst=1
fi
exit "$worst"
