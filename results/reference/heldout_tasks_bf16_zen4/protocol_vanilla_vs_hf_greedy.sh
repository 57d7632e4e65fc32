#!/usr/bin/env bash
# vanilla vs hf_greedy on held-out MBPP with 3 repeats (worktree at a fixed commit, nothing else running)
cd /tmp/timed3   # a worktree of commit 89f3ea7
export SPECDEC_DATA_DIR=/work/shared/data
OUT=results/reference/heldout_tasks_bf16_zen4
log() { echo "$(date -u +%FT%TZ) load=$(cut -d' ' -f1-3 /proc/loadavg) $*" >> $OUT/protocol.log; }
log "start vanilla_vs_hf_greedy_mbpp commit=$(git rev-parse --short HEAD)"
/work/main/.venv/bin/python run.py experiment=race_heldout_mbpp 'decoder=[vanilla,hf_greedy]' runner.repeats=3 hydra.sweep.dir=$OUT/vanilla_vs_hf_greedy_mbpp > $OUT/vanilla_vs_hf_greedy_mbpp.log 2>&1
log "vanilla_vs_hf_greedy_mbpp rc=$?"
