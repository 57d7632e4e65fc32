#!/usr/bin/env bash
# Resume demo: a sweep over two tasks x three decoders on tiny models, killed halfway, re-run, then reported.
set -u; cd "$(dirname "$0")/.."; PY=${PYTHON:-.venv/bin/python}
D=${OUT:-/tmp/resume_demo}; rm -rf "$D"
ARGS="-m model=tiny-random task=humaneval,mbpp data_dir=${DATA_DIR:-../shared/data} task.limit=10 runner.max_new_tokens=40 decoder=[vanilla,speculative,prompt_lookup] hydra.sweep.dir=$D"
timeout -s KILL 9 $PY run.py $ARGS > /tmp/resume_demo1.log 2>&1; echo "first attempt rc=$? (137 = killed)"
for f in $D/*/results.jsonl; do echo "$f: $(wc -l < $f) rows after the kill"; done
$PY run.py $ARGS > /tmp/resume_demo2.log 2>&1; echo "re-run rc=$?"
$PY - "$D" <<'PY'
import json, glob, collections, sys
for f in sorted(glob.glob(sys.argv[1] + "/*/results.jsonl")):
    rows = [json.loads(l) for l in open(f) if l.strip()]
    cells = collections.Counter((r["task"], r["sample_id"], r["decoder"]) for r in rows if r["status"] == "ok")
    print(f, "rows", len(rows), "cells", len(cells), "max per cell", max(cells.values()), "attempts", len({r["attempt_id"] for r in rows}))
PY
$PY -m harness.report $D --out $D/report > /dev/null && ls $D/report
