"""The project's protocol steps that read committed or fresh runs and write what the repository keeps.

* :mod:`harness.protocols.tune` -- step 2 of the tuning protocol (``benchmarks/tune.py``): the best setting of
  each decoder family from dev-split tuning runs, written as ``conf/decoder/tuned/<family>_tuned.yaml``; its
  rules in :mod:`~harness.protocols.tune_select`, its output in :mod:`~harness.protocols.tune_write`.
* :mod:`harness.protocols.headline` -- the README's headline table and the committed race reports behind it
  (``benchmarks/headline.py``, ``--check`` in CI), compared with :mod:`~harness.protocols.committed`.
* :mod:`harness.protocols.papers` -- the tables of docs/papers.md, the papers' numbers beside ours read from the
  committed paper-preset reports (``benchmarks/papers.py``, ``--check`` in CI).

The protocols themselves are described in docs/experiments.md ("Tuning protocol") and docs/results.md. This part
imports the report, rows and config parts (and ``tasks`` for the dev splits), never the job: no model is loaded.
"""
