#!/usr/bin/env bash
# Timed protocol in one sitting (Zen 4, bf16), re-run with the decoders of issue 35's work: tune_all on the HumanEval
# dev split, tune.py, the held-out HumanEval race, then the held-out MBPP race if it can start before 01:35 UTC
# (rule fixed before the start).
cd /work/wt_proto3
PY=/work/main/.venv/bin/python
export PYTHONPATH=/work/wt_proto3
export SPECDEC_DATA_DIR=/work/shared/data
OUT=results/reference/heldout_rerun_bf16_zen4
log() { echo "$(date -u +%FT%TZ) load=$(cut -d' ' -f1-3 /proc/loadavg) $*" >> $OUT/protocol.log; }
log "start commit=$(git rev-parse --short HEAD) cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) flags=$(grep -o -m1 avx512_bf16 /proc/cpuinfo)"
$PY run.py experiment=tune_all hydra.sweep.dir=$OUT/tune_all > $OUT/tune_all.log 2>&1; log "tune_all rc=$?"
$PY benchmarks/tune.py $OUT/tune_all --force > $OUT/tune.txt 2>&1; log "tune.py rc=$?"
git add conf/decoder/tuned/*_tuned.yaml && git -c user.name=protocol -c user.email=protocol@localhost commit -q -m "Tuned settings from the HumanEval dev split 0-4 (bfloat16, 2-core Zen 4, re-run): benchmarks/tune.py $OUT/tune_all" ; log "tuned commit=$(git rev-parse --short HEAD)"
$PY run.py experiment=race_heldout_humaneval hydra.sweep.dir=$OUT/race_heldout_humaneval > $OUT/race_heldout_humaneval.log 2>&1; log "race_heldout_humaneval rc=$?"
if [ "$(date -u +%H%M)" -lt 0135 ]; then
  $PY run.py experiment=race_heldout_mbpp hydra.sweep.dir=$OUT/race_heldout_mbpp > $OUT/race_heldout_mbpp.log 2>&1; log "race_heldout_mbpp rc=$?"
else
  log "race_heldout_mbpp not started (after 01:35 UTC, the rule fixed before the start)"
fi
log end
