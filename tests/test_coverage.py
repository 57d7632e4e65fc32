"""Every cell accounted for in the tables (harness/rows/cells.py through harness.rows.metrics and
harness.report.build): tests on fixture rows with known answers for hidden coverage, pooled unpaired rows,
duplicates counted twice and comparisons over different samples."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fixture_rows import IDENTITY, fixture_rows, real_run, write_run
from harness.report import compare
from harness.rows import cells as coverage
from harness.report import figdata
from harness.rows import grouping
from harness.rows import metrics
from harness.report import build as report
from harness.report import tables
from harness.rows.results import read_results

#: Columns a row keeps when its cell did not run (what the runner writes for a skip or an error).
KEPT = {"run_id", "attempt_id", *IDENTITY, "task", "task_version", "sample_id", "turn", "repeat", "decoder",
        "decoder_params", "max_new_tokens", "prompt_tokens", "category", "gamma", "window_size", "ngram_size",
        "guess_set_size", "pool_scope"}
TOO_LONG = ("prompt (431 tokens) + max_new_tokens (16) exceeds the draft model's (draft-1b) context of 440 "
            "tokens")


def _index(r: dict) -> int:
    return int(r["sample_id"].rsplit("/", 1)[1])


def fail(rows: list[dict], decoder: str, samples: set[int], status: str = "error",
         reason: str = "RuntimeError: boom") -> list[dict]:
    """``rows`` with ``decoder``'s cells on ``samples`` turned into rows that did not run, as the runner writes
    them: the cell's keys, ``status`` and ``reason``, no measurement."""
    out = []
    for r in rows:
        if r["decoder"] == decoder and _index(r) in samples:
            r = {**{k: v for k, v in r.items() if k in KEPT}, "status": status, "reason": reason}
        out.append(r)
    return out


def _line(md: str, label: str) -> list[str]:
    row = next(line for line in md.splitlines() if line.startswith(f"| {label} "))
    return [c.strip() for c in row.strip().strip("|").split("|")]


def _cells(md: str, label: str) -> dict[str, str]:
    header = [c.strip() for c in md.splitlines()[0].strip().strip("|").split("|")]
    return dict(zip(header, _line(md, label)))


# ----------------------------------------------------------------------------------------- skipped cells
@pytest.fixture()
def short_context(tmp_path):
    """5 HumanEval problems: the draft's context too short for problems 3 and 4 (speculative skipped there,
    prompt_too_long), lookahead raising on problems 1 and 2 (error)."""
    rows = fixture_rows("cov", tasks=["humaneval"], n=5, lookahead_scope="sample")
    rows = fail(rows, "speculative", {3, 4}, "prompt_too_long", TOO_LONG)
    rows = fail(rows, "lookahead", {1, 2})
    return write_run(tmp_path / "run", rows)


def test_coverage_is_in_every_table(short_context, tmp_path):
    # Before: speculative has 3 rows, vanilla 5; report.md said "humaneval (5 samples)", main.md had no
    # samples column and nothing warned; with a decoder raising on 2 problems only summary.csv had failed=2.
    agg = metrics.aggregate(report.load_rows([short_context])).set_index("label")
    assert agg.loc["speculative", ["group_samples", "samples", "paired_samples", "failed"]].tolist() == [5, 3, 3, 2]
    assert agg.loc["speculative", "failed_statuses"] == "2 prompt_too_long"
    assert agg.loc["lookahead", "failed_statuses"] == "2 error"
    assert agg.loc["vanilla", ["samples", "failed"]].tolist() == [5, 0]
    written = report.write_report([short_context], tmp_path / "rep")
    main = written["main.md"].read_text()
    spec, la, van = (_cells(main, lab) for lab in ("speculative", "lookahead", "vanilla"))
    assert (spec["samples"], spec["failed"]) == ("3/5", "2 prompt_too_long")
    assert (la["samples"], la["failed"]) == ("3/5", "2 error")
    assert (van["samples"], van["failed"]) == ("5", "-")
    csv = pd.read_csv(written["main.csv"]).set_index("label")
    assert csv.loc["lookahead", "failed"] == 2 and csv.loc["lookahead", "paired_samples"] == 3
    tex = written["main.tex"].read_text()
    assert "3/5" in tex and "2 prompt\\_too\\_long" in tex and "samples" in tex
    rep = written["report.md"].read_text()
    assert "humaneval (5 samples)" not in rep and "humaneval (3-5 of 5 samples per decoder)" in rep
    warnings = rep.split("## Warnings", 1)[1].split("##", 1)[0]
    assert "exceeds the draft model's (draft-1b) context" in warnings and "RuntimeError: boom" in warnings
    assert "cover different samples" in warnings and "speculative 3 (not humaneval/3, humaneval/4)" in warnings


def test_the_runner_summary_says_it_too(short_context):
    # summary.csv / summary.md as the runner writes them (metrics.summarize, tables.to_markdown)
    summary = metrics.summarize(read_results([short_context]))
    spec = summary.set_index("label").loc["speculative"]
    assert (spec["samples"], spec["group_samples"], spec["failed"]) == (3, 5, 2)
    assert spec["failed_statuses"] == "2 prompt_too_long"
    md = tables.to_markdown(summary)
    assert _cells(md.split("\n\n")[-1], "speculative")["failed"] == "2 prompt_too_long"
    assert _cells(md.split("\n\n")[-1], "vanilla")["failed"] == "0"
    assert "Warnings:" in md and "cover different samples" in md and "exceeds the draft model" in md


def test_real_run_with_a_draft_context_too_short_for_some_problems(tmp_path):
    # A real run: tiny-random, 5 HumanEval problems, the draft's context cut to 440
    # positions (speculative skipped where prompt + budget exceed it; vanilla and prompt_lookup run everywhere)
    run = real_run(tmp_path / "run", "task.limit=5", "decoder=[vanilla,speculative,prompt_lookup]",
                   "model.draft.config.max_position_embeddings=440")
    rows = read_results([run])
    k = int(((rows["decoder"] == "speculative") & (rows["status"] == "prompt_too_long")).sum())
    assert 0 < k < 5
    summary = pd.read_csv(run / "summary.csv").set_index("label")
    assert summary.loc["speculative", ["samples", "group_samples", "failed"]].tolist() == [5 - k, 5, k]
    assert summary.loc["prompt_lookup", ["samples", "failed"]].tolist() == [5, 0]
    md = (run / "summary.md").read_text()
    assert f"{k} prompt_too_long" in md and "cover different samples" in md and "context of 440" in md
    written = report.write_report([run], tmp_path / "rep")
    assert _cells(written["main.md"].read_text(), "speculative")["samples"] == f"{5 - k}/5"
    assert f"({5 - k}-5 of 5 samples per decoder)" in written["report.md"].read_text()


def test_category_table_says_how_many_samples(tmp_path):
    rows = fixture_rows("c", tasks=["mt_bench"], n=6, turns=2, categories=["writing", "math"])
    rows = fail(rows, "speculative", {0})                    # writing: samples 0, 2, 4
    written = report.write_report([write_run(tmp_path / "run", rows)], tmp_path / "rep")
    md = written["category.md"].read_text()
    assert md.splitlines()[0] == "| decoder | writing | math | overall | samples | cells | failed |"
    assert _line(md, "speculative") == ["speculative", "2.00 (2/3)", "2.00", "2.00", "5/6", "10/12", "2 error"]
    assert _line(md, "vanilla")[1:] == ["1.00", "1.00", "1.00", "6", "12", "-"]


def test_clean_runs_say_every_cell_was_measured(tmp_path):
    written = report.write_report([write_run(tmp_path / "run", fixture_rows("ok", tasks=["humaneval"]))],
                                  tmp_path / "rep")
    main = written["main.md"].read_text()
    assert main.splitlines()[0].startswith("| decoder | settings | samples | tok/s |") and "failed" not in main
    assert "Every cell was measured and paired with vanilla" in written["report.md"].read_text()
    assert "## Warnings" not in written["report.md"].read_text()


# ----------------------------------------------------------------------------------------- unpaired rows
def _vanilla_fails_twice() -> list[dict]:
    """5 problems, vanilla failing on 3 and 4; speculative 2x vanilla where vanilla ran, fast elsewhere, and
    (a stale reference) marked unequal there; pass@1 = 1 on even problems."""
    rows = fixture_rows("v", tasks=["humaneval"], n=5, spec_factor=[2.0, 2.0, 2.0, 6.0, 6.0], scores=["pass@1"])
    for r in rows:
        if r["decoder"] == "speculative" and _index(r) >= 3:
            r["matches_vanilla"] = False
    return fail(rows, "vanilla", {3, 4})


def test_unpaired_rows_are_in_no_figure(tmp_path):
    # Before: with vanilla failing on 2 of 5 problems the decoder rows of those problems stayed in:
    # tokens/s averaged 5 samples while speedup used 3 (126 tok/s against vanilla's 105 printed as speedup
    # 0.63), equality and quality counted rows without a reference. No warning.
    run = write_run(tmp_path / "run", _vanilla_fails_twice())
    agg = metrics.aggregate(report.load_rows([run])).set_index("label")
    spec = agg.loc["speculative"]
    assert spec["tokens_per_s"] == pytest.approx(np.mean([20.0, 22.0, 24.0]))   # the 3 paired samples
    assert spec["speedup"] == pytest.approx(2.0) and spec["speedup_total"] == pytest.approx(2.0)
    assert spec["tokens_per_s"] / agg.loc["vanilla", "tokens_per_s"] == pytest.approx(2.0)
    assert spec["equal_to_vanilla"] == 1.0 and spec["divergent_samples"] == []
    assert spec["pass@1"] == pytest.approx(2 / 3)                                   # problems 0, 1, 2
    assert (spec["samples"], spec["paired_samples"], spec["unpaired"], spec["rows"]) == (5, 3, 2, 3)
    assert any("2 ok rows on humaneval/3, humaneval/4 have no ok vanilla row" in w and "vanilla: 2 error" in w
               for w in spec["warnings"])
    written = report.write_report([run], tmp_path / "rep")
    cells = _cells(written["main.md"].read_text(), "speculative")
    assert (cells["samples"], cells["unpaired"], cells["tok/s"]) == ("3/5", "2", "22.00")
    assert "unpaired: ok rows left out" in written["main.tex"].read_text()


def test_a_missing_vanilla_row_unpairs_too_and_a_run_without_vanilla_keeps_its_rows(tmp_path):
    rows = [r for r in fixture_rows("m", tasks=["t"], n=4) if not (r["decoder"] == "vanilla" and _index(r) == 0)]
    spec = metrics.summarize(pd.DataFrame(rows)).set_index("label").loc["speculative"]
    assert (spec["paired_samples"], spec["unpaired"]) == (3, 1)
    assert "vanilla: 1 no row" in spec["warnings"]
    alone = [r for r in fixture_rows("s", tasks=["t"], n=4) if r["decoder"] != "vanilla"]
    spec = metrics.summarize(pd.DataFrame(alone)).set_index("label").loc["speculative"]
    assert (spec["paired_samples"], spec["unpaired"], spec["rows"]) == (4, 0, 4)
    assert spec["tokens_per_s"] == pytest.approx(np.mean([2.0 * (10 + i) for i in range(4)]))
    assert pd.isna(spec["speedup"])


def test_figure_frames_use_paired_rows_only():
    rows = grouping.prepare(pd.DataFrame(_vanilla_fails_twice()))
    bd = figdata.time_breakdown(rows).set_index("label")
    spec = rows[(rows["decoder"] == "speculative") & (rows["sample_id"].str[-1].astype(int) < 3)]
    ms = 1000 * 0.3 * spec["wall_time_s"].sum() / spec["new_tokens"].sum()
    assert bd.loc["speculative", "draft_ms"] == pytest.approx(ms)


# --------------------------------------------------------------------------------------- duplicate cells
def test_a_run_and_its_partial_copy_count_each_cell_once(tmp_path):
    # Before: a report over a folder holding a run and a partial copy of it counted 7 rows and printed
    # speedup 0.57 instead of 0.47.
    rows = fixture_rows("dup", tasks=["humaneval"], n=5, spec_factor=[0.3, 0.35, 0.4, 0.6, 0.7])
    alone = metrics.aggregate(report.load_rows([write_run(tmp_path / "alone", rows)])).set_index("label")
    write_run(tmp_path / "both" / "run", rows)
    write_run(tmp_path / "both" / "0_copy", [r for r in rows if _index(r) >= 3])   # read first
    loaded = report.load_rows([tmp_path / "both"])
    agg = metrics.aggregate(loaded).set_index("label")
    assert agg.loc["speculative", "rows"] == 5 and agg.loc["vanilla", "rows"] == 5
    assert agg.loc["speculative", "speedup"] == pytest.approx(alone.loc["speculative", "speedup"])
    assert agg.loc["speculative", "speedup"] == pytest.approx(0.47)
    assert len(loaded.attrs["warnings"]) == 1 and "repeats 4 cells of run dup" in loaded.attrs["warnings"][0]
    written = report.write_report([tmp_path / "both"], tmp_path / "rep")
    assert "duplicate cells" in written["report.md"].read_text().split("## Warnings", 1)[1]


def test_duplicate_rows_in_one_frame_are_collapsed_with_a_warning():
    rows = fixture_rows("dup", tasks=["humaneval"], n=5, spec_factor=[0.3, 0.35, 0.4, 0.6, 0.7])
    doubled = metrics.summarize(pd.DataFrame(rows + [r for r in rows if _index(r) >= 3]))
    spec = doubled.set_index("label").loc["speculative"]
    assert spec["rows"] == 5 and spec["speedup"] == pytest.approx(0.47)
    assert any("duplicate cells: 4 ok rows repeat a cell" in w for w in doubled.attrs["warnings"])
    # a retried cell (an error, then ok) is one cell and no warning
    rows = fixture_rows("retry", tasks=["humaneval"], n=5)
    retried = [dict(rows[1], status="error", tokens_per_s=None), *rows]
    summary = metrics.summarize(pd.DataFrame(retried))
    assert summary.set_index("label").loc["speculative", "failed"] == 0 and summary.attrs["warnings"] == []


def test_shards_of_one_run_id_are_not_copies(tmp_path):
    rows = fixture_rows("one", tasks=["humaneval"], n=4)
    write_run(tmp_path / "sh" / "0", [r for r in rows if _index(r) % 2 == 0])
    write_run(tmp_path / "sh" / "1", [r for r in rows if _index(r) % 2 == 1])
    loaded = report.load_rows([tmp_path / "sh"])
    assert loaded.attrs["warnings"] == []
    assert metrics.aggregate(loaded).set_index("label").loc["speculative", "samples"] == 4


# ------------------------------------------------------------------------------------------- comparisons
def test_compare_pairs_on_the_samples_both_runs_cover(tmp_path, capsys):
    # Before: a decoder failing on 2 of 5 problems in B was compared over 5 samples in A and 3 in B;
    # only "paired: no" showed.
    a_rows = fixture_rows("a", tasks=["humaneval"], n=5, spec_factor=[1.5, 1.6, 1.7, 1.8, 1.9])
    b_rows = fail(fixture_rows("b", tasks=["humaneval"], n=5, spec_factor=2.0, identity={"git_commit": "def4567"}),
                  "speculative", {3, 4})
    a, b = write_run(tmp_path / "A", a_rows), write_run(tmp_path / "B", b_rows)
    assert report.main(["--compare", str(a), str(b), "--out", str(tmp_path / "cmp")]) == 0
    out = capsys.readouterr().out
    cmp = pd.read_csv(tmp_path / "cmp" / "compare.csv").set_index("label")
    spec = cmp.loc["speculative"]
    assert (spec["samples_a"], spec["samples_b"], spec["common_samples"]) == (5, 3, 3)
    assert (spec["failed_a"], spec["failed_b"]) == (0, 2)
    assert spec["speedup_ratio"] == pytest.approx(2.0 / 1.6)                      # problems 0, 1, 2 on both sides
    a_tps = np.mean([(10 + i) * f for i, f in enumerate([1.5, 1.6, 1.7])])
    assert spec["tokens_per_s_ratio"] == pytest.approx(np.mean([20.0, 22.0, 24.0]) / a_tps)
    assert "compared on the 3 both cover" in spec["note"]
    assert "B: 2 cells without a measurement (2 error)" in spec["note"]
    assert cmp.loc["vanilla", "common_samples"] == 5 and pd.isna(cmp.loc["vanilla", "note"])
    assert "Warnings:" in out and "speculative (humaneval" in out and "| 3 (A 5, B 3) |" in out


def test_compare_with_a_failed_vanilla_leaves_its_decoders_unpaired(tmp_path):
    a = write_run(tmp_path / "A", fixture_rows("a", tasks=["humaneval"], n=5))
    b = write_run(tmp_path / "B", fail(fixture_rows("b", tasks=["humaneval"], n=5, spec_factor=3.0), "vanilla", {0}))
    cmp, md = compare.write_compare(a, b)
    spec = cmp.set_index("label").loc["speculative"]
    assert (spec["common_samples"], spec["unpaired_b"]) == (4, 1)
    assert spec["speedup_ratio"] == pytest.approx(1.5)
    assert "B: 1 ok row without a vanilla pair" in spec["note"] and "4 (A 5, B 4)" in md


# ------------------------------------------------------------------------------------------------ helpers
def test_coverage_helpers():
    assert coverage.count_values(["error", "error", "prompt_too_long"]) == "2 error, 1 prompt_too_long"
    assert coverage.count_values([None, float("nan")]) == "2 no row"
    ids = [("t", f"t/{i}") for i in (10, 2, 1, 3, 4, 5, 6)]
    assert coverage.name_samples(ids) == "t/1, t/2, t/3, t/4, t/5, ... (7 in all)"
    rows = pd.DataFrame({"status": ["error", "prompt_too_long"], "reason": ["x" * 300, "short"]})
    why = coverage.reasons(rows)
    assert why.startswith("error: xxx") and why.endswith("...; prompt_too_long: short")


# ----------------------------------------------------------------------------------------- cells, not samples
def _mt_bench_losing_turn_2(samples: set[int]) -> list[dict]:
    """MT-Bench (2 turns) on 3 questions; speculative has no turn-2 row on ``samples`` (the runner never got
    there), so it covers every sample but not every cell."""
    rows = fixture_rows("mt", tasks=["mt_bench"], n=3, turns=2)
    return [r for r in rows if not (r["decoder"] == "speculative" and r.get("turn") == 1 and _index(r) in samples)]


def test_a_decoder_missing_a_later_turn_is_warned_by_cell(tmp_path):
    # Before: every decoder showed the same samples and no warning fired, although speculative's figures
    # stood on 4 of the 6 (sample, turn) cells the others had.
    run = write_run(tmp_path / "run", _mt_bench_losing_turn_2({0, 1}))
    agg = metrics.aggregate(report.load_rows([run])).set_index("label")
    assert agg.loc["speculative", ["paired_samples", "paired_cells", "group_cells"]].tolist() == [3, 4, 6]
    warnings = agg.loc["speculative", "warnings"]
    assert any("cover different (sample, turn) cells (6 in all)" in w and "speculative 4 (not mt_bench/0 turn 2, "
               "mt_bench/1 turn 2)" in w for w in warnings), warnings
    written = report.write_report([run], tmp_path / "rep")
    main = written["main.md"].read_text()
    assert _cells(main, "speculative")["cells"] == "4/6" and _cells(main, "vanilla")["cells"] == "6"
    assert "Every cell was measured" not in written["report.md"].read_text()


def test_summary_md_and_the_report_print_the_same_samples(tmp_path):
    # Before: summary.md printed the ok samples (3) where the report printed the paired ones of the group
    # (1/3) for the same decoder.
    from harness.report.summary import write_summary

    rows = fail(fixture_rows("same", tasks=["humaneval"], n=3), "vanilla", {1, 2})
    run = write_run(tmp_path / "run", rows)
    write_summary(run, read_results([run]), [], "header", [])
    summary_md = (run / "summary.md").read_text()
    table = summary_md[summary_md.index("| label"):]
    report_md = report.write_report([run], tmp_path / "rep")["main.md"].read_text()
    assert _cells(table, "speculative")["samples"] == _cells(report_md, "speculative")["samples"] == "1/3"
    assert "samples = the samples a row's figures are computed over (k/n" in summary_md


def test_a_shard_reported_alone_says_so(tmp_path):
    # Before: summary.md said a folder was one shard of n; the report over that folder alone did not.
    rows = [dict(r, shard="0/2", run_identity="ident") for r in fixture_rows("sh", tasks=["humaneval"], n=2)]
    run = write_run(tmp_path / "shard0", rows)
    rep = report.write_report([run], tmp_path / "rep")["report.md"].read_text()
    assert "shard 0/2 only (1 of 2 shards, runner.shard)" in rep.split("## Warnings", 1)[1]
    other = [dict(r, shard="1/2", run_identity="ident", sample_id=r["sample_id"] + "b")
             for r in fixture_rows("sh", tasks=["humaneval"], n=2)]
    both = report.load_rows([run, write_run(tmp_path / "shard1", other)])
    assert not [w for w in both.attrs["warnings"] if "shard" in w]


def test_repeated_inputs_are_warned_not_dropped_silently(tmp_path):
    # Before: a folder given twice, and a run beside a copy of its rows, were de-duplicated without a word.
    rows = fixture_rows("rep", tasks=["humaneval"], n=3)
    run = write_run(tmp_path / "run", rows)
    twice = report.load_rows([run, run])
    assert any(w.startswith("repeated input:") and "named 2 times" in w for w in twice.attrs["warnings"])
    (run / "copy.jsonl").write_text((run / "results.jsonl").read_text())
    copied = report.load_rows([run, run / "copy.jsonl"])
    assert any("duplicate cells" in w and "copy.jsonl" in w for w in copied.attrs["warnings"])
    appended = write_run(tmp_path / "appended", rows + rows)  # the run's rows pasted into its own file again
    loaded = report.load_rows([appended])
    assert any("holds 6 ok rows repeating a cell" in w for w in loaded.attrs["warnings"])
    agg = metrics.aggregate(loaded).set_index("label")
    assert agg.loc["speculative", "rows"] == 3  # each cell still counted once
