#!/usr/bin/env bash
# in-situ step costs, code before (keep_path whole-cache copy) vs after (in place), same machine, one after the other
set -u
for side in old new; do
  dir=$([ $side = old ] && echo /tmp/old || echo /work/wt_run)
  cd $dir
  echo "== $side $(git log --oneline -1 | cut -c1-60) $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  .venv/bin/python run.py task=humaneval task.offset=20 task.limit=3 runner.max_new_tokens=128 \
    "decoder=[vanilla,speculative,opt_tree,fixed_tree]" data_dir=/work/shared/data hydra.run.dir=/tmp/insitu_$side \
    > /tmp/insitu_$side.log 2>&1
  echo "rc=$? $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
done
