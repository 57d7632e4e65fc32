"""harness.report and plots: tables and figures from fixture result rows, with known numbers; no torch."""

from __future__ import annotations

import logging
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fixture_rows import fixture_rows, write_run
from harness import report
from plots import acceptance_per_position
from plots.make_all import make_all

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture()
def sweep(tmp_path):
    """A gamma sweep (three job folders) with a warm and a cold lookahead, as a multirun would leave it."""
    write_run(tmp_path / "sweep" / "0", fixture_rows("a", gamma=2, spec_factor=1.6, lookahead_scope="sample"))
    write_run(tmp_path / "sweep" / "1", fixture_rows("b", gamma=4, spec_factor=2.0, divergent=[1],
                                                     lookahead_scope="task", lookahead_factor=1.8))
    write_run(tmp_path / "sweep" / "2", fixture_rows("c", gamma=8, spec_factor=1.7, pattern=(8, 2, 5)))
    return tmp_path / "sweep"


# ------------------------------------------------------------------------------------------------ stats
def test_bootstrap_two_point_case_is_exact():
    # Resampled means of [0, 1] take 0, 1/2, 1 with probabilities 1/4, 1/2, 1/4: the 95 % interval is [0, 1]
    # and the bootstrap standard error is sqrt(1/8).
    ci = report.bootstrap_mean_ci([0.0, 1.0], n_boot=20000, seed=0)
    assert ci["mean"] == 0.5
    assert (ci["low"], ci["high"]) == (0.0, 1.0)
    assert ci["std"] == pytest.approx(math.sqrt(1 / 8), rel=0.03)


def test_bootstrap_matches_normal_theory_and_is_seeded():
    values = np.arange(100, dtype=float)  # sd = 29.01, standard error 2.90
    ci = report.bootstrap_mean_ci(values, n_boot=4000, seed=1)
    se = values.std(ddof=0) / 10
    assert ci["mean"] == pytest.approx(49.5)
    assert ci["std"] == pytest.approx(se, rel=0.08)
    assert ci["low"] == pytest.approx(49.5 - 1.96 * se, abs=0.6)
    assert ci["high"] == pytest.approx(49.5 + 1.96 * se, abs=0.6)
    assert report.bootstrap_mean_ci(values, n_boot=4000, seed=1) == ci
    constant = report.bootstrap_mean_ci([2.0] * 5)
    assert (constant["low"], constant["high"], constant["std"]) == (2.0, 2.0, 0.0)
    single = report.bootstrap_mean_ci([3.0])
    assert single["mean"] == 3.0 and math.isnan(single["low"])


def test_leviathan_formulas_reproduce_worked_numbers():
    # ALGORITHMS.md section 6: alpha=0.8, gamma=4 -> E[tau]=3.36; S=2.80 / 2.40 / 1.87 for c=0.05 / 0.1 / 0.2
    assert report.expected_accept_length(0.8, 4) == pytest.approx(3.3616)
    assert [round(report.theory_speedup(0.8, 4, c), 2) for c in (0.05, 0.1, 0.2)] == [2.80, 2.40, 1.87]
    assert report.expected_accept_length(1.0, 4) == 5.0
    assert report.expected_accept_length(0.0, 4) == 1.0


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
    agg = report.aggregate(report.load_rows([write_run(tmp_path / "run", rows)]))
    spec = agg[agg["decoder"] == "speculative"].iloc[0]
    assert spec["cost_ratio_source"] == "wall-time fit"
    assert spec["cost_ratio"] == pytest.approx(c_true)
    # --cost-ratio wins over any measurement
    agg = report.aggregate(report.load_rows([tmp_path / "run"]), cost_ratio=0.1)
    spec = agg[agg["decoder"] == "speculative"].iloc[0]
    assert spec["cost_ratio_source"] == "option"
    assert spec["theory_speedup"] == pytest.approx(report.theory_speedup(spec["acceptance_rate"], 4, 0.1))


# ------------------------------------------------------------------------------------------------ tables
def test_aggregate_numbers(sweep):
    rows = report.load_rows([sweep])
    agg = report.aggregate(rows).set_index(["task", "label"])
    g4 = agg.loc[("humaneval", "speculative (gamma=4)")]
    # every sample runs exactly 2x vanilla -> speedup 2 with a degenerate interval
    assert g4["speedup"] == pytest.approx(2.0) and g4["speedup_low"] == pytest.approx(2.0)
    assert g4["speedup_high"] == pytest.approx(2.0) and g4["speedup_total"] == pytest.approx(2.0, rel=0.1)
    # pattern (4, 1, 2) over 8 decode steps: accepted 4+1+2+4+1+2+4+1 = 19, drafted 32, emitted 1 + 19 + 8 = 28
    assert g4["accept_length"] == pytest.approx(28 / 9)
    assert g4["acceptance_rate"] == pytest.approx(19 / 32)
    assert g4["equal_to_vanilla"] == pytest.approx(0.75)
    assert g4["divergent_samples"] == ["humaneval/1"]
    # timers: c = (0.3 wall / drafted) / (0.6 wall / steps) = 0.5 * 9 / 32
    assert g4["cost_ratio_source"] == "timers"
    assert g4["cost_ratio"] == pytest.approx(0.5 * 9 / 32)
    assert g4["theory_speedup"] == pytest.approx(
        report.theory_speedup(19 / 32, 4, 0.5 * 9 / 32))
    assert g4["efficiency"] == pytest.approx(2.0 / (28 / 9))
    vanilla = agg.loc[("humaneval", "vanilla")]
    assert vanilla["speedup"] == 1.0 and vanilla["accept_length"] == 1.0 and math.isnan(vanilla["theory_speedup"])
    assert vanilla["samples"] == 12  # three jobs x four samples, each paired within its own job
    la = agg.loc[("mbpp", "lookahead (pool_scope=task)")]
    assert la["speedup"] == pytest.approx(1.8) and math.isnan(la["theory_speedup"])


def test_labels_distinguish_swept_configs_only(sweep):
    rows = report.load_rows([sweep])
    assert report.swept_params(rows)["speculative"] == ["gamma"]
    assert set(rows["label"]) == {"vanilla", "speculative (gamma=2)", "speculative (gamma=4)",
                                  "speculative (gamma=8)", "lookahead (pool_scope=sample)",
                                  "lookahead (pool_scope=task)"}
    assert report.ordered_labels(report.aggregate(rows))[:4] == [
        "vanilla", "speculative (gamma=2)", "speculative (gamma=4)", "speculative (gamma=8)"]


def test_write_report_files_and_layout(sweep, tmp_path):
    out = tmp_path / "out"
    written = report.write_report([sweep], out)
    for name in ("main.md", "main.tex", "main.csv", "theory.md", "theory.tex", "theory.csv", "detail.csv",
                 "report.md"):
        assert (out / name).is_file() and name in written
    main = pd.read_csv(out / "main.csv")
    assert list(main["task"]) == ["humaneval", "mbpp"]  # rows: task x model pair
    assert main.loc[0, "speculative (gamma=4)|speedup"] == pytest.approx(2.0)
    assert main.loc[1, "speculative (gamma=2)|speedup"] == pytest.approx(1.6)
    assert main.loc[0, "speculative (gamma=4)|equal_to_vanilla"] == pytest.approx(0.75)
    md = (out / "main.md").read_text()
    assert "speculative (gamma=4) / speedup" in md and "2.00 [2.00, 2.00]" in md
    tex = (out / "main.tex").read_text()
    assert r"\multicolumn{4}{c}{speculative (gamma=4)}" in tex and r"\toprule" in tex
    assert r"lookahead (pool\_scope=task)" in tex  # escaped
    theory = pd.read_csv(out / "theory.csv")
    assert {"theory_speedup", "efficiency", "cost_ratio", "acceptance_rate"} <= set(theory.columns)
    assert "Leviathan" in (out / "report.md").read_text()


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
    agg = report.aggregate(report.load_rows([tmp_path / "run"])).set_index("label")
    assert agg.loc["speculative", "samples"] == 2 and agg.loc["speculative", "failed"] == 0
    assert agg.loc["speculative", "speedup"] == pytest.approx(2.0)


# ------------------------------------------------------------------------------------------------ plots
def test_acceptance_per_position_docstring_example():
    rows = pd.DataFrame({"label": ["x"], "status": ["ok"], "accepted_per_step": [[2, 0, 4]],
                         "drafted_per_step": [[4, 4, 4]]})
    t = acceptance_per_position(rows).set_index("position")
    assert t.loc[0, "rate"] == pytest.approx(2 / 3)
    assert t.loc[2, "rate"] == pytest.approx(1 / 3)
    assert t.loc[2, "conditional"] == pytest.approx(1 / 2)
    assert list(t["drafted"]) == [3, 3, 3, 3]


def test_make_all_draws_every_figure(sweep, tmp_path):
    written = make_all([sweep], tmp_path / "figs")
    assert set(written) == {"speedup_by_task", "accept_length", "acceptance_by_position",
                            "tokens_per_s_vs_param", "time_breakdown", "warm_vs_cold"}
    for paths in written.values():
        for p in paths:
            assert p.is_file() and p.stat().st_size > 1000
    assert {p.suffix for p in written["speedup_by_task"]} == {".png", ".pdf"}


def test_figures_without_timers_or_pools_are_skipped_with_a_note(tmp_path, caplog):
    run = write_run(tmp_path / "run", fixture_rows("a", timers=False))
    with caplog.at_level(logging.INFO, logger="plots"):
        written = make_all([run], tmp_path / "figs")
    assert "time_breakdown" not in written and "warm_vs_cold" not in written
    assert "tokens_per_s_vs_param" not in written  # nothing swept
    assert "speedup_by_task" in written
    text = caplog.text
    assert "time_breakdown skipped" in text and "warm_vs_cold skipped" in text


def test_report_and_plots_never_import_torch_or_decoders(sweep, tmp_path):
    code = f"""
import sys
from harness.report import write_report
from harness.regress import summarize_cells
from plots.make_all import make_all
import harness.callbacks, harness.resume
write_report([{str(sweep)!r}], {str(tmp_path / 'r')!r})
make_all([{str(sweep)!r}], {str(tmp_path / 'f')!r})
summarize_cells([{str(sweep)!r}])
bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'decoders', 'transformers', 'tasks'))
assert not bad, bad
print('clean')
"""
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "clean" in res.stdout
    assert (tmp_path / "f" / "speedup_by_task.pdf").is_file()


def test_warm_vs_cold_pairs_configs_that_differ_only_in_pool_scope():
    import json

    from plots import _scope_free_names

    def params(scope, w=8):
        return json.dumps({"window_size": w, "ngram_size": 3, "pool_scope": scope}, sort_keys=True)

    rows = pd.DataFrame({
        "decoder": ["vanilla", "lookahead", "lookahead_w8n3g8_warm", "la_w4", "la_w4_warm", "ouroboros"],
        "decoder_params": ["{}", params("sample"), params("task"), params("sample", 4), params("task", 4),
                           params("sample", 2)],
        "pool_scope": [None, "sample", "task", "sample", "task", "sample"],
    })
    names = _scope_free_names(rows)
    assert names["lookahead"] == names["lookahead_w8n3g8_warm"] == "lookahead"  # named after the cold one
    assert names["la_w4"] == names["la_w4_warm"] == "la_w4"
    assert names["ouroboros"] == "ouroboros" and names["vanilla"] == "vanilla"
