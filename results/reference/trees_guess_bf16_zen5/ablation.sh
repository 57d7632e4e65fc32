#!/usr/bin/env bash
set -u
echo "== guess ablation start $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
cd /work/wt_run && .venv/bin/python run.py experiment=race_heldout_humaneval data_dir=/work/shared/data \
  "decoder=[vanilla,tuned/speculative_tuned,tuned/prompt_lookup_tuned,opt_tree,opt_tree_guess,opt_tree_hybrid]" \
  decoder.opt_tree.num_nodes=32 decoder.opt_tree_guess.num_nodes=32 \
  decoder.opt_tree_hybrid.num_nodes=32 decoder.opt_tree_hybrid.copy_min_match=3 \
  +decoder.opt_tree_hybrid_guess._target_=decoders.opt_tree.OptTreeDecoder +decoder.opt_tree_hybrid_guess.num_nodes=32 \
  +decoder.opt_tree_hybrid_guess.copy_tokens=20 +decoder.opt_tree_hybrid_guess.draft_on_copy=false \
  +decoder.opt_tree_hybrid_guess.copy_min_match=3 +decoder.opt_tree_hybrid_guess.guess_tokens=8 \
  hydra.sweep.dir=results/heldout/guess_ablation > /work/ablation.log 2>&1
echo "rc=$? end $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
