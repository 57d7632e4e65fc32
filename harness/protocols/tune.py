"""Pick each decoder family's best setting from tuning runs on the dev split; write ``conf/decoder/tuned/<family>_tuned.yaml``.

Step 2 of the tuning protocol (docs/experiments.md, "Tuning protocol")::

    python run.py experiment=tune_all                 # HumanEval dev problems, every family's grid, one vanilla
    python run.py experiment=tune_all_mbpp            # optional: the same grid on MBPP's validation split
    python benchmarks/tune.py results/tuning/tune_all results/tuning/tune_all_mbpp --combine task [--metric speedup]
    python run.py experiment=race_heldout_humaneval   # the held-out race runs tuned/<family>_tuned by name

Rows are read with :func:`harness.rows.results.load_rows` and aggregated by :func:`harness.rows.metrics.aggregate` (the one
aggregation module: paired speedup vs the same run's vanilla, its seeded 95 % bootstrap interval, accept length,
equality with vanilla); nothing is re-computed here. Each decoder name of a tuning run is one grid point; its
config (``_target_`` and hyper-parameters) is read from the run folder's ``meta.json`` and must equal the rows'
``decoder_params``.

Families, by ``_target_``: ``speculative``, ``lookahead``, ``prompt_lookup``, ``hf_assisted``, ``ouroboros``
(paper-faithful points only: no prompt n-grams, every cheaper-drafting option off), ``ouroboros_best`` (every
Ouroboros point), ``opt_tree`` (paper-faithful: every option of
:data:`~harness.protocols.tune_select.OPT_TREE_EXTENSIONS` off) and ``opt_tree_best`` (every OPT-Tree point).
``vanilla`` and ``hf_greedy`` are references, never tuned. Warm points (``pool_scope: task``) are not eligible: in
the held-out race's second repeat a warm pool would see the sample again.

Selection per family, among the points whose output equals vanilla on every dev sample: the highest score, where
score = the mean over the dev tasks (one run group each) of the point's ``--metric`` (default ``speedup_total``:
total tokens / total time vs vanilla's on the same samples; ``speedup`` is the mean of per-sample ratios); scores within
``--tie-tolerance`` of the best are ties, broken by the narrower interval (``<metric>_high - <metric>_low``,
mean over tasks), then by name. Refused, with the reason, and nothing written for the family:

* a family with no points in the runs (``--family`` asks for one);
* any point of the family whose output differs from vanilla in a float32 run (a lossless decoder must not);
  in half precision such a point is only excluded from the candidates (listed in the table), unless
  ``--allow-half-divergence`` admits it;
* any point with failed cells or fewer samples than vanilla in some task (an interrupted run: resume it);
* a point missing from one of the dev tasks (points must be measured on every task that is scored).

Refused for the whole call (exit status 2, one ``error:`` line per reason): no rows; rows of held-out samples
(HumanEval >= 20, MBPP test ids 11-510, any other task) unless ``--any-split``; sampled rows (``temperature > 0``:
tuning is greedy); several run identities for one task (tune from one run per dev task); a grid point whose config
differs between runs; and runs that differ in

* ``dtype`` (a float32 sweep and a bfloat16 one: speedups differ several-fold between them on a CPU without bf16
  units), unless ``--combine dtype``;
* machine class (the rows' ``device_name`` or ``cpu_isa``), unless ``--combine machine``;
* task (the score would be the mean over the tasks), unless ``--combine task`` -- e.g. to tune from
  the HumanEval and MBPP dev splits together (tune_all and tune_all_mbpp).

What ``--combine`` admitted is stated in the written header, and every written config carries one
machine-readable line, ``# tuned-on: {"dtype": ..., "device_name": ..., "cpu_isa": ..., "task": ...,
"combined": [...]}`` (JSON; a list where the runs combined several values), which :func:`harness.config.compose.tuned_on` reads back so
that a later run can check that it uses the config on the dtype and machine it was tuned on.

Writes (unless ``--dry-run``) ``<conf-dir>/<family>_tuned.yaml``: a decoder config with the schema default line
and a header naming the tuning runs, the split, the machine, the metric and its value; the file is then composed
and validated with :func:`harness.config.compose.compose`. The default ``<conf-dir>`` is ``conf/decoder/tuned/``, the
generated configs' own folder beside the hand-written ones: selected as ``decoder=[vanilla,tuned/<family>_tuned]``,
their rows and overrides keep the name ``<family>_tuned`` (``decoder.speculative_tuned.gamma=...``). An existing file with other contents is replaced only with
``--force``. Exit status: 0 every requested family written, 1 some family refused, 2 refused input.

The rules are :mod:`harness.protocols.tune_select`'s, the written text :mod:`harness.protocols.tune_write`'s; this
module is the command line (``python benchmarks/tune.py`` or ``python -m harness.protocols.tune``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from harness.config.compose import CONF_DIR, TUNED_GROUP
from harness.protocols.tune_select import (COMBINABLE, FAMILIES, Refused, check_combination, check_input,
                                           decoder_nodes, differing, error_counts, select)
from harness.protocols.tune_write import table, tuned_yaml, validate_written
from harness.rows import metrics
from harness.rows.results import load_rows


def _combine_arg(text: str) -> list[str]:
    """``--combine task,dtype`` -> ``["task", "dtype"]``; an unknown name is an argparse error."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in COMBINABLE]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(COMBINABLE)} (comma-separated or repeated)")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="tuning run or sweep folders (or results.jsonl files), one per dev task")
    parser.add_argument("--metric", default="speedup_total",
                        help="column of harness.rows.metrics.aggregate to maximise (default speedup_total: vanilla's total "
                             "seconds per token over the point's, over the same samples; speedup = mean of ratios)")
    parser.add_argument("--allow-half-divergence", action="store_true",
                        help="admit points whose bf16/fp16 output differs from vanilla on some dev sample (said in "
                             "the header); default: such points are not candidates")
    parser.add_argument("--family", action="append", choices=FAMILIES,
                        help="tune only these families (repeatable); default: all, each refused when it has no points")
    parser.add_argument("--conf-dir", default=str(CONF_DIR / "decoder" / TUNED_GROUP),
                        help=f"where <family>_tuned.yaml is written (default: conf/decoder/{TUNED_GROUP})")
    parser.add_argument("--tie-tolerance", type=float, default=0.005,
                        help="scores within this of the best are ties, broken by the narrower interval (default 0.005)")
    parser.add_argument("--any-split", action="store_true", help="allow rows outside the dev split (said in the header)")
    parser.add_argument("--combine", action="append", default=[], type=_combine_arg, metavar="WHAT",
                        help="tune from runs that differ in WHAT (task, dtype or machine; repeatable or comma-"
                             "separated); said in the tuned config's header. Default: such runs are refused "
                             "(benchmarks/protocol.sh --dev humaneval,mbpp passes --combine task for its two dev runs)")
    parser.add_argument("--dry-run", action="store_true", help="print the choice, write nothing")
    parser.add_argument("--force", action="store_true", help="replace existing *_tuned.yaml files with other contents")
    args = parser.parse_args(argv)
    combine = sorted({c for group in args.combine for c in group}, key=COMBINABLE.index)
    args.runs = list(dict.fromkeys(args.runs))  # a run named twice is one run (its rows are read once)
    try:
        rows = load_rows(args.runs)
        if rows.empty:
            raise Refused(f"no result rows under {', '.join(args.runs)}")
        problems = []
        try:
            check_input(rows, args.any_split)
        except Refused as e:
            problems.append(str(e))
        problems += check_combination(rows, combine)
        if problems:
            raise Refused("\n".join(problems))
        kept = differing(rows, combine)  # the header says only what was combined
        if kept != combine:
            unused = [c for c in combine if c not in kept]
            print(f"note: --combine {','.join(unused)}: the runs do not differ in it; nothing combined there")
            combine = kept
        nodes = decoder_nodes(rows)
        agg = metrics.aggregate(rows)
        choices = select(agg, nodes, args.metric, args.family or FAMILIES, args.tie_tolerance, error_counts(rows),
                         args.allow_half_divergence)
    except (Refused, FileNotFoundError) as e:
        for line in str(e).splitlines():
            print(f"error: {line}", file=sys.stderr)
        return 2
    print(table(choices, args.metric))
    print()
    conf_dir = Path(args.conf_dir)
    status = 0
    for c in choices:
        if c.chosen is None:
            print(f"{c.family}: REFUSED, nothing written: {c.refused}")
            status = 1
            continue
        target = conf_dir / f"{c.family}_tuned.yaml"
        text = tuned_yaml(c, args.metric, args.runs, rows, args.any_split, args.allow_half_divergence, combine)
        line = f"{c.family}: {c.chosen.name} ({args.metric} {c.chosen.score:.3f})"
        if args.dry_run:
            print(f"{line}; --dry-run: {target} not written")
            continue
        if target.is_file() and target.read_text() != text and not args.force:
            print(f"{line}; REFUSED to replace {target} (it holds another tuning; --force replaces it)")
            status = 1
            continue
        conf_dir.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        try:
            validate_written(conf_dir, f"{c.family}_tuned")
        except Exception as e:  # a config that cannot run must not be left behind
            target.unlink()
            print(f"{line}; the written config does not validate, removed: {e}", file=sys.stderr)
            status = 1
            continue
        print(f"{line} -> {target}")
    return status


if __name__ == "__main__":
    sys.exit(main())
