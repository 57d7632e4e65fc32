"""What ``run.py`` does once Hydra has composed the config (kept importable for tests)."""

from __future__ import annotations

import inspect
import logging
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from decoders.common.stopping import collect_eos_token_ids
from harness.metrics import to_markdown
from harness.models import load_pair
from harness.resume import ResumeMismatchError
from harness.results import environment
from harness.runner import NON_PARAM_KEYS, RunSettings, Runner

log = logging.getLogger(__name__)
PROJECT_DIR = Path(__file__).resolve().parent.parent


class ConfigError(ValueError):
    """The composed configuration cannot run; the message says what to change."""


CONF_DIR = PROJECT_DIR / "conf"
GROUPS = ("model", "task", "decoder", "runner", "experiment")


def available(group: str) -> list[str]:
    """Names of the configs in ``conf/<group>/``."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def check_choices(argv: list[str]) -> None:
    """Before Hydra composes: an unknown model, task, decoder or experiment name exits with the valid choices.

    Understands ``group=name``, ``group=[a,b]``, ``+group=name`` and ``-m`` sweeps ``group=a,b``.
    """
    for arg in argv:
        key, sep, value = arg.lstrip("+~").partition("=")
        if not sep or key not in GROUPS:
            continue
        names = [v.strip() for v in value.strip("[]").split(",") if v.strip()]
        choices = available(key)
        unknown = [n for n in names if n not in choices and not any(c in n for c in "*?$")]
        if unknown and value not in ("null",):
            sys.exit(f"error: unknown {key} {', '.join(map(repr, unknown))}. Valid choices for {key}: "
                     f"{', '.join(choices)}")


def _run_dir(cfg: DictConfig) -> Path:
    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path(cfg.get("output_dir") or "results/unnamed")


def decoder_configs(cfg: DictConfig) -> dict[str, dict[str, Any]]:
    """``cfg.decoder`` (Hydra multi-select: name -> config) as plain dicts, vanilla first."""
    raw = OmegaConf.to_container(cfg.decoder, resolve=True) if cfg.get("decoder") is not None else {}
    if not raw:
        raise ConfigError("no decoder selected: pass e.g. decoder=[vanilla,speculative]")
    if "_target_" in raw:
        raise ConfigError("`decoder` must be a list of decoder names, e.g. decoder=[vanilla,speculative]")
    if "vanilla" not in raw:
        log.info("adding the vanilla decoder: it is the reference for speedup and equality")
        raw = {"vanilla": {"_target_": "decoders.vanilla.VanillaDecoder", "_partial_": True}, **raw}
    return {"vanilla": raw["vanilla"], **{k: v for k, v in raw.items() if k != "vanilla"}}


def build_decoder(dcfg: dict[str, Any], supplied: dict[str, Any]) -> Any:
    """Instantiate one decoder config: ``uses_draft`` stripped, then only the runner-supplied arguments
    (:data:`harness.config.RUNNER_SUPPLIED`) that its constructor names are passed."""
    factory = hydra.utils.instantiate({k: v for k, v in dcfg.items() if k != "uses_draft"})
    params = inspect.signature(factory.func).parameters
    return factory(**{k: v for k, v in supplied.items() if k in params})


#: Exit statuses of a run (``python run.py``).
EXIT_FAILED_CELLS = 1      # some cells raised (status=error); the others are in the rows and summary
EXIT_REFUSED = 2           # the run folder holds another run's rows (resume refused); nothing was written
EXIT_NOTHING_MEASURED = 3  # no cell was measured (all prompt_too_long / empty_prompt / error)
EXIT_INTERRUPTED = 130     # Ctrl-C; the finished cells are summarised


def _stop_quietly_on_ctrl_c() -> None:
    """Ctrl-C outside the runner's cell loop (loading models, building decoders) ends the process with one
    line instead of a traceback (Python then exits by SIGINT, status 130 in the shell). The runner catches
    Ctrl-C itself while it runs cells: it finishes the row being written, summarises the finished cells and
    exits with :data:`EXIT_INTERRUPTED`."""
    previous = sys.excepthook
    if getattr(previous, "quiet_ctrl_c", False):
        return

    def hook(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        if issubclass(exc_type, KeyboardInterrupt):
            print("interrupted (Ctrl-C) outside the measurement loop; rows already written are kept",
                  file=sys.stderr)
        else:
            previous(exc_type, exc, tb)

    hook.quiet_ctrl_c = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def main_job(cfg: DictConfig) -> float | None:
    """Run one job; returns the best non-vanilla speedup (for Hydra sweepers) or None."""
    run_dir = _run_dir(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    _stop_quietly_on_ctrl_c()
    settings = RunSettings(**OmegaConf.to_container(cfg.runner, resolve=True))
    dec_cfgs = decoder_configs(cfg)
    # The task is built before any model: missing data fails fast.
    task = hydra.utils.instantiate(cfg.task)
    if settings.sample_ids is not None:
        settings.select(list(task.samples()))  # unknown ids fail here, before any model loads
    need_draft = any(bool(c.get("uses_draft")) for c in dec_cfgs.values())
    if need_draft and cfg.model.get("draft") is None:
        users = [n for n, c in dec_cfgs.items() if c.get("uses_draft")]
        raise ConfigError(f"decoders {users} need a draft model but model={cfg.model.name} has none; "
                          "choose a pair with a draft (e.g. model=qwen2.5-coder-1.5b) or drop those decoders")
    pair = load_pair(OmegaConf.to_container(cfg.model, resolve=True), device=cfg.get("device", "auto"),
                     need_draft=need_draft)
    eos = collect_eos_token_ids(pair.tokenizer, pair.target.generation_config)
    supplied = {"target_model": pair.target, "draft_model": pair.draft, "eos_token_ids": eos,
                "tokenizer": pair.tokenizer}
    decoders, params = {}, {}
    for name, dcfg in dec_cfgs.items():
        decoders[name] = build_decoder(dcfg, supplied)
        params[name] = {k: v for k, v in dcfg.items() if k not in NON_PARAM_KEYS}
    env = environment(pair.device, pair.dtype, PROJECT_DIR)
    identity = {
        "model": cfg.model.name,
        "target_model": pair.target_name,
        "draft_model": pair.draft_name,
        "dtype": env["dtype"],
        "device": env["device"],
        "device_name": env["device_name"],
        "git_commit": env["git_commit"],
        "git_dirty": env["git_dirty"],
        "cpu_model": env["cpu_model"],
    }
    try:  # checks the folder against this run's identity, then writes meta.json
        runner = Runner(task, pair, decoders, params, settings, run_dir, identity,
                        chat=cfg.model.get("chat_template"), config=OmegaConf.to_container(cfg, resolve=True),
                        environment=env, meta={"eos_token_ids": sorted(eos)},
                        draft_users=[n for n, c in dec_cfgs.items() if c.get("uses_draft")])
    except ResumeMismatchError as e:
        for line in str(e).splitlines():
            print(f"error: {line}", file=sys.stderr)
        sys.exit(EXIT_REFUSED)
    summary = runner.run()
    print(f"\n{run_dir}/summary.md\n" + (run_dir / "summary.md").read_text())
    if runner.interrupted:
        print(f"interrupted (Ctrl-C): cells measured: {runner.measured}; summary of the finished cells in "
              f"{run_dir}/summary.md; rerun the same command to resume", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    if runner.measured == 0:
        counts = ", ".join(f"{n} {s}" for s, n in runner.status_counts.items()) or "no cells"
        print(f"error: nothing was measured ({counts}; reasons in the rows' `reason` column of "
              f"{runner.writer.path}). A prompt_too_long cell needs a smaller runner.max_new_tokens or a model with a "
              "longer context; an empty_prompt cell needs a non-empty prompt in the task's data.", file=sys.stderr)
        sys.exit(EXIT_NOTHING_MEASURED)
    if runner.errors:
        log.error("%d (sample, decoder) cells failed; see status/reason in %s", runner.errors, runner.writer.path)
        sys.exit(EXIT_FAILED_CELLS)
    if "speedup" not in summary:
        return None
    others = summary[summary["decoder"] != "vanilla"]["speedup"]
    return float(others.max()) if len(others) and others.notna().any() else None
