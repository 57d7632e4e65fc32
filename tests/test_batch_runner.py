"""``runner.batch_size > 1`` end to end on the tiny random models: static batches, one row per request, paired with
vanilla's batch, refusals before models load."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from harness.config.compose import ConfigError
from harness.rows.cell_figures import resampling_units
from tiny_jobs import result_rows, run_tiny_job


def test_batches_write_one_row_per_request(tmp_path):
    run_tiny_job(tmp_path, "decoder=[vanilla,speculative,prompt_lookup]", "task.limit=5", "runner.batch_size=2",
                 max_new_tokens=10)
    rows = result_rows(tmp_path)
    assert len(rows) == 15 and all(r["status"] == "ok" for r in rows)
    batches = {(r["sample_index"], r["batch_index"]) for r in rows}
    assert batches == {(0, 0), (1, 0), (2, 1), (3, 1), (4, 2)}  # consecutive batches of 2, the last of 1
    for r in rows:
        assert r["batch_size"] == 2 and r["batch_rows"] == (1 if r["batch_index"] == 2 else 2)
        assert r["matches_vanilla"] is True and r["tokens_per_s"] == pytest.approx(r["new_tokens"] / r["wall_time_s"])
        assert 0 < r["ttft_s"] <= r["latency_s"] <= r["wall_time_s"]
    for (decoder, batch), g in pd.DataFrame(rows).groupby(["decoder", "batch_index"]):
        assert g["wall_time_s"].nunique() == 1 and g["ttft_s"].nunique() == 1  # one call per batch and decoder
        assert g["batch_tokens_per_s"].iloc[0] == pytest.approx(g["new_tokens"].sum() / g["wall_time_s"].iloc[0])
        assert g["latency_s"].max() == pytest.approx(g["wall_time_s"].iloc[0], rel=0.5)
    orders = pd.DataFrame(rows).groupby("batch_index").apply(
        lambda g: tuple(g.sort_values("order_position").drop_duplicates("decoder")["decoder"]), include_groups=False)
    assert orders[0] != orders[1]  # the decoder order rotates per batch
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert (summary["batch_size"] == 2).all() and (summary["batch_tokens_per_s"] > 0).all()
    assert (summary["equal_to_vanilla"].dropna() == 1).all()


def test_drafting_models_per_row_in_a_batch_job(tmp_path):
    run_tiny_job(tmp_path, "decoder=[vanilla,opt_tree,ouroboros,fixed_tree]", "task.limit=3", "runner.batch_size=3",
                 max_new_tokens=8)
    rows = result_rows(tmp_path)
    assert len(rows) == 12 and all(r["status"] == "ok" and r["matches_vanilla"] is True for r in rows)
    assert {r["batch_rows"] for r in rows} == {3}


def test_bootstrap_resamples_batches():
    rows = pd.DataFrame({"task": ["t"] * 4, "sample_id": ["a", "b", "c", "d"], "batch_index": [0, 0, 1, None]})
    assert list(resampling_units(rows)) == ["t/batch 0", "t/batch 0", "t/batch 1", "t/d"]


@pytest.mark.parametrize("overrides, message", [
    (["runner.batch_size=2", "decoder=[vanilla,hf_assisted]"], "decoder 'hf_assisted' does not decode batches"),
    (["runner.batch_size=2", "decoder=[vanilla,hf_greedy]"], "decoder 'hf_greedy' does not decode batches"),
    (["runner.batch_size=2", "task=mt_bench", "model.chat_template=true", "task.data_path={mt_bench}",
      "decoder=[vanilla]"], "multi-turn samples"),
    (["runner.batch_size=0", "decoder=[vanilla]"], "batch_size"),
])
def test_batches_refuse_before_models_load(tmp_path, overrides, message, monkeypatch):
    def no_models(*args, **kwargs):
        raise AssertionError("models were loaded")

    monkeypatch.setattr("harness.job.app.load_pair", no_models)
    data = tmp_path / "question.jsonl"
    question = {"question_id": 81, "category": "writing", "turns": ["Write a haiku.", "Sadder."]}
    data.write_text(json.dumps(question) + "\n")
    with pytest.raises(ConfigError, match=message):
        run_tiny_job(tmp_path, *(o.format(mt_bench=data) for o in overrides), max_new_tokens=4)
    assert not (tmp_path / "results.jsonl").exists()


def test_a_batch_resumes_whole(tmp_path):
    """A batch cell with a row missing runs again as a whole batch; done batches are skipped."""
    run_tiny_job(tmp_path, "decoder=[vanilla,speculative]", "task.limit=4", "runner.batch_size=2", max_new_tokens=6)
    rows = result_rows(tmp_path)
    kept = [r for r in rows if not (r["decoder"] == "speculative" and r["sample_index"] == 3)]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    run_tiny_job(tmp_path, "decoder=[vanilla,speculative]", "task.limit=4", "runner.batch_size=2", max_new_tokens=6)
    again = result_rows(tmp_path)[len(kept):]
    assert sorted((r["decoder"], r["sample_index"]) for r in again) == [("speculative", 2), ("speculative", 3)]
    assert all(r["matches_vanilla"] is True for r in again)
