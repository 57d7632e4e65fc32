#!/usr/bin/env bash
# Resume of benchmarks/protocol.sh after its tune step refused (bf16 divergences on MBPP's dev split): the same
# steps by hand, tune.py with --allow-half-divergence, logged to the same protocol.log.
set -uo pipefail
cd "${WORKTREE:?the worktree of the protocol run}"
PYTHON=/work/main/.venv/bin/python
export PYTHONPATH=$PWD
OUT=results/reference/heldout_devboth_bf16_zen5
LOG=$OUT/protocol.log
log() { echo "$(date -u +%FT%TZ) load=$(cut -d' ' -f1-3 /proc/loadavg) $*" | tee -a "$LOG"; }
cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) [$(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | xargs)/$(grep -m1 '^model\s' /proc/cpuinfo | cut -d: -f2 | xargs)]"
log "resume by hand: tune.py with --allow-half-divergence (the first tune refused: tune_refused.txt), then the races"
$PYTHON benchmarks/tune.py $OUT/tune_all $OUT/tune_all_mbpp --combine task --allow-half-divergence --force > $OUT/tune.txt 2>&1
rc=$?; log "tune rc=$rc"; [ $rc -eq 0 ] || exit $rc
git add conf/decoder/tuned/*_tuned.yaml
git -c user.name=protocol -c user.email=protocol@localhost commit -q \
  -m "Tuned settings from the dev split(s) of humaneval,mbpp ($cpu): benchmarks/tune.py $OUT/tune_all $OUT/tune_all_mbpp --combine task --allow-half-divergence --force"
log "tuned commit=$(git rev-parse --short HEAD)"
$PYTHON run.py experiment=race_heldout_humaneval hydra.sweep.dir=$OUT/race_heldout_humaneval > $OUT/race_heldout_humaneval.log 2>&1
log "race_heldout_humaneval rc=$?"
if [ "$(date -u +%s)" -lt "$(date -u -d 'today 02:15' +%s)" ]; then
  $PYTHON run.py experiment=race_heldout_mbpp hydra.sweep.dir=$OUT/race_heldout_mbpp > $OUT/race_heldout_mbpp.log 2>&1
  log "race_heldout_mbpp rc=$?"
else
  log "race_heldout_mbpp not started (after the cut-off fixed before the start)"
fi
log end
