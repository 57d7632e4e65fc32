"""Honest statistics: no interval from too few samples, quality with its interval, a flag where lossless decoders
disagree on quality, the theory only where its model holds, decode-only speedup like with like, serving latency
percentiles, configurations named by their settings."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from fixture_rows import fixture_rows, write_run
from harness.report import figdata
from harness.rows import grouping
from harness.rows import metrics
from harness.report import build as report
from harness.rows import stats
from harness.report import tables


def _agg(rows):
    return metrics.aggregate(pd.DataFrame(rows)).set_index("label")


def test_wilson_interval_known_values():
    lo, hi = stats.wilson_interval(9, 10)
    assert (round(lo, 3), round(hi, 3)) == (0.596, 0.982)
    lo, hi = stats.wilson_interval(0, 20)
    assert lo == 0.0 and 0.15 < hi < 0.17
    assert all(math.isnan(v) for v in stats.wilson_interval(2, stats.MIN_INTERVAL_SAMPLES - 1))


def test_no_interval_below_the_minimum_sample_count():
    # Before: a 95% interval over 2 problems printed as [1.64, 1.66]
    few = _agg(fixture_rows("f", tasks=["humaneval"], n=2, jitter=0.01))
    assert math.isnan(few.loc["speculative", "speedup_low"]) and few.loc["speculative", "speedup"] > 1
    enough = _agg(fixture_rows("e", tasks=["humaneval"], n=stats.MIN_INTERVAL_SAMPLES, jitter=0.01))
    assert enough.loc["speculative", "speedup_low"] < enough.loc["speculative", "speedup_high"]
    summary = metrics.summarize(pd.DataFrame(fixture_rows("f", tasks=["humaneval"], n=2)))
    md = tables.to_markdown(summary)
    assert "(n too small)" in md
    assert "(n too small)" in tables.interval_cell(few.reset_index().iloc[1], "speedup")


def test_quality_has_an_interval_and_two_decimals():
    rows = fixture_rows("q", tasks=["humaneval"], n=10, scores=["pass@1"])
    agg = _agg(rows)
    v = agg.loc["vanilla"]
    assert v["pass@1"] == pytest.approx(0.5)
    lo, hi = stats.wilson_interval(5, 10)
    assert (v["pass@1_low"], v["pass@1_high"]) == pytest.approx((lo, hi))
    _, text = report.main_table(agg.reset_index(), ["pass@1"])
    assert text["pass@1"].iloc[0] == f"0.50 [{lo:.2f}, {hi:.2f}]"


def test_lossless_decoders_that_disagree_on_quality_are_flagged():
    rows = fixture_rows("d", tasks=["humaneval"], n=6, scores=["pass@1"], divergent=[1])
    for r in rows:  # the divergent output fails where vanilla passed
        if r["decoder"] == "speculative" and r["sample_id"].endswith("/0"):
            r["pass@1"] = 0.0
    agg = metrics.aggregate(pd.DataFrame(rows))
    spec = agg.set_index("label").loc["speculative"]
    assert any("pass@1 differs from vanilla's on 1 of 6 paired rows" in w for w in spec["warnings"])
    clean = metrics.aggregate(pd.DataFrame(fixture_rows("c", tasks=["humaneval"], n=6, scores=["pass@1"])))
    assert not any("differs from vanilla" in w for ws in clean["warnings"] for w in ws)


def test_theory_only_for_fixed_length_chains():
    rows = fixture_rows("t", tasks=["humaneval"], n=5)
    chain = _agg([{**r, "draft_shape": "none" if r["decoder"] == "vanilla" else "chain"} for r in rows])
    assert chain.loc["speculative", "theory_speedup"] > 0
    dynamic = _agg([{**r, "draft_shape": "dynamic chain"} for r in rows])
    assert math.isnan(dynamic.loc["speculative", "theory_speedup"])
    assert dynamic.loc["speculative", "cost_ratio_source"] == "n/a (draft shape: dynamic chain)"
    legacy = _agg(rows)  # rows without the column: only speculative* counts as a chain
    assert legacy.loc["speculative", "theory_speedup"] > 0


def test_decode_speedup_counts_both_prefills_on_the_prefill_side():
    rows = fixture_rows("p", tasks=["humaneval"], n=5, ttft_share=0.3)
    agg = _agg(rows)
    assert any("predate the timing of the draft's prefill" in w for w in agg.loc["speculative", "warnings"])
    # a known bias is not printed as a number: the decode-only figures of those rows are blank
    assert agg.loc[["speculative"], list(metrics.UNTIMED_PREFILL_BLANKS)].isna().all(axis=None)
    assert agg.loc["vanilla", "decode_speedup"] == pytest.approx(1.0)
    for r in rows:
        r.update(draft_prefill_s=0.1 * r["wall_time_s"] if r["decoder"] != "vanilla" else None,
                 prefill_s=r["ttft_s"] + (0.1 * r["wall_time_s"] if r["decoder"] != "vanilla" else 0.0),
                 tpot_s=(r["wall_time_s"] - r["ttft_s"]) / (r["new_tokens"] - 1), peak_memory_mb=100.0)
    agg = _agg(rows)
    assert not any("predate" in w for w in agg.loc["speculative", "warnings"])
    spec = agg.loc["speculative"]
    tpots = [r["tpot_s"] for r in rows if r["decoder"] == "speculative"]
    assert spec["tpot_s"] == pytest.approx(sum(tpots) / 5)
    assert spec["tpot_s_p50"] == pytest.approx(sorted(tpots)[2]) and spec["decode_speedup"] > 0
    # over 5 rows a p90 or p99 would only be the largest value: not reported (10 and 100 rows needed)
    assert math.isnan(spec["tpot_s_p90"]) and math.isnan(spec["tpot_s_p99"])
    assert spec["peak_memory_mb"] == 100.0
    shares = [r["prefill_s"] / r["wall_time_s"] for r in rows if r["decoder"] == "speculative"]
    assert spec["prefill_share"] == pytest.approx(sum(shares) / 5)
    br = figdata.time_breakdown(grouping.prepare(pd.DataFrame(rows))).set_index("label").loc["speculative"]
    ms = 1000.0 / sum(r["new_tokens"] for r in rows if r["decoder"] == "speculative")
    assert br["prefill_ms"] == pytest.approx(sum(r["prefill_s"] for r in rows if r["decoder"] == "speculative") * ms)


def test_settings_label():
    assert grouping.settings_label(json.dumps({"gamma": 8})) == "gamma=8"
    assert grouping.settings_label({"window_size": 8, "ngram_size": 3, "guess_set_size": 8, "pool_scope": "sample",
                                    "seed": 0, "pool_from_prompt": True}) == "W=8, N=3, G=8, prompt n-grams"
    tree = {"num_nodes": 16, "threshold": 0.5, "copy_tokens": 20, "cost_aware": False, "draft_on_copy": False}
    # the schema's defaults (threshold 0.5, draft_on_copy true) decide what is off them ...
    assert grouping.settings_label({**tree, "_target_": "decoders.opt_tree.OptTreeDecoder"}) == \
        "nodes=16, copy=20, draft on copy=false"
    assert grouping.settings_label({**tree, "threshold": 0.9, "max_depth": 16},
                                   decoder_class="decoders.opt_tree.OptTreeDecoder") == \
        "nodes=16, threshold=0.9, max_depth=16, copy=20, draft on copy=false"
    # ... without one, off means false, zero or empty (a threshold is a setting, shown)
    assert grouping.settings_label(tree) == "nodes=16, copy=20, threshold=0.5"
    # against a schema's defaults, a non-default option shows even when it is "off"-looking
    assert grouping.settings_label({"gamma": 4, "stop_confidence": 0.0}, defaults={"stop_confidence": 0.4}) == \
        "gamma=4, stop below=0"
    assert grouping.settings_label("{}") == ""


def test_report_names_settings_and_fits_latex_per_group(tmp_path):
    run = write_run(tmp_path / "run", fixture_rows("s", tasks=["humaneval", "mbpp"], n=5))
    written = report.write_report([run], tmp_path / "rep")
    md = (tmp_path / "rep" / "main.md").read_text().splitlines()
    assert "settings" in md[0] and any("| gamma=4 |" in line for line in md)
    tex = written["main.tex"].read_text()
    # two tables (one per group), each ~270 pt at \small: wider than a column (241 pt), so across both
    assert tex.count("\\begin{table*}") == 2 and "Run group: humaneval" in tex and "tok/s &" not in tex
    assert "Settings: speculative: gamma=4." in tex
