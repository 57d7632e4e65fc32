"""The CI gate (benchmarks/ci_regress.sh) under real machine load: prints its verdict per scenario.

    python benchmarks/gate_under_load.py            # ~7 min on 2 cores; needs the committed baseline

Scenarios, each one gate attempt (``ATTEMPTS=1``) of ``benchmarks/ci_regress.sh`` against
``benchmarks/baselines/tiny_random.json``, with the verdict expected:

====================================  ===============================================  ========
scenario                              load                                             expected
====================================  ===============================================  ========
quiet, unchanged                      none added                                       0 pass
load 3, unchanged                     2 busy processes (+ the run's thread: load ~3)   0 pass
load 3, speculative 2x slower         idem                                             1
load 3, every decoder 2x slower       idem (speedups unchanged: tokens/s must see it)  1
load 3, 2 torch threads (old setting) idem                                             3 or 0, never a false 1
load 6, unchanged                     5 busy processes                                 3 (busy)
====================================  ===============================================  ========

A slowdown is real work, not a doctored row: the decoder's ``generate`` is followed by a busy loop burning as
much CPU time of its thread as the call did (``--shim``; outputs and counters are unchanged), so under load it
stretches like computation does. Busy processes are plain Python spin loops, started before the scenario and
given time for the 1-minute load average to reach ~90 % of its target (the rows record that average).

Not a test (it takes minutes and its timings depend on the machine): run it by hand after changing the gate.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import runpy
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLASSES = {"vanilla": "decoders.vanilla.VanillaDecoder", "speculative": "decoders.speculative.SpeculativeDecoder",
           "prompt_lookup": "decoders.prompt_lookup.PromptLookupDecoder",
           "lookahead": "decoders.lookahead.LookaheadDecoder", "ouroboros": "decoders.ouroboros.OuroborosDecoder"}


def slow_down(path: str) -> None:
    """Make ``path``'s ``generate`` twice as expensive: after the call, spin until the calling thread has used
    as much CPU time again (so the slowdown scales with load like computation does)."""
    import importlib

    module, name = path.rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)
    orig = cls.generate

    def generate(self, *args, **kwargs):
        c0 = time.thread_time()
        out = orig(self, *args, **kwargs)
        end = time.thread_time() + (time.thread_time() - c0)
        while time.thread_time() < end:
            pass
        return out

    cls.generate = generate


def shim(slow: str, hydra_args: list[str]) -> None:
    """Run ``run.py`` with ``hydra_args`` after slowing the decoders named in ``slow`` (comma list, ``*`` = all)."""
    sys.path.insert(0, str(ROOT))
    os.chdir(ROOT)
    for name in (CLASSES if slow == "*" else slow.split(",")):
        slow_down(CLASSES[name])
    sys.argv = [str(ROOT / "run.py"), *hydra_args]
    runpy.run_path(str(ROOT / "run.py"), run_name="__main__")


def _spin() -> None:
    while True:
        pass


def load1() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


class Load:
    """``n`` busy processes; :meth:`settle` waits for the 1-minute load average to approach ``target``."""

    def __init__(self) -> None:
        self.procs: list[mp.Process] = []

    def set(self, n: int, target: float, timeout_s: float = 150.0) -> None:
        while len(self.procs) > n:
            p = self.procs.pop()
            p.terminate()
            p.join()
        while len(self.procs) < n:
            p = mp.Process(target=_spin, daemon=True)
            p.start()
            self.procs.append(p)
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            now = load1()
            if (n and now >= 0.9 * target) or (not n and now <= target):
                break
            time.sleep(5)
        print(f"  [load: {n} busy processes, 1-minute load {load1():.2f} after {time.monotonic() - t0:.0f} s]",
              flush=True)

    def stop(self) -> None:
        self.set(0, 99.0, timeout_s=0)


def scenario(name: str, expected: str, out: Path, python: str, slow: str | None = None,
             threads: int = 1) -> dict:
    env = dict(os.environ, ATTEMPTS="1", CI_REGRESS_DIR=str(out / re.sub(r"\W+", "_", name)), PYTHON=python,
               THREADS=str(threads))
    if slow:
        env["RUN_PY"] = f"benchmarks/gate_under_load.py --shim {slow}"
    t0 = time.monotonic()
    proc = subprocess.run(["bash", "benchmarks/ci_regress.sh"], cwd=ROOT, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    took = time.monotonic() - t0
    lines = proc.stdout.splitlines()
    load = next((m.group(1) for line in lines if (m := re.search(r"peak 1-minute load ([0-9.]+)", line))
                 and line.startswith("current")), "-")
    speed = [line for line in lines if re.search(r" (speedup|tokens_per_s) ", line) and "|" in line]
    last = next((line for line in reversed(lines) if line.strip()), "")
    print(f"\n=== {name}: exit {proc.returncode} (expected {expected}), rows' peak load {load}, {took:.0f} s")
    for line in speed:
        print("  " + re.sub(r"\s{2,}", "  ", line.split(" | ", 2)[-1])[:170])
    print(f"  -> {last}", flush=True)
    return {"scenario": name, "exit": proc.returncode, "expected": expected, "load": load, "seconds": round(took)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--shim"]:
        shim(argv[1], argv[2:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=str(ROOT / ".venv/bin/python") if (ROOT / ".venv/bin/python").exists()
                        else sys.executable)
    parser.add_argument("--keep", help="folder to keep the runs in (default: a temporary folder)")
    args = parser.parse_args(argv)
    out = Path(args.keep or tempfile.mkdtemp(prefix="gate_under_load."))
    cores = os.cpu_count() or 2
    load = Load()
    results = []
    try:
        load.set(0, target=1.0, timeout_s=60)
        results.append(scenario("quiet, unchanged", "0", out, args.python))
        load.set(cores, target=cores + 1.0)
        results.append(scenario("load 3, unchanged", "0", out, args.python))
        results.append(scenario("load 3, speculative 2x slower", "1", out, args.python, slow="speculative"))
        results.append(scenario("load 3, every decoder 2x slower", "1", out, args.python, slow="*"))
        results.append(scenario("load 3, 2 torch threads (old setting)", "3 or 0", out, args.python, threads=2))
        load.set(3 * cores - 1, target=3.0 * cores)
        results.append(scenario("load 6, unchanged", "3", out, args.python))
    finally:
        load.stop()
    print("\nscenario                                  exit  expected  rows' peak load  seconds")
    for r in results:
        print(f"{r['scenario']:40s}  {r['exit']:>4}  {r['expected']:>8}  {r['load']:>15}  {r['seconds']:>7}")
    print(f"(runs kept in {out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
