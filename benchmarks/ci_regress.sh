#!/usr/bin/env bash
# CI regression gate on tiny random float32 models: no network, no GPU, one run of ~15-30 s on 2 CPU cores.
#
#   benchmarks/ci_regress.sh              # one run, gated against benchmarks/baselines/tiny_random.json
#   benchmarks/ci_regress.sh --update     # BASELINE_RUNS (default 3) runs -> rewrite that baseline; commit it
#                                         # with the change that legitimately moved it (run it on the CI
#                                         # machine class: speedups are only comparable on like hardware)
#   benchmarks/ci_regress.sh --k 4        # any other argument goes to python -m harness.regress
#
# The run: HumanEval's first 3 prompts, 48 new tokens, float32, decoders vanilla + every one of
# speculative, prompt_lookup, lookahead, ouroboros whose config exists. The draft is a twin of the target
# (same tiny config and seed), so speculative decoding accepts every draft and exercises multi-token
# commits; prompt lookup and lookahead accept partially (tiny random models repeat themselves).
#
# What the gate checks, and what it can and cannot catch:
# * Exactly (float32 is deterministic): no new divergence from vanilla, and the counters -- new tokens,
#   target forwards, draft forwards, drafted and accepted tokens, per sample. Any change in what a decoder
#   computes (accept length, forwards per token) fails, with no false alarms on the same software stack.
#   A different CPU or torch build may legitimately change float32 results: then rewrite the baseline.
# * Speed, against run-to-run noise: the baseline holds BASELINE_RUNS runs, and the spread of each
#   decoder's speedup over them is its noise sigma. The run fails when a speedup falls below
#   baseline - k * sigma * sqrt(1/BASELINE_RUNS + 1/1), with k = 3, the margin kept within 5 %..50 % of the
#   baseline (limits stay positive). Tiny-model timings on a shared 2-core runner are noisy (sigma of a few
#   to ~10 % per decoder), so the gate reliably catches slowdowns of about 3.5 sigma (roughly 15-40 %) and
#   misses smaller ones; k = 3 keeps false alarms near 0.1 % per check when sigma is right (one check per
#   decoder, plus tokens/s when the machine name matches the baseline's). A noisier runner than the
#   baseline's raises false alarms; a quieter one hides small slowdowns. Small slowdowns are for the
#   full-size gate with repeats (README, "Reports, paper figures, sweeps and the CI gate").
# Exit status: 0 pass, 1 regression, 2 incomparable run or usage error.
#
# Env: PYTHON (default: python), CI_REGRESS_DIR (run folder to keep; default: a fresh temp folder),
#      DECODERS (comma list, overrides the detection above), BASELINE_RUNS (runs for --update, default 3).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python}
BASELINE=benchmarks/baselines/tiny_random.json
RUN_DIR=${CI_REGRESS_DIR:-$(mktemp -d)/tiny_random}
UPDATE=0
ARGS=()
for a in "$@"; do
  if [[ $a == --update ]]; then UPDATE=1; else ARGS+=("$a"); fi
done

if [[ -z ${DECODERS:-} ]]; then
  DECODERS=vanilla
  for d in speculative prompt_lookup lookahead ouroboros; do
    [[ -f conf/decoder/$d.yaml ]] && DECODERS+=",$d"
  done
fi

one_run() {  # $1: run folder
  echo "ci_regress: decoders [$DECODERS] -> $1"
  "$PYTHON" run.py model=tiny-random "decoder=[$DECODERS]" task=humaneval task.limit=3 \
    runner.max_new_tokens=48 runner.warmup=1 runner.score=false runner.resume=false \
    model.draft.name=tiny-random-qwen2-twin model.draft.seed=0 model.draft.config.model_type=qwen2 \
    model.draft.config.hidden_size=64 model.draft.config.intermediate_size=128 model.draft.config.vocab_size=260 \
    hydra.run.dir="$1"
}

if [[ $UPDATE == 1 ]]; then
  RUNS=()
  for i in $(seq 1 "${BASELINE_RUNS:-3}"); do
    one_run "$RUN_DIR/$i"
    RUNS+=("$RUN_DIR/$i")
  done
  exec "$PYTHON" -m harness.regress --write-baseline "${RUNS[@]}" --out "$BASELINE"
fi
one_run "$RUN_DIR"
exec "$PYTHON" -m harness.regress --baseline "$BASELINE" --current "$RUN_DIR" \
  --k 3 --min-margin 0.05 --max-margin 0.5 \
  ${ARGS[@]+"${ARGS[@]}"}
