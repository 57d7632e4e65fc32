"""Every experiment preset that claims figures (``hydra.callbacks.report.figures``) draws each of them: the preset
runs on the tiny random pair (1 problem, 4 new tokens, float32, no warm-up, its sweeps kept) and every claimed
figure must exist as a PNG in its report. A preset whose rows cannot support a figure it names (a grid figure
without a swept setting, warm vs cold without a warm decoder) fails here.

A preset that is another one on a different task or on a subset of its decoders (:data:`COVERED_BY`) is not run
again (each run costs ~12 s of CI): a test shows that it claims no figure, sweeps no setting and uses no decoder
class its representative does not, so the representative's run stands for it; a preset that outgrows it fails
there and must run on its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.config.compose import compose

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("SPECDEC_DATA_DIR") or ROOT.parent / "shared" / "data")
PRESETS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))
#: Overrides that make a preset a smoke run (its sweeps stay: a grid figure needs them).
TINY = ["model=tiny-random", "model.dtype=float32", "task.limit=1", "runner.max_new_tokens=4", "runner.warmup=0"]
#: Per preset: what the tiny pair cannot do (its two models' vocabularies differ, so transformers' assisted
#: generation refuses to sample with them), and long sweeps cut to two values each (a figure needs two).
EXTRA = {"sampled_heldout_humaneval": ["decoder=[vanilla,tuned/speculative_tuned,tuned/prompt_lookup_tuned]"],
         "gamma_ablation": ["decoder.speculative.gamma=2,4"],
         "lookahead_sweep": ["decoder.lookahead.window_size=5,10", "decoder.lookahead.ngram_size=3"]}


#: Preset -> the preset whose tiny run stands for it: the same sweep on another task, or a subset of its decoders.
COVERED_BY = {"race_heldout_mbpp": "race_heldout_humaneval", "tune_all_mbpp": "tune_all",
              **{f"tune_{family}": "tune_all" for family in
                 ("speculative", "lookahead", "prompt_lookup", "hf_assisted", "ouroboros", "trees")}}


def claimed(name: str) -> tuple[list[str], set[str]]:
    """The figures preset ``name`` claims and the tasks it runs."""
    cfg = compose([f"experiment={name}"], return_hydra_config=True, check=False)
    report = cfg.hydra.callbacks.get("report") if cfg.hydra.get("callbacks") else None
    figures = list(report.get("figures") or []) if report is not None else []
    params = cfg.hydra.sweeper.get("params") or {}
    tasks = {t.strip() for t in str(params.get("task", cfg.task.name)).split(",")}
    return figures, tasks


def _shape(name: str) -> tuple[set[str], set[str], set[str]]:
    """(claimed figures, swept keys, decoder classes) of preset ``name``."""
    cfg = compose([f"experiment={name}"], return_hydra_config=True, check=False)
    params = set(cfg.hydra.sweeper.get("params") or {}) - {"task.split"}   # a task's own split: not a figure axis
    return set(claimed(name)[0]), params, {str(d._target_) for d in cfg.decoder.values()}


@pytest.mark.parametrize("name,representative", sorted(COVERED_BY.items()))
def test_a_covered_preset_needs_nothing_its_representative_does_not_run(name, representative):
    figures, params, classes = _shape(name)
    rep_figures, rep_params, rep_classes = _shape(representative)
    assert figures and figures <= rep_figures, (name, sorted(figures - rep_figures))
    assert params <= rep_params, (name, sorted(params - rep_params))
    assert classes <= rep_classes, (name, sorted(classes - rep_classes))
    assert representative not in COVERED_BY and representative in PRESETS


@pytest.mark.parametrize("name", [p for p in PRESETS if p not in COVERED_BY])
def test_preset_draws_every_figure_it_claims(name, tmp_path):
    figures, tasks = claimed(name)
    if not figures:
        pytest.skip(f"{name} claims no figure")
    if tasks - {"humaneval"} and not (SHARED / "gsm8k" / "test.jsonl").is_file():
        pytest.skip(f"{name} runs {sorted(tasks)}: shared offline data not found at {SHARED}")
    env = {**os.environ, "SPECDEC_DATA_DIR": str(SHARED), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "run.py"), f"experiment={name}", *TINY, *EXTRA.get(name, []),
                           f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    drawn = {p.stem for p in (tmp_path / "sweep" / "report" / "figures").glob("*.png")}
    assert set(figures) <= drawn, (name, sorted(set(figures) - drawn), proc.stderr[-2000:])
