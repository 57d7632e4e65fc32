"""Running a whole job on the tiny random model from a test: ``conf/`` composed with overrides, then the rows it
wrote (the runner tests of several modules)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir

from harness.job.app import main_job

CONF = Path(__file__).resolve().parent.parent / "conf"


def run_tiny_job(tmp_path: Path, *overrides: str, max_new_tokens: int) -> Any:
    """``main_job`` of ``conf/config.yaml`` on ``model=tiny-random`` (2 samples, ``max_new_tokens`` per sample,
    2 warm-up tokens) writing to ``tmp_path``, with ``overrides`` last; returns what ``main_job`` returns."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "model=tiny-random", "task.limit=2", f"runner.max_new_tokens={max_new_tokens}", "runner.warmup_tokens=2",
            f"+output_dir={tmp_path}", *overrides])
    return main_job(cfg)


def result_rows(tmp_path: Path) -> list[dict[str, Any]]:
    """The rows of ``tmp_path/results.jsonl``, in file order."""
    return [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
