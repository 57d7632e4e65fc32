"""Hydra callbacks: every sweep ends with its tables and figures.

Registered for every run in ``conf/hydra/default.yaml`` (experiments may set its arguments, e.g. which
figures)::

    hydra:
      callbacks:
        report:
          _target_: harness.job.callbacks.ReportCallback

After the last job of a multirun (``on_multirun_end``, in the launching process, whatever the launcher) it
runs :func:`harness.report.build.write_report` with ``plots=True`` on the sweep folder, writing
``<sweep dir>/report/`` and ``<sweep dir>/report/figures/``. A failure is logged, never raised: the
results are already on disk and ``python -m harness.report <sweep dir> --plots`` redoes it. A single run
(no ``-m``) gets no report unless ``on_single_run=true``; its ``summary.md`` is there.
No torch is imported here.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger(__name__)


class ReportCallback(Callback):
    """Build the report (and figures) of a sweep or run folder when Hydra is done with it.

    Args:
        out_subdir: folder for the tables, under the sweep (or run) folder.
        plots: also draw the figures (into ``<out_subdir>/figures``).
        figures: names of :data:`plots.FIGURES` to draw; None = all that the rows support.
        cost_ratio: c for the theory column; None = measured (see :mod:`harness.report.build`).
        on_single_run: also report after a single (non-multirun) run.
    """

    def __init__(self, out_subdir: str = "report", plots: bool = True, figures: Sequence[str] | None = None,
                 cost_ratio: float | None = None, on_single_run: bool = False):
        self.out_subdir = out_subdir
        self.plots = plots
        self.figures = list(figures) if figures else None
        self.cost_ratio = cost_ratio
        self.on_single_run = on_single_run

    def build(self, folder: str | Path) -> Path | None:
        """Write the report of ``folder``; returns the report folder, or None when it failed."""
        from harness.report.build import write_report

        folder = Path(folder)
        out = folder / self.out_subdir
        try:
            written = write_report([folder], out, cost_ratio=self.cost_ratio, plots=self.plots, only=self.figures)
            log.info("report of %s: %s", folder, ", ".join(str(out / n) for n in written))
        except Exception:
            log.exception("report of %s failed; rerun: python -m harness.report %s --plots", folder, folder)
            return None
        return out

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self.build(config.hydra.sweep.dir)

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.on_single_run:
            self.build(config.hydra.runtime.output_dir)
