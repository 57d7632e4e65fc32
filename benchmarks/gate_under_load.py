"""The CI gate (benchmarks/ci_regress.sh) under real machine load: does it hold? Prints a verdict per run, a
table and a final PASS/FAIL line.

    python benchmarks/gate_under_load.py              # the protocol: 15 gate runs, ~22 min on 2 quiet cores
    python benchmarks/gate_under_load.py --quick      # sanity: 3 short runs (10 repeats), ~1.5 min; no verdict
                                                      # on power
    python benchmarks/gate_under_load.py --factor 1.25 --decoder lookahead   # another slowdown

Needs a baseline measured on this machine class, quietly: ``bash benchmarks/ci_regress.sh --update`` first
when the machine or the gate's shape (prompts, tokens, repeats) changed. The machine must otherwise be QUIET:
the burners below are the only load the protocol means to add.

The protocol, each run one gate attempt (``ATTEMPTS=1``: the gate's own verdict, no re-measuring):

* 10 runs of unchanged code beside 0, 1, 2, 3, 0, 1, 2, 3, 2, 3 CPU-bound processes (Python spin loops): each
  must exit 0 (pass) or 3 (not judged: the calls' measured run-queue wait was too high), never 1;
* 5 runs on the quiet machine with one decoder (``--decoder``, default speculative) made ``--factor`` (1.1)
  times slower: at least 4 must exit 1 with regressions of that decoder only.

A slowdown is real work, not a doctored row: the decoder's ``generate`` is followed by a busy loop burning
``factor - 1`` times the CPU time its thread used in the call (``--shim``; outputs and counters unchanged),
so under load it stretches like computation does.

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
UNCHANGED_BURNERS = (0, 1, 2, 3, 0, 1, 2, 3, 2, 3)
SLOW_RUNS, SLOW_NEEDED = 5, 4
#: Seconds of one gate run on 2 quiet cores: start-up, warm-up and judging, and per timed (prompt, repeat)
#: round of the 5 decoders (48 tokens each); beside 2-3 burners the calls take up to twice as long.
RUN_OVERHEAD_S, ROUND_S = 15.0, 0.25


def slow_down(path: str, factor: float) -> None:
    """Make ``path``'s ``generate`` ``factor`` times as expensive: after the call, spin until the calling thread
    has used ``factor - 1`` times its CPU time again (so the slowdown scales with load like computation)."""
    import importlib

    module, name = path.rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)
    orig = cls.generate

    def generate(self, *args, **kwargs):
        c0 = time.thread_time()
        out = orig(self, *args, **kwargs)
        end = time.thread_time() + (factor - 1.0) * (time.thread_time() - c0)
        while time.thread_time() < end:
            pass
        return out

    cls.generate = generate


def shim(slow: str, factor: float, hydra_args: list[str]) -> None:
    """Run ``run.py`` with ``hydra_args`` after slowing the decoders named in ``slow`` (comma list, ``*`` = all)
    by ``factor``."""
    sys.path.insert(0, str(ROOT))
    os.chdir(ROOT)
    for name in (CLASSES if slow == "*" else slow.split(",")):
        slow_down(CLASSES[name], factor)
    sys.argv = [str(ROOT / "run.py"), *hydra_args]
    runpy.run_path(str(ROOT / "run.py"), run_name="__main__")


def _spin() -> None:
    while True:
        pass


class Burners:
    """``n`` CPU-bound processes beside the gate (the gate measures the contention they cause per call)."""

    def __init__(self) -> None:
        self.procs: list[mp.Process] = []

    def set(self, n: int) -> None:
        while len(self.procs) > n:
            p = self.procs.pop()
            p.terminate()
            p.join()
        while len(self.procs) < n:
            p = mp.Process(target=_spin, daemon=True)
            p.start()
            self.procs.append(p)
        time.sleep(2.0 if n else 0.0)


def gate_run(label: str, out: Path, python: str, repeats: int, slow: tuple[str, float] | None) -> dict:
    """One attempt of benchmarks/ci_regress.sh; returns its exit status, regressions, contention and seconds."""
    env = dict(os.environ, ATTEMPTS="1", CI_REGRESS_DIR=str(out / re.sub(r"\W+", "_", label)), PYTHON=python,
               REPEATS=str(repeats))
    if slow:
        env["RUN_PY"] = f"benchmarks/gate_under_load.py --shim {slow[0]} {slow[1]}"
    t0 = time.monotonic()
    proc = subprocess.run(["bash", "benchmarks/ci_regress.sh"], cwd=ROOT, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines = proc.stdout.splitlines()
    current = next((line for line in lines if line.startswith("current:")), "")
    m = re.search(r"run delay median ([0-9.]+%) of wall, (\d+) of (\d+)", current)
    bad = [line for line in lines if "REGRESSION" in line]
    flagged = sorted({line.split(" | ")[2].split()[0] for line in bad if line.count(" | ") >= 2})
    return {"exit": proc.returncode, "flagged": flagged, "seconds": time.monotonic() - t0,
            "contention": f"{m[1]}, {m[2]}/{m[3]} over" if m else "-",
            "last": next((line for line in reversed(lines) if line.strip()), "")}


def estimate_s(repeats: int, burners: list[int], slow_runs: int) -> float:
    per = RUN_OVERHEAD_S + 3 * repeats * ROUND_S
    return sum(per * (1.8 if b >= 2 else 1.0) for b in burners) + slow_runs * per * 1.05


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--shim"]:
        shim(argv[1], float(argv[2]), argv[3:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=str(ROOT / ".venv/bin/python") if (ROOT / ".venv/bin/python").exists()
                        else sys.executable)
    parser.add_argument("--decoder", default="speculative", help="the decoder made slower in the slow runs")
    parser.add_argument("--factor", type=float, default=1.1, help="how many times slower (its generate's CPU time)")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats per cell (default: the gate's)")
    parser.add_argument("--quick", action="store_true", help="sanity check: 0 and 3 burners unchanged, one slow "
                        "run, 10 repeats (minutes less; too few timings to show the gate's power)")
    parser.add_argument("--keep", help="folder to keep the runs in (default: a temporary folder)")
    args = parser.parse_args(argv)
    if args.decoder not in CLASSES or args.decoder == "vanilla":
        parser.error(f"--decoder must be one of {', '.join(c for c in CLASSES if c != 'vanilla')}")
    if not args.factor > 1.0:
        parser.error("--factor must be > 1 (how many times slower)")
    if args.repeats is not None and args.repeats < 2:
        parser.error("--repeats must be >= 2 (the gate measures its noise over repeats)")
    script = (ROOT / "benchmarks" / "ci_regress.sh").read_text()
    repeats = args.repeats or (10 if args.quick else int(re.search(r"REPEATS=\$\{REPEATS:-(\d+)\}", script)[1]))
    burners = [0, 3] if args.quick else list(UNCHANGED_BURNERS)
    n_slow = 1 if args.quick else SLOW_RUNS
    out = Path(args.keep or tempfile.mkdtemp(prefix="gate_under_load."))
    sys.path.insert(0, str(ROOT))
    from harness.regress import classes
    from harness.rows.machine import device_name

    own = [b for b in classes.load([ROOT / "benchmarks" / "baselines" / "tiny_random"])
           if classes.same_class(b.machine, (device_name("cpu"), 1))]
    replicates = min(c["replicates"] for c in own[0].data["cells"].values()) if own else 0
    if replicates < 0.9 * 3 * repeats and not args.quick:  # a few pairs left out for contention are expected
        print(f"warning: the baseline of this machine class holds {replicates} timings per prompt, not 3 runs x "
              f"{repeats}: its noise widens every margin (none: speed judged against other classes, margins "
              f"widened). Write it on this machine, quietly, first: bash benchmarks/ci_regress.sh --update "
              f"(~3-8 min)", flush=True)
    est = estimate_s(repeats, burners, n_slow)
    print(f"gate_under_load: {len(burners)} unchanged runs beside {burners} CPU-bound processes, {n_slow} quiet "
          f"run(s) with {args.decoder} {args.factor:g}x slower; {repeats} repeats per cell; {os.cpu_count()} cores; "
          f"estimated {est / 60:.0f} min; runs in {out}", flush=True)
    load, results, t0 = Burners(), [], time.monotonic()
    try:
        for i, n in enumerate(burners):
            load.set(n)
            r = gate_run(f"unchanged_{i}_b{n}", out, args.python, repeats, None)
            r.update(run=f"unchanged, {n} burners", expected="0 or 3", good=r["exit"] in (0, 3))
            results.append(r)
            print(f"  {r['run']}: exit {r['exit']} ({r['contention']}), {r['seconds']:.0f} s -> {r['last']}",
                  flush=True)
        load.set(0)
        for i in range(n_slow):
            r = gate_run(f"slow_{i}", out, args.python, repeats, (args.decoder, args.factor))
            r.update(run=f"{args.decoder} {args.factor:g}x slower, quiet", expected="1",
                     good=r["exit"] == 1 and r["flagged"] == [args.decoder])
            results.append(r)
            print(f"  {r['run']}: exit {r['exit']} ({r['contention']}), {r['seconds']:.0f} s -> {r['last']}",
                  flush=True)
    finally:
        load.set(0)
    print(f"\n{'run':40s}  {'exit':>4}  {'expected':>8}  {'flagged':20s}  {'contention (run delay)':28s}  seconds")
    for r in results:
        print(f"{r['run']:40s}  {r['exit']:>4}  {r['expected']:>8}  {','.join(r['flagged']) or '-':20s}  "
              f"{r['contention']:28s}  {r['seconds']:7.0f}")
    unchanged = [r for r in results if r["expected"] != "1"]
    slow = [r for r in results if r["expected"] == "1"]
    false_alarms = [r for r in unchanged if not r["good"]] + [r for r in slow if set(r["flagged"]) - {args.decoder}]
    caught = sum(r["good"] for r in slow)
    need = SLOW_NEEDED if not args.quick else 1
    ok = not false_alarms and caught >= need
    print(f"\n{'PASS' if ok else 'FAIL'}: {len(false_alarms)} false alarm(s) or errors in {len(unchanged)} unchanged "
          f"runs (0 allowed); {args.decoder} {args.factor:g}x slower caught in {caught} of {len(slow)} quiet runs "
          f"({need} needed){' (--quick: a sanity check, not the protocol)' if args.quick else ''}; "
          f"{(time.monotonic() - t0) / 60:.1f} min (estimated {est / 60:.0f})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
