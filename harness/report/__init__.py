"""Reports and figures: report.md/.tex/.csv, summary.md, tables, figure data and comparisons of runs.

``python -m harness.report RUN ...`` runs :func:`harness.report.build.main`."""
