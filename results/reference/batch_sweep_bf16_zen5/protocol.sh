#!/usr/bin/env bash
# The batch_sweep reference run: one sitting, nothing else on the machine.
cd /work/wt_batch
echo "start $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" > /work/batch.status
/usr/bin/time -v .venv/bin/python run.py experiment=batch_sweep data_dir=/work/shared/data hydra.sweep.dir=results/experiments/batch_sweep/run > /work/batch_sweep.log 2> /work/batch_sweep.err
echo "end $(date -u +%FT%TZ) rc $? load $(cut -d' ' -f1-3 /proc/loadavg)" >> /work/batch.status
