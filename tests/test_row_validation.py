"""Every row validated where rows are read (harness.rows.results.read_results against the rows schema,
harness.rows.columns.row_problem): hand-written hostile rows -- NaN, Infinity, negative speeds, non-object lines,
bad bytes, rows whose tokens/s contradicts their own counts, folders of failed rows -- never reach a table, a
tau, a ratio or the gate, and each is named by file, line and reason."""

from __future__ import annotations

import json
import math

import pytest

from fixture_rows import IDENTITY, fixture_rows, write_run
from harness.rows import columns
from harness.rows import metrics
from harness.regress import gate as regress
from harness.report import build as report
from harness.rows.results import read_results

#: Columns a row keeps when its cell did not run (as the runner writes an error row).
KEPT = {"run_id", "attempt_id", *IDENTITY, "task", "task_version", "sample_id", "turn", "repeat", "decoder",
        "decoder_params", "max_new_tokens", "prompt_tokens", "gamma"}


def _run(tmp_path, name: str = "run", n: int = 5, edit=None, extra: list[str] = (), raw: bytes = b""):
    """A run folder of fixture rows (vanilla and speculative, 2x, on ``n`` HumanEval problems); ``edit(lines)``
    rewrites its JSON lines (a list of dicts), ``extra`` lines and ``raw`` bytes are appended as they are."""
    rows = fixture_rows(name, tasks=["humaneval"], n=n)
    if edit:
        edit(rows)
    run = tmp_path / name
    run.mkdir(parents=True)
    text = "".join(json.dumps(r) + "\n" for r in rows) + "".join(line + "\n" for line in extra)
    (run / "results.jsonl").write_bytes(text.encode() + raw)
    return run


def _spec(rows: list[dict], i: int) -> dict:
    return [r for r in rows if r["decoder"] == "speculative"][i]


def _no_nan(text: str) -> None:
    low = text.lower()
    assert "nan" not in low and "inf" not in low.replace("info", ""), text


# ------------------------------------------------------------------------------------------ the schema
def test_the_schema_knows_types_and_ranges():
    ok = {"decoder": "vanilla", "sample_id": "s", "new_tokens": 5, "num_steps": 5, "wall_time_s": 0.5,
          "tokens_per_s": 10.0}
    assert columns.row_problem(ok) is None
    bad = {
        "tokens_per_s": (float("nan"), "not a finite number"), "wall_time_s": (math.inf, "not a finite number"),
        "new_tokens": (2.5, "not an integer"), "matches_vanilla": (1, "not a boolean"),
        "acceptance_rate": (1.5, "must be <= 1"), "ttft_s": (-0.1, "must be >= 0"), "decoder": (3, "not a str"),
        "num_steps": ("5", "not a number"), "turn": (True, "not a number"),
    }
    for col, (value, why) in bad.items():
        assert why in columns.row_problem({**ok, col: value}), col
    assert "must be > 0" in columns.row_problem({**ok, "wall_time_s": 0.0, "tokens_per_s": None})
    assert "beyond any float" in columns.row_problem({**ok, "new_tokens": 10 ** 400})
    assert "not a finite number" in columns.row_problem({**ok, "pass@1": float("nan")})  # a quality score too
    assert columns.row_problem({**ok, "tokens_per_s": None}) is None  # a call of no measurable speed: left out
    # an error row carries no measurement, but what it carries is checked
    assert columns.row_problem({"decoder": "v", "sample_id": "s", "status": "error", "reason": "x"}) is None
    assert "lacks decoder, sample_id" in columns.row_problem({"a": 1})
    assert columns.row_problem([1, 2]) == "not a JSON object (a list)"


def test_tokens_per_s_is_checked_against_new_tokens_over_wall_time():
    # the runner's tokens_per_s is new_tokens / wall_time_s of the whole generate call (prefill included;
    # harness/job/cell.py cell_row), so a row whose figure contradicts its own counts was edited or mixed
    row = {"decoder": "vanilla", "sample_id": "s", "new_tokens": 28, "num_steps": 28, "wall_time_s": 1.0,
           "tokens_per_s": 28.0}
    assert columns.row_problem(row) is None
    assert columns.row_problem({**row, "tokens_per_s": 28.0 * (1 + columns.TOKENS_PER_S_RTOL / 2)}) is None
    why = columns.row_problem({**row, "tokens_per_s": 84.0})
    assert "new_tokens / wall_time_s = 28 / 1 = 28" in why


# ------------------------------------------------------------------------------------------ reading
def test_nan_and_infinity_never_reach_a_table(tmp_path):
    # Before: "tokens_per_s": NaN with "wall_time_s": Infinity printed tau as a 300-digit negative number.
    def edit(rows):
        _spec(rows, 1).update(tokens_per_s=math.nan, wall_time_s=math.inf)

    run = _run(tmp_path, edit=edit)
    rows = read_results([run])
    assert "line 4: wall_time_s=inf: not a finite number" in rows.attrs["warnings"][0]
    assert str(run / "results.jsonl") in rows.attrs["warnings"][0]
    bad = rows[rows["status"] == columns.STATUS_INVALID]
    assert len(bad) == 1 and "tokens_per_s" not in bad.dropna(axis=1).columns
    written = report.write_report([run], tmp_path / "rep")
    main = written["main.md"].read_text()
    _no_nan(main)
    spec = next(line for line in main.splitlines() if line.startswith("| speculative"))
    assert "| 4/5 |" in spec and "1 invalid" in spec
    assert "line 4: wall_time_s=inf" in written["report.md"].read_text()
    agg = metrics.aggregate(report.load_rows([run])).set_index("label")
    assert 0 < agg.loc["speculative", "accept_length"] < 10


def test_a_negative_speed_is_left_out(tmp_path):
    # Before: -5.0 tok/s gave a negative speedup.
    run = _run(tmp_path, edit=lambda rows: _spec(rows, 0).update(tokens_per_s=-5.0))
    agg = metrics.aggregate(report.load_rows([run])).set_index("label")
    assert agg.loc["speculative", "speedup"] == pytest.approx(2.0) and agg.loc["speculative", "failed"] == 1
    assert "tokens_per_s=-5.0: must be >= 0" in agg.loc["speculative", "warnings"][-1]


def test_lines_that_are_not_rows_are_named_not_a_traceback(tmp_path):
    # Before: {"a": 1}, [1,2] or null in results.jsonl was a TypeError traceback.
    run = _run(tmp_path, extra=['{"a": 1}', "[1,2]", "null", "not json"])
    rows = read_results([run])
    assert len(rows) == 10
    w = rows.attrs["warnings"][0]
    for part in ("line 11: lacks decoder, sample_id", "line 12: not a JSON object (a list)",
                 "line 13: not a JSON object (null)", "line 14: not JSON"):
        assert part in w
    assert report.main([str(run), "--out", str(tmp_path / "rep")]) == 0


def test_one_bad_byte_costs_one_line_and_names_it(tmp_path):
    # Before: one invalid UTF-8 byte rejected the whole report without naming file or line.
    rows = fixture_rows("u", tasks=["humaneval"], n=5)
    lines = [json.dumps(r).encode() for r in rows]
    lines[3] = lines[3].replace(b'"answer', b'"\xff answer', 1)
    run = tmp_path / "u"
    run.mkdir()
    (run / "results.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    read = read_results([run])
    assert len(read) == 9
    assert f"{run / 'results.jsonl'}: 1 line left out (line 4: not UTF-8 (byte 0xff" in read.attrs["warnings"][0]
    assert report.main([str(run), "--out", str(tmp_path / "rep")]) == 0


def test_a_speed_that_contradicts_the_row_is_left_out(tmp_path):
    # Before: tokens/s was never checked against new_tokens / wall_time_s.
    run = _run(tmp_path, edit=lambda rows: _spec(rows, 2).update(tokens_per_s=_spec(rows, 2)["tokens_per_s"] * 3))
    agg = metrics.aggregate(report.load_rows([run])).set_index("label")
    assert agg.loc["speculative", "speedup"] == pytest.approx(2.0)
    assert agg.loc["speculative", "failed_statuses"] == "1 invalid"


# ------------------------------------------------------------------------------------------ nothing valid
def test_a_folder_of_failed_rows_is_a_table_of_failures(tmp_path, capsys):
    # Before: a folder holding only failed rows was KeyError: 'tokens_per_s'.
    rows = [{**{k: v for k, v in r.items() if k in KEPT}, "status": "error", "reason": "RuntimeError: boom"}
            for r in fixture_rows("f", tasks=["humaneval"], n=2)]
    run = write_run(tmp_path / "failed", rows)
    assert report.main([str(run), "--out", str(tmp_path / "rep")]) == 0
    out = capsys.readouterr().out
    assert "| vanilla | - | 0/2 | - |" in out and "2 error" in out


def test_a_folder_without_a_valid_row_is_one_error_line(tmp_path, capsys):
    run = tmp_path / "junk"
    run.mkdir()
    (run / "results.jsonl").write_text('[1,2]\nnull\n{"a": 1}\n')
    assert report.main([str(run), "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no valid result row under") and "line 2: not a JSON object (null)" in err
    assert len(err.strip().splitlines()) == 1
    ok = write_run(tmp_path / "ok", fixture_rows("ok", tasks=["humaneval"], n=2))
    assert report.main(["--compare", str(ok), str(run)]) == 2
    assert capsys.readouterr().err.startswith("error: no valid result row")
    assert regress.main(["--write-baseline", str(run), "--out", str(tmp_path / "b.json")]) == 2


# ------------------------------------------------------------------------------------------ compare and gate
def test_compare_never_forms_a_ratio_from_an_invalid_row(tmp_path):
    # Before: --compare computed a tok/s ratio from a NaN/Infinity row.
    a = _run(tmp_path, "a")
    b = _run(tmp_path, "b", edit=lambda rows: _spec(rows, 0).update(tokens_per_s=math.nan, wall_time_s=math.inf))
    from harness.report.compare import write_compare

    cmp, md = write_compare(a, b)
    _no_nan(md.split("|", 1)[1])
    spec = cmp.set_index("label").loc["speculative"]
    assert spec["common_samples"] == 4 and spec["speedup_ratio"] == pytest.approx(1.0)
    assert spec["failed_b"] == 1


def test_the_gate_reads_hostile_rows_without_crashing(tmp_path, capsys):
    # Before: the gate crashed (OverflowError) on rows with NaN / Infinity.
    def edit(rows):
        _spec(rows, 0).update(tokens_per_s=math.nan, wall_time_s=math.inf)
        _spec(rows, 1).update(tokens_per_s=math.inf)

    base = _run(tmp_path, "base")
    cur = _run(tmp_path, "cur", edit=edit)
    assert regress.main(["--write-baseline", str(base), "--out", str(tmp_path / "b.json")]) == 0
    status = regress.main(["--baseline", str(tmp_path / "b.json"), "--current", str(cur)])
    assert status in (1, 2)  # the run lost two cells: a regression or incomparable, said in words
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
