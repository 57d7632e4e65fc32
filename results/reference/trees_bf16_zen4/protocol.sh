#!/usr/bin/env bash
# Timed protocol of the draft-tree race (run from a worktree at a fixed commit, nothing else running).
cd /tmp/timed
PY=/work/main/.venv/bin/python
OUT=results/reference/trees_bf16_zen4
log() { echo "$(date -u +%FT%TZ) load=$(cut -d' ' -f1-3 /proc/loadavg) $*" >> $OUT/protocol.log; }
log "start commit=$(git rev-parse --short HEAD)"
PYTHON=$PY bash benchmarks/ci_regress.sh > $OUT/gate.txt 2>&1; log "gate rc=$?"
$PY run.py experiment=tune_trees hydra.sweep.dir=$OUT/tune_trees > $OUT/tune_trees.log 2>&1; log "tune_trees rc=$?"
$PY benchmarks/tune.py $OUT/tune_trees --family opt_tree --family opt_tree_best > $OUT/tune.txt 2>&1; log "select rc=$?"
$PY run.py experiment=race_heldout_humaneval 'decoder=[vanilla,speculative_tuned,prompt_lookup_tuned,ouroboros_best_tuned,opt_tree_tuned,opt_tree_best_tuned]' task.limit=10 hydra.sweep.dir=$OUT/race > $OUT/race.log 2>&1; log "race rc=$?"
log end
