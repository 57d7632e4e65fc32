"""Paper-ready report from result files.

    python -m harness.report RUN [RUN ...] [--out DIR] [--plots [--only FIG ...]] [--pool]
                             [--spec-bench ANSWERS ...] [--export-spec-bench DIR]
    python -m harness.report --compare RUN_A RUN_B [--out DIR]

Reads ``results.jsonl`` files only (a run folder, a sweep folder -- searched recursively -- or a file) and,
with ``--spec-bench``, Spec-Bench answer files; never imports torch or the decoders. Every number comes from
:mod:`harness.rows.metrics` and its neighbours; this module loads rows, builds the tables, writes them
(:mod:`harness.report.tables` formats) and calls :mod:`plots` to draw.

Runs that differ are never pooled: rows of different settings (code version, model pair, dtype, machine,
task version, budget, sampling settings, and the runner's ``group_identity``: every other setting but the
decoder list and the seed; :data:`harness.rows.columns.RUN_IDENTITY_FIELDS`) are reported as separate groups, named
by what differs. Shards of one run, the jobs of a decoder sweep and runs that differ only in ``runner.seed``
are one group. ``--pool`` pools groups anyway (only task and model pair separate groups) and says so loudly.

Every cell is accounted for (:mod:`harness.rows.cells`): each table says per decoder how many samples its
figures are over (``3/5``: 3 of the run group's 5), how many cells failed or were skipped (by status; the
reasons are in ``report.md``'s warnings) and how many ok rows had no vanilla row to pair with; every figure
of a decoder -- tokens/s included -- is computed over its rows paired with an ok vanilla row of the same
sample, turn and repeat; decoders of one group that cover different samples, and folders that hold copies of
one run's cells (counted once), are named in the warnings.

Writes to ``--out`` (default ``<first RUN>/report``, refused where git tracks that folder: committed
reference reports are rewritten only by ``python benchmarks/references.py``):

* ``main.{md,tex,csv}`` (:mod:`harness.report.main_table`): decoders as rows with their settings, metrics as
  columns -- the samples, tokens/s, speedup vs vanilla with its 95 % bootstrap interval ("n too small" below 5
  samples), accept length tau, acceptance rate alpha, equality with vanilla (``n/a`` for sampled runs), then,
  when rows record the runner's stopwatch, decode-only speedup with its interval, mean TTFT and TPOT and the
  prefill share, the task's quality columns with their interval (Wilson over samples; over several seeds a
  t-interval), and the failed/skipped cells and unpaired rows when there are any. One block of rows per run
  group; LaTeX one table per group, narrow enough for a page (:func:`harness.report.tables.latex_by_group`).
* ``tasks.{md,tex,csv}`` (:mod:`harness.report.task_table`; rows of two or more tasks run with one setup):
  decoders as rows, tasks as columns, each with its speedup [95% CI] and accept length, the papers' shape; the
  LaTeX in one column where it fits, else across both.
* ``category.{md,tex,csv}`` (rows with ``subtask`` / ``category``: Spec-Bench, MT-Bench): speedup per
  category, decoders as rows.
* ``theory.{md,tex,csv}``: Leviathan et al. 2023 eq. 1 predictions beside the measurement (see
  :func:`harness.rows.metrics.cost_ratio_of` for the cost ratio c).
* ``detail.csv``: every aggregate; ``report.md``: all tables, definitions and warnings.
* ``figures/`` with ``--plots``.

``--compare A B`` (:func:`harness.report.compare.write_compare`) writes ``compare.{md,csv}`` and a figure: first every
setting in which the runs differ, then per decoder both figures (tokens/s, speedup, tau), their ratio B / A
and a bootstrap interval for the ratio, on the samples both runs cover (paired by sample), equality and
quality on each side; how many samples, and a warning when the runs cover different samples or lost cells.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from harness.rows import columns
from harness.report import compare
from harness.rows import cells as coverage
from harness.report import figdata
from harness.report import task_table
from harness.rows import flags
from harness.rows import grouping
from harness.rows import metrics
from harness.rows.results import find_result_files, load_rows
from harness.report.summary import code_execution_lines
from harness.report.main_table import (coverage_caption, coverage_columns, main_caption, main_table, row_index,
                                       settings_caption)
from harness.report.tables import coverage_cell, fmt_cell, latex, latex_by_group, markdown, short_of, tex_label

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------------
# Loading
def load_all(paths: Sequence[str | Path], pool: bool = False, spec_bench: Sequence[str | Path] = (),
             spec_bench_baseline: str | None = None) -> pd.DataFrame:
    """:func:`harness.rows.results.load_rows` of ``paths`` plus the rows of Spec-Bench answer files
    (``spec_bench``), labelled together so one report holds both."""
    frames, warnings = [], []
    if paths:
        rows = load_rows(paths)
        warnings = list(rows.attrs.get("warnings", []))
        if not rows.empty:
            frames.append(rows.drop(columns=["label", "group"]))
    if spec_bench:
        from harness.exchange.specbench import import_answers

        frames.append(import_answers(spec_bench, baseline=spec_bench_baseline))
    if not frames:
        return pd.DataFrame()
    rows = grouping.prepare(pd.concat(frames, ignore_index=True), pool)
    rows.attrs["warnings"] = warnings
    return rows


# --------------------------------------------------------------------------------------------------
# Tables (the main one: :mod:`harness.report.main_table`)
#: The theory table's columns in order (headers and formats from their declarations,
#: :data:`harness.rows.columns.THEORY_COLUMNS_DECLARED` and the summary's), and where it shows a measured figure
#: otherwise than the main table: beside its prediction (``τ measured``), alpha at three decimals.
THEORY_COLUMNS = ("acceptance_rate", "gamma_used", "cost_ratio", "cost_ratio_source", "theory_accept_length",
                  "accept_length", "theory_speedup", "speedup", "efficiency", "verify_cost", "draft_cost")
THEORY_MEASURED = {"accept_length": " measured", "speedup": " measured"}
THEORY_FMT = {"acceptance_rate": ".3f"}


def theory_table(agg: pd.DataFrame) -> pd.DataFrame:
    """Formatted theory-vs-measurement table, decoders that draft as rows (with the samples their figures are
    over, :func:`harness.report.tables.coverage_cell`)."""
    sub = agg[agg["acceptance_rate"].notna()] if "acceptance_rate" in agg else agg.iloc[0:0]
    text = pd.DataFrame(index=row_index(sub) if len(sub) else pd.Index([]))
    text["samples"] = [coverage_cell(r) for _, r in sub.iterrows()]
    for name in THEORY_COLUMNS:
        col = columns.shown(name)
        head = (col.display or col.name) + THEORY_MEASURED.get(name, "")
        text[head] = [fmt_cell(v, THEORY_FMT.get(name, col.fmt)) for v in sub[name]] if name in sub else []
    text.columns.name = "decoder"
    return text


def category_table(rows: pd.DataFrame, **kwargs: Any) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """Speedup per category (Spec-Bench's subtasks, MT-Bench's categories), decoders as rows, plus
    ``overall``; None when rows carry no category. Keyword arguments go to :func:`harness.rows.metrics.aggregate`.

    Returns:
        ``(numeric, text)``: the long per-(group, category, configuration) aggregate for CSV and the
        formatted wide table.
    """
    col = figdata.category_column(rows)
    if col is None:
        return None
    per = metrics.aggregate(rows[rows[col].notna()], by=(col,), **kwargs)
    overall = metrics.aggregate(rows, **kwargs)
    keys = list(dict.fromkeys(zip(overall["group"], overall["label"])))
    cats = list(dict.fromkeys(per[col]))
    index = pd.MultiIndex.from_tuples(keys) if overall["group"].nunique() > 1 else pd.Index([k[1] for k in keys])
    text = pd.DataFrame(index=index, columns=[*map(str, cats), "overall"], dtype=object)
    for i, (grp, lab) in enumerate(keys):
        for c in cats:
            m = per[(per["group"] == grp) & (per["label"] == lab) & (per[col] == c)]
            text.iloc[i, cats.index(c)] = _category_cell(m.iloc[0]) if len(m) else "-"
        m = overall[(overall["group"] == grp) & (overall["label"] == lab)]
        text.iloc[i, len(cats)] = fmt_cell(m["speedup"].iloc[0]) if len(m) else "-"
    for name, cells in coverage_columns(overall).items():  # overall's rows are the table's, in its order
        text[name] = cells
    text.columns.name = "decoder"
    keep = ["group", col, "label", "decoder", *coverage.COVERAGE_COLUMNS, "tokens_per_s", "speedup", "speedup_low",
            "speedup_high", "speedup_total", "accept_length", "acceptance_rate", "equal_to_vanilla"]
    return per[[c for c in keep if c in per]], text


def _category_cell(r: pd.Series) -> str:
    """A category's speedup, with ``(k/n)`` when it is over fewer samples than the category has."""
    return fmt_cell(r.get("speedup")) + short_of(r)




CATEGORY_CAPTION = ("Speedup vs vanilla per category (mean of paired per-sample ratios; (k/n): over k of the "
                    "category's n samples); overall: all samples.")
THEORY_CAPTION = ("alpha: accepted / drafted tokens. gamma: configured draft length (else drafted tokens per "
                  "step). c: draft / target forward cost (source in 'c from'). Theory: Leviathan et al. 2023 eq. 1, "
                  "E[tau] = (1 - alpha^(gamma+1)) / (1 - alpha), speedup = E[tau] / (gamma c + 1); meaningful "
                  "for linear-chain drafting. efficiency = measured speedup / measured tau.")
#: The same in LaTeX, its formulas in math mode (theory.tex).
THEORY_CAPTION_TEX = (r"$\alpha$: accepted / drafted tokens. $\gamma$: configured draft length (else drafted tokens "
                      r"per step). $c$: draft / target forward cost (source in `c from'). Theory: Leviathan et al.\ "
                      r"2023 eq.~1, $E[\tau] = (1 - \alpha^{\gamma+1}) / (1 - \alpha)$, speedup "
                      r"$= E[\tau] / (\gamma c + 1)$; meaningful for linear-chain drafting. efficiency = measured "
                      r"speedup / measured $\tau$.")


def subtitle(agg: pd.DataFrame) -> str:
    """``model pair · dtype · hardware · task (n samples)`` of an aggregate (distinct values joined)."""
    def join(col: str) -> str:
        if col not in agg:
            return "-"
        return ", ".join(dict.fromkeys(columns.fmt_value(v) for v in agg[col]))

    tasks = ", ".join(_task_size(t, g) for t, g in agg.groupby("task", sort=False)) if "task" in agg else ""
    parts = [join("model_pair"), join("dtype"), join("device_name"), tasks]
    temps = columns.num(agg["temperature"]).dropna() if "temperature" in agg else pd.Series(dtype=float)
    if (temps > 0).any():  # sampled runs say so (greedy is the default and goes unsaid)
        parts.append("temperature " + ", ".join(dict.fromkeys(columns.fmt_value(t) for t in temps)))
    return " · ".join(parts)


def measured(agg: pd.DataFrame) -> dict[str, str]:
    """Run group -> what it measured, for a table's caption: :func:`subtitle` of its rows and its token budget
    (``... · humaneval (2 samples) · at most 64 new tokens``)."""
    return {str(group): what_measured(g) for group, g in agg.groupby("group", sort=False)}


def what_measured(agg: pd.DataFrame) -> str:
    """:func:`subtitle` of an aggregate and its token budget (``... · at most 64 new tokens``)."""
    budget = columns.num(agg["max_new_tokens"]).dropna() if "max_new_tokens" in agg else pd.Series(dtype=float)
    limit = f" · at most {', '.join(dict.fromkeys(str(int(b)) for b in budget))} new tokens" if len(budget) else ""
    return subtitle(agg) + limit


def _task_size(task: str, agg: pd.DataFrame) -> str:
    """``humaneval (5 samples)``; ``(3 of 5 samples)`` when every row's figures are over fewer samples than the
    task has, ``(3-5 of 5 samples per decoder)`` when the rows differ."""
    n = columns.num(agg["paired_samples"] if "paired_samples" in agg else agg["samples"]).dropna()
    total = columns.num(agg["group_samples"] if "group_samples" in agg else agg["samples"]).max()
    lo, hi = (int(n.min()), int(n.max())) if len(n) else (0, 0)
    total = int(total) if not pd.isna(total) else hi
    if lo == hi == total:
        return f"{task} ({total} samples)"
    return f"{task} ({lo} of {total} samples)" if lo == hi else f"{task} ({lo}-{hi} of {total} samples per decoder)"


# --------------------------------------------------------------------------------------------------
# Figures
def figure_frames(rows: pd.DataFrame, agg: pd.DataFrame, **kwargs: Any) -> dict[str, Any]:
    """Everything :func:`plots.draw_all` draws, aggregated by :mod:`harness.rows.metrics`."""
    return {"agg": agg, "positions": figdata.acceptance_per_position(rows), "breakdown": figdata.time_breakdown(rows),
            "warm_cold": figdata.warm_cold(rows, **kwargs), "swept": grouping.swept_by_class(grouping.ok_rows(rows)),
            "task_bars": figdata.task_bars(rows, agg), "per_sample": figdata.per_sample_speedups(rows),
            "bare_costs": figdata.bare_costs(rows, agg)}


def write_figures(rows: pd.DataFrame, agg: pd.DataFrame, out_dir: str | Path, only: Sequence[str] | None = None,
                  **kwargs: Any) -> dict[str, list[Path]]:
    """Draw the figures of ``rows`` (aggregate ``agg``) into ``out_dir`` via :func:`plots.draw_all`."""
    import plots

    return plots.draw_all(figure_frames(rows, agg, **kwargs), out_dir, only=only, subtitle=subtitle(agg))


# --------------------------------------------------------------------------------------------------
# The report
def write_report(paths: Sequence[str | Path], out_dir: str | Path | None = None, cost_ratio: float | None = None,
                 n_boot: int = 2000, seed: int = 0, *, pool: bool = False, plots: bool = False,
                 only: Sequence[str] | None = None, spec_bench: Sequence[str | Path] = (),
                 spec_bench_baseline: str | None = None) -> dict[str, Path]:
    """Build every table (and, with ``plots``, every figure) from the result files under ``paths`` (and
    Spec-Bench answer files ``spec_bench``) into ``out_dir``.

    Returns:
        name -> written path (figures as ``figures/<name>.png``).

    Raises:
        ValueError: no rows. FileNotFoundError: a path does not exist.
    """
    rows = load_all(paths, pool, spec_bench, spec_bench_baseline)
    if rows.empty:
        raise ValueError(f"no result rows under {', '.join(map(str, [*paths, *spec_bench]))}")
    source = Path((list(paths) or list(spec_bench))[0])
    out = Path(out_dir) if out_dir else source / "report"
    out.mkdir(parents=True, exist_ok=True)
    kw = dict(n_boot=n_boot, seed=seed, pool=pool)
    agg = metrics.aggregate(rows, cost_ratio=cost_ratio, **kw)
    quality = grouping.quality_columns(rows)
    written: dict[str, Path] = {}

    def put(name: str, text: str) -> None:
        (out / name).write_text(text)
        written[name] = out / name

    def csv(name: str, frame: pd.DataFrame) -> None:
        frame.to_csv(out / name, index=False)
        written[name] = out / name

    numeric, text = main_table(agg, quality)
    caption = main_caption(agg)
    csv("main.csv", numeric)
    put("main.md", markdown(text) + "\n")
    put("main.tex", latex_by_group(text, caption + settings_caption(agg), tex_label("main", source, out),
                                   measured(agg)))
    sections = ["## Main results\n\n" + caption + "\n\n" + markdown(text)]
    by_task = task_table.task_table(agg)
    if by_task is not None:
        numeric_t, text_t = by_task
        shown = agg[agg["group"].isin(set(numeric_t["group"]))]
        cap = task_table.caption(what_measured(shown), settings_caption(shown), task_table.any_interval(text_t))
        md_t = task_table.markdown(text_t)
        csv("tasks.csv", numeric_t)
        put("tasks.md", md_t + "\n")
        put("tasks.tex", task_table.latex(text_t, cap, tex_label("tasks", source, out)))
        sections.append("## Tasks side by side\n\n" + cap + "\n\n" + md_t)
    else:  # an earlier report's table of these rows would now be stale
        for stale in ("tasks.csv", "tasks.md", "tasks.tex"):
            (out / stale).unlink(missing_ok=True)
    cat = category_table(rows, **kw)
    if cat is not None:
        csv("category.csv", cat[0])
        put("category.md", markdown(cat[1]) + "\n")
        put("category.tex", latex(cat[1], CATEGORY_CAPTION + coverage_caption(agg),
                                  tex_label("category", source, out)))
        sections.append("## Speedup per category\n\n" + CATEGORY_CAPTION + coverage_caption(agg) + "\n\n"
                        + markdown(cat[1]))
    theory = theory_table(agg)
    csv("theory.csv", agg[["group", "label", *[c for c in ("paired_samples", "group_samples") if c in agg],
                           *[c for c in THEORY_COLUMNS if c in agg]]])
    put("theory.md", markdown(theory) + "\n")
    put("theory.tex", latex(theory, label=tex_label("theory", source, out), caption_tex=THEORY_CAPTION_TEX))
    sources = ", ".join(sorted(set(agg.get("cost_ratio_source", pd.Series(dtype=str)).dropna())))
    sections.append("## Theory vs measurement\n\n" + THEORY_CAPTION + (f" Cost ratio from: {sources}." if sources
                                                                         else "") + "\n\n" + markdown(theory))
    detail = agg.copy()
    detail["warnings"] = ["; ".join(w) for w in detail["warnings"]]
    csv("detail.csv", detail)
    groups = "\n".join(f"- {g}" for g in dict.fromkeys(agg["group"]))
    loaded = list(rows.attrs.get("warnings", []))  # logged as the rows were read
    code_facts, unscored = code_execution_lines(rows)  # isolation of executed code; quality never scored
    none = columns.code_isolation_text("none")
    unisolated = [f"{none} (rows with code_isolation=none)"] if any(none in f for f in code_facts) else []
    warns = list(dict.fromkeys([*loaded, *flags.run_warnings(agg), *unscored, *unisolated]))
    for w in warns[len(loaded):]:
        log.warning("%s", w)
    head = [f"# Report\n\nSources: {', '.join(_shown(f) for f in (find_result_files(paths) if paths else []))}"
            + (f"; Spec-Bench answers: {', '.join(map(str, spec_bench))}" if spec_bench else ""),
            f"Run groups (rows of different run identities are never pooled{'; POOLED with --pool' if pool else ''}):"
            f"\n\n{groups}\n\n{subtitle(agg)}" + "".join(f"\n\n{fact}" for fact in code_facts)]
    if warns:
        head.append("## Warnings\n\n" + "\n".join(f"- {w}" for w in warns))
    put("report.md", "\n\n".join(head + sections) + "\n")
    if plots:
        figs = write_figures(rows, agg, out / "figures", only, n_boot=n_boot, seed=seed)
        written.update({f"figures/{name}.png": paths_[0] for name, paths_ in figs.items()})
    return written


def tracked(folder: str | Path) -> bool:
    """Whether git tracks files under ``folder`` (a committed reference run, whose report only
    ``benchmarks/references.py`` rewrites); False outside a git checkout."""
    import subprocess

    folder = Path(folder)
    if not folder.exists():
        return False
    try:
        out = subprocess.run(["git", "ls-files", "--", "."], cwd=folder, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and bool(out.stdout.strip())


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it lies below it (reports are committed)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


# --------------------------------------------------------------------------------------------------
# CLI
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.report", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("run_dirs", nargs="*", help="run folders, multirun sweep folders or results.jsonl files")
    parser.add_argument("--out", default=None,
                        help="output folder (default: <first RUN>/report; refused where that folder is committed)")
    parser.add_argument("--plots", action="store_true", help="also draw the figures into <out>/figures")
    parser.add_argument("--only", nargs="+", default=None, metavar="FIG", help="with --plots: only these figures")
    parser.add_argument("--pool", action="store_true",
                        help="pool rows of different run identities (code version, dtype, machine, ...) that share "
                             "task and model pair; off by default, a warning names what is pooled")
    parser.add_argument("--compare", nargs=2, metavar=("RUN_A", "RUN_B"), default=None,
                        help="compare two runs per decoder: both figures, their ratio B/A and a CI")
    parser.add_argument("--spec-bench", nargs="+", default=(), metavar="ANSWERS",
                        help="also read Spec-Bench answer files (files or folders of *.jsonl)")
    parser.add_argument("--spec-bench-baseline", default=None, metavar="MODEL_ID",
                        help="model_id of the Spec-Bench baseline file (default: the one named *vanilla*/*baseline*)")
    parser.add_argument("--export-spec-bench", default=None, metavar="DIR",
                        help="write the rows as Spec-Bench answer files (one JSONL per decoder) into DIR")
    parser.add_argument("--cost-ratio", type=float, default=None,
                        help="draft/target forward cost ratio c for the theory table (default: measured)")
    parser.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.compare:
            if args.run_dirs:
                parser.error("--compare takes its two runs itself; drop the positional RUN arguments")
            _, md = compare.write_compare(*args.compare, args.out, args.bootstrap, args.seed)
            print(md)
            if args.out:
                print(f"written to {args.out}: compare.md, compare.csv")
            return 0
        if not args.run_dirs and not args.spec_bench:
            parser.error("give at least one RUN (or --spec-bench ANSWERS, or --compare A B)")
        if args.export_spec_bench:
            from harness.exchange.specbench import export_answers

            files = export_answers(load_all(args.run_dirs, args.pool), args.export_spec_bench)
            print(f"Spec-Bench answer files: {', '.join(map(str, files))}")
        if args.out is None and args.run_dirs:
            run = Path(args.run_dirs[0])
            if tracked(run):
                raise ValueError(f"{run} is a committed run (git tracks its files): pass --out DIR for a report "
                                 "elsewhere; the committed reports are regenerated by `python "
                                 "benchmarks/references.py`")
        written = write_report(args.run_dirs, args.out, args.cost_ratio, args.bootstrap, args.seed, pool=args.pool,
                               plots=args.plots, only=args.only, spec_bench=args.spec_bench,
                               spec_bench_baseline=args.spec_bench_baseline)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = written["main.md"].parent
    print(out.joinpath("main.md").read_text())
    print(f"written to {out}: {', '.join(written)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
