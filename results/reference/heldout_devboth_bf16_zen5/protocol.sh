#!/usr/bin/env bash
# The tuning protocol in one sitting (docs/experiments.md, "Tuning protocol and the held-out race"), logged: tune_all
# on the HumanEval dev split (and tune_all_mbpp on MBPP's with --dev humaneval,mbpp), tune.py (--combine task over
# both), a commit of the tuned configs (the races record it), the held-out HumanEval race, then each further race
# only if it can start before the cut-off, a rule fixed before the start (a protocol sized to fit the session,
# never trimmed after the fact).
#
#   bash benchmarks/protocol.sh OUT CUTOFF [RACES] [--dev humaneval,mbpp] [-- OVERRIDES...]
#     OUT      a new folder, e.g. results/reference/heldout_<what>_<dtype>_<cpu>
#     CUTOFF   HH:MM (UTC): a race after the HumanEval one starts only before it (after midnight if already past)
#     RACES    further races, in order, from: mbpp gsm8k (default "mbpp"; "" for none)
#     --dev    the dev tasks tuned on, comma-separated, from: humaneval mbpp (default "humaneval"; both: every grid
#              point is scored by its mean speedup over the two, and the tuning takes ~2x as long)
#     OVERRIDES  passed to every run.py call (an untimed smoke run: -- model=tiny-random task.limit=1
#                runner.max_new_tokens=4; in a scratch worktree too: it commits the tuned configs it writes)
#
# Run it from a clean checkout (a worktree: git worktree add --detach /work/wt HEAD), with nothing else running on
# the machine: the rows record the commit, and tune.py's configs are committed there (merge that commit where the
# results land). Every Python call runs this checkout's code (PYTHONPATH), not the checkout the venv's editable
# install points at (from a worktree, tune.py would otherwise write the tuned configs into that other checkout).
# Writes OUT/protocol.log (UTC time, load average, each step's exit status), OUT/tune_all/ (and OUT/tune_all_mbpp/),
# OUT/tune.txt (tune.py's selection), a log per step and OUT/race_heldout_<task>/. Exit 2 (nothing run): bad
# arguments, a dirty checkout, an existing OUT, or a tuning step's command that run.py would refuse (its checks run
# first, e.g. a missing MBPP data file with --dev humaneval,mbpp).
# PYTHON: the interpreter (default .venv/bin/python); SPECDEC_DATA_DIR as for any run.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
usage="usage: bash benchmarks/protocol.sh OUT CUTOFF(HH:MM UTC) [RACES] [--dev humaneval,mbpp] [-- OVERRIDES...]"
[ $# -ge 2 ] || { echo "error: $usage" >&2; exit 2; }
OUT=$1 CUTOFF=$2
shift 2
[ -n "$OUT" ] || { echo "error: OUT is empty; $usage" >&2; exit 2; }
[[ "$CUTOFF" =~ ^([01][0-9]|2[0-3]):[0-5][0-9]$ ]] || { echo "error: CUTOFF '$CUTOFF' is not HH:MM (00:00-23:59, UTC); $usage" >&2; exit 2; }
RACES="mbpp" DEV="humaneval"
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  case "$1" in
    --dev|--dev=*)
      [ -z "${dev_given:-}" ] || { echo "error: --dev given twice" >&2; exit 2; }
      if [ "$1" = --dev ]; then
        [ $# -ge 2 ] && [ "${2#-}" = "$2" ] || { echo "error: --dev needs a value, e.g. --dev humaneval,mbpp; $usage" >&2; exit 2; }
        DEV=$2 dev_given=1; shift 2
      else
        DEV=${1#--dev=} dev_given=1; shift
      fi ;;
    -*) echo "error: unknown option '$1'; $usage" >&2; exit 2 ;;
    *=*) echo "error: '$1' looks like a run.py override: overrides go after --, e.g. -- $1; $usage" >&2; exit 2 ;;
    *) [ -z "${races_given:-}" ] || { echo "error: RACES given twice ('$RACES', '$1'): quote them as one, e.g. \"mbpp gsm8k\"" >&2; exit 2; }
       RACES=$1 races_given=1; shift ;;
  esac
done
[ $# -gt 0 ] && [ "$1" = "--" ] && shift
seen=" "
for race in $RACES; do
  case "$race" in mbpp|gsm8k) ;; *) echo "error: unknown race '$race' (mbpp, gsm8k; HumanEval always runs)" >&2; exit 2 ;; esac
  case "$seen" in *" $race "*) echo "error: race '$race' given twice in RACES ('$RACES')" >&2; exit 2 ;; esac
  seen="$seen$race "
done
case "$DEV" in  # the dev tasks tuned on (their tuning presets): HumanEval always, MBPP's validation split on request
  humaneval) TUNES=(tune_all) ;;
  humaneval,mbpp|mbpp,humaneval) DEV=humaneval,mbpp TUNES=(tune_all tune_all_mbpp) ;;
  *) echo "error: --dev '$DEV': choose humaneval or humaneval,mbpp" >&2; exit 2 ;;
esac
TUNE_ARGS=() # tune.py's arguments: the tuning runs, --combine task for two dev tasks
for t in "${TUNES[@]}"; do TUNE_ARGS+=("$OUT/$t"); done
[ ${#TUNES[@]} -gt 1 ] && TUNE_ARGS+=(--combine task)
cut=$(date -u -d "today $CUTOFF" +%s)
[ "$cut" -gt "$(date -u +%s)" ] || cut=$((cut + 86400))
if [ -n "$(git status --porcelain)" ]; then
  echo "error: the checkout has uncommitted changes (git status): run the protocol from a clean checkout, e.g." \
       "git worktree add --detach /work/wt HEAD" >&2
  exit 2
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's code, not the one the venv installed
root=$("$PYTHON" -c 'import harness, os; print(os.path.dirname(os.path.dirname(os.path.abspath(harness.__file__))))')
if [ "$root" != "$PWD" ]; then
  echo "error: $PYTHON imports the harness from $root, not from this checkout ($PWD)" >&2
  exit 2
fi
if [ -e "$OUT" ]; then
  echo "error: $OUT exists: a protocol writes a new folder (rerun a step by hand to resume it)" >&2
  exit 2
fi
for t in "${TUNES[@]}"; do  # run.py's own checks of each tuning step, before anything runs (races: after tuning)
  "$PYTHON" -c 'import sys
from run import ConfigError, precheck, refuse
try:
    precheck(sys.argv[1:])
except ConfigError as e:
    refuse(e)' "experiment=$t" "hydra.sweep.dir=$OUT/$t" "$@" || exit 2
done
mkdir -p "$OUT" 2>/dev/null || { echo "error: cannot create $OUT (mkdir -p failed): choose another OUT" >&2; exit 2; }
LOG=$OUT/protocol.log
log() { echo "$(date -u +%FT%TZ) load=$(cut -d' ' -f1-3 /proc/loadavg) $*" | tee -a "$LOG"; }
cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) [$(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | xargs)/$(grep -m1 '^model\s' /proc/cpuinfo | cut -d: -f2 | xargs)]"
flags=$(grep -o -m1 -w -e avx512_bf16 -e amx_bf16 /proc/cpuinfo | sort -u | xargs)
log "start commit=$(git rev-parse --short HEAD) cpu=$cpu bf16=${flags:-none} cutoff=$(date -u -d "@$cut" +%FT%TZ)" \
    "dev=$DEV races=humaneval $RACES overrides=$*"
worst=0
step() {  # step NAME COMMAND...: run it, log its exit status
  local name=$1; shift
  "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  log "$name rc=$rc"
  [ "$rc" -gt "$worst" ] && worst=$rc
  return "$rc"
}
for t in "${TUNES[@]}"; do
  step "$t" "$PYTHON" run.py "experiment=$t" "hydra.sweep.dir=$OUT/$t" "$@" || { log end; exit "$worst"; }
done
step tune "$PYTHON" benchmarks/tune.py "${TUNE_ARGS[@]}" --force || { log end; exit "$worst"; }
mv "$OUT/tune.log" "$OUT/tune.txt"
git add conf/decoder/tuned/*_tuned.yaml
git diff --cached --quiet || git -c user.name="${GIT_AUTHOR_NAME:-protocol}" \
    -c user.email="${GIT_AUTHOR_EMAIL:-protocol@localhost}" commit -q \
    -m "Tuned settings from the dev split(s) of $DEV ($cpu): benchmarks/tune.py ${TUNE_ARGS[*]} --force"
log "tuned commit=$(git rev-parse --short HEAD)"
step race_heldout_humaneval "$PYTHON" run.py experiment=race_heldout_humaneval \
    "hydra.sweep.dir=$OUT/race_heldout_humaneval" "$@"
for race in $RACES; do
  if [ "$(date -u +%s)" -lt "$cut" ]; then
    step "race_heldout_$race" "$PYTHON" run.py "experiment=race_heldout_$race" "hydra.sweep.dir=$OUT/race_heldout_$race" "$@"
  else
    log "race_heldout_$race not started (after the cut-off fixed before the start)"
  fi
done
log end
exit "$worst"
