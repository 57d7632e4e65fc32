#!/usr/bin/env bash
# In-situ step costs against the bare curves each job now times: HumanEval dev problems 0-4, 128 tokens, bf16,
# six decoders in one job (rotated), at a clean commit, nothing else running. Sized before the start: 30 cells.
cd /work/main
OUT=results/reference/insitu_bare_bf16_zen5
echo "$(date -u +%FT%TZ) load=$(cut -d' ' -f1-3 /proc/loadavg) start commit=$(git rev-parse --short HEAD)" >> $OUT/protocol.log
.venv/bin/python run.py task=humaneval task.offset=0 task.limit=5 runner.max_new_tokens=128 runner.order=rotate \
  'decoder=[vanilla,tuned/speculative_tuned,tuned/opt_tree_tuned,opt_tree,fixed_tree,tuned/opt_tree_best_tuned]' \
  decoder.opt_tree.num_nodes=16 decoder.opt_tree.draft_vocab_size=32768 data_dir=/work/shared/data \
  hydra.run.dir=$OUT/run > $OUT/run.log 2>&1
echo "$(date -u +%FT%TZ) load=$(cut -d' ' -f1-3 /proc/loadavg) end rc=$?" >> $OUT/protocol.log
