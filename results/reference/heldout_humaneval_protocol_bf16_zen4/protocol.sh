#!/usr/bin/env bash
# Timed HumanEval protocol in one sitting: tuning on the dev split, tune.py, the held-out race with the trees.
# Run from a worktree at a fixed commit, nothing else running; tune.py's configs are committed (detached HEAD)
# before the race so that the race's rows name a clean commit.
cd /tmp/timed3
PY=/work/main/.venv/bin/python
export SPECDEC_DATA_DIR=/work/shared/data
OUT=results/reference/heldout_humaneval_protocol_bf16_zen4
log() { echo "$(date -u +%FT%TZ) load=$(cut -d' ' -f1-3 /proc/loadavg) $*" >> $OUT/protocol.log; }
log "start commit=$(git rev-parse --short HEAD) cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) flags=$(grep -o -m1 avx512_bf16 /proc/cpuinfo)"
$PY run.py experiment=tune_all hydra.sweep.dir=$OUT/tune_all > $OUT/tune_all.log 2>&1; log "tune_all rc=$?"
$PY benchmarks/tune.py $OUT/tune_all --force > $OUT/tune.txt 2>&1; log "tune.py rc=$?"
git add conf/decoder/*_tuned.yaml && git -c user.name=protocol -c user.email=protocol@localhost commit -q -m "Tuned settings from the HumanEval dev split 0-4 (bfloat16, 2-core Zen 4): benchmarks/tune.py results/reference/heldout_humaneval_protocol_bf16_zen4/tune_all" ; log "tuned commit=$(git rev-parse --short HEAD)"
$PY run.py experiment=race_heldout_humaneval hydra.sweep.dir=$OUT/race_heldout_humaneval > $OUT/race_heldout_humaneval.log 2>&1; log "race_heldout_humaneval rc=$?"
log end
