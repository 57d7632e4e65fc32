#!/usr/bin/env bash
# Stop the race (SIGINT to run.py, which summarises the finished cells) at a problem boundary when the problems
# left would take tuning + race past 100 min from the protocol's start (23:50:50Z), judged from the mean of the
# last three problems' durations; from 9 problems on. Interrupting within the next problem's first cells writes
# none of its rows (cells before vanilla's are held until vanilla's finishes).
LOG=/tmp/timed3/results/reference/heldout_humaneval_protocol_bf16_zen4/race_heldout_humaneval.log
OUT=/tmp/watch_race.log
DEADLINE=$(date -u -d "2026-12-02T01:30:50Z" +%s)
declare -a T=()
last=""
while true; do
  line=$(tail -c 400 "$LOG" | tr '\r' '\n' | grep -o '[0-9]*/15 \[[^]]*\]' | tail -1)
  n=${line%%/*}
  now=$(date -u +%s)
  if [ -n "$n" ] && [ "$n" != "$last" ]; then
    T[$n]=$now; last=$n
    echo "$(date -u +%FT%TZ) $n problems done ($line)" >> $OUT
    if [ "$n" -ge 9 ] && [ "$n" -lt 15 ] && [ -n "${T[$((n-3))]:-}" ]; then
      rate=$(( (now - T[$((n-3))]) / 3 ))
      finish=$(( now + (15 - n) * rate ))
      echo "  rate ${rate}s/problem, projected end $(date -u -d @$finish +%TZ)" >> $OUT
      if [ "$finish" -gt "$DEADLINE" ]; then
        pid=$(pgrep -f "run.py experiment=race_heldout_humaneval" | head -1)
        echo "$(date -u +%FT%TZ) stop after $n problems: SIGINT to $pid" >> $OUT
        kill -INT "$pid"; break
      fi
    fi
  fi
  if ! pgrep -f "run.py experiment=race_heldout_humaneval" >/dev/null; then echo "$(date -u +%FT%TZ) run ended" >> $OUT; break; fi
  sleep 5
done
