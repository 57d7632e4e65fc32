#!/usr/bin/env bash
# CI regression gate on tiny random float32 models: no network, no GPU, ~15 s on 2 CPU cores.
#
#   benchmarks/ci_regress.sh              # run, then gate against benchmarks/baselines/tiny_random.json
#   benchmarks/ci_regress.sh --update     # run, then rewrite that baseline (commit it with the change
#                                         # that legitimately moved it, e.g. a new decoder)
#   benchmarks/ci_regress.sh --speedup-k 4   # any other argument goes to python -m harness.regress
#
# The run: HumanEval's first 3 prompts, 48 new tokens, float32, decoders vanilla + every one of
# speculative, prompt_lookup, lookahead, ouroboros whose config exists. The draft is a twin of the target
# (same tiny config and seed), so speculative decoding accepts every draft and exercises multi-token
# commits; prompt lookup and lookahead accept partially (tiny random models repeat themselves).
#
# The gate: equality with vanilla (any new divergence fails) and accept length (no drop at all: both are
# deterministic in float32) are strict. Speedup on tiny CPU models is mostly noise, so it only fails below
# 40 % of the baseline's (or 3 bootstrap stds, or 0.5 absolute, whichever is looser).
# Exit status: 0 pass, 1 regression, 2 incomparable run or usage error.
#
# Env: PYTHON (default: python), CI_REGRESS_DIR (run folder to keep; default: a fresh temp folder),
#      DECODERS (comma list, overrides the detection above).
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

echo "ci_regress: decoders [$DECODERS] -> $RUN_DIR"
"$PYTHON" run.py model=tiny-random "decoder=[$DECODERS]" task=humaneval task.limit=3 \
  runner.max_new_tokens=48 runner.warmup=1 runner.score=false runner.resume=false \
  model.draft.name=tiny-random-qwen2-twin model.draft.seed=0 model.draft.config.model_type=qwen2 \
  model.draft.config.hidden_size=64 model.draft.config.intermediate_size=128 model.draft.config.vocab_size=260 \
  hydra.run.dir="$RUN_DIR"

if [[ $UPDATE == 1 ]]; then
  exec "$PYTHON" -m harness.regress --write-baseline "$RUN_DIR" --out "$BASELINE"
fi
exec "$PYTHON" -m harness.regress --baseline "$BASELINE" --current "$RUN_DIR" \
  --accept-length-tolerance 0 --speedup-rel-tolerance 0.6 --speedup-k 3 --speedup-tolerance 0.5 \
  ${ARGS[@]+"${ARGS[@]}"}
