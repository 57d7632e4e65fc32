#!/usr/bin/env bash
# Create .venv and install the harness with its test extra: everything the README's two commands need,
# no hand step. CPU machines get torch 2.13.0 (CPU build); set TORCH_SPEC to choose another build, e.g.
# TORCH_SPEC="torch==2.13.0 --index-url .../cu128". Ends with `pip check`: a broken environment fails here.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/python -m pip install -q ${TORCH_SPEC:-torch==2.13.0}
fi
.venv/bin/python -m pip install -q -e ".[test]"
.venv/bin/python -m pip check
echo "setup done: .venv ready"
