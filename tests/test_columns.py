"""The rows schema (harness/rows/columns.py) holds what the runner writes: every column of a real run's rows is
declared, apart from the open-ended ones (each hyper-parameter, the task's quality columns, a decoder's own
statistics); and every summary column is declared, so the summary's legend can explain it."""

from __future__ import annotations

import json

from fixture_rows import real_run
from harness.rows import columns
from harness.rows import metrics
from harness.rows.results import read_results


def test_every_row_column_is_declared(tmp_path):
    run = real_run(tmp_path / "run", "decoder=[vanilla,speculative,lookahead]")
    rows = read_results([run / "results.jsonl"])
    params = {k for p in rows["decoder_params"] for k in json.loads(p)}
    quality = {q for qs in rows["quality_columns"] for q in qs}
    undeclared = set(rows.columns) - set(columns.ROW) - params - quality
    assert not undeclared, sorted(undeclared)
    assert set(rows["draft_shape"]) == {"none", "chain", "n-grams"}
    ok = rows[rows["decoder"] == "speculative"].iloc[0]
    assert ok["draft_prefill_s"] > 0 and ok["prefill_s"] >= ok["ttft_s"] > 0 and ok["tpot_s"] > 0
    meta = json.loads((run / "meta.json").read_text())
    assert meta["quality_columns"] == ["pass@1"]


def test_every_summary_column_is_declared_and_explained():
    assert set(metrics.SUMMARY_COLUMNS) == {c.name for c in columns.SUMMARY_COLUMNS_DECLARED}
    assert all(c.meaning for c in columns.SUMMARY_COLUMNS_DECLARED + columns.ROW_COLUMNS)
    assert "tpot_s = mean seconds per output token after the first" in columns.legend(columns.SUMMARY_MD_COLUMNS)
    assert len(columns.ROW) == len(columns.ROW_COLUMNS)  # no column declared twice
