"""The run's own summary, written by the runner at the end of a run: ``summary.csv``
(:func:`harness.rows.metrics.summarize` of the run's rows) and ``summary.md`` (a header naming the run, a shard's
coverage, the notes and warnings, the table and its legend). The paper report over one or more runs is
:mod:`harness.report.build`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Sequence

import pandas as pd

from harness.rows import columns
from harness.rows.flags import first_cell_flags
from harness.rows.metrics import summarize
from harness.report.tables import SUMMARY_LEGEND, to_markdown

log = logging.getLogger(__name__)


def write_summary(run_dir: Path, rows: pd.DataFrame, quality: Sequence[str], header: str, notes: Sequence[str],
                  coverage: str = "") -> pd.DataFrame:
    """Write ``summary.csv`` and ``summary.md`` into ``run_dir``; log the notes and warnings.

    Args:
        run_dir: the run folder.
        rows: the run's rows (one per cell).
        quality: the task's quality columns (those present in ``rows`` are summarised).
        header: the first line of ``summary.md`` (task, models, dtype, device, budget, ...).
        notes: what only the runner knows (an interruption, settings tuned elsewhere).
        coverage: what a shard covers ("" for a whole run).

    Returns:
        The summary (:func:`harness.rows.metrics.summarize`).
    """
    summary = summarize(rows, [c for c in quality if c in rows.columns])
    summary.to_csv(Path(run_dir) / "summary.csv", index=False)
    facts, unscored = code_execution_lines(rows, quality)
    header += "".join(f"\n\n{line}" for line in facts)
    notes = [*notes, *unscored, *first_cell_flags(rows)]
    for line in [*notes, *summary.attrs.get("warnings", [])]:
        log.warning("%s", line)
    (Path(run_dir) / "summary.md").write_text(header + "\n\n" + (coverage + "\n\n" if coverage else "")
                                              + to_markdown(summary, notes=notes) + "\n\n" + SUMMARY_LEGEND + "\n")
    return summary


def code_execution_lines(rows: pd.DataFrame, quality: Sequence[str] | None = None) -> tuple[list[str], list[str]]:
    """What ``summary.md`` and the report say about scoring: ``(facts, warnings)``; ``quality``: the requested
    quality columns (``None``: those the rows' ``quality_columns`` name).

    * facts: ``Code execution: ...`` naming the isolation model-written code ran under (the rows'
      ``code_isolation``; one line per distinct value), e.g. "code executed without OS isolation".
    * warnings: a quality column that was requested (scoring was attempted: rows carry ``score_error``) but
      could not be computed for any row, with the first reason.
    """
    facts = []
    if "code_isolation" in rows:
        for value in dict.fromkeys(rows["code_isolation"].dropna().astype(str)):
            facts.append(f"Code execution: {columns.code_isolation_text(value)}.")
    if quality is None:
        quality = []
        for v in rows["quality_columns"].dropna() if "quality_columns" in rows else ():
            v = json.loads(v) if isinstance(v, str) and v.startswith("[") else v
            quality.extend(x for x in ([v] if isinstance(v, str) else v) if x not in quality)
    warnings = []
    errors = rows["score_error"].dropna().astype(str) if "score_error" in rows else pd.Series(dtype=str)
    for q in quality:
        if len(errors) and (q not in rows or rows[q].isna().all()):
            warnings.append(f"{q} could not be scored for any row ({len(errors)} of {len(rows)} rows with "
                            f"score_error, e.g. {' '.join(errors.iloc[0].split())[:300]})")
    return facts, warnings
