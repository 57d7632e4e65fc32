"""The CI gate: paired speed ratios, equality and counters of a run against a baseline.

``python -m harness.regress`` runs :func:`harness.regress.gate.main` (the command line, writing baselines);
:mod:`harness.regress.cells` reads rows into per-cell records, :mod:`harness.regress.noise` is the noise model,
:mod:`harness.regress.checks` the checks and the verdict, :mod:`harness.regress.classes` a baseline per machine
class and how a run on another class is judged. The statistics: docs/measurement.md, "The regression
gate's statistics"."""
