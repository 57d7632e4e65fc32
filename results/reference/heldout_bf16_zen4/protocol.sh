#!/bin/bash
# HumanEval protocol on the 2-core bf16 CPU: tuning (dev 0-5, 128 tokens) -> tune.py -> commit -> held-out race.
set -u
export SPECDEC_TIMED=1 LEAD_GIT=1
cd /work/race
PY=/work/main/.venv/bin/python-real
OUT=results/reference/heldout_bf16_zen4
stamp() { echo "[protocol] $(date -u +%FT%TZ) $1 | $(cat /proc/loadavg)"; }
stamp "tune_all start"
$PY run.py experiment=tune_all model.dtype=bfloat16 hydra.sweep.dir=$OUT/tune_all > $OUT/tune_all.log 2>&1
stamp "tune_all end rc=$?"
$PY benchmarks/tune.py $OUT/tune_all --force > $OUT/tune.txt 2>&1
stamp "tune.py end rc=$?"
git add conf/decoder/*_tuned.yaml && git commit -q -m "Tuned decoder configs: HumanEval dev 0-5, 128 tokens, bf16, 2-core AMD EPYC Zen 4 (avx512_bf16)"
stamp "committed $(git rev-parse --short HEAD)"
$PY run.py experiment=race_heldout_humaneval model.dtype=bfloat16 hydra.sweep.dir=$OUT/race_heldout_humaneval > $OUT/race.log 2>&1
stamp "race end rc=$?"
