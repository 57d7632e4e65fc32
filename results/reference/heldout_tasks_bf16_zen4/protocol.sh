#!/usr/bin/env bash
# Timed protocol of the held-out MBPP and GSM8K races (run from a worktree at a fixed commit, nothing else running).
cd /tmp/timed2
PY=/work/main/.venv/bin/python
export SPECDEC_DATA_DIR=/work/shared/data
OUT=results/reference/heldout_tasks_bf16_zen4
log() { echo "$(date -u +%FT%TZ) load=$(cut -d' ' -f1-3 /proc/loadavg) $*" >> $OUT/protocol.log; }
log "start commit=$(git rev-parse --short HEAD) cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) flags=$(grep -o -m1 avx512_bf16 /proc/cpuinfo)"
for t in mbpp gsm8k; do
  $PY run.py experiment=race_heldout_$t hydra.sweep.dir=$OUT/race_heldout_$t > $OUT/race_heldout_$t.log 2>&1; log "race_heldout_$t rc=$?"
done
log end
