"""The papers' table (harness.report.task_table, tasks.{md,tex,csv}): decoders as rows, tasks as columns, from
fixture rows with known speedups; written only where the tasks share one setup; LaTeX fitted to the page."""

from __future__ import annotations

import logging
import re

import pandas as pd
import pytest

from fixture_rows import fixture_rows, write_run
from harness.report import build as report
from harness.report import tables
from harness.report import task_table
from harness.rows import metrics


def _report(tmp_path, *runs):
    for i, rows in enumerate(runs):
        write_run(tmp_path / "runs" / str(i), rows)
    return report.write_report([tmp_path / "runs"], tmp_path / "rep")


def test_tasks_side_by_side_with_speedup_interval_and_tau(tmp_path):
    written = _report(tmp_path, fixture_rows("a", tasks=("humaneval", "mbpp"), n=6, spec_factor=2.0,
                                             lookahead_scope="sample", lookahead_factor=1.5))
    assert {"tasks.md", "tasks.tex", "tasks.csv"} <= set(written)
    md = (tmp_path / "rep" / "tasks.md").read_text().splitlines()
    assert md[0] == ("| decoder | humaneval speedup [95% CI] | humaneval τ | mbpp speedup [95% CI] | mbpp τ |")
    cells = {line.split(" | ")[0].strip("| "): line.strip("| ").split(" | ")[1:] for line in md[2:]}
    assert list(cells) == ["vanilla", "speculative", "lookahead"]          # configurations in run order, once each
    assert cells["speculative"][0] == "2.00 [2.00, 2.00]" and cells["speculative"][2] == "2.00 [2.00, 2.00]"
    assert cells["lookahead"][0].startswith("1.50 [") and cells["vanilla"][1] == "1.00"
    csv = pd.read_csv(tmp_path / "rep" / "tasks.csv")
    assert len(csv) == 6 and set(csv["task"]) == {"humaneval", "mbpp"}    # long: task x configuration
    assert {"tokens_per_s", "speedup_low", "accept_length", "paired_samples"} <= set(csv.columns)
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "## Tasks side by side" in text


def test_no_interval_header_over_cells_without_intervals(tmp_path):
    _report(tmp_path, fixture_rows("a", tasks=("humaneval", "mbpp"), n=3, spec_factor=2.0))
    md = (tmp_path / "rep" / "tasks.md").read_text()
    assert "[95% CI]" not in md and "n too small" not in md
    assert "| speculative | 2.00 |" in md
    tex = (tmp_path / "rep" / "tasks.tex").read_text()
    assert "CI" not in tex                                                 # nor in the caption


def test_one_task_has_no_tasks_table(tmp_path):
    written = _report(tmp_path, fixture_rows("a", tasks=("humaneval",), n=6))
    assert "tasks.md" not in written and not (tmp_path / "rep" / "tasks.tex").exists()


def test_setups_are_blocks_and_never_share_a_row(tmp_path):
    _report(tmp_path, fixture_rows("a", n=6, spec_factor=2.0),
            fixture_rows("b", n=6, spec_factor=1.5, identity={"dtype": "bfloat16"}))
    md = (tmp_path / "rep" / "tasks.md").read_text().splitlines()
    assert md[0].startswith("| setup | decoder | humaneval speedup")
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in md[2:]]
    setups = [r[0] for r in rows]
    assert [s for s in setups if s] == ["dtype=float32", "dtype=bfloat16"]  # each block's setup once, first row
    second = setups.index("dtype=bfloat16")
    assert setups[0] == "dtype=float32" and set(setups[1:second]) == set(setups[second + 1:]) == {""}
    spec = [(i, r[2].split()[0]) for i, r in enumerate(rows) if r[1] == "speculative"]
    assert [v for _, v in spec] == ["2.00", "1.50"] and spec[0][0] < second < spec[1][0]


def test_two_groups_of_one_task_and_setup_leave_the_table_out(tmp_path, caplog):
    a = fixture_rows("a", n=6, identity={"group_identity": "h1"})
    b = fixture_rows("b", tasks=("humaneval",), n=6, identity={"group_identity": "h2"})
    with caplog.at_level(logging.INFO, logger="harness.report.task_table"):
        written = _report(tmp_path, a, b)
    assert "tasks.md" not in written
    assert "tasks table left out: task humaneval has 2 run groups of one setup" in caplog.text


def test_a_missing_cell_is_a_dash_and_a_short_one_says_k_of_n(tmp_path):
    rows = fixture_rows("a", n=6, spec_factor=2.0, lookahead_scope="sample")
    rows = [r for r in rows if not (r["decoder"] == "lookahead" and r["task"] == "mbpp")]
    rows = [r for r in rows if not (r["decoder"] == "speculative" and r["sample_id"] == "humaneval/5")]
    _report(tmp_path, rows)
    md = (tmp_path / "rep" / "tasks.md").read_text()
    la = next(line for line in md.splitlines() if line.startswith("| lookahead |"))
    assert la.endswith("| - | - |")
    spec = next(line for line in md.splitlines() if line.startswith("| speculative |"))
    assert "(5/6)" in spec.split(" | ")[1]


def _tex_width(tex: str) -> tuple[str, float]:
    """The table's environment and its body's estimated width at its font size."""
    env = re.search(r"\\begin\{(table\*?)\}", tex).group(1)
    size = next(s for s in tables.EM_PT if s in tex)
    body = tex.split("\\midrule", 1)[1].split("\\bottomrule", 1)[0].strip().splitlines()
    header = tex.split("\\midrule", 1)[0].rstrip().splitlines()[-1]  # the line of column heads
    rows = [[c.strip().replace("\\", "").replace("$tau$", "τ").replace("$alpha$", "α")
             for c in line.rstrip("\\ ").split(" & ")] for line in [header, *body]]
    return env, tables.width_pt(list(zip(*rows)), tables.EM_PT[size])


def test_latex_fits_a_column_or_spans_both(tmp_path):
    _report(tmp_path, fixture_rows("a", tasks=("humaneval", "mbpp"), n=3))
    tex = (tmp_path / "rep" / "tasks.tex").read_text()
    env, width = _tex_width(tex)
    assert env == "table" and width <= tables.COLUMN_PT               # two tasks without intervals: one column
    assert tex.count(r"\multicolumn{2}{c}") == 2 and r"\cmidrule(lr){2-3}" in tex and r"$\tau$" in tex
    assert re.search(r"\\label\{tab:tasks:[A-Za-z0-9-]+\}", tex)
    assert re.search(r"\\caption\{Measured: target-7b / draft-1b \$\\cdot\$ float32 \$\\cdot\$ test cpu \$\\cdot\$ "
                     r"humaneval \(3 samples\), mbpp \(3 samples\) \$\\cdot\$ at most 64 new tokens\. Speedup", tex)
    four = tmp_path / "four"
    _report(four, fixture_rows("a", tasks=("humaneval", "mbpp", "gsm8k", "cnn_dm"), n=6, lookahead_scope="task"))
    tex = (four / "rep" / "tasks.tex").read_text()
    env, width = _tex_width(tex)
    body = tex.split("\\midrule", 1)[1]
    assert env == "table*" and width <= tables.TEXT_PT                   # four tasks: both columns,
    assert "[1.50, 1.50]" in body                                        # the intervals kept (they fit)


def test_too_wide_drops_the_intervals_and_says_so():
    agg_cols = pd.MultiIndex.from_tuples([(f"task{i}", h) for i in range(6) for h in ("speedup [95% CI]", "τ")])
    text = pd.DataFrame([["1.23 [1.01, 1.45]", "2.50"] * 6], index=["speculative"], columns=agg_cols)
    tex = task_table.latex(text, "Measured: x.", "tab:tasks:x")
    assert r"\begin{table*}" in tex and r"\footnotesize" in tex
    assert "[1.01" not in tex and "left out here to fit the page" in tex
    assert "speculative & 1.23 & 2.50" in tex


def test_setup_fields_leave_the_task_out():
    assert not {"task", "task_version", "max_new_tokens"} & set(task_table.SETUP_FIELDS)
    assert {"dtype", "device_name", "target_model", "draft_model", "git_commit"} <= set(task_table.SETUP_FIELDS)
    agg = metrics.aggregate(pd.DataFrame(fixture_rows("a", n=2)))
    assert task_table.task_table(agg[agg["task"] == "humaneval"]) is None


@pytest.mark.parametrize("tasks", [("humaneval", "mbpp"), ("mt_bench", "gsm8k")])
def test_task_order_is_the_rows_order(tasks, tmp_path):
    _report(tmp_path, fixture_rows("a", tasks=tasks, n=3))
    head = (tmp_path / "rep" / "tasks.md").read_text().splitlines()[0]
    assert head.index(tasks[0]) < head.index(tasks[1])


def test_every_report_table_fits_its_environment(tmp_path):
    # Before: main.tex was ~340 pt wide inside a one-column `table` (a column is 241 pt).
    _report(tmp_path, fixture_rows("a", n=6, lookahead_scope="sample", ttft_share=0.2, scores=("pass@1",)))
    envs = []
    for name in ("main.tex", "theory.tex", "tasks.tex"):
        text = (tmp_path / "rep" / name).read_text()
        for table in re.findall(r"\\begin\{table\*?\}.*?\\end\{table\*?\}", text, flags=re.S):
            env, width = _tex_width(table)
            envs.append(env)
            fits = width <= (tables.COLUMN_PT if env == "table" else tables.TEXT_PT)
            assert fits or "\\resizebox{\\textwidth}" in table, (name, env, width)
    assert "table*" in envs                                      # the wide main table spans both columns
    narrow = pd.DataFrame({"speedup": ["1.20"]}, index=["speculative"])
    assert tables.fit(narrow) == ("table", "\\small", True)
    wide = pd.DataFrame([["1.23 [1.01, 1.45]"] * 12], index=["speculative"], columns=[f"c{i}" for i in range(12)])
    assert tables.fit(wide)[0] == "table*" and "\\resizebox{\\textwidth}{!}" in tables.latex(wide)


def _with_warm_twin(rows, factor):
    """``rows`` plus a warm twin of their lookahead (``lookahead_warm``: pool kept across samples) at ``factor``
    times its tokens/s."""
    import json

    twins = []
    for r in rows:
        if r["decoder"] == "lookahead":
            t = dict(r, decoder="lookahead_warm", pool_scope="task", tokens_per_s=r["tokens_per_s"] * factor,
                     wall_time_s=r["wall_time_s"] / factor)
            t["decoder_params"] = json.dumps({**json.loads(r["decoder_params"]), "pool_scope": "task"}, sort_keys=True)
            twins.append(t)
    return rows + twins


@pytest.mark.parametrize("factor", [1.3, 0.8])
def test_task_bars_group_tasks_and_shade_warm_start(factor, tmp_path):
    import plots
    from harness.report import figdata
    from matplotlib.container import BarContainer

    rows = pd.DataFrame(_with_warm_twin(fixture_rows("a", n=6, spec_factor=2.0, lookahead_scope="sample",
                                                     lookahead_factor=1.5), factor))
    agg = metrics.aggregate(rows)
    bars = figdata.task_bars(rows, agg)
    assert set(bars.loc[bars["warm"], "decoder"]) == {"lookahead_warm"}
    assert set(bars.loc[bars["warm"], "bar"]) == {"lookahead"}          # drawn on its cold twin's bar
    fig = plots.task_bars(bars, report.subtitle(agg))
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["humaneval\nn=6", "mbpp\nn=6"]
    containers = [c for c in ax.containers if isinstance(c, BarContainer)]
    heights = {c.get_label(): [round(p.get_height(), 2) for p in c.patches] for c in containers}
    assert heights["speculative"] == [2.0, 2.0] and heights["lookahead"] == [1.5, 1.5]
    hatched = [p for p in ax.patches if p.get_hatch()]
    if factor > 1:
        assert [round(p.get_height(), 2) for p in hatched] == [0.45, 0.45]   # 1.5 x 1.3 - 1.5: the warm extra
        assert "hatched" in plots.caption(fig)
    else:
        from matplotlib.collections import PathCollection

        marks = [c for c in ax.collections if isinstance(c, PathCollection)]   # slower warm: a diamond in the bar
        assert all(p.get_height() == 0 for p in hatched)
        assert marks and sorted(round(y, 2) for c in marks for y in c.get_offsets()[:, 1]) == [1.2, 1.2]
    from matplotlib.container import ErrorbarContainer

    warm_bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)
                 and c.get_label() == "_warm start interval"]   # the warm start's own interval, at its value
    segments = [seg for c in warm_bars for seg in c.lines[2][0].get_segments()]
    warm_values = pd.to_numeric(bars.loc[bars["warm"], "speedup"]).tolist()
    assert len(segments) == 2
    assert all(lo - 1e-9 <= v <= hi + 1e-9 for ((_, lo), (_, hi)), v in zip(segments, warm_values))
    assert fig._suptitle is None and "float32" in plots.caption(fig)
    assert "vanilla" not in heights
    legend = fig.legends[0]
    names = [t.get_text() for t in legend.get_texts()]
    assert [n for n in names if not n.startswith("warm start")] == ["speculative", "lookahead"]   # short names
    plots.plt.close(fig)
    one = metrics.aggregate(rows[rows["task"] == "humaneval"])
    assert figdata.task_bars(rows[rows["task"] == "humaneval"], one).empty


def test_captions_live_beside_the_figures(tmp_path):
    write_run(tmp_path / "runs" / "0", fixture_rows("a", n=6, lookahead_scope="sample"))
    written = report.write_report([tmp_path / "runs"], tmp_path / "rep", plots=True)
    assert "figures/task_bars.png" in written
    caps = (tmp_path / "rep" / "figures" / "captions.md").read_text().splitlines()
    named = [line.split("**")[1] for line in caps if line.startswith("- **")]
    assert sorted(named) == sorted(p.split("/")[1][:-4] for p in written if p.startswith("figures/"))
    assert all("test cpu" in line for line in caps if line.startswith("- **"))
    # a figure the rows stop supporting loses its caption with its files
    write_run(tmp_path / "one" / "0", fixture_rows("a", tasks=("humaneval",), n=6, lookahead_scope="sample"))
    report.write_report([tmp_path / "one"], tmp_path / "rep", plots=True)
    assert "task_bars" not in (tmp_path / "rep" / "figures" / "captions.md").read_text()
    assert not (tmp_path / "rep" / "figures" / "task_bars.png").exists()


def test_a_job_s_notes_reach_the_report(tmp_path):
    # Before: a job's summary.md warned that its decoders were tuned on another dtype; the sweep's report did not.
    import json

    run = write_run(tmp_path / "runs" / "0", fixture_rows("a", n=3))
    note = "speculative_tuned: tuned on bfloat16 / AMD EPYC, run in float32 here"
    (run / "meta.json").write_text(json.dumps({"notes": [note], "identity": {}}))
    report.write_report([tmp_path / "runs"], tmp_path / "rep")
    warnings = (tmp_path / "rep" / "report.md").read_text().split("## Warnings", 1)[1]
    assert note in warnings


def test_a_group_s_latex_table_leaves_out_other_tasks_quality_columns(tmp_path):
    # Before: main.tex's HumanEval table carried GSM8K's accuracy and CNN/DM's ROUGE columns, every cell "-".
    _report(tmp_path, fixture_rows("a", tasks=("humaneval",), n=3, scores=("pass@1",)),
            fixture_rows("b", tasks=("gsm8k",), n=3, scores=("accuracy",)))
    tex = (tmp_path / "rep" / "main.tex").read_text()
    tables_ = re.findall(r"\\begin\{table\*?\}.*?\\end\{table\*?\}", tex, flags=re.S)
    heads = [t.split("\\midrule", 1)[0].rsplit("\\toprule", 1)[1] for t in tables_]
    assert len(heads) == 2
    assert "pass@1" in heads[0] and "accuracy" not in heads[0]
    assert "accuracy" in heads[1] and "pass@1" not in heads[1]


def test_tasks_at_their_own_budgets_share_one_table_headed_with_them(tmp_path):
    # Before: at the papers' full size (512 tokens for code, 256 for GSM8K) the budget split the setup: no table.
    a = fixture_rows("a", tasks=("humaneval",), n=3, spec_factor=2.0)
    b = [dict(r, max_new_tokens=256) for r in fixture_rows("b", tasks=("gsm8k",), n=3, spec_factor=1.5)]
    _report(tmp_path, a, b)
    head = (tmp_path / "rep" / "tasks.md").read_text().splitlines()[0]
    assert head == ("| decoder | humaneval (64 tokens) speedup | humaneval (64 tokens) τ | "
                    "gsm8k (256 tokens) speedup | gsm8k (256 tokens) τ |")


def test_a_decoder_without_a_figure_and_twins_without_scopes(tmp_path):
    import json

    from harness.report import figdata

    rows = fixture_rows("a", n=6, spec_factor=2.0, lookahead_scope="sample")
    # a second configuration with the same settings as speculative but no pool: not a warm twin
    rows += [dict(r, decoder="speculative_copy") for r in rows if r["decoder"] == "speculative"]
    # a warm decoder whose cold twin is not in the rows: drawn as a bar of its own
    rows += [dict(r, decoder="ouroboros_warm", decoder_params=json.dumps({"gamma": 4, "pool_scope": "task"}))
             for r in rows if r["decoder"] == "speculative"]
    frame = pd.DataFrame(rows)
    agg = metrics.aggregate(frame)
    bars = figdata.task_bars(frame, agg)
    assert not bars["warm"].any()
    assert {"speculative_copy", "ouroboros_warm"} <= set(bars["bar"])
    nan = agg.copy()
    nan.loc[nan["label"] == "lookahead", "speedup"] = float("nan")
    _, text = task_table.task_table(nan)
    assert text.loc["lookahead", ("humaneval", "speedup [95% CI]")] == "-"


def test_captions_are_one_line_each_and_survive_rewrites(tmp_path):
    import plots

    fig = plots.plt.figure()
    plots.style.set_titles(fig, "A title **with** stars\nand a break.", "subtitle.")
    assert plots.caption(fig) == "A title **with** stars and a break. subtitle."
    plots.save(fig, tmp_path, "one")
    fig = plots.plt.figure()
    plots.style.set_titles(fig, "Second", "")
    plots.save(fig, tmp_path, "two")
    plots.style.record_caption(tmp_path, "one", "Rewritten")
    lines = (tmp_path / "captions.md").read_text().splitlines()
    assert lines[2:] == ["- **one** (one.png, one.pdf): Rewritten", "- **two** (two.png, two.pdf): Second."]


def test_latex_text_takes_no_raw_unicode():
    text = tables.tex_escape("τ · α × γ ≈ 2 – 3 and 50% of a_b")
    assert text.isascii() and r"$\tau$" in text and r"$\cdot$" in text and r"50\%" in text and r"a\_b" in text
