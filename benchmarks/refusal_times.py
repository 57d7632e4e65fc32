"""How long each common command-line mistake takes to be refused (``tests/test_refusals.py`` checks that each is
one ``error:`` line, exit status 2, without importing torch; this prints the wall time of each, the goal being
under 2 s on the 2-core CPU).

    python benchmarks/refusal_times.py            # one row per mistake: seconds, exit status, the line
    python benchmarks/refusal_times.py --check    # exit 1 when a refusal takes 2 s or more, or is not one line
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.test_refusals import MISTAKES, run_without_torch  # noqa: E402

#: Slowest acceptable refusal, seconds.
LIMIT_S = 2.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help=f"exit 1 when a refusal takes >= {LIMIT_S} s")
    args = parser.parse_args()
    bad = 0
    print("| mistake | seconds | exit | stderr lines | first line |\n|---|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for i, (what, argv, _) in enumerate(MISTAKES):
            folder = Path(tmp) / str(i)
            folder.mkdir()
            t0 = time.perf_counter()
            proc = run_without_torch(folder, argv)
            seconds = time.perf_counter() - t0
            lines = [line for line in proc.stderr.splitlines() if line.strip()]
            ok = proc.returncode == 2 and len(lines) == 1 and seconds < LIMIT_S
            bad += not ok
            first = (lines[0] if lines else "")[:100].replace("|", "\\|")
            print(f"| {what} | {seconds:.2f} | {proc.returncode} | {len(lines)} | {first} |")
    if args.check and bad:
        print(f"{bad} refusal(s) slower than {LIMIT_S} s or not one line", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
