"""Regression gate: compare a run against a small JSON baseline; exit 1 on a regression, 3 when the timed calls
met too much contention (or the timings were too noisy) to judge speed.

Usage::

    python -m harness.regress --write-baseline RUN [RUN ...] --out baseline.json   # baseline from run(s)
    python -m harness.regress --write-baseline RUN [RUN ...] --out FOLDER   # FOLDER/<machine class>.json
    python -m harness.regress --baseline baseline.json|FOLDER [...] --current RUN [RUN ...]

A *cell* is (task, model pair, decoder configuration). Per cell the gate checks equality with vanilla (float32:
no new divergence; half precision: ``--equality-tolerance``; sampled runs: not gated), the deterministic
counters (float32: exactly, whatever the machine load; half precision: accept length within
``--accept-length-tolerance``) and speed as paired speedups over vanilla of the same run, which must stay above
``baseline x (1 - margin)``, the margin measured from the timing noise over repeats (tokens/s is reported, never
gated). Timed pairs that waited longer than ``--max-contention`` of their wall time for a CPU are left out; a
cell with too few pairs left, or a margin above ``--max-margin``, is not judged. A baseline cell missing from
the run fails (``--allow-missing`` to accept); runs over other samples, budget, task version, sampling settings
or seeds are refused; ``--write-baseline`` refuses contended or loaded rows (``--allow-busy`` overrides).

Paired speedups of tiny models differ between CPUs: a baseline folder holds one file per machine class, and a
run on a class without one of its own is judged as :mod:`harness.regress.classes` says (margins widened by the
spread between recorded classes; with one class recorded, speed is not judged there).

Why timings of small models are noisy, the statistics of the speed figures, the margin and the contention cut,
and the alternatives weighed: docs/measurement.md, "The regression gate's statistics". Modules: cell summaries
in :mod:`harness.regress.cells`, the noise model in :mod:`harness.regress.noise`, the checks and the verdict in
:mod:`harness.regress.checks`; this module writes baselines and runs the command line.

Exit status: 0 no regression and every speed check judged; 1 regression (counters, equality, failed or missing
cells, or speed); 2 usage error or incomparable runs; 3 no regression found but at least one speed check could
not be judged (contended, or noise too large): NOT a pass. Reads result files only (no torch).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from harness.regress import classes
from harness.regress.cells import summarize_cells
from harness.regress.checks import Tolerances, contended, contention_text, fmt_number, format_checks, verdict
from harness.regress.noise import MAX_CONTENTION
from harness.rows import flags

_f = fmt_number


def write_baseline(paths: Sequence[str | Path], out: str | Path, n_boot: int = 200, seed: int = 0,
                   allow_busy: bool = False, max_contention: float = MAX_CONTENTION) -> Path:
    """Write the baseline JSON of the runs under ``paths`` to ``out``, or, where ``out`` is a folder, to the
    file of the runs' machine class in it (:func:`harness.regress.classes.file_name`); several runs of one
    identity, and repeats, are replicates for the noise; pairs that waited longer than ``max_contention`` for a
    CPU are left out, as in the run judged. Returns the file written.

    Raises:
        ValueError: a cell's pairs were mostly contended (:func:`harness.regress.checks.contended`), or, for
            rows that did not measure contention, rows were measured on a loaded machine (above
            ``cores + flags.LOAD_MARGIN``); unless ``allow_busy``.
    """
    data = summarize_cells(paths, n_boot=n_boot, seed=seed, max_contention=max_contention)
    busy = {name: why for name, c in data["cells"].items() if (why := contended(c))}
    if busy and not allow_busy:
        name, why = next(iter(busy.items()))
        raise ValueError(f"{len(busy)} cell(s) measured under contention ({name}: {why.split('; ')[0]}); a "
                         f"baseline must be quiet: re-measure (or --allow-busy)")
    load = data["meta"]["load"]
    if load["rows_over"] and not data["meta"]["contention"]["measured"] and not allow_busy:
        raise ValueError(f"{load['rows_over']} rows were measured on a loaded machine (load up to "
                         f"{load['peak']:.1f} on {load['cores']:g} usable cores > cores + {flags.LOAD_MARGIN:g}); "
                         f"a baseline must be quiet: re-measure (or --allow-busy)")
    out = Path(out)
    if out.is_dir():
        out = out / classes.file_name(data)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (module docstring); returns the exit status (0, 1, 2 or 3, as it says)."""
    parser = argparse.ArgumentParser(prog="python -m harness.regress", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write-baseline", nargs="+", metavar="RUN", help="write a baseline from these runs "
                      "(several runs of one configuration, and repeats, measure the noise)")
    mode.add_argument("--baseline", nargs="+", metavar="JSON|FOLDER", help="baseline JSON file(s), or folder(s) "
                      "of one file per machine class, to compare against")
    parser.add_argument("--out", help="with --write-baseline: the JSON to write, or a folder (the file of the "
                        "runs' machine class in it)")
    parser.add_argument("--allow-busy", action="store_true", help="with --write-baseline: accept rows measured "
                        "on a loaded machine")
    parser.add_argument("--current", nargs="+", metavar="RUN", help="with --baseline: the run(s) to judge")
    parser.add_argument("--accept-length-tolerance", type=float, default=0.01,
                        help="relative accept-length drop allowed outside float32 (float32: counters exact)")
    parser.add_argument("--equality-tolerance", type=float, default=0.02,
                        help="equality-rate drop allowed outside float32 (float32: no new divergence)")
    parser.add_argument("--k", type=float, default=2.0, help="speed margin in standard errors of the difference")
    parser.add_argument("--assumed-noise", type=float, default=0.03,
                        help="relative noise of a figure assumed when no repeats measured it")
    parser.add_argument("--min-margin", type=float, default=0.02, help="smallest speed margin (fraction)")
    parser.add_argument("--max-margin", type=float, default=0.5, help="largest speed margin (fraction); a larger "
                        "one needed leaves the check unjudged (exit 3)")
    parser.add_argument("--max-contention", type=float, default=MAX_CONTENTION, help="a timed pair whose side "
                        "waited longer than this share of its wall time for a CPU (run_delay_s / wall_time_s) is "
                        "left out; a cell with fewer than half its pairs left is unjudged (exit 3)")
    parser.add_argument("--max-load-per-core", type=float, default=2.5, help="rows without measured contention "
                        "(older rows) measured above this load x usable cores leave speed unjudged (exit 3)")
    parser.add_argument("--allow-missing", action="store_true", help="a baseline cell missing from the run is "
                        "not a regression")
    args = parser.parse_args(argv)
    try:
        if args.write_baseline:
            if not args.out:
                parser.error("--write-baseline needs --out")
            path = write_baseline(args.write_baseline, args.out, allow_busy=args.allow_busy,
                                  max_contention=args.max_contention)
            data = json.loads(path.read_text())
            cells, load = data["cells"], data["meta"]["load"]
            reps = sorted({c["replicates"] for c in cells.values()})
            print(f"baseline with {len(cells)} cells ({'/'.join(map(str, reps))} replicates per sample, rows' "
                  f"peak load {_f(load['peak'], '.2f')} on {_f(load['cores'], 'g')} cores) written to {path}")
            return 0
        if not args.current:
            parser.error("--baseline needs --current RUN")
        baselines = classes.load(args.baseline)
        current = summarize_cells(args.current, max_contention=args.max_contention)
        tol = Tolerances(args.accept_length_tolerance, args.equality_tolerance, args.k, args.assumed_noise,
                         args.min_margin, args.max_margin, args.allow_missing, args.max_load_per_core,
                         args.max_contention)
        checks, used, matched = classes.judge(baselines, current, tol)
    except (FileNotFoundError, ValueError, json.JSONDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(matched)
    sides = [("baseline", str(b.path), b.data) for b in used] + [("current", ", ".join(args.current), current)]
    for side, path, data in sides:
        m = data["meta"]
        load = m.get("load") or {}
        print(f"{side + ':':9s} {path} (commit {m.get('git_commit')}, {m.get('device_name')}, torch threads "
              f"{m.get('torch_num_threads', '-')}; rows' peak 1-minute load {_f(load.get('peak'), '.2f')} on "
              f"{_f(load.get('cores'), 'g')} cores, {load.get('rows_over', '-')} rows above cores + "
              f"{flags.LOAD_MARGIN:g}; {contention_text(m.get('contention'))})")
    print()
    print(format_checks(checks))
    status, line = verdict(checks)
    print(f"\n{line}")
    return status


if __name__ == "__main__":
    sys.exit(main())
