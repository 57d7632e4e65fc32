"""Every experiment preset that claims figures (``hydra.callbacks.report.figures``) draws each of them: the preset
runs on the tiny random pair (1 problem, 4 new tokens, float32, no warm-up, its sweeps kept) and every claimed
figure must exist as a PNG in its report. A preset whose rows cannot support a figure it names (a grid figure
without a swept setting, warm vs cold without a warm decoder) fails here.

A preset that is another one on a different task or on a subset of its decoders (:data:`COVERED_BY`) is not run
again (each run costs ~12 s of CI): a test shows that it claims no figure, sweeps no setting and uses no decoder
class its representative does not, so the representative's run stands for it; a preset that outgrows it fails
there and must run on its own.

The presets run through ``run.py`` one after another in ONE Python process (:data:`DRIVER`, started by the
:func:`preset_runs` fixture for the presets the session selected): torch, transformers, Hydra and matplotlib are
imported once instead of once per preset (~5 s each). Each preset still gets its own folder, its own
``sys.argv``, a fresh Hydra and its own exit status and stderr, which its test checks."""

from __future__ import annotations

import functools
import json
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
#: generation refuses to sample with them), long sweeps cut to two values each (a figure needs two), and GSM8K's
#: 8-shot prompt (~2400 byte tokens, prefilled by each of the 10 decoders) cut to one shot: no figure depends on it.
EXTRA = {"sampled_heldout_humaneval": ["decoder=[vanilla,tuned/speculative_tuned,tuned/prompt_lookup_tuned]"],
         "race_heldout_gsm8k": ["task.num_fewshot=1"],
         "gamma_ablation": ["decoder.speculative.gamma=2,4"], "batch_sweep": ["runner.batch_size=1,2"],
         "lookahead_sweep": ["decoder.lookahead.window_size=5,10", "decoder.lookahead.ngram_size=3"]}


#: Preset -> the preset whose tiny run stands for it: the same sweep on another task, or a subset of its decoders.
COVERED_BY = {"race_heldout_mbpp": "race_heldout_humaneval", "tune_all_mbpp": "tune_all",
              **{f"tune_{family}": "tune_all" for family in
                 ("speculative", "lookahead", "prompt_lookup", "hf_assisted", "ouroboros", "trees")}}


@functools.lru_cache(maxsize=None)
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


#: ``python -c DRIVER RUN_PY JOBS``: runs ``run.py`` as ``__main__`` once per ``[name, folder, args]`` of the JSON
#: list JOBS, in that folder, with a fresh Hydra, its stdout and stderr in ``folder/stdout`` and ``folder/stderr``,
#: and writes its exit status (what ``python run.py args`` would return) to ``folder/status``.
DRIVER = r"""
import json, os, runpy, sys, traceback
from hydra.core.global_hydra import GlobalHydra

run_py, jobs = sys.argv[1], json.loads(sys.argv[2])
sys.path[0] = os.path.dirname(run_py)  # as `python run.py` has it (not -c's current folder)
for name, folder, args in jobs:
    os.chdir(folder)
    sys.stdout.flush(), sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    for fd, stream in ((1, "stdout"), (2, "stderr")):
        out = os.open(os.path.join(folder, stream), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(out, fd)
        os.close(out)
    sys.argv = [run_py, *args]
    try:
        runpy.run_path(run_py, run_name="__main__")
        status = 0
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        status = 1
    finally:
        sys.stdout.flush(), sys.stderr.flush()
        for fd, old in zip((1, 2), saved):
            os.dup2(old, fd)
            os.close(old)
        GlobalHydra.instance().clear()
    with open(os.path.join(folder, "status"), "w") as f:
        f.write(str(status))
"""


def skip_reason(name: str) -> str | None:
    """Why preset ``name`` is not run here (no figure claimed, shared data missing), or None."""
    figures, tasks = claimed(name)
    if not figures:
        return f"{name} claims no figure"
    if tasks - {"humaneval"} and not (SHARED / "gsm8k" / "test.jsonl").is_file():
        return f"{name} runs {sorted(tasks)}: shared offline data not found at {SHARED}"
    return None


@pytest.fixture(scope="module")
def preset_runs(request, tmp_path_factory) -> dict[str, Path]:
    """Preset name -> its folder (``sweep/``, ``status``, ``stdout``, ``stderr``), for every preset that this
    session's :func:`test_preset_draws_every_figure_it_claims` cases run, all run by one :data:`DRIVER` process."""
    names = [item.callspec.params["name"] for item in request.session.items
             if getattr(item, "function", None) is test_preset_draws_every_figure_it_claims]
    folders = {name: tmp_path_factory.mktemp(name) for name in dict.fromkeys(names) if skip_reason(name) is None}
    jobs = [[name, str(folder), [f"experiment={name}", *TINY, *EXTRA.get(name, []),
                                 f"hydra.sweep.dir={folder / 'sweep'}"]] for name, folder in folders.items()]
    env = {**os.environ, "SPECDEC_DATA_DIR": str(SHARED), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(ROOT / "run.py"), json.dumps(jobs)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900 * max(1, len(jobs)))
    for folder in folders.values():  # a driver that died leaves the presets after it without a status
        if not (folder / "status").is_file():
            (folder / "status").write_text(f"driver ended ({proc.returncode}) before this preset finished")
            (folder / "stderr").write_text(proc.stderr)
    return folders


@pytest.mark.parametrize("name", [p for p in PRESETS if p not in COVERED_BY])
def test_preset_draws_every_figure_it_claims(name, preset_runs):
    reason = skip_reason(name)
    if reason:
        pytest.skip(reason)
    figures, _ = claimed(name)
    folder = preset_runs[name]
    status, stderr = (folder / "status").read_text(), (folder / "stderr").read_text()
    assert status == "0", (status, stderr[-3000:])
    drawn = {p.stem for p in (folder / "sweep" / "report" / "figures").glob("*.png")}
    assert set(figures) <= drawn, (name, sorted(set(figures) - drawn), stderr[-2000:])
