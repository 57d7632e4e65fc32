"""harness.rows.metrics (the one aggregation), harness.report.build (tables, comparison) and plots (figures from frames):
known numbers from fixture rows, the reproducers of earlier bugs, and the layering; no torch."""

from __future__ import annotations

import ast
import json
import logging
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fixture_rows import fixture_rows, real_run, write_run
from harness.report import compare
from harness.report import figdata
from harness.rows import cell_figures, grouping
from harness.rows import metrics
from harness.report import build as report
from harness.rows import stats
from harness.report import tables
from harness.rows.results import read_results

import plots

ROOT = Path(__file__).resolve().parent.parent
RACE = ROOT / "results" / "reference" / "race20_cpu"


@pytest.fixture()
def sweep(tmp_path):
    """A gamma sweep (three job folders) with a warm and a cold lookahead, as a multirun would leave it."""
    write_run(tmp_path / "sweep" / "0", fixture_rows("a", gamma=2, spec_factor=1.6, lookahead_scope="sample"))
    write_run(tmp_path / "sweep" / "1", fixture_rows("b", gamma=4, spec_factor=2.0, divergent=[1],
                                                     lookahead_scope="task", lookahead_factor=1.8))
    write_run(tmp_path / "sweep" / "2", fixture_rows("c", gamma=8, spec_factor=1.7, pattern=(8, 2, 5)))
    return tmp_path / "sweep"


# ------------------------------------------------------------------------------------------------ statistics
def test_bootstrap_two_point_case_is_exact():
    # Resampled means of [0, 1] take 0, 1/2, 1 with probabilities 1/4, 1/2, 1/4: the 95 % interval is [0, 1]
    # and the bootstrap standard error is sqrt(1/8).
    ci = stats.bootstrap_mean_ci([0.0, 1.0], n_boot=20000, seed=0)
    assert ci["mean"] == 0.5
    assert (ci["low"], ci["high"]) == (0.0, 1.0)
    assert ci["std"] == pytest.approx(math.sqrt(1 / 8), rel=0.03)


def test_bootstrap_matches_normal_theory_and_is_seeded():
    values = np.arange(100, dtype=float)  # sd = 29.01, standard error 2.90
    ci = stats.bootstrap_mean_ci(values, n_boot=4000, seed=1)
    se = values.std(ddof=0) / 10
    assert ci["mean"] == pytest.approx(49.5)
    assert ci["std"] == pytest.approx(se, rel=0.08)
    assert ci["low"] == pytest.approx(49.5 - 1.96 * se, abs=0.6)
    assert ci["high"] == pytest.approx(49.5 + 1.96 * se, abs=0.6)
    assert stats.bootstrap_mean_ci(values, n_boot=4000, seed=1) == ci
    constant = stats.bootstrap_mean_ci([2.0] * 5)
    assert (constant["low"], constant["high"], constant["std"]) == (2.0, 2.0, 0.0)
    single = stats.bootstrap_mean_ci([3.0])
    assert single["mean"] == 3.0 and math.isnan(single["low"])


def test_two_level_bootstrap_resamples_samples_then_their_repeats():
    # 2 samples x 3 repeats: each resample draws 2 samples, and 3 repeats within each drawn sample
    w = stats.bootstrap_weights(["a", "a", "a", "b", "b", "b"], n_boot=500, seed=0)
    assert w.shape == (500, 6) and (w.sum(axis=1) == 6).all()
    assert set(np.unique(w[:, :3].sum(axis=1))) <= {0, 3, 6}   # sample a drawn 0, 1 or 2 times
    # repeats of one sample that differ widen the interval; identical repeats leave the one-level one
    same = stats.bootstrap_mean_ci([1, 1, 3, 3], clusters=["a", "a", "b", "b"], n_boot=4000)
    spread = stats.bootstrap_mean_ci([0, 2, 2, 4], clusters=["a", "a", "b", "b"], n_boot=4000)
    assert same["mean"] == spread["mean"] == 2.0
    assert spread["std"] > same["std"]


def test_leviathan_formulas_reproduce_worked_numbers():
    # docs/measurement.md (Metric definitions, theory): alpha=0.8, gamma=4 -> E[tau]=3.36;
    # S=2.80 / 2.40 / 1.87 for c=0.05 / 0.1 / 0.2
    assert stats.expected_accept_length(0.8, 4) == pytest.approx(3.3616)
    assert [round(stats.theory_speedup(0.8, 4, c), 2) for c in (0.05, 0.1, 0.2)] == [2.80, 2.40, 1.87]
    assert stats.expected_accept_length(1.0, 4) == 5.0
    assert stats.expected_accept_length(0.0, 4) == 1.0


def test_cost_ratio_wall_time_fit_recovers_c(tmp_path):
    # Without per-phase timers: wall = steps * t_ar + draft_forwards * c * t_ar exactly -> c comes back.
    rows = fixture_rows("r", tasks=["t"], n=3, timers=False)
    c_true = 0.25
    by_sample = {r["sample_id"]: r for r in rows if r["decoder"] == "vanilla"}
    for r in rows:
        if r["decoder"] == "speculative":
            v = by_sample[r["sample_id"]]
            t_ar = v["wall_time_s"] / v["new_tokens"]
            r["wall_time_s"] = r["num_steps"] * t_ar + r["draft_forwards"] * c_true * t_ar
            r["tokens_per_s"] = r["new_tokens"] / r["wall_time_s"]
    agg = metrics.aggregate(report.load_rows([write_run(tmp_path / "run", rows)]))
    spec = agg[agg["decoder"] == "speculative"].iloc[0]
    assert spec["cost_ratio_source"] == "wall-time fit"
    assert spec["cost_ratio"] == pytest.approx(c_true)
    agg = metrics.aggregate(report.load_rows([tmp_path / "run"]), cost_ratio=0.1)  # the option wins
    spec = agg[agg["decoder"] == "speculative"].iloc[0]
    assert spec["cost_ratio_source"] == "option"
    assert spec["theory_speedup"] == pytest.approx(stats.theory_speedup(spec["acceptance_rate"], 4, 0.1))


def test_in_situ_step_costs_in_units_of_a_vanilla_step():
    """verify_cost / draft_cost: what a decoder's verify step and draft forward cost where they run, against
    vanilla's seconds per output token on the same samples (docstring of cell_figures.step_costs)."""
    # ttft 0.2 s; 5 decode steps verified in 1.4 - 0.2 = 1.2 s: 0.24 s each = 1.2 vanilla steps of 0.2 s;
    # the draft prefill (0.1 s, after the first token: prefill_s 0.3) is one of the 11 draft forwards and
    # 0.1 of the 0.6 s lapped as drafting: the other 10 take 0.05 s each = 0.25 of a vanilla step
    g = pd.DataFrame({"ttft_s": [0.2, 0.2], "verify_time_s": [1.4, 1.4], "num_steps": [6, 6],
                      "vanilla_tpot_s": [0.2, 0.2], "prefill_s": [0.3, 0.3], "draft_time_s": [0.6, 0.6],
                      "draft_forwards": [11, 11]})
    costs = cell_figures.step_costs(g)
    assert costs["verify_cost"] == pytest.approx(1.2) and costs["draft_cost"] == pytest.approx(0.25)
    assert math.isnan(cell_figures.step_costs(g.assign(draft_forwards=0))["draft_cost"])    # n-gram decoders
    assert all(math.isnan(v) for v in cell_figures.step_costs(g.drop(columns="vanilla_tpot_s")).values())
    # through the aggregate: rows with the stopwatch's columns get both, shown in the theory table
    rows = fixture_rows("c", tasks=["humaneval"], ttft_share=0.1)
    for r in rows:
        r["tpot_s"] = (r["wall_time_s"] - r["ttft_s"]) / max(r["new_tokens"] - 1, 1)
    agg = metrics.aggregate(pd.DataFrame(rows)).set_index("decoder")
    assert agg.loc["speculative", "verify_cost"] > 0 and agg.loc["speculative", "draft_cost"] > 0
    assert "verify cost" in report.theory_table(agg.reset_index()).columns


def test_in_situ_step_costs_against_the_bare_models_cost_curves():
    """verify_bare / draft_bare: the same in-situ seconds in units of the target's bare one-token forward
    (bare_token_s), beside what the bare curves give at the same tokens per forward (cell_figures.step_costs)."""
    # bare token 0.16 s: a verify of 0.24 s is 1.5 bare tokens; 5 tokens fed per verify lie between the curve's
    # 4 (1.0) and 8 (1.2): 1.05. The draft: its prefill fed the prompt (9) and the first token, so the other 10
    # forwards fed 30 - 10 = 20 tokens, 2 each: the draft curve gives 0.3 there; in situ 0.05 s = 0.3125.
    g = pd.DataFrame({"ttft_s": [0.2, 0.2], "verify_time_s": [1.4, 1.4], "num_steps": [6, 6],
                      "vanilla_tpot_s": [0.2, 0.2], "prefill_s": [0.3, 0.3], "draft_time_s": [0.6, 0.6],
                      "draft_forwards": [11, 11], "draft_tokens_fed": [30, 30], "prompt_tokens": [9, 9],
                      "target_tokens_fed_per_step": [5.0, 5.0], "bare_token_s": [0.16, 0.16],
                      "target_cost_curve": ["1:1.000,4:1.000,8:1.200"] * 2,
                      "draft_cost_curve": ["1:0.250,2:0.300,4:0.350"] * 2})
    costs = cell_figures.step_costs(g)
    assert costs["verify_cost"] == pytest.approx(1.2) and costs["draft_cost"] == pytest.approx(0.25)  # unchanged
    assert costs["verify_bare"] == pytest.approx(1.5) and costs["verify_bare_curve"] == pytest.approx(1.05)
    assert costs["draft_bare"] == pytest.approx(0.3125) and costs["draft_bare_curve"] == pytest.approx(0.3)
    assert costs["draft_tokens_per_forward"] == pytest.approx(2.0)
    # a draft window: a 209-token prompt of which the window cut 200, so the prefill fed the same 10 tokens
    windowed = cell_figures.step_costs(g.assign(prompt_tokens=209, draft_window_cut=200))
    assert windowed["draft_tokens_per_forward"] == pytest.approx(2.0)
    assert windowed["draft_bare_curve"] == pytest.approx(0.3)
    mixed = cell_figures.step_costs(g.assign(prompt_tokens=[209, 9], draft_window_cut=[200, None]))  # one cut
    assert mixed["draft_tokens_per_forward"] == pytest.approx(2.0)
    # a windowed decoder's rows written before draft_window_cut existed: the prefill is unknown, so is the rest
    unknown = cell_figures.step_costs(g.assign(prompt_tokens=209, decoder_params='{"gamma": 4, "draft_window": 128}'))
    assert math.isnan(unknown["draft_tokens_per_forward"]) and math.isnan(unknown["draft_bare_curve"])
    assert not math.isnan(unknown["draft_bare"])
    for no_window in ('{"gamma": 4, "draft_window": 0}', '{"gamma": 4, "draft_window": "0"}', '{"gamma": 4}'):
        unwindowed = cell_figures.step_costs(g.assign(decoder_params=no_window))
        assert unwindowed["draft_tokens_per_forward"] == pytest.approx(2.0), no_window
    one_unknown = cell_figures.step_costs(g.assign(prompt_tokens=[209, 9], draft_window_cut=[None, None],
                                                   decoder_params=['{"draft_window": 8}', "{}"]))
    assert math.isnan(one_unknown["draft_tokens_per_forward"]) and math.isnan(one_unknown["draft_bare_curve"])
    older = cell_figures.step_costs(g.drop(columns=["bare_token_s", "target_cost_curve", "draft_cost_curve"]))
    assert older["verify_cost"] == pytest.approx(1.2)  # rows without the curves keep the vanilla-step units
    assert all(math.isnan(older[k]) for k in ("verify_bare", "verify_bare_curve", "draft_bare", "draft_bare_curve"))
    assert cell_figures.cost_curve("garbled") == [] and cell_figures.cost_curve(None) == []
    assert cell_figures.curve_at([(1.0, 1.0), (4.0, 2.0)], 4) == 2.0
    assert math.isnan(cell_figures.curve_at([(1.0, 1.0), (4.0, 2.0)], 4.5))  # beyond the timed points: unmeasured
    beyond = cell_figures.step_costs(g.assign(target_tokens_fed_per_step=100.0))  # past the curve's last point
    assert math.isnan(beyond["verify_bare_curve"]) and not math.isnan(beyond["verify_bare"])
    straddling = cell_figures.step_costs(g.assign(target_tokens_fed_per_step=[5.0, 100.0]))  # one row past it
    assert math.isnan(straddling["verify_bare_curve"])  # not the first row's value beside both rows' verify_bare

    # the figure: the curves as lines, each decoder's in-situ cost as a point on them
    rows = g.assign(label="speculative")
    agg = pd.DataFrame([{"label": "vanilla", "target_tokens_fed_per_step": 1.0, "verify_bare": math.nan,
                         "draft_tokens_per_forward": math.nan, "draft_bare": math.nan},
                        {"label": "speculative", "target_tokens_fed_per_step": 5.0, "verify_bare": 1.5,
                         "draft_tokens_per_forward": 2.0, "draft_bare": 0.3125}])
    frame = figdata.bare_costs(rows, agg)
    points = frame[frame["kind"] == "decoder"].set_index("panel")
    assert points.loc["verify", "cost"] == 1.5 and points.loc["draft", "k"] == 2.0
    assert list(frame[(frame["kind"] == "curve") & (frame["panel"] == "verify")]["k"]) == [1.0, 4.0, 8.0]
    fig = plots.insitu_vs_bare(frame, "pair · bfloat16 · cpu")
    assert len(fig.axes) == 2 and all(len(ax.lines) == 1 and len(ax.collections) == 1 for ax in fig.axes)
    assert "bfloat16" in plots.caption(fig) and fig._suptitle is None
    assert_legible(fig, "insitu_vs_bare")
    plots.plt.close(fig)
    assert figdata.bare_costs(rows.drop(columns=["target_cost_curve", "draft_cost_curve"]), agg).empty
    assert plots.insitu_vs_bare(figdata.bare_costs(rows.drop(columns=["target_cost_curve", "draft_cost_curve"]),
                                                   agg), "s") is None  # older rows: no figure


# ------------------------------------------------------------------------------------------------ aggregates
def test_aggregate_numbers(sweep):
    agg = metrics.aggregate(report.load_rows([sweep])).set_index(["task", "label"])
    g4 = agg.loc[("humaneval", "speculative (gamma=4)")]
    # every sample runs exactly 2x vanilla -> speedup 2; 4 samples are too few for an interval
    assert g4["speedup"] == pytest.approx(2.0) and g4["speedup_total"] == pytest.approx(2.0, rel=0.1)
    assert math.isnan(g4["speedup_low"]) and math.isnan(g4["speedup_high"]) and g4["samples"] < stats.MIN_INTERVAL_SAMPLES
    # pattern (4, 1, 2) over 8 decode steps: accepted 4+1+2+4+1+2+4+1 = 19, drafted 32, emitted 1 + 19 + 8 = 28
    assert g4["accept_length"] == pytest.approx(28 / 9)
    assert math.isnan(g4["accept_length_low"])
    assert g4["acceptance_rate"] == pytest.approx(19 / 32)
    assert g4["equal_to_vanilla"] == pytest.approx(0.75)
    assert g4["divergent_samples"] == ["humaneval/1"]
    # timers: c = (0.3 wall / drafted) / (0.6 wall / steps) = 0.5 * 9 / 32
    assert g4["cost_ratio_source"] == "timers"
    assert g4["cost_ratio"] == pytest.approx(0.5 * 9 / 32)
    assert g4["theory_speedup"] == pytest.approx(stats.theory_speedup(19 / 32, 4, 0.5 * 9 / 32))
    assert g4["efficiency"] == pytest.approx(2.0 / (28 / 9))
    vanilla = agg.loc[("humaneval", "vanilla (gamma=4, pool_scope=task)")]
    assert vanilla["speedup"] == 1.0 and vanilla["accept_length"] == 1.0 and math.isnan(vanilla["theory_speedup"])
    # one row per job's vanilla, named by what tells the job apart: its four samples, paired within the job
    assert vanilla["rows"] == 4 and vanilla["samples"] == 4
    la = agg.loc[("mbpp", "lookahead (pool_scope=task)")]
    assert la["speedup"] == pytest.approx(1.8) and math.isnan(la["theory_speedup"])


def test_labels_distinguish_swept_configs_and_print_integers(sweep):
    rows = report.load_rows([sweep])
    assert grouping.swept_params(rows)["speculative"] == ["gamma"]
    vanillas = ["vanilla (gamma=2, pool_scope=sample)", "vanilla (gamma=4, pool_scope=task)", "vanilla (gamma=8)"]
    assert set(rows["label"]) == {*vanillas, "speculative (gamma=2)", "speculative (gamma=4)",
                                  "speculative (gamma=8)", "lookahead (pool_scope=sample)",
                                  "lookahead (pool_scope=task)"}
    assert metrics.ordered_labels(metrics.aggregate(rows))[:6] == [
        *vanillas, "speculative (gamma=2)", "speculative (gamma=4)", "speculative (gamma=8)"]
    # a float-typed value (pandas turns int columns with gaps into floats) still prints as an integer
    odd = pd.DataFrame({"decoder": ["la", "la"], "decoder_params": ['{"ngram_size": 3.0}', '{"ngram_size": 4}']})
    assert list(grouping.config_labels(odd)) == ["la (ngram_size=3)", "la (ngram_size=4)"]


def test_labels_leave_out_a_setting_whose_parent_is_off():
    """draft_on_copy means nothing where copy_tokens is 0: a label does not carry it there, unless two
    configurations would then read alike."""
    rows = pd.DataFrame({"decoder": ["opt_tree"] * 3, "decoder_params": [
        '{"num_nodes": 32, "copy_tokens": 0, "draft_on_copy": true}',
        '{"num_nodes": 32, "copy_tokens": 20, "draft_on_copy": false}',
        '{"num_nodes": 16, "copy_tokens": 20, "draft_on_copy": true}']})
    assert list(grouping.config_labels(rows)) == [
        "opt_tree (num_nodes=32, copy_tokens=0)", "opt_tree (num_nodes=32, copy_tokens=20, draft_on_copy=false)",
        "opt_tree (num_nodes=16, copy_tokens=20, draft_on_copy=true)"]
    twins = pd.DataFrame({"decoder": ["t", "t"], "decoder_params": ['{"copy_tokens": 0, "draft_on_copy": true}',
                                                                   '{"copy_tokens": 0, "draft_on_copy": false}']})
    assert list(grouping.config_labels(twins)) == ["t (draft_on_copy=true)", "t (draft_on_copy=false)"]


def test_intervals_over_repeats_and_samples(tmp_path):
    rows = fixture_rows("r", tasks=["humaneval"], n=6, repeats=3, jitter=0.05, seed=1)
    agg = metrics.aggregate(report.load_rows([write_run(tmp_path / "run", rows)])).set_index("label")
    spec = agg.loc["speculative"]
    assert spec["samples"] == 6 and spec["rows"] == 18 and spec["replicates"] == 3
    assert spec["speedup_low"] < spec["speedup"] < spec["speedup_high"]
    assert spec["tokens_per_s_low"] < spec["tokens_per_s"] < spec["tokens_per_s_high"]
    # run-to-run noise: std over the three repeats of the cell's mean speedup (not over samples)
    per_repeat = pd.DataFrame(rows).pipe(lambda d: d[d["decoder"] == "speculative"].groupby("repeat")[
        "tokens_per_s"].mean())
    assert spec["tokens_per_s_repeat_std"] == pytest.approx(per_repeat.std(ddof=1))
    assert 0 < spec["speedup_repeat_std"] < 0.2


# -----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("task, columns", [("gsm8k", ["accuracy"]), ("cnn_dm", ["rouge1", "rouge2", "rougeL"])])
def test_report_shows_the_quality_columns_summary_csv_shows(task, columns, tmp_path):
    # Reproducer: the paper report of a GSM8K run had no accuracy column, that of a CNN/DM run no ROUGE,
    # while summary.csv had them (two aggregators). Now one aggregation serves both.
    run = write_run(tmp_path / "run", fixture_rows("q", tasks=[task], scores=columns))
    rows = read_results([run])
    summary = metrics.summarize(rows, columns)  # what the runner writes as summary.csv
    report.write_report([run], tmp_path / "rep")
    main = pd.read_csv(tmp_path / "rep" / "main.csv").set_index("label")
    md = (tmp_path / "rep" / "main.md").read_text()
    for c in columns:
        assert c in md.splitlines()[0]
        assert main.loc["vanilla", c] == pytest.approx(0.5)          # samples 0 and 2 of 4 score 1
        assert main.loc["vanilla", c] == pytest.approx(summary.set_index("label").loc["vanilla", c])
    assert "accuracy" not in md if task == "cnn_dm" else "rouge1" not in md


def test_summary_of_rows_that_never_ran():
    # every cell skipped (prompt_too_long): no timing columns at all; the summary still lists each decoder
    rows = pd.DataFrame([{"run_id": "r", "task": "t", "sample_id": f"t/{i}", "decoder": d, "decoder_params": "{}",
                          "status": "prompt_too_long", "reason": "too long"} for i in range(2) for d in
                         ("vanilla", "speculative")])
    summary = metrics.summarize(rows).set_index("label")
    assert list(summary.index) == ["vanilla", "speculative"]
    assert (summary["samples"] == 0).all() and (summary["failed"] == 2).all()
    assert "| vanilla | 0/2 |" in tables.to_markdown(summary.reset_index())  # none of the group's 2 samples


def test_quality_columns_declared_or_found():
    rows = pd.DataFrame({"decoder": ["vanilla"], "accuracy": [1.0], "my_score": [0.5]})
    assert grouping.quality_columns(rows) == ["accuracy"]                     # known score names
    assert grouping.quality_columns(rows, ["my_score"]) == ["my_score"]       # the task's declaration
    rows["quality_columns"] = [json.dumps(["my_score"])]
    assert grouping.quality_columns(rows) == ["my_score"]                     # declared in the rows


# -----------------------------------------------------------------------------------------------------------
def test_runs_of_different_code_versions_are_two_groups(tmp_path, capsys):
    # Reproducer: `python -m harness.report A B` on two runs of the same config from different code versions
    # reported their mean (70.9 and 141.7 tokens/s shown as 106.3). Now: two groups, never pooled.
    a = write_run(tmp_path / "A", fixture_rows("a", tasks=["humaneval"]))
    b = write_run(tmp_path / "B", fixture_rows("b", tasks=["humaneval"], spec_factor=3.0, vanilla_factor=2.0,
                                               identity={"git_commit": "def4567890"}))
    agg = metrics.aggregate(report.load_rows([a, b]))
    spec = agg[agg["decoder"] == "speculative"].set_index("group")
    assert len(spec) == 2
    assert sorted(spec["speedup"]) == pytest.approx([2.0, 3.0])
    assert any("git_commit=abc123" in g for g in spec.index) and any("git_commit=def4567" in g for g in spec.index)
    assert report.main([str(a), str(b), "--out", str(tmp_path / "rep")]) == 0
    main = pd.read_csv(tmp_path / "rep" / "main.csv")
    assert len(main) == 4 and main["group"].nunique() == 2
    tex = (tmp_path / "rep" / "main.tex").read_text()
    assert tex.count("git\\_commit=") == 2


def test_pool_flag_pools_loudly(tmp_path, caplog):
    a = write_run(tmp_path / "A", fixture_rows("a", tasks=["humaneval"]))
    b = write_run(tmp_path / "B", fixture_rows("b", tasks=["humaneval"], spec_factor=3.0,
                                               identity={"git_commit": "def456"}))
    with caplog.at_level(logging.WARNING):
        agg = metrics.aggregate(report.load_rows([a, b], pool=True))
    spec = agg[agg["decoder"] == "speculative"]
    assert len(spec) == 1 and spec["speedup"].iloc[0] == pytest.approx(2.5)
    assert "POOLING" in caplog.text and "git_commit" in caplog.text


def test_shards_and_repeated_runs_of_one_identity_merge(tmp_path):
    rows = fixture_rows("s", tasks=["humaneval"], n=4)
    shard0 = write_run(tmp_path / "sweep" / "0", [r for r in rows if r["sample_id"] in ("humaneval/0", "humaneval/1")])
    write_run(tmp_path / "sweep" / "1", [dict(r, run_id="s2") for r in rows if r["sample_id"] in
                                         ("humaneval/2", "humaneval/3")])
    agg = metrics.aggregate(report.load_rows([shard0.parent])).set_index("label")
    whole = metrics.aggregate(report.load_rows([write_run(tmp_path / "whole", rows)])).set_index("label")
    assert agg["group"].nunique() == 1 and agg.loc["speculative", "samples"] == 4
    for col in ("speedup", "accept_length", "tokens_per_s", "equal_to_vanilla"):
        assert agg.loc["speculative", col] == pytest.approx(whole.loc["speculative", col])


def test_compare_two_runs_paired_by_sample(tmp_path, capsys):
    a = write_run(tmp_path / "A", fixture_rows("a", tasks=["humaneval"], n=8, jitter=0.02, seed=1))
    b = write_run(tmp_path / "B", fixture_rows("b", tasks=["humaneval"], n=8, spec_factor=2.4, jitter=0.02, seed=2,
                                               identity={"git_commit": "def456"}))
    assert report.main(["--compare", str(a), str(b), "--out", str(tmp_path / "cmp")]) == 0
    out = capsys.readouterr().out
    assert "tok/s B/A [95% CI]" in out and "git_commit" not in out.split("\n\n")[1]
    cmp = pd.read_csv(tmp_path / "cmp" / "compare.csv").set_index("label")
    spec = cmp.loc["speculative"]
    assert bool(spec["paired"])
    assert spec["speedup_ratio"] == pytest.approx(1.2, rel=0.05)
    assert spec["speedup_ratio_low"] < spec["speedup_ratio"] < spec["speedup_ratio_high"]
    assert spec["speedup_ratio_low"] > 1.1 and spec["speedup_ratio_high"] < 1.3
    assert spec["accept_length_ratio"] == pytest.approx(1.0)
    assert cmp.loc["vanilla", "tokens_per_s_ratio"] == pytest.approx(1.0, rel=0.05)
    # other samples in B: the bootstrap is unpaired, and it says so
    c = write_run(tmp_path / "C", fixture_rows("c", tasks=["humaneval"], n=5))
    cmp2, _ = compare.write_compare(a, c)
    # Before: compared on the 5 samples both runs hold (it was an unpaired bootstrap of 8 against 5),
    # and it says so
    spec2 = cmp2.set_index("label").loc["speculative"]
    assert (spec2["samples_a"], spec2["samples_b"], spec2["common_samples"]) == (8, 5, 5) and spec2["paired"]
    assert "compared on the 5 both cover" in spec2["note"]


def test_report_never_writes_into_a_committed_run(capsys):
    run = Path(__file__).resolve().parent.parent / "results" / "reference" / "humaneval20-29_greedy"
    if not run.is_dir() or not report.tracked(run):
        pytest.skip("the committed reference run is not in this checkout")
    before = set(run.rglob("*"))
    assert report.main([str(run)]) == 2
    assert "is a committed run" in capsys.readouterr().err and set(run.rglob("*")) == before


def test_compare_names_every_difference_first(tmp_path):
    # Before: the head named task and model pair only, not that A is bf16 with 8 problems and B float32 with 3
    # on another commit; a decoder of one run only showed "-" for that run too.
    a = write_run(tmp_path / "A", fixture_rows("a", tasks=["humaneval"], n=8, identity={"dtype": "bfloat16"}))
    rows_b = [r for r in fixture_rows("b", tasks=["humaneval"], n=3, identity={"dtype": "float32",
                                                                                  "git_commit": "def456"},
                                      lookahead_scope="sample", gamma=6)]
    b = write_run(tmp_path / "B", rows_b)
    cmp, md = compare.write_compare(a, b, tmp_path / "cmp")
    head = md.split("\n\n")[0].splitlines()
    assert head[0] == "Differences between the runs:"
    assert any(line.startswith("- dtype: A bfloat16, B float32") for line in head)
    assert any(line.startswith("- git_commit: A") and "def456" in line for line in head)
    assert any(line.startswith("- problems: A 8, B 3 (B's are a subset of A's") for line in head)
    assert any("decoders: only in B: lookahead" in line for line in head)
    assert "- settings of speculative: A gamma=4, B gamma=6" in head        # a re-tuned setting, not a regression
    look = cmp.set_index("label").loc["lookahead"]
    assert pd.isna(look.get("speedup_a")) and look["speedup_b"] > 1   # its own run's figure, not "-"
    # Before: its equality with vanilla was "-" (taken over the samples both runs cover: none), its speedup shown
    own = pd.DataFrame(rows_b)
    own = own[(own["decoder"] == "lookahead") & (own["status"] == "ok")]["matches_vanilla"].astype(bool).mean()
    assert look["equal_to_vanilla_b"] == pytest.approx(own) and pd.isna(look["equal_to_vanilla_a"])
    assert (tmp_path / "cmp" / "figures" / "compare.png").is_file()
    same, md_same = compare.write_compare(a, a)
    assert md_same.startswith("The runs do not differ in any recorded setting.")


# -----------------------------------------------------------------------------------------------------------
def test_estimator_disagreement_and_load_warn_in_the_summary(tmp_path):
    # Reproducer: a loaded machine printed mean-of-ratios 3.91 vs ratio of totals 1.30 with no warning.
    factors = [4.0, 1.0] * 5
    rows = fixture_rows("w", tasks=["humaneval"], n=10, spec_factor=factors, load=5.0, cpu_count=2)
    summary = metrics.summarize(read_results([write_run(tmp_path / "run", rows)]))
    spec = summary.set_index("label").loc["speculative"]
    assert spec["speedup"] == pytest.approx(2.5) and spec["speedup_total"] < 2.0
    warnings = summary.attrs["warnings"]
    assert any("estimators disagree" in w for w in warnings)
    assert any("machine load" in w and "2 usable cores" in w for w in warnings)
    md = tables.to_markdown(summary)
    assert "Warnings:" in md and "estimators disagree" in md
    assert "estimators disagree" in spec["warnings"]
    # a quiet machine and agreeing estimators: no warning
    quiet = metrics.summarize(read_results([write_run(tmp_path / "quiet", fixture_rows("q", load=1.2))]))
    assert quiet.attrs["warnings"] == [] and "Warnings" not in tables.to_markdown(quiet)


# -------------------------------------------------------------------------------------------------------------
def test_summary_rows_are_tidy_and_concatenate(tmp_path):
    # Reproducer: summary.csv had no task, model pair, dtype or hyper-parameter columns, so the summaries of
    # a gamma sweep concatenated lost which gamma was which.
    parts = [metrics.summarize(read_results([write_run(tmp_path / str(g), fixture_rows(str(g), gamma=g))]))
             for g in (2, 4)]
    both = pd.concat(parts, ignore_index=True)
    for col in ("task", "target_model", "draft_model", "dtype", "device_name", "git_commit", "gamma", "label"):
        assert col in both
    spec = both[both["decoder"] == "speculative"]
    assert sorted(spec["gamma"].dropna().astype(int)) == [2, 2, 4, 4]     # one row per task per gamma
    assert spec["gamma"].dtype == "Int64"                                 # written as 2, not 2.0
    assert "2.0" not in spec[["gamma"]].to_csv()


def _tex_rows(tex: str) -> list[list[str]]:
    """Body rows of a booktabs table (between \\midrule and \\bottomrule), split into cells."""
    body = tex.split("\\midrule", 1)[1].split("\\bottomrule", 1)[0]
    return [[c.strip() for c in line.rstrip("\\ ").split("&")] for line in body.strip().splitlines()]


def test_race_latex_table_has_one_row_per_decoder(tmp_path):
    # Before: main.tex of the 9-decoder race was one row of 38 `l` columns.
    if not RACE.joinpath("results.jsonl").is_file():
        pytest.skip("reference race rows not present")
    report.write_report([RACE], tmp_path / "rep")
    tex = (tmp_path / "rep" / "main.tex").read_text()
    decoders = list(dict.fromkeys(json.loads(line)["decoder"] for line in RACE.joinpath("results.jsonl").open()))
    assert len(decoders) == 9
    spec = re.search(r"\\begin\{tabular\}\{([lrc]+)\}", tex).group(1)
    assert spec == "l" + "r" * 5                         # decoder | samples speedup tau alpha eq. (tok/s: main.md)
    rows = _tex_rows(tex)
    assert [r[0].replace("\\_", "_") for r in rows] == decoders    # decoders as rows, in run order
    assert all(len(r) == len(spec) for r in rows)
    assert tex.count("\\toprule") == tex.count("\\midrule") == tex.count("\\bottomrule") == 1
    assert r"$\tau$" in tex and r"95\% CI" in tex
    header = tex.split("\\toprule", 1)[1].split("\\midrule", 1)[0]
    assert header.count("\\\\") == 1                                # one header line
    md = (tmp_path / "rep" / "main.md").read_text().splitlines()
    assert len(md) == 2 + 9 and md[1].startswith("|---|---:")      # same shape, numbers right-aligned


def test_committed_race_report_is_current():
    """results/reference/race20_cpu/report was regenerated with this code (decoders as rows)."""
    tex = RACE / "report" / "main.tex"
    if not tex.is_file():
        pytest.skip("reference race report not present")
    assert len(_tex_rows(tex.read_text())) == 9


@pytest.mark.parametrize("task, column, cats", [
    ("mt_bench", "category", ["writing", "roleplay", "reasoning", "math"]),
    ("spec_bench", "subtask", ["mt_bench", "translation", "summarization", "qa"]),
])
def test_per_category_tables(task, column, cats, tmp_path):
    rows = fixture_rows("c", tasks=[task], n=8, turns=2, spec_factor=[1.5, 2.0, 2.5, 3.0] * 2)
    for r in rows:
        r[column] = cats[int(r["sample_id"].rsplit("/", 1)[1]) % 4]
    written = report.write_report([write_run(tmp_path / "run", rows)], tmp_path / "rep")
    assert {"category.md", "category.tex", "category.csv"} <= set(written)
    md = (tmp_path / "rep" / "category.md").read_text().splitlines()
    assert md[0] == "| decoder | " + " | ".join(cats) + " | overall | samples |"
    spec = next(line for line in md if line.startswith("| speculative"))
    assert [c.strip() for c in spec.strip("|").split("|")][1:] == ["1.50", "2.00", "2.50", "3.00", "2.25", "8"]
    assert len(_tex_rows((tmp_path / "rep" / "category.tex").read_text())) == 2


# ------------------------------------------------------------------------------------------------ figures
def test_report_plots_draws_every_figure(sweep, tmp_path):
    written = report.write_report([sweep], tmp_path / "rep", plots=True)
    figs = {k.split("/")[1].rsplit(".", 1)[0] for k in written if k.startswith("figures/")}
    assert figs == set(plots.FIGURES) - TREE_FIGURES - BATCH_FIGURES - COST_FIGURES  # gamma sweep: no tree, batch 1
    for name in figs:
        for ext in (".png", ".pdf"):
            p = tmp_path / "rep" / "figures" / f"{name}{ext}"
            assert p.is_file() and p.stat().st_size > 1000


def test_figures_without_timers_or_pools_are_skipped_with_a_note(tmp_path, caplog):
    run = write_run(tmp_path / "run", fixture_rows("a", timers=False))
    with caplog.at_level(logging.INFO, logger="plots"):
        written = report.write_report([run], tmp_path / "rep", plots=True)
    figs = {k for k in written if k.startswith("figures/")}
    assert "figures/time_breakdown.png" not in figs and "figures/warm_vs_cold.png" not in figs
    assert "figures/tokens_per_s_vs_param.png" not in figs  # nothing swept
    assert "figures/speedup_by_task.png" in figs
    assert "time_breakdown skipped" in caplog.text and "warm_vs_cold skipped" in caplog.text


@pytest.fixture()
def frames(sweep):
    rows = report.load_rows([sweep])
    agg = metrics.aggregate(rows)
    return rows, agg, report.figure_frames(rows, agg)


def assert_legible(fig, name):
    """At the size a paper prints it: one column (3.5 in) or two (7 in) wide, legends under the axes (never over
    the data), tick labels that do not overlap."""
    assert fig.get_size_inches()[0] in (plots.COLUMN_WIDTH_IN, plots.PAGE_WIDTH_IN), name
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    lowest = min(ax.get_window_extent(r).y0 for ax in fig.axes)
    for leg in fig.legends:  # under every axes
        assert leg.get_window_extent(r).y1 <= lowest + 1, name
    for ax in fig.axes:
        assert ax.get_legend() is None, name
        for ticks in (ax.get_yticklabels(), ax.get_xticklabels()):
            boxes = [t.get_window_extent(r) for t in ticks if t.get_text() and t.get_visible()]
            assert not any(a.overlaps(b) for a, b in zip(boxes, boxes[1:])), name


def test_figures_are_readable(frames):
    # Before: legends over the bars, repeating colours, `ngram_size=3.0`, ticks like 2.5, no error bars on
    # tau, no model pair / dtype / hardware on any figure, rotated labels over half the canvas.
    rows, agg, fr = frames
    sub = report.subtitle(agg)
    assert sub == "target-7b / draft-1b · float32 · test cpu · humaneval (4 samples), mbpp (4 samples)"
    style = plots.Style.of(agg)
    for name, (fn, needs) in plots.FIGURES.items():
        if name in TREE_FIGURES | BATCH_FIGURES | COST_FIGURES:
            continue  # tested on their own: test_node_budget_figure, test_speedup_vs_batch_figure, test_in_situ_...
        fig = fn(*[fr[k] for k in needs], subtitle=sub, style=style)
        assert fig is not None, name
        assert fig._suptitle is None, name                              # no title baked into the image
        assert "float32" in plots.caption(fig) and "test cpu" in plots.caption(fig), name
        assert_legible(fig, name)
        plots.plt.close(fig)
    enough = metrics.aggregate(pd.DataFrame(fixture_rows("e", tasks=["humaneval"], n=6, jitter=0.02)))
    fig = plots.accept_length_by_decoder(enough, sub)  # 6 samples: enough for an interval (the sweep has 4)
    from matplotlib.container import BarContainer

    bars = [c for ax in fig.axes for c in ax.containers if isinstance(c, BarContainer)]
    assert bars and all(c.errorbar is not None for c in bars)          # error bars on tau
    assert "95% bootstrap CI" in plots.caption(fig)
    plots.plt.close(fig)
    fig = plots.accept_length_by_decoder(agg, sub)  # 4 samples: no interval is drawn, none is promised
    title = plots.caption(fig)
    assert "no interval (too few samples)" in title and "CI" not in title
    plots.plt.close(fig)
    fig = plots.acceptance_by_position(fr["positions"], sub)
    fig.canvas.draw()
    assert all(float(t).is_integer() for t in fig.axes[0].get_xticks())
    plots.plt.close(fig)


def test_two_groups_are_panels_with_the_group_written_once(sweep, tmp_path):
    # Before: the full group label (model pair + temperature) under every bar, overlapping; a legend wider than
    # the plot; a decoder blue in one figure and orange in the next.
    rows = report.load_rows([sweep])
    other = rows.copy()
    other["temperature"] = 0.7
    other["run_id"] = other["run_id"].astype(str) + "-t07"
    both = pd.concat([rows, other], ignore_index=True)
    agg = metrics.aggregate(both)
    assert agg["group"].nunique() >= 2
    style = plots.Style.of(agg)
    fig = plots.speedup_by_task(agg, "s", style)
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    assert len(titles) == agg["group"].nunique() and all(titles)
    labels = [t.get_text() for ax in fig.axes for t in ax.get_yticklabels()]
    assert not any(g in lab for g in agg["group"] for lab in labels)   # the group is a panel title, not a label
    assert_legible(fig, "speedup_by_task")
    colours = {}
    for ax in fig.axes:
        names = {round(float(y), 3): t.get_text() for y, t in zip(ax.get_yticks(), ax.get_yticklabels())}
        for patch in ax.patches:
            name = names[round(patch.get_y() + patch.get_height() / 2, 3)]
            colours.setdefault(name, set()).add(tuple(round(c, 4) for c in patch.get_facecolor()[:3]))
    assert all(len(c) == 1 for c in colours.values())                   # one colour per configuration
    plots.plt.close(fig)


#: Figures that only a draft-tree sweep draws.
TREE_FIGURES = {"accept_length_vs_nodes", "accept_length_vs_threshold"}
#: Figures that only a sweep of ``runner.batch_size`` draws.
BATCH_FIGURES = {"speedup_vs_batch"}
#: Figures that only rows with the bare cost curves (a run with a warm-up, on this code) draw.
COST_FIGURES = {"insitu_vs_bare"}


def test_crossover_is_the_first_batch_size_where_speculation_stops_paying():
    from plots.batch import crossover

    def points(speedups):
        return pd.DataFrame({"batch_size": [8, 1, 4, 2][:len(speedups)], "speedup": speedups})
    assert crossover(points([0.7, 1.8, 0.9, 1.2])) == 4  # unsorted input: 1 -> 1.8, 2 -> 1.2, 4 -> 0.9, 8 -> 0.7
    assert crossover(points([1.1, 1.8, 1.3, 1.2])) is None  # never below 1
    assert crossover(points([0.7, 0.9, 0.8, 0.95])) is None  # below 1 from the start: no crossover seen


def test_speedup_vs_batch_figure():
    sizes = [1, 2, 4, 8]
    speedups = {"vanilla": [1.0] * 4, "speculative": [1.8, 1.3, 0.9, 0.7], "prompt_lookup": [0.9, 0.8, 0.8, 0.7]}
    agg = pd.DataFrame([{"label": label, "decoder": label, "batch_size": b, "speedup": v, "speedup_low": v - 0.1,
                         "speedup_high": v + 0.1, "tokens_per_s": 5.0 * v * b, "batch_tokens_per_s": 5.0 * v * b}
                        for label, values in speedups.items() for b, v in zip(sizes, values)])
    fig = plots.speedup_vs_batch(agg, "pair · bfloat16 · cpu")
    caption = plots.caption(fig)
    assert "speculative at batch size 4" in caption and "prompt_lookup below 1x at every batch size" in caption
    narrow = plots.caption(plots.speedup_vs_batch(agg.assign(speedup_high=agg["speedup"] + 0.05), "s"))
    assert "speculative at batch size 4." in narrow or "speculative at batch size 4;" in narrow  # 0.9 [0.8, 0.95]
    wide = agg.assign(speedup_high=agg["speedup"] + 0.2)  # 0.9 [0.8, 1.1]: the crossover is not resolved
    assert "speculative at batch size 4 (its interval reaches 1x: 1.10)" in plots.caption(
        plots.speedup_vs_batch(wide, "s"))
    assert "bfloat16" in caption and fig._suptitle is None
    assert [t.get_text() for t in fig.axes[1].get_xticklabels()] == ["1", "2", "4", "8"]
    assert len(fig.axes[1].lines) >= 3  # two decoders' lines (vanilla is the 1x reference), the 1x line
    assert_legible(fig, "speedup_vs_batch")
    plots.plt.close(fig)
    assert plots.speedup_vs_batch(agg[agg["batch_size"] == 1], "s") is None  # one batch size: nothing to plot


def test_speedup_per_sample_figure(frames, caplog):
    rows, agg, fr = frames
    per = fr["per_sample"]
    decoders = agg[agg["decoder"] != "vanilla"]
    assert set(per["label"]) == set(decoders["label"]) and (per["rows"] == 1).all()
    for (group, label), sub in per.groupby(["group", "label"]):
        cell = decoders[(decoders["group"] == group) & (decoders["label"] == label)].iloc[0]
        assert sub["speedup"].mean() == pytest.approx(cell["speedup"])   # one row per sample: the tables' mean
        assert len(sub) == cell["paired_samples"]
    fig = plots.speedup_per_sample(per, agg, subtitle="s")
    marks = {round(x, 6) for ax in fig.axes for line in ax.get_lines() if len(line.get_xdata()) == 2
             for x in line.get_xdata()}
    assert {round(v, 6) for v in decoders["speedup"]} <= marks          # a tick at each configuration's mean
    dots = sum(len(c.get_offsets()) for ax in fig.axes for c in ax.collections)
    assert dots == len(per) + decoders["speedup_total"].notna().sum()  # a dot per sample, a diamond per config
    assert "ratio of totals" in plots.caption(fig)
    assert_legible(fig, "speedup_per_sample")
    plots.plt.close(fig)
    with caplog.at_level(logging.INFO, logger="plots"):
        assert plots.speedup_per_sample(per.groupby(["group", "label"]).head(2), agg) is None
    assert "speedup_per_sample skipped" in caplog.text


def test_node_budget_figure(tmp_path, caplog):
    """OPT-Tree's scaling figure: accept length and speedup against num_nodes, one line per tree option; each
    grid point is its own decoder config (as in tune_trees)."""
    rows = []
    grid = [(16, 0, 1.8), (32, 0, 2.1), (60, 0, 2.0), (16, 20, 2.4), (32, 20, 2.6)]
    for i, (nodes, hybrid, factor) in enumerate(grid):
        for r in fixture_rows("t", tasks=["humaneval"], spec_factor=factor, pattern=(nodes // 8, 2, 3)):
            if r["decoder"] == "vanilla":
                if i == 0:
                    rows.append(r)
                continue
            params = {"num_nodes": nodes, "threshold": 0.5, "max_depth": 10, "copy_tokens": hybrid}
            r.update(params, decoder=f"opt_tree_n{nodes}_c{hybrid}", decoder_params=json.dumps(params, sort_keys=True))
            rows.append(r)
    rows_df = report.load_rows([write_run(tmp_path / "trees", rows)])
    agg = metrics.aggregate(rows_df)
    fig = plots.accept_length_vs_nodes(agg, subtitle="s")
    texts = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    assert texts == ["opt_tree (copy_tokens=0)", "opt_tree (copy_tokens=20)"]  # in the opt_tree family's colour
    lines = fig.axes[0].get_lines()
    assert [list(line.get_xdata()) for line in lines] == [[16, 32, 60], [16, 32]]
    assert "node budget" in fig.axes[0].get_xlabel() and "accept length" in fig.axes[0].get_ylabel()
    plots.plt.close(fig)
    with caplog.at_level(logging.INFO, logger="plots"):   # one budget only: nothing to plot against
        assert plots.accept_length_vs_nodes(agg[agg["num_nodes"].isin([16, None]) | agg["num_nodes"].isna()]) is None
    assert "accept_length_vs_nodes skipped" in caplog.text
    # Reproducer: a cost-aware tree that verifies ~9.5 nodes per step stood at its budget (60) on the x axis
    sized = agg.assign(cost_aware=agg["decoder"].eq("opt_tree_n60_c0"),
                       target_tokens_fed_per_step=np.where(agg["decoder"].eq("opt_tree_n60_c0"), 9.5, 20.0))
    fig = plots.accept_length_vs_nodes(sized, subtitle="s")
    xs = [list(line.get_xdata()) for line in fig.axes[0].get_lines()]
    assert [9.5] in xs and [16, 32] in xs and not any(60 in x for x in xs)
    assert "budget 60" in [t.get_text() for t in fig.axes[0].texts]
    assert "verified per step" in fig.axes[0].get_xlabel() and "cost-aware" in plots.caption(fig)
    plots.plt.close(fig)


def test_threshold_figure(tmp_path, caplog):
    """The other axis of OPT-Tree's scaling study: accept length and speedup against the growth threshold, one
    line per node budget measured at two thresholds or more (a budget at one threshold, and a cost-aware tree,
    are left out)."""
    rows = []
    grid = [(25, 0.3, False, 2.2, 0), (25, 0.5, False, 2.0, 0), (25, 0.9, False, 1.6, 0), (16, 0.5, False, 1.8, 0),
            (25, 0.7, True, 2.1, 0), (25, 0.7, False, 2.3, 40)]  # a reduced draft vocabulary is another line
    for i, (nodes, threshold, cost, factor, vocab) in enumerate(grid):
        for r in fixture_rows("t", tasks=["humaneval"], spec_factor=factor, pattern=(nodes // 8, 2, 3)):
            if r["decoder"] == "vanilla":
                if i == 0:
                    rows.append(r)
                continue
            params = {"num_nodes": nodes, "threshold": threshold, "max_depth": 10, "cost_aware": cost,
                      "draft_vocab_size": vocab}
            r.update(params, decoder=f"opt_tree_n{nodes}_t{threshold}_c{cost}_v{vocab}",
                     decoder_params=json.dumps(params, sort_keys=True))
            rows.append(r)
    agg = metrics.aggregate(report.load_rows([write_run(tmp_path / "trees", rows)]))
    fig = plots.accept_length_vs_threshold(agg, subtitle="pair · bfloat16 · cpu")
    assert [t.get_text() for leg in fig.legends for t in leg.get_texts()] == ["opt_tree (nodes=25, draft_vocab_size=0)"]
    assert [list(line.get_xdata()) for line in fig.axes[0].get_lines()] == [[0.3, 0.5, 0.9]]
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["0.3", "0.5", "0.9"]
    assert "threshold" in fig.axes[0].get_xlabel() and "bfloat16" in plots.caption(fig)
    assert_legible(fig, "accept_length_vs_threshold")
    plots.plt.close(fig)
    with caplog.at_level(logging.INFO, logger="plots"):
        assert plots.accept_length_vs_threshold(agg[agg["threshold"].ne(0.3) & agg["threshold"].ne(0.9)]) is None
    assert "accept_length_vs_threshold skipped" in caplog.text


def test_legends_print_integers_and_colours_do_not_repeat(tmp_path):
    # a lookahead sweep over window_size with two ngram_size values: the legend must say ngram_size=3
    runs = []
    for i, (w, n) in enumerate([(4, 3), (8, 3), (4, 4), (8, 4)]):
        rows = fixture_rows(str(i), tasks=["humaneval"], lookahead_scope="sample")
        for r in rows:
            if r["decoder"] == "lookahead":
                params = {"window_size": w, "ngram_size": n, "guess_set_size": w, "pool_scope": "sample"}
                r.update(params, decoder_params=json.dumps(params, sort_keys=True))
        runs.append(write_run(tmp_path / "sweep" / str(i), rows))
    rows = report.load_rows([tmp_path / "sweep"])
    agg = metrics.aggregate(rows)
    fig = plots.tokens_per_s_vs_param(agg, grouping.swept_params(rows), subtitle="s")
    texts = [t.get_text() for leg in fig.legends for t in leg.get_texts()]
    assert "lookahead (ngram_size=3)" in texts and not any(".0" in t for t in texts)
    plots.plt.close(fig)
    colours = plots.palette(25)
    assert len(set(colours)) == 25 and len(set(plots.palette(12))) == 12


# ------------------------------------------------------------------------------------------------ Spec-Bench
def test_spec_bench_round_trip(tmp_path):
    from harness.exchange.specbench import export_answers, import_answers, spec_bench_speed

    rows = fixture_rows("sb", tasks=["mt_bench"], n=4, turns=2, repeats=2, jitter=0.03, divergent=[2],
                        categories=["writing", "math"])
    run = write_run(tmp_path / "run", rows)
    ours = report.load_rows([run])
    files = export_answers(ours, tmp_path / "answers")
    assert sorted(f.name for f in files) == ["target-7b-speculative-float32-temp-0.0.jsonl",
                                             "target-7b-vanilla-float32-temp-0.0.jsonl"]
    line = json.loads(files[0].read_text().splitlines()[0])
    assert {"question_id", "category", "answer_id", "model_id", "choices", "tstamp"} <= set(line)
    assert line["question_id"] == 0 and line["category"] == "writing"
    choice = line["choices"][0]
    assert {"index", "turns", "decoding_steps", "new_tokens", "wall_time", "accept_lengths"} <= set(choice)
    assert len(line["choices"]) == 2 and len(choice["turns"]) == 2
    # Spec-Bench's speed.py formulas read them (tokens/s per question = sum tokens / sum time, tau = mean)
    spec_file = next(f for f in files if "speculative" in f.name)
    base_file = next(f for f in files if "vanilla" in f.name)
    sb = spec_bench_speed(spec_file, base_file)
    assert sb["mean_accept_length"] == pytest.approx(28 / 9)
    assert sb["speedup"] == pytest.approx(2.0, rel=0.1)
    # import: the same aggregate as the original rows
    back = import_answers([tmp_path / "answers"])
    a = metrics.aggregate(ours).set_index("label")
    b = metrics.aggregate(grouping.prepare(back)).set_index("label")
    for col in ("samples", "rows", "replicates", "tokens_per_s", "speedup", "speedup_total",
                "accept_length", "equal_to_vanilla"):
        assert b.loc["speculative", col] == pytest.approx(a.loc["speculative", col]), col
    assert b.loc["speculative", "divergent_samples"] == ["mt_bench/2"]
    # and our report puts them beside our own run as a separate group
    written = report.write_report([run], tmp_path / "rep", spec_bench=[tmp_path / "answers"])
    main = pd.read_csv(written["main.csv"])
    assert main["group"].nunique() == 2 and any("spec_bench_import" in g for g in main["group"])


def test_spec_bench_foreign_answer_files_import(tmp_path):
    from harness.exchange.specbench import import_answers

    def answer(qid, mid, text, tokens, seconds, steps):
        return json.dumps({"question_id": qid, "category": "qa", "answer_id": "x", "model_id": mid, "tstamp": 0.0,
                           "choices": [{"index": 0, "turns": [text], "decoding_steps": [steps],
                                        "new_tokens": [tokens], "wall_time": [seconds],
                                        "accept_lengths": [tokens / steps] * steps}]}) + "\n"

    d = tmp_path / "model_answer"
    d.mkdir()
    (d / "vicuna-7b-vanilla-float16-temp-0.0.jsonl").write_text(
        answer(1, "vicuna-7b-vanilla-float16-temp-0.0", "a", 100, 10.0, 100)
        + answer(2, "vicuna-7b-vanilla-float16-temp-0.0", "b", 50, 5.0, 50))
    (d / "vicuna-7b-sps-68m-float16-temp-0.0.jsonl").write_text(
        answer(1, "vicuna-7b-sps-68m-float16-temp-0.0", "a", 100, 4.0, 25)
        + answer(2, "vicuna-7b-sps-68m-float16-temp-0.0", "c", 50, 2.5, 25))
    rows = import_answers([d])
    agg = metrics.aggregate(grouping.prepare(rows)).set_index("decoder")
    sps = agg.loc["vicuna-7b-sps-68m-float16-temp-0.0"]
    assert sps["speedup"] == pytest.approx((2.5 + 2.0) / 2)
    assert sps["accept_length"] == pytest.approx(150 / 50)
    assert sps["equal_to_vanilla"] == 0.5 and sps["dtype"] == "float16"
    with pytest.raises(ValueError, match="baseline"):
        import_answers([d / "vicuna-7b-sps-68m-float16-temp-0.0.jsonl"])


# ------------------------------------------------------------------------------------------------ CLI, layering
def test_report_cli(sweep, tmp_path, capsys):
    assert report.main([str(sweep), "--out", str(tmp_path / "cli"), "--cost-ratio", "0.2"]) == 0
    assert "speculative (gamma=8)" in capsys.readouterr().out
    theory = pd.read_csv(tmp_path / "cli" / "theory.csv")
    assert set(theory["cost_ratio"].dropna()) == {0.2}
    assert report.main([str(tmp_path / "nothing-here")]) == 2


def test_resumed_folder_pairs_across_processes_and_counts_cells_once(tmp_path):
    # A resumed run: vanilla of sample 1 written by the first process (run_id a), the rest by the second
    # (run_id b), plus a retried error row: every cell counts once and pairs with its vanilla.
    rows = fixture_rows("a", tasks=["t"], n=2)
    for r in rows[2:]:
        r["run_id"] = "b"
    err = dict(rows[3], status="error", tokens_per_s=None)
    write_run(tmp_path / "run", rows[:3] + [err] + rows[3:])
    agg = metrics.aggregate(report.load_rows([tmp_path / "run"])).set_index("label")
    assert agg.loc["speculative", "rows"] == 2 and agg.loc["speculative", "failed"] == 0
    assert agg.loc["speculative", "speedup"] == pytest.approx(2.0)


def test_acceptance_per_position_docstring_example():
    """The docstring's example; a tree (16 nodes, accepted paths of depth <= 10) is left out: its "positions"
    past the depth would read as acceptance 0, an artefact of treating nodes as a line."""
    rows = pd.DataFrame({"label": ["x", "tree"], "decoder": ["speculative", "opt_tree"], "status": ["ok", "ok"],
                         "draft_shape": ["chain", "tree"], "accepted_per_step": [[2, 0, 4], [10, 9]],
                         "drafted_per_step": [[4, 4, 4], [16, 16]]})
    table = figdata.acceptance_per_position(rows)
    assert set(table["label"]) == {"x"}
    t = table.set_index("position")
    assert t.loc[0, "rate"] == pytest.approx(2 / 3)
    assert t.loc[2, "rate"] == pytest.approx(1 / 3)
    assert t.loc[2, "conditional"] == pytest.approx(1 / 2)
    assert list(t["drafted"]) == [3, 3, 3, 3]


def test_warm_vs_cold_pairs_configs_that_differ_only_in_pool_scope():
    def params(scope, w=8):
        return json.dumps({"window_size": w, "ngram_size": 3, "pool_scope": scope}, sort_keys=True)

    rows = pd.DataFrame({
        "decoder": ["vanilla", "lookahead", "lookahead_w8n3g8_warm", "la_w4", "la_w4_warm", "ouroboros"],
        "decoder_params": ["{}", params("sample"), params("task"), params("sample", 4), params("task", 4),
                           params("sample", 2)],
        "pool_scope": [None, "sample", "task", "sample", "task", "sample"],
    })
    names = figdata.scope_free_names(rows)
    assert names["lookahead"] == names["lookahead_w8n3g8_warm"] == "lookahead"  # named after the cold one
    assert names["la_w4"] == names["la_w4_warm"] == "la_w4"
    assert names["ouroboros"] == "ouroboros" and names["vanilla"] == "vanilla"


def test_warm_vs_cold_never_merges_twins_of_one_scope():
    # Reproducer: two decoders with identical settings and the same pool_scope (a tuned copy of a config) were
    # given one name, so the warm-vs-cold figure pooled two runs into one bar.
    same = json.dumps({"window_size": 8, "ngram_size": 3, "pool_scope": "sample"}, sort_keys=True)
    warm = json.dumps({"window_size": 8, "ngram_size": 3, "pool_scope": "task"}, sort_keys=True)
    rows = pd.DataFrame({"decoder": ["lookahead", "lookahead_tuned", "lookahead_tuned_warm"],
                         "decoder_params": [same, same, warm], "pool_scope": ["sample", "sample", "task"]})
    names = figdata.scope_free_names(rows)
    assert names == {"lookahead": "lookahead", "lookahead_tuned": "lookahead_tuned",
                     "lookahead_tuned_warm": "lookahead_tuned"}
    twins = pd.DataFrame({"decoder": ["a", "b"], "decoder_params": [same, same], "pool_scope": ["sample", "sample"]})
    assert figdata.scope_free_names(twins) == {"a": "a", "b": "b"}
    order = pd.DataFrame({"decoder": ["a", "b", "c_hot", "d_hot"], "decoder_params": [same, same, warm, warm],
                          "pool_scope": ["sample", "sample", "task", "task"]})
    assert figdata.scope_free_names(order) == {"a": "a", "b": "b", "c_hot": "a", "d_hot": "b"}


def test_report_and_plots_never_import_torch_decoders_or_tasks(sweep, tmp_path):
    code = f"""
import sys
import plots
assert not [m for m in sys.modules if m.split('.')[0] == 'harness'], 'plots imports the harness'
from harness.report.build import write_report
from harness.regress.cells import summarize_cells
import harness.job.callbacks, harness.exchange.specbench
write_report([{str(sweep)!r}], {str(tmp_path / 'r')!r}, plots=True)
summarize_cells([{str(sweep)!r}])
# the decoders' own declarations (decoders/columns.py: columns, decoders/settings.py: settings and their
# defaults, for labels) are torch-free and read by the rows layer
declared = {'decoders', 'decoders.columns', 'decoders.settings'}
bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'decoders', 'transformers', 'tasks')
             and m not in declared)
assert not bad, bad
print('clean')
"""
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr
    assert "clean" in res.stdout
    assert (tmp_path / "r" / "figures" / "speedup_by_task.pdf").is_file()


def _imports(folder: Path) -> dict[str, set[str]]:
    out = {}
    for path in folder.rglob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        out[str(path.relative_to(ROOT))] = names
    return out


def test_layers_read_bottom_up():
    # Before: report and plots imported each other; harness/ must be imported by nothing below it.
    for layer in ("decoders", "tasks", "plots"):
        for path, names in _imports(ROOT / layer).items():
            assert not [n for n in names if n.split(".")[0] == "harness"], f"{path} imports the harness"
    report_imports = _imports(ROOT / "harness")["harness/report/build.py"]
    assert "plots" in report_imports or any(n.startswith("plots") for n in report_imports) or \
        "import plots" in (ROOT / "harness" / "report.py").read_text()
    assert not (ROOT / "plots" / "make_all.py").exists()  # the figures are drawn by the report


def test_every_sweep_gets_the_report_callback():
    from hydra import compose, initialize_config_dir

    from harness.job.app import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["model=tiny-random"], return_hydra_config=True)
    assert cfg.hydra.callbacks.report._target_ == "harness.job.callbacks.ReportCallback"


# ------------------------------------------------------------------------------------------------ merged pieces
# The runner, the report and the gate as one whole (report2): rows written by the real runner on tiny random
# models, and fixture rows for the numbers that need known answers.
_runner = real_run


def test_real_runner_rows_carry_what_metrics_reads(tmp_path, monkeypatch):
    # Reproducer: metrics read load_avg_1m_before/after and cpu_count while the runner writes load_1m_before/
    # after and cpu_affinity, so the report of a loaded run had no load warning and no load_max; the
    # summary's samples column did not say rows and repeats apart.
    import harness.job.runner

    monkeypatch.setattr(harness.job.runner.os, "getloadavg", lambda: (64.0, 8.0, 2.0))
    run = _runner(tmp_path / "run", "runner.repeats=2")
    summary = pd.read_csv(run / "summary.csv").set_index("label")
    spec = summary.loc["speculative"]
    assert (spec["samples"], spec["rows"], spec["repeats"], spec["replicates"]) == (2, 4, 2, 2)
    assert spec["load_max"] == 64.0 and spec["rows_over_load"] == 4
    assert spec["paired_across_processes"] == 0 and spec["equality_check"] == "exact"
    for col in ("decode_speedup", "ttft_s", "tpot_s", "tpot_s_p50", "prefill_share", "peak_memory_mb", "run_identity"):
        assert col in summary and not pd.isna(spec[col]), col
    assert pd.isna(spec["tpot_s_p90"])  # 4 rows: a p90 would only be the largest (10 rows needed)
    assert "decode_speedup_low" in summary and pd.isna(spec["decode_speedup_low"])  # 2 samples: n too small
    assert 0 < spec["prefill_share"] < 1
    md = (run / "summary.md").read_text()
    assert "| rows | repeats |" in md and "decode_speedup" in md and "machine load" in md
    written = report.write_report([run], tmp_path / "rep")
    rep = written["report.md"].read_text()
    assert "machine load" in rep and "64.0" in rep                    # the same warning as the summary's
    line = next(w for w in md.splitlines() if "machine load" in w)
    assert line.lstrip("- ") in rep
    main = (tmp_path / "rep" / "main.md").read_text()
    assert "decode speedup" in main and "TTFT ms" in main and "prefill" in main
    # 2 samples: no row has an interval, so no header claims one and no cell says why
    assert "[95% CI]" not in main and "n too small" not in main
    tex = (tmp_path / "rep" / "main.tex").read_text()
    assert "\\label{tab:main:rep}" in tex and "Measured: " in tex and "at most" in tex and "no interval" in tex
    theory = (tmp_path / "rep" / "theory.tex").read_text()
    assert r"$E[\tau] = (1 - \alpha^{\gamma+1}) / (1 - \alpha)$" in theory and r"\^{}" not in theory


def test_real_shards_merge_and_other_settings_never_pool(tmp_path):
    # Shards of one run_identity merge in the report (same counters as the unsharded run); a run that differs
    # in a setting no row column shows (here runner.warmup) is another group, never pooled; the two jobs of a
    # gamma sweep are one group told apart by their labels.
    args = ("task.limit=3", "decoder=[vanilla,speculative,prompt_lookup]")
    whole = _runner(tmp_path / "whole", *args)
    _runner(tmp_path / "shards" / "0", *args, "runner.shard=0/2")
    _runner(tmp_path / "shards" / "1", *args, "runner.shard=1/2")
    merged = metrics.aggregate(report.load_rows([tmp_path / "shards"])).set_index("label")
    alone = metrics.aggregate(report.load_rows([whole])).set_index("label")
    assert merged["group"].nunique() == 1
    assert list(merged.index) == list(alone.index) == ["vanilla", "speculative", "prompt_lookup"]
    for col in ("samples", "rows", "accept_length", "acceptance_rate", "equal_to_vanilla", "replicates"):
        pd.testing.assert_series_equal(merged[col], alone[col], check_names=False, obj=col)
    ok = report.load_rows([tmp_path / "shards"])
    ok_whole = report.load_rows([whole])
    for label in merged.index:
        a = metrics.counters(ok[ok["label"] == label])
        b = metrics.counters(ok_whole[ok_whole["label"] == label])
        assert a == b, label
    other = _runner(tmp_path / "other", *args, "runner.warmup=0")
    both = metrics.aggregate(report.load_rows([whole, other]))
    assert both["group"].nunique() == 2 and len(both) == 6               # never pooled
    assert sorted(set(both["group"])) == [                               # named by the setting that differs
        "humaneval: tiny-random-qwen2 / tiny-random-llama [runner.warmup=0]",
        "humaneval: tiny-random-qwen2 / tiny-random-llama [runner.warmup=1]"]
    pooled = metrics.aggregate(report.load_rows([whole, other], pool=True))
    assert pooled["group"].nunique() == 1 and len(pooled) == 3
    for gamma in (1, 2):
        _runner(tmp_path / "sweep" / str(gamma), f"decoder.speculative.gamma={gamma}")
    sweep = metrics.aggregate(report.load_rows([tmp_path / "sweep"]))
    assert sweep["group"].nunique() == 1
    assert list(sweep["label"]) == ["vanilla (gamma=1)", "vanilla (gamma=2)", "speculative (gamma=1)",
                                    "speculative (gamma=2)"]
    assert int(sweep.set_index("label").loc["vanilla (gamma=2)", "rows"]) == 2   # each job's vanilla, its own row


def test_real_sampled_runs_over_seeds_are_one_row_per_decoder(tmp_path):
    # Before: runs that differ only in runner.seed are one group (one row per decoder),
    # equality is n/a (never divergent), speedups stay paired within each seed's run.
    for seed in (0, 1, 2):
        _runner(tmp_path / "seeds" / str(seed), "runner.temperature=0.7", f"runner.seed={seed}")
    rows = report.load_rows([tmp_path / "seeds"])
    assert rows["run_identity"].nunique() == 3 and rows["group_identity"].nunique() == 1
    agg = metrics.aggregate(rows).set_index("label")
    spec = agg.loc["speculative"]
    assert (spec["samples"], spec["rows"], spec["seeds"], spec["replicates"]) == (2, 6, 3, 3)
    assert spec["equality_check"] == "n/a (sampled)" and pd.isna(spec["equal_to_vanilla"])
    assert spec["divergent_samples"] == []
    assert "temperature=0.7" not in agg["group"].iloc[0]                 # nothing else to tell apart
    paired = metrics.paired_speedups(rows)
    assert paired["speedup"].notna().all()
    # each speculative row is paired with the vanilla row of its own seed's run
    assert (paired.groupby(["run_id", "sample_id"])["sampling_seed"].nunique() == 1).all()
    written = report.write_report([tmp_path / "seeds"], tmp_path / "rep")
    main = written["main.md"].read_text().splitlines()
    spec_line = next(line for line in main if line.startswith("| speculative"))
    assert "| n/a |" in spec_line and "| seeds |" in main[0]
    # beside a greedy run of the same setting: another group, labelled by the temperature
    _runner(tmp_path / "greedy")
    both = metrics.aggregate(report.load_rows([tmp_path / "seeds", tmp_path / "greedy"]))
    assert both["group"].nunique() == 2 and any("temperature=0.7" in g for g in both["group"])
    assert any("temperature=0" in g and "0.7" not in g for g in both["group"])


# --- fixture rows: known answers
def test_sampled_rows_say_na_and_are_never_divergent(tmp_path):
    # Reproducer: sampled rows carry matches_vanilla=null; metrics listed every sampled sample as divergent
    # (fillna(False)) and counted repeats that draw different tokens as disagreeing.
    rows = fixture_rows("s", tasks=["humaneval"], temperature=0.7, repeats=2)
    for r in rows:  # the second draw of each sample took one more step (different tokens)
        if r["decoder"] == "speculative" and r["repeat"] == 1:
            r["num_steps"] += 1
    run = write_run(tmp_path / "run", rows)
    summary = metrics.summarize(read_results([run])).set_index("label")
    spec = summary.loc["speculative"]
    assert spec["equality_check"] == "n/a (sampled)" and pd.isna(spec["equal_to_vanilla"])
    agg = metrics.aggregate(report.load_rows([run])).set_index("label")
    assert agg.loc["speculative", "divergent_samples"] == []
    md = tables.to_markdown(summary.reset_index())
    assert next(line for line in md.splitlines() if line.startswith("| speculative")).rstrip(" |").endswith("n/a")
    c = metrics.counters(report.load_rows([run]).query("label == 'speculative'"))
    assert c["inconsistent_samples"] == [] and c["totals"]["num_steps"] == 8 * 9 + 4


def test_quality_over_seeds_has_a_t_interval_and_speedup_stays_paired(tmp_path):
    # three seeds, accuracy 0.25 / 0.5 / 0.75 over 4 samples; each seed's run has its own vanilla speed
    for seed, acc, vf in ((0, 0.25, 1.0), (1, 0.5, 1.5), (2, 0.75, 0.7)):
        rows = fixture_rows(f"r{seed}", tasks=["gsm8k"], temperature=0.7, sampling_seed=seed, vanilla_factor=vf)
        for r in rows:
            r["accuracy"] = float(int(r["sample_id"].rsplit("/", 1)[1]) < round(acc * 4))
        write_run(tmp_path / "seeds" / str(seed), rows)
    agg = metrics.aggregate(report.load_rows([tmp_path / "seeds"])).set_index("label")
    spec = agg.loc["speculative"]
    assert agg["group"].nunique() == 1 and spec["seeds"] == 3 and spec["samples"] == 4 and spec["rows"] == 12
    assert spec["speedup"] == pytest.approx(2.0) and math.isnan(spec["speedup_high"])  # paired per run; n = 4
    half = 4.302653 * 0.25 / math.sqrt(3)                              # t(0.975, 2) x sd / sqrt(n)
    assert spec["accuracy"] == pytest.approx(0.5)
    assert 0.5 + half > 1.0  # the raw t-interval leaves [0, 1]; an accuracy's interval is clipped to it
    assert (spec["accuracy_low"], spec["accuracy_high"]) == (0.0, 1.0)
    assert spec["accuracy_seed_std"] == pytest.approx(0.25)
    report.write_report([tmp_path / "seeds"], tmp_path / "rep")
    main = (tmp_path / "rep" / "main.md").read_text()
    assert "0.50 [0.00, 1.00]" in main and "seeds" in main
    assert "Student-t interval over seeds" in (tmp_path / "rep" / "report.md").read_text()


def test_quality_interval_over_seeds_unclipped_when_inside_the_unit_range(tmp_path):
    for seed, acc in ((0, 0.5), (1, 0.5), (2, 0.75)):
        rows = fixture_rows(f"r{seed}", tasks=["gsm8k"], temperature=0.7, sampling_seed=seed)
        for r in rows:
            r["accuracy"] = float(int(r["sample_id"].rsplit("/", 1)[1]) < round(acc * 4))
        write_run(tmp_path / "seeds" / str(seed), rows)
    spec = metrics.aggregate(report.load_rows([tmp_path / "seeds"])).set_index("label").loc["speculative"]
    mean, sd = 1.75 / 3, math.sqrt(((0.5 - 1.75 / 3) ** 2 * 2 + (0.75 - 1.75 / 3) ** 2) / 2)
    half = 4.302653 * sd / math.sqrt(3)
    assert 0.0 < mean - half and mean + half < 1.0
    assert (spec["accuracy_low"], spec["accuracy_high"]) == (pytest.approx(mean - half), pytest.approx(mean + half))


def test_t_quantile_matches_tables():
    for dof, q in ((1, 12.706), (2, 4.303), (4, 2.776), (10, 2.228), (30, 2.042)):
        assert stats.t_quantile(0.975, dof) == pytest.approx(q, abs=1e-3)
    assert stats.t_quantile(0.95, 5) == pytest.approx(2.015, abs=1e-3)


def test_decode_speedup_ttft_and_prefill_share(tmp_path):
    # Before: a prefill of 40 % of vanilla's wall time, the same for every decoder; speculative is 2x
    # end to end, so its decode-only speedup is larger: (w_v - t) / (w_s - t) per sample.
    rows = fixture_rows("p", tasks=["humaneval"], ttft_share=0.4)
    for r in rows:  # the draft's prefill timed (zero here): rows that predate its timing get no decode figures
        r["draft_prefill_s"] = 0.0 if r["decoder"] != "vanilla" else None
    run = write_run(tmp_path / "run", rows)
    summary = metrics.summarize(read_results([run])).set_index("label")
    spec, van = summary.loc["speculative"], summary.loc["vanilla"]
    by = {(r["sample_id"], r["decoder"]): r for r in rows}
    ratios = [by[(s, "speculative")]["decode_tokens_per_s"] / by[(s, "vanilla")]["decode_tokens_per_s"]
              for s, d in by if d == "vanilla"]
    assert ratios[0] == pytest.approx((1 - 0.4) / (0.5 - 0.4))          # 6x once the prompt is in
    assert spec["decode_speedup"] == pytest.approx(np.mean(ratios)) and spec["speedup"] == pytest.approx(2.0)
    assert van["decode_speedup"] == pytest.approx(1.0)
    assert spec["prefill_share"] == pytest.approx(0.8) and van["prefill_share"] == pytest.approx(0.4)
    assert spec["ttft_s"] == pytest.approx(van["ttft_s"])
    assert math.isnan(spec["decode_speedup_low"])  # 4 samples: too few for an interval
    written = report.write_report([run], tmp_path / "rep", plots=True, only=["time_breakdown"])
    tex = (tmp_path / "rep" / "main.tex").read_text()
    # samples, speedup, tau, alpha, eq. (tok/s, decode speedup, TTFT, TPOT, prefill, settings: main.md only)
    assert re.search(r"\\begin\{tabular\}\{l(r+)\}", tex).group(1) == "r" * 5
    assert len(_tex_rows(tex)) == 2
    assert "figures/time_breakdown.png" in written
    bd = figdata.time_breakdown(report.load_rows([run])).set_index("label")
    assert bd.loc["speculative", "prefill_ms"] > 0 and bd.loc["vanilla", "decode_ms"] > 0


def test_time_breakdown_docstring_example():
    rows = pd.DataFrame({"group": ["g", "g"], "label": ["a", "b"], "status": ["ok", "ok"], "new_tokens": [10, 10],
                         "wall_time_s": [1.0, 1.0], "ttft_s": [0.2, 0.2], "draft_time_s": [None, 0.3],
                         "verify_time_s": [None, 0.6]})
    bd = figdata.time_breakdown(rows).set_index("label")
    assert bd.loc["a", ["prefill_ms", "draft_ms", "verify_ms", "decode_ms", "other_ms"]].tolist() == \
        pytest.approx([20, 0, 0, 80, 0])
    assert bd.loc["b", ["prefill_ms", "draft_ms", "verify_ms", "decode_ms", "other_ms"]].tolist() == \
        pytest.approx([20, 30, 40, 0, 10])


def test_cross_process_pairs_are_counted_by_metrics(tmp_path):
    # Item 11.1's flag, counted in summary.csv by the one aggregation (the runner only adds "interrupted")
    rows = fixture_rows("x", tasks=["t"], n=3)
    spec = [r for r in rows if r["decoder"] == "speculative"]
    spec[0]["attempt_id"] = "later"                                    # resumed in another process
    spec[1]["paired_across_processes"] = True                          # flagged by the runner
    summary = metrics.summarize(read_results([write_run(tmp_path / "run", rows)])).set_index("label")
    assert summary.loc["speculative", "paired_across_processes"] == 2
    assert summary.loc["vanilla", "paired_across_processes"] == 0
    assert any("2 of 3 rows are paired with a vanilla row measured in another process" in w
               for w in summary.attrs["warnings"])


def test_load_of_older_rows_is_read_too(tmp_path):
    rows = fixture_rows("old", tasks=["t"])
    for r in rows:
        r.update(load_avg_1m_before=9.0, load_avg_1m_after=9.0, cpu_count=4)   # names before the runner merge
    summary = metrics.summarize(read_results([write_run(tmp_path / "run", rows)]))
    assert summary["load_max"].tolist() == [9.0, 9.0]
    assert any("machine load" in w and "4 usable cores" in w for w in summary.attrs["warnings"])
    # the usable cores (cpu_affinity) win over the cores present
    quiet = fixture_rows("q", tasks=["t"], load=3.0, cpu_count=4)
    for r in quiet:
        r["cpu_affinity"] = 2
    assert metrics.summarize(read_results([write_run(tmp_path / "q", quiet)])).attrs["warnings"]


def test_shards_add_no_replicates(tmp_path):
    rows = fixture_rows("s", tasks=["humaneval"], n=4, repeats=2, jitter=0.02)
    write_run(tmp_path / "sh" / "0", [r for r in rows if r["sample_id"] in ("humaneval/0", "humaneval/2")])
    write_run(tmp_path / "sh" / "1", [r for r in rows if r["sample_id"] in ("humaneval/1", "humaneval/3")])
    agg = metrics.aggregate(report.load_rows([tmp_path / "sh"])).set_index("label")
    assert agg.loc["speculative", "replicates"] == 2 and agg.loc["speculative", "repeats"] == 2


def test_spec_bench_export_of_sampled_seeds(tmp_path):
    from harness.exchange.specbench import export_answers, import_answers

    for seed in (0, 1):
        write_run(tmp_path / "seeds" / str(seed), fixture_rows(f"r{seed}", tasks=["mt_bench"], n=2,
                                                               temperature=0.7, sampling_seed=seed))
    files = export_answers(report.load_rows([tmp_path / "seeds"]), tmp_path / "answers")
    assert sorted(f.name for f in files) == ["target-7b-speculative-float32-temp-0.7.jsonl",
                                             "target-7b-vanilla-float32-temp-0.7.jsonl"]
    line = json.loads(files[0].read_text().splitlines()[0])
    assert len(line["choices"]) == 2 and len(line["choices"][0]["turns"]) == 1   # one choice per seed's run
    back = metrics.aggregate(grouping.prepare(import_answers([tmp_path / "answers"]))).set_index("label")
    assert back.loc["speculative", "seeds"] == 2 and back.loc["speculative", "speedup"] == pytest.approx(2.0)
    assert back.loc["speculative", "equality_check"] == "n/a (sampled)"


def test_rows_without_the_columns_the_numbers_come_from_are_refused(tmp_path):
    # A column the aggregation reads but no row has must not print as a number (before: prepare() filled
    # wall_time_s with NaN and the summary showed speedup_total and accept_length from nothing). Read from a
    # file such rows are left out (read_results, with a warning); a frame built otherwise is refused.
    rows = fixture_rows("m", tasks=["t"])
    for r in rows:
        del r["wall_time_s"]
    read = read_results([write_run(tmp_path / "a", rows)])
    assert (read["status"] == "invalid").all() and "wall_time_s" not in read  # cells kept, as not measured
    assert "lacks wall_time_s" in read.attrs["warnings"][0]
    with pytest.raises(ValueError, match=r"wall_time_s \(no such column\)"):
        metrics.summarize(pd.DataFrame(rows))
    rows = fixture_rows("n", tasks=["t"])
    rows[1]["num_steps"] = None
    assert (read_results([write_run(tmp_path / "b", rows)])["status"] == "ok").sum() == 7
    with pytest.raises(ValueError, match=r"num_steps \(null in 1 of 8 ok rows\)"):
        metrics.aggregate(pd.DataFrame(rows))
    rows = fixture_rows("o", tasks=["t"])
    rows[1]["tokens_per_s"] = None                                    # a call of no measurable time: left out
    assert metrics.aggregate(read_results([write_run(tmp_path / "c", rows)])).set_index("label").loc[
        "speculative", "rows"] == 4


def test_a_quality_score_missing_in_some_rows_is_said(tmp_path):
    rows = fixture_rows("q", tasks=["gsm8k"], scores=["accuracy"])
    spec = [r for r in rows if r["decoder"] == "speculative"]
    del spec[0]["accuracy"]
    spec[0]["score_error"] = "boom"
    summary = metrics.summarize(read_results([write_run(tmp_path / "run", rows)]), ["accuracy"])
    assert any("accuracy is missing in 1 of 4 rows" in w for w in summary.attrs["warnings"])


def test_a_sweeps_vanilla_rows_are_one_per_job_named_by_its_setting(tmp_path):
    """A sweep's jobs each measure their own vanilla, and each decoder's speedup is paired with its own job's: the
    report keeps one vanilla row per job, named by the setting that tells the job apart, each holding that job's
    tok/s (a pooled row would hold tok/s no speedup was computed from)."""
    for job, (gamma, factor) in enumerate([(2, 1.0), (12, 2.0), (4, 3.0)]):
        write_run(tmp_path / "sweep" / str(job), fixture_rows(f"r{job}", tasks=["t"], gamma=gamma,
                                                              vanilla_factor=factor))
    agg = metrics.aggregate(report.load_rows([tmp_path / "sweep"]))
    vanilla = agg[agg["decoder"] == "vanilla"].set_index("label")
    assert list(vanilla.index) == ["vanilla (gamma=2)", "vanilla (gamma=4)", "vanilla (gamma=12)"]  # in order
    for job, label in enumerate(["vanilla (gamma=2)", "vanilla (gamma=12)", "vanilla (gamma=4)"]):
        alone = metrics.aggregate(report.load_rows([tmp_path / "sweep" / str(job)]))
        assert vanilla.loc[label, "tokens_per_s"] == pytest.approx(
            alone.loc[alone["decoder"] == "vanilla", "tokens_per_s"].item())
        assert alone.loc[alone["decoder"] == "vanilla", "label"].item() == "vanilla"  # one run: plain vanilla
    assert not any("pools the vanilla rows" in w for ws in vanilla["warnings"] for w in ws)
    spec = agg[agg["decoder"] == "speculative"].set_index("label")
    assert spec.loc["speculative (gamma=12)", "speedup"] == pytest.approx(
        spec.loc["speculative (gamma=12)", "tokens_per_s"] / vanilla.loc["vanilla (gamma=12)", "tokens_per_s"],
        rel=0.05)


def test_a_vanilla_row_pooled_over_runs_no_setting_tells_apart_says_so(tmp_path):
    """Two runs of the same settings in one report: one vanilla row pools them, and says that each decoder was
    paired with its own run's vanilla (tok/s ratios against the pooled row are not the speedups)."""
    write_run(tmp_path / "runs" / "a", fixture_rows("a", tasks=["t"], vanilla_factor=1.0))
    write_run(tmp_path / "runs" / "b", fixture_rows("b", tasks=["t"], vanilla_factor=2.0))
    agg = metrics.aggregate(report.load_rows([tmp_path / "runs"]))
    assert agg.loc[agg["decoder"] == "vanilla", "label"].tolist() == ["vanilla"]
    warnings = agg.loc[agg["decoder"] == "vanilla", "warnings"].item()
    assert any("pools the vanilla rows of 2 runs that no decoder setting tells apart" in w for w in warnings)
