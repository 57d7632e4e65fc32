#!/usr/bin/env bash
set -u
echo "== insitu head $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
cd /work/wt_run && .venv/bin/python run.py task=humaneval task.offset=20 task.limit=3 runner.max_new_tokens=128 \
  "decoder=[vanilla,speculative,opt_tree,fixed_tree]" data_dir=/work/shared/data hydra.run.dir=/tmp/insitu_head > /tmp/insitu_head.log 2>&1
echo "rc=$? $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
for side in old head; do
  dir=$([ $side = old ] && echo /tmp/old || echo /work/wt_run)
  echo "== host_overhead $side $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  cd $dir && .venv/bin/python benchmarks/host_overhead.py --json /tmp/ho_$side.json > /tmp/ho_$side.txt 2>&1
  echo "rc=$? $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
done
