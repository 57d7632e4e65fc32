"""``benchmarks/protocol.sh`` refuses bad arguments in one line, exit status 2, before it writes or runs anything.

The protocol takes hours on the real models, so a typo must cost nothing: each case below is refused by the
argument checks (before the clean-checkout check, so these run in any checkout) and leaves no OUT folder. The
happy path needs a clean checkout and runs the models; it is smoke-tested by hand on the tiny models (the
command is in the script's header).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "protocol.sh"


@pytest.mark.parametrize("args, says", [
    (["23:59", "--dev"], "--dev needs a value"),
    (["23:59", "--dev", "--", "model=tiny-random"], "--dev needs a value"),
    (["23:59", "--dev", "mbpp"], "choose humaneval or humaneval,mbpp"),
    (["23:59", "--dev=humaneval,gsm8k"], "choose humaneval or humaneval,mbpp"),
    (["23:59", "--dev", "humaneval,mbpp", "--dev", "humaneval"], "--dev given twice"),
    (["23:59", "--bogus"], "unknown option '--bogus'"),
    (["23:59", "--allow-half-divergence", "--allow-half-divergence"], "--allow-half-divergence given twice"),
    (["23:59", "mbpp", "gsm8k"], "RACES given twice"),
    (["23:59", "mbpp mbpp"], "race 'mbpp' given twice"),
    (["23:59", "humaneval"], "unknown race 'humaneval'"),
    (["23:59", "mbpp", "task.limit=1"], "overrides go after --"),
    (["12"], "CUTOFF '12' is not HH:MM"),
    (["now"], "CUTOFF 'now' is not HH:MM"),
    (["24:00"], "CUTOFF '24:00' is not HH:MM"),
    (["--", "model=tiny-random"], "CUTOFF '--' is not HH:MM"),
])
def test_bad_arguments_are_one_line_and_exit_2_before_anything(tmp_path, args, says):
    out = tmp_path / "out"
    r = subprocess.run(["bash", str(SCRIPT), str(out), *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], r.stderr
    assert r.stdout == "" and not out.exists()


def test_an_empty_out_is_refused():
    r = subprocess.run(["bash", str(SCRIPT), "", "23:59"], capture_output=True, text=True, timeout=60)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "OUT is empty" in lines[0], r.stderr
