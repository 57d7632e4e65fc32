"""Resumable runs (runner.resume): a rerun into the same folder computes only the cells not yet done, a
kill mid-run loses only the cell in progress, and a done vanilla cell stays the equality reference.

Runs the real app (``harness.app.main_job`` on a config composed with ``hydra.compose``) with the tiny
random models, 2 HumanEval prompts and 12 new tokens.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict

from harness.app import CONF_DIR, main_job
from harness.resume import latest_rows, repair_trailing_newline

BASE = ["model=tiny-random", "task.limit=2", "runner.max_new_tokens=12", "runner.warmup=0", "runner.score=false",
        "decoder=[vanilla,speculative]"]


def run_job(run_dir: Path, *overrides: str) -> None:
    """``python run.py <BASE> <overrides> hydra.run.dir=<run_dir>``, in process."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[*BASE, *overrides], return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(run_dir)
    HydraConfig.instance().set_config(cfg)
    try:
        with open_dict(cfg):
            del cfg["hydra"]
        main_job(cfg)
    finally:
        HydraConfig.instance().cfg = None


def lines(run_dir: Path) -> list[str]:
    return (run_dir / "results.jsonl").read_text().splitlines()


def rows(run_dir: Path) -> list[dict]:
    out = []
    for line in lines(run_dir):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def cells(rs: list[dict]) -> Counter:
    return Counter((r["sample_id"], r["decoder"], r["decoder_params"]) for r in rs if r["status"] == "ok")


@pytest.fixture(scope="module")
def done_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("resume") / "full"
    run_job(run_dir)
    return run_dir


@pytest.fixture()
def run(done_run, tmp_path) -> Path:
    """A private copy of a finished run folder."""
    return Path(shutil.copytree(done_run, tmp_path / "run"))


def test_first_run_is_complete(done_run):
    rs = rows(done_run)
    assert len(rs) == 4 and set(cells(rs).values()) == {1}
    assert len({r["run_id"] for r in rs}) == 1


def test_rerun_skips_every_done_cell(run):
    before = lines(run)
    run_job(run)
    assert lines(run) == before  # nothing recomputed, nothing appended
    summary = pd.read_csv(run / "summary.csv").set_index("decoder")
    assert summary.loc["vanilla", "samples"] == 2 and summary.loc["speculative", "samples"] == 2


def test_kill_mid_run_loses_only_the_cell_in_progress(run):
    full = lines(run)
    # killed while writing the 4th row (speculative, sample 2): 3 rows and a partial line remain
    (run / "results.jsonl").write_text("\n".join(full[:3]) + "\n" + full[3][:25])
    run_job(run)
    rs = rows(run)
    assert set(cells(rs).values()) == {1} and len(cells(rs)) == 4  # each cell exactly once
    new = rs[-1]
    old = {(r["sample_id"], r["decoder"]): r for r in rows(run)[:3]}
    assert (new["sample_id"], new["decoder"]) == (json.loads(full[3])["sample_id"], "speculative")
    assert new["run_id"] == old[(new["sample_id"], "vanilla")]["run_id"]          # run_id adopted
    assert new["attempt_id"] != old[(new["sample_id"], "vanilla")]["attempt_id"]  # another process
    assert new["matches_vanilla"] is True
    summary = pd.read_csv(run / "summary.csv").set_index("decoder")
    assert summary.loc["speculative", "samples"] == 2  # rows of both processes, paired


def test_stored_vanilla_row_is_the_reference(run):
    full = [json.loads(line) for line in lines(run)]
    # drop speculative of sample 2 and tamper with vanilla's stored tokens: the rerun must compare against
    # the stored row (and report a divergence at token 0), proving vanilla was not re-run
    vanilla = full[2]
    assert vanilla["decoder"] == "vanilla"
    vanilla["token_ids"][0] = (vanilla["token_ids"][0] + 1) % 256
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in full[:3]))
    run_job(run)
    rs = rows(run)
    assert len(rs) == 4
    assert rs[-1]["decoder"] == "speculative" and rs[-1]["matches_vanilla"] is False
    assert rs[-1]["first_divergence"] == 0


def test_only_new_decoder_configs_are_computed(run):
    run_job(run, "decoder.speculative.gamma=2")
    rs = rows(run)
    assert len(rs) == 6  # vanilla reused; two speculative gamma=2 cells added
    added = rs[4:]
    assert {r["decoder"] for r in added} == {"speculative"} and {r["gamma"] for r in added} == {2}
    summary = pd.read_csv(run / "summary.csv")
    assert list(summary["decoder"]) == ["vanilla", "speculative"] and list(summary["samples"]) == [2, 2]


def test_errors_are_retried_and_counted_once(run):
    full = [json.loads(line) for line in lines(run)]
    failed = dict(full[3], status="error", reason="RuntimeError: out of memory")
    for k in ("token_ids", "tokens_per_s", "wall_time_s"):
        failed.pop(k, None)
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in full[:3] + [failed]))
    run_job(run)
    rs = rows(run)
    assert len(rs) == 5 and rs[-1]["status"] == "ok" and rs[-1]["decoder"] == "speculative"
    assert len(latest_rows(pd.DataFrame(rs))) == 4
    summary = pd.read_csv(run / "summary.csv").set_index("decoder")
    assert summary.loc["speculative", "failed"] == 0 and summary.loc["speculative", "samples"] == 2


def test_other_settings_or_resume_false_recompute(run):
    run_job(run, "runner.max_new_tokens=8")  # another configuration: nothing of it is done
    rs = rows(run)
    assert len(rs) == 8 and len({r["run_id"] for r in rs}) == 2
    run_job(run, "runner.resume=false")
    rs = rows(run)
    assert len(rs) == 12 and len({r["run_id"] for r in rs}) == 3
    summary = pd.read_csv(run / "summary.csv").set_index("decoder")
    assert summary.loc["speculative", "samples"] == 2  # only the new run's rows


def test_repair_trailing_newline(tmp_path):
    f = tmp_path / "results.jsonl"
    f.write_text('{"a": 1}\n{"b"')
    assert repair_trailing_newline(f) is True
    assert f.read_text().endswith('{"b"\n')
    assert repair_trailing_newline(f) is False
