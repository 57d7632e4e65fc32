#!/usr/bin/env bash
# The six paper presets at their quick size in one sitting (Zen 5, bf16), each priced by run.py before it starts from
# a cost table that holds no paper-preset run of this CPU (its Zen 5 entry came from the tuning protocol only): the
# out-of-sample check of the estimates. Rule fixed before the start: a preset starts only if the time now plus 1.5x
# its printed estimate is before 13:25 UTC; order main_result, opt_tree_comparison, opt_tree_scaling, gamma_ablation,
# warm_cold, lookahead_sweep (the tasks' result and the trees' comparison first).
cd /work/wt_papers
PY=/work/main/.venv/bin/python
export PYTHONPATH=/work/wt_papers
export SPECDEC_DATA_DIR=/work/shared/data
REF=results/reference
LOG=$REF/papers_quick_bf16_zen5/protocol.log
DEADLINE=$(date -u -d 'today 13:25' +%s)
log() { echo "$(date -u +%FT%TZ) load=$(cut -d' ' -f1-3 /proc/loadavg) $*" >> $LOG; }
log "start commit=$(git rev-parse --short HEAD) dirty=$(git status --porcelain --untracked-files=no | wc -l) cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) flags=$(grep -o -m1 avx512_bf16 /proc/cpuinfo)"
for p in main_result opt_tree_comparison opt_tree_scaling gamma_ablation warm_cold lookahead_sweep; do
  out=$REF/${p}_bf16_zen5
  est=$($PY - "$p" <<'PYEOF'
import sys
p = sys.argv[1]
sys.argv = ["run.py", f"experiment={p}", "data_dir=/work/shared/data", f"hydra.sweep.dir=/tmp/est_{p}"]
import run
from harness.config.estimate import line
from harness.rows.machine import cpu_isa, cpu_signature, native_half_precision
f = run.precheck(sys.argv[1:])
print(line(f.configs, f.njobs, cpu_isa(), native_half_precision("bfloat16"), cpu_signature()))
PYEOF
)
  mins=$(echo "$est" | sed -n 's/.*~\([0-9.]*\) min.*/\1/p')
  if [ -z "$mins" ] || [ $(( $(date -u +%s) + ${mins%.*} * 90 )) -gt "$DEADLINE" ]; then
    log "$p not started (estimate '${mins:-none}' min: 1.5x of it ends after 13:25 UTC, the rule fixed before the start)"; continue
  fi
  log "$p start; printed: $est"
  s=$(date -u +%s)
  $PY run.py experiment=$p data_dir=/work/shared/data hydra.sweep.dir=$out > $REF/papers_quick_bf16_zen5/$p.log 2>&1
  log "$p rc=$? wall_s=$(( $(date -u +%s) - s ))"
done
log end
