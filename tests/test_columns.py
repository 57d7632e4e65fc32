"""The rows schema (harness/rows/columns.py) holds what the runner writes: every column of a real run's rows is
declared, apart from the open-ended ones (each hyper-parameter, the task's quality columns); every decoder
configuration produces the statistics its decoder declares (decoders/columns.py) and no undeclared one; every
summary column is declared, so the summary's legend can explain it; and a new figure is one declaration and its
producer: the summary CSV, summary.md and the report's main table show it under its declared name and format."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from decoders.columns import DECODER_STATISTICS
from fixture_rows import fixture_rows, real_run, write_run
from harness.api import build_decoder, compose_config
from harness.config.precheck import available, decoder_key
from harness.job.models import ModelPair
from harness.report import build as report
from harness.report import tables
from harness.report.summary import write_summary
from harness.rows import cell_figures, columns
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


@pytest.fixture(scope="module")
def pair(target, noisy_draft, tokenizer):
    return ModelPair(target, noisy_draft, tokenizer, "tiny-target", "tiny-draft", torch.float32, torch.device("cpu"))


@pytest.mark.parametrize("name", available("decoder"))
def test_every_decoder_config_produces_its_declared_statistics(name, pair):
    """Each configuration of conf/decoder/ generates on the tiny pair; its row carries every statistic its
    decoder declares (those conditional on a setting where that setting is on), each declared in the rows
    schema with its type, and nothing undeclared but its hyper-parameters."""
    dec = build_decoder(name, pair)
    ids = torch.tensor([list(b"abcabcabcabcabcabcabc")], dtype=torch.long)
    row = dec.generate(ids, 12).summary()
    declared = DECODER_STATISTICS.get(type(dec).__name__, ())
    expected = {s.name for s in declared if not s.when or any(getattr(dec, w) for w in s.when)}
    assert expected <= set(row), sorted(expected - set(row))
    params = _params(name)
    undeclared = set(row) - set(columns.ROW) - params
    assert not undeclared, sorted(undeclared)
    for key in expected:
        assert columns.value_problem(key, row[key]) is None, (key, row[key])
        assert columns.ROW[key].stage == "decoder"


def _config(name: str) -> dict:
    cfg = compose_config([f"decoder=[{name}]"])
    return OmegaConf.to_container(cfg.decoder[decoder_key(name)], resolve=True)


def _params(name: str) -> set[str]:
    return set(_config(name))


def test_every_declared_statistic_is_produced_by_some_config():
    """The test above covers every declaration: each decoder that declares statistics has a configuration, and
    each conditional statistic's setting is on in one of them."""
    configs = [_config(name) for name in available("decoder")]
    for cls, stats in DECODER_STATISTICS.items():
        mine = [c for c in configs if c["_target_"].rsplit(".", 1)[-1] == cls]
        assert mine, cls
        for s in stats:
            assert not s.when or any(c.get(w) for c in mine for w in s.when), (cls, s.name)


def test_each_declared_statistic_is_gathered_once_with_its_bound():
    stats = {s.name: s for ss in DECODER_STATISTICS.values() for s in ss}
    for s in stats.values():
        assert columns.ROW[s.name].meaning == s.meaning and columns.ROW[s.name].type == s.type
        if s.bound == "share":
            assert columns.ROW_BOUNDS[s.name].check(1.5) and columns.ROW_BOUNDS[s.name].check(0.5) is None
        elif s.bound == "count":
            assert columns.ROW_BOUNDS[s.name].check(-1) and columns.ROW_BOUNDS[s.name].check(3) is None


def test_every_summary_column_is_declared_and_explained():
    assert set(metrics.SUMMARY_COLUMNS) == {c.name for c in columns.SUMMARY_COLUMNS_DECLARED}
    assert all(c.meaning for c in columns.SUMMARY_COLUMNS_DECLARED + columns.ROW_COLUMNS)
    assert "tpot_s = mean seconds per output token after the first" in columns.legend(columns.SUMMARY_MD_COLUMNS)
    assert len(columns.ROW) == len(columns.ROW_COLUMNS)  # no column declared twice
    # the figures --compare sets side by side are declared there, with their headers
    assert [(c.name, c.display or c.name) for c in columns.compared_columns()] == [
        ("tokens_per_s", "tok/s"), ("speedup", "speedup"), ("accept_length", "τ")]
    assert columns.SUMMARY["speedup"].header == "speedup [95% CI]" and columns.SUMMARY["ttft_s"].cell(0.01234) == "12.3"


def test_one_formatter_for_parameters_and_cells():
    assert [columns.format_value(v) for v in (3.0, 0.25, None, True, "x")] == ["3", "0.25", "null", "true", "x"]
    assert [tables.fmt_cell(v) for v in (3.0, float("nan"), False, 7)] == ["3.00", "-", "false", "7"]
    assert columns.format_value(0.5, ".0%", missing="-") == "50%"


@pytest.fixture
def example_column(monkeypatch):
    """A new figure: declared (one summary :class:`Column`, printed in summary.md and in the report's main table)
    and produced (one key of a cell family's dict, from a row column: draft milliseconds per new token)."""
    col = columns.Column("draft_ms_per_token", "float", "summary", "example: draft milliseconds per new token", True,
                         display="draft ms/tok", fmt=".4f", report="main")
    monkeypatch.setattr(columns, "SUMMARY_COLUMNS_DECLARED", (*columns.SUMMARY_COLUMNS_DECLARED, col))
    columns.gather()
    latency = cell_figures.cell_latency

    def produce(g: pd.DataFrame) -> dict:
        ms = 1000 * columns.num(g["draft_time_s"]).sum() / columns.num(g["new_tokens"]).sum()
        return {**latency(g), "draft_ms_per_token": float(ms)}

    monkeypatch.setattr(metrics, "cell_latency", produce)
    yield col
    monkeypatch.undo()
    columns.gather()


def test_a_new_column_is_one_declaration_and_its_producer(example_column, tmp_path):
    rows = fixture_rows("x", tasks=["humaneval"], n=5)
    run = write_run(tmp_path / "run", rows)
    summary = write_summary(run, pd.DataFrame(rows), [], "header", [])
    spec = summary[summary["decoder"] == "speculative"].iloc[0]
    value = spec["draft_ms_per_token"]
    assert value > 0
    assert "draft_ms_per_token" in pd.read_csv(run / "summary.csv").columns
    md = (run / "summary.md").read_text()
    head = next(line for line in md.splitlines() if line.startswith("| label") or line.startswith("| group"))
    assert head.rstrip(" |").endswith("draft_ms_per_token") and f"| {value:.3f} |" in md
    report.write_report([run], tmp_path / "report")
    main = (tmp_path / "report" / "main.md").read_text()
    assert "| draft ms/tok |" in main and f"| {value:.4f} |" in main
    assert "draft_ms_per_token" in pd.read_csv(tmp_path / "report" / "main.csv").columns
    tex = (tmp_path / "report" / "main.tex").read_text()
    assert "draft ms/tok" in tex  # on the page: declared without page=False


def test_the_schema_is_whole_again_after_an_example_column():
    assert "draft_ms_per_token" not in columns.SUMMARY and "draft_ms_per_token" not in columns.SUMMARY_COLUMNS
