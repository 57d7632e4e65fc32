"""The CI gate: paired speed ratios, equality and counters of a run against a baseline.

``python -m harness.regress`` runs :func:`harness.regress.gate.main`."""
