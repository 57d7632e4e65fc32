"""Hydra launchers and experiment configs: a two-point multirun through submitit_local on the tiny random
models ends with its report (harness.job.callbacks.ReportCallback, registered for every sweep); every conf/experiment/*.yaml composes as a
multirun with sweeper params and the report callback; the SLURM launcher preset composes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from harness.job.app import CONF_DIR

ROOT = Path(__file__).resolve().parent.parent
EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))


def test_two_point_multirun_through_submitit_local(tmp_path):
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "run.py", "-m", "hydra/launcher=submitit_local", "model=tiny-random", "task.limit=1",
           "runner.max_new_tokens=4", "runner.warmup=0", "runner.score=false", "decoder=[vanilla,speculative]",
           "decoder.speculative.gamma=1,2", f"hydra.sweep.dir={sweep}"]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    gammas = {}
    for job in ("0", "1"):
        rows = [json.loads(line) for line in (sweep / job / "results.jsonl").read_text().splitlines()]
        assert {r["decoder"] for r in rows} == {"vanilla", "speculative"}
        assert all(r["status"] == "ok" and r["matches_vanilla"] for r in rows)
        gammas[job] = next(r["gamma"] for r in rows if r["decoder"] == "speculative")
    assert sorted(gammas.values()) == [1, 2]
    assert (sweep / ".submitit").is_dir()  # the jobs really went through submitit
    # on_multirun_end built the sweep's report and figures: the callback is in conf/hydra/default.yaml, so
    # every -m sweep gets one (not only the experiment presets)
    main = pd.read_csv(sweep / "report" / "main.csv")
    assert {"speculative (gamma=1)", "speculative (gamma=2)"} <= set(main["label"])
    assert (sweep / "report" / "figures" / "tokens_per_s_vs_param.png").is_file()


def _missing_configs(name: str) -> list[str]:
    """Decoder / task / model configs an experiment names that do not exist (yet)."""
    data = yaml.safe_load((CONF_DIR / "experiment" / f"{name}.yaml").read_text())
    wanted: list[tuple[str, str]] = []
    for entry in data.get("defaults", []):
        if isinstance(entry, dict):
            for key, value in entry.items():
                group = key.replace("override", "").strip().lstrip("/")
                for v in value if isinstance(value, list) else [value]:
                    wanted.append((group, v))
    for key, values in (data.get("hydra", {}).get("sweeper", {}).get("params") or {}).items():
        if key in ("task", "model"):
            wanted += [(key, v.strip()) for v in str(values).split(",")]
    return [f"{g}/{v}.yaml" for g, v in wanted if g in ("decoder", "task", "model")
            and not (CONF_DIR / g / f"{v}.yaml").exists()]


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_composes_as_a_multirun_with_its_report(name):
    missing = _missing_configs(name)
    if missing:
        pytest.skip(f"experiment {name} needs {', '.join(missing)}, not written yet")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment={name}"], return_hydra_config=True)
    assert cfg.hydra.mode.name == "MULTIRUN"
    params = cfg.hydra.sweeper.params
    assert params, "an experiment sweeps something"
    for key in params:
        if "." in key and not key.startswith("+"):  # a swept value must land on an existing config key
            parent, _, leaf = key.rpartition(".")
            assert leaf in OmegaConf.select(cfg, parent), f"{key} is not a key of the composed config"
    assert cfg.hydra.callbacks.report._target_ == "harness.job.callbacks.ReportCallback"
    instantiate(cfg.hydra.callbacks.report)
    assert "vanilla" in cfg.decoder  # every experiment keeps the reference
    # every interpolation of the job config resolves
    job = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    OmegaConf.to_container(job, resolve=True)


def test_slurm_gpu_launcher_preset_composes():
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["hydra/launcher=slurm_gpu", "hydra.launcher.partition=gpu"],
                      return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert launcher.gpus_per_node == 1 and launcher.timeout_min > 0 and launcher.partition == "gpu"
    assert launcher.max_num_timeout > 0  # requeue is safe: runs resume


@pytest.mark.parametrize("launcher", ["submitit_local", "local_cpu", "joblib"])
def test_other_launchers_compose(launcher):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"hydra/launcher={launcher}"], return_hydra_config=True)
    assert "Launcher" in cfg.hydra.launcher._target_
