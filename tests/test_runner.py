"""The runner end to end on tiny random models: rows, summary, bad input, failures kept."""

import json
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from harness.app import main_job

CONF = Path(__file__).resolve().parent.parent / "conf"


def _run(tmp_path, *overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "model=tiny-random", "task.limit=2", "runner.max_new_tokens=12", "runner.warmup_tokens=2",
            f"+output_dir={tmp_path}", *overrides])
    return main_job(cfg)


def _rows(tmp_path):
    return [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]


def test_runner_writes_rows_and_summary(tmp_path):
    _run(tmp_path, "decoder=[vanilla,speculative]")
    rows = _rows(tmp_path)
    assert [(r["sample_id"], r["decoder"]) for r in rows] == [
        ("HumanEval/0", "vanilla"), ("HumanEval/0", "speculative"),
        ("HumanEval/1", "vanilla"), ("HumanEval/1", "speculative")]
    for r in rows:
        for key in ("task", "sample_id", "decoder", "prompt_tokens", "new_tokens", "wall_time_s", "tokens_per_s",
                    "num_steps", "accept_length", "acceptance_rate", "matches_vanilla", "first_divergence",
                    "status", "dtype", "target_model", "draft_model", "git_commit"):
            assert key in r, key
        assert r["status"] == "ok" and r["matches_vanilla"] is True and r["first_divergence"] is None
        assert r["new_tokens"] == len(r["token_ids"]) <= 12
    assert rows[1]["gamma"] == 4
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert list(summary["decoder"]) == ["vanilla", "speculative"]
    assert summary.loc[0, "speedup"] == pytest.approx(1.0)
    assert summary.loc[0, "accept_length"] == pytest.approx(1.0)
    assert summary.loc[1, "equal_to_vanilla"] == pytest.approx(1.0)
    assert (tmp_path / "summary.md").exists()
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["environment"]["packages"]["torch"] and meta["config"]["model"]["name"] == "tiny-random"


def test_vanilla_is_always_run(tmp_path):
    _run(tmp_path, "decoder=[speculative]", "task.limit=1")
    assert [r["decoder"] for r in _rows(tmp_path)] == ["vanilla", "speculative"]


def test_prompt_longer_than_context_is_recorded(tmp_path):
    _run(tmp_path, "decoder=[vanilla]", "model.target.config.max_position_embeddings=64")
    rows = _rows(tmp_path)
    assert len(rows) == 2 and all(r["status"] == "prompt_too_long" for r in rows)
    assert "exceeds the target's context of 64 tokens" in rows[0]["reason"]


def test_failure_keeps_rows_and_exits_nonzero(tmp_path, monkeypatch):
    from decoders import speculative

    calls = {"n": 0}
    original = speculative.SpeculativeDecoder.generate

    def flaky(self, input_ids, max_new_tokens, stopwatch=None):
        calls["n"] += 1
        if calls["n"] == 3:  # warm-up, sample 0, then sample 1 fails
            raise RuntimeError("boom")
        return original(self, input_ids, max_new_tokens, stopwatch)

    monkeypatch.setattr(speculative.SpeculativeDecoder, "generate", flaky)
    with pytest.raises(SystemExit):
        _run(tmp_path, "decoder=[vanilla,speculative]")
    rows = _rows(tmp_path)
    assert [r["status"] for r in rows] == ["ok", "ok", "ok", "error"]
    assert "boom" in rows[-1]["reason"]
    assert (tmp_path / "summary.csv").exists()


def test_bad_lengths_refused_before_running(tmp_path):
    with pytest.raises(ValueError, match="max_new_tokens"):
        _run(tmp_path, "runner.max_new_tokens=0")
    with pytest.raises(ValueError, match="gamma"):
        _run(tmp_path, "decoder.speculative.gamma=0")
    assert not (tmp_path / "results.jsonl").exists()


def test_missing_draft_is_explained(tmp_path):
    with pytest.raises(ValueError, match="need a draft model"):
        _run(tmp_path, "decoder=[vanilla,speculative]", "model.draft=null")


def test_sample_ids_run_only_the_named_samples_in_task_order(tmp_path):
    _run(tmp_path, "decoder=[vanilla,speculative]", "task.limit=5", "runner.sample_ids=[HumanEval/3,HumanEval/1]")
    rows = _rows(tmp_path)
    assert [(r["sample_id"], r["decoder"]) for r in rows] == [
        ("HumanEval/1", "vanilla"), ("HumanEval/1", "speculative"),
        ("HumanEval/3", "vanilla"), ("HumanEval/3", "speculative")]
    assert all(r["matches_vanilla"] is True for r in rows)


def test_unknown_sample_ids_refused_before_any_model_loads(tmp_path, monkeypatch):
    import harness.app

    def no_models(*args, **kwargs):
        raise AssertionError("models were loaded before the sample ids were checked")

    monkeypatch.setattr(harness.app, "load_pair", no_models)
    with pytest.raises(ValueError, match=r"HumanEval/7.*raise task.limit"):
        _run(tmp_path, "decoder=[vanilla]", "runner.sample_ids=[HumanEval/7]")  # task.limit=2
    with pytest.raises(ValueError, match="non-empty list"):
        _run(tmp_path, "decoder=[vanilla]", "runner.sample_ids=HumanEval/0")
    assert not (tmp_path / "results.jsonl").exists()
