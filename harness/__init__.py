"""The harness: run decoders on tasks, write rows, read them back into tables, figures and a gate.

Parts, each importing only the parts listed after it (tests/test_structure.py checks this):

* ``harness.api``      -- the Python entry point (``run``, ``build_decoder``).
* ``harness.job``      -- running a job: the app, the runner and its cell rows, timing, run folders, models.
* ``harness.regress``  -- the CI gate (``python -m harness.regress``).
* ``harness.protocols`` -- protocol steps that write what the repository keeps: tuned decoder configs
  (``benchmarks/tune.py``), the README headline and its reports (``benchmarks/headline.py``).
* ``harness.report``   -- reports, summaries, tables, figure data and run comparisons (``python -m harness.report``).
* ``harness.exchange`` -- exchange formats (Spec-Bench answer files).
* ``harness.rows``     -- reading and aggregating rows: result files, columns, grouping, statistics, flags, metrics.
* ``harness.config``   -- settings: schemas, composing conf/, the torch-free precheck.
"""
