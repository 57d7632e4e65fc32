#!/usr/bin/env bash
set -u
echo "== tune_trees start $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
cd /work/wt_run && .venv/bin/python run.py experiment=tune_trees data_dir=/work/shared/data > /work/tune_trees.log 2>&1
echo "rc=$? end $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
