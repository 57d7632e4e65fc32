"""The run's own summary, written by the runner at the end of a run: ``summary.csv``
(:func:`harness.metrics.summarize` of the run's rows) and ``summary.md`` (a header naming the run, a shard's
coverage, the notes and warnings, the table and its legend). The paper report over one or more runs is
:mod:`harness.report`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

import pandas as pd

from harness.metrics import summarize
from harness.tables import SUMMARY_LEGEND, to_markdown

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
        The summary (:func:`harness.metrics.summarize`).
    """
    summary = summarize(rows, [c for c in quality if c in rows.columns])
    summary.to_csv(Path(run_dir) / "summary.csv", index=False)
    for line in [*notes, *summary.attrs.get("warnings", [])]:
        log.warning("%s", line)
    (Path(run_dir) / "summary.md").write_text(header + "\n\n" + (coverage + "\n\n" if coverage else "")
                                              + to_markdown(summary, notes=notes) + "\n\n" + SUMMARY_LEGEND + "\n")
    return summary
