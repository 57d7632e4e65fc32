"""What ``run.py`` does once Hydra has composed the config (kept importable for tests)."""

from __future__ import annotations

import inspect
import logging
import shutil
import sys
from pathlib import Path
from typing import Any, Sequence

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from decoders.common.sampling import GREEDY, SamplingConfig, require_sampling_support
from decoders.common.stopping import collect_eos_token_ids
from harness.config import (
    CONF_DIR, ConfigError, compose, refuse_group_lists, tuning_mismatches, validate,
)
from harness.metrics import to_markdown
from harness.models import ModelLoadError, check_fits, load_pair
from harness.resume import ResumeMismatchError
from harness.results import environment
from harness.runner import NON_PARAM_KEYS, RunSettings, Runner, parse_shard
from tasks.base import task_stop_token_ids

log = logging.getLogger(__name__)
PROJECT_DIR = Path(__file__).resolve().parent.parent

__all__ = ["ConfigError", "check_choices", "precheck", "decoder_configs", "main_job", "CONF_DIR"]

GROUPS = ("model", "task", "decoder", "runner", "experiment")
#: Sweep points composed by :func:`precheck` at most (each compose takes ~0.2 s).
MAX_PRECHECK_COMPOSES = 64


def available(group: str) -> list[str]:
    """Names of the configs in ``conf/<group>/``."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def describe(group: str) -> list[tuple[str, str]]:
    """``(name, description)`` of every config in ``conf/<group>/``: the description is the first comment line
    of its YAML that is not a ``# @package`` directive (empty when there is none), with `` ...`` when its
    sentence goes on."""
    out = []
    for name in available(group):
        text = ""
        lines = (CONF_DIR / group / f"{name}.yaml").read_text().splitlines() + [""]
        for line, after in zip(lines, lines[1:]):
            if line.startswith("#") and not line.startswith("# @package"):
                text = line.lstrip("#").strip()
                if after.startswith("#") and not text.endswith((".", ":", ")")):
                    text += " ..."
                break
        out.append((name, text))
    return out


def list_configs(groups: list[str] | None = None) -> str:
    """``python run.py list [GROUP ...]``: every model, decoder, task, runner and experiment config with its
    one-line description. Raises SystemExit on an unknown group."""
    unknown = [g for g in groups or [] if g not in GROUPS]
    if unknown:
        sys.exit(f"error: unknown config group {', '.join(unknown)}; groups: {', '.join(GROUPS)}")
    lines = []
    for group in groups or GROUPS:
        entries = describe(group)
        width = max((len(n) for n, _ in entries), default=0)
        lines.append(f"{group} ({group}=NAME):")
        lines += [f"  {name.ljust(width)}  {text}".rstrip() for name, text in entries]
        lines.append("")
    return "\n".join(lines) + "Use: python run.py model=NAME task=NAME 'decoder=[vanilla,NAME]' [experiment=NAME]"


def missing_decoder_configs(experiment: str) -> list[str]:
    """Decoder configs that ``conf/experiment/<experiment>.yaml`` selects (``override /decoder: [...]``) and that
    ``conf/decoder/`` lacks, e.g. the held-out races' ``speculative_tuned`` before benchmarks/tune.py wrote it."""
    defaults = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "experiment" / f"{experiment}.yaml")).get("defaults")
    names = [v for d in defaults or [] if isinstance(d, dict) for k, v in d.items()
             if k.replace("override", "").strip(" /") == "decoder"]
    names = [n for v in names for n in (v if isinstance(v, list) else [v])]
    return [n for n in names if n and not (CONF_DIR / "decoder" / f"{n}.yaml").is_file()]


def check_choices(argv: Sequence[str]) -> None:
    """Before Hydra composes: an unknown model, task, decoder or experiment name, or a list for a group that
    takes one name (``task=[humaneval,mbpp]``), raises :class:`ConfigError` with the valid choices; so does an
    experiment selecting decoder configs not written yet (:func:`missing_decoder_configs`; Hydra would name
    only the first one and not say where ``*_tuned`` configs come from).

    Understands ``group=name``, ``group=[a,b]``, ``+group=name`` and ``-m`` sweeps ``group=a,b``.
    """
    refuse_group_lists([a for a in argv if not a.startswith("-")])
    for arg in argv:
        key, sep, value = arg.lstrip("+~").partition("=")
        if not sep or key not in GROUPS:
            continue
        names = [v.strip() for v in value.strip("[]").split(",") if v.strip()]
        choices = available(key)
        unknown = [n for n in names if n not in choices and not any(c in n for c in "*?$()")]
        if unknown and value not in ("null",):
            raise ConfigError(f"unknown {key} {', '.join(map(repr, unknown))}. Valid choices for {key}: "
                              f"{', '.join(choices)}")
        missing = [m for n in names for m in missing_decoder_configs(n)] if key == "experiment" else []
        if missing and not any(a.lstrip("+~").startswith("decoder=") for a in argv):
            raise ConfigError(f"{arg}: decoder configs {', '.join(missing)} do not exist yet in conf/decoder/. "
                              "*_tuned configs are written by benchmarks/tune.py from the dev-split tuning runs "
                              "(docs/experiments.md, \"Tuning protocol\").")


def _sweep_points(overrides: list[str], sweeper_params: dict[str, str]) -> list[list[str]]:
    """Override lists covering every value of every sweep once (not the cross product): the first point takes
    each sweep's first value, each further point changes one sweep to one other value."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    fixed: list[str] = []
    sweeps: dict[str, list[str]] = {}
    given = [f"{k}={v}" for k, v in sweeper_params.items()] + overrides  # the command line wins
    for ov in parser.parse_overrides(given):
        key = ov.get_key_element()
        if ov.is_sweep_override():
            try:
                values = [f"{key}={v}" for v in ov.sweep_string_iterator()]
            except Exception:  # glob() and interval() sweeps: checked per job by main_job
                continue
            sweeps[key] = values
        else:
            fixed = [f for f in fixed if f.split("=", 1)[0] != key] + [ov.input_line]
            sweeps.pop(key, None)
    first = {k: v[0] for k, v in sweeps.items() if v}
    points = [fixed + list(first.values())]
    for key, values in sweeps.items():
        for v in values[1:]:
            points.append(fixed + [v if k == key else f for k, f in first.items()])
    return points


def precheck(argv: Sequence[str]) -> None:
    """What ``run.py`` does before Hydra starts: check group names, then compose and :func:`validate` the
    config of every job the command line asks for (each value of each sweep, the experiment's
    ``hydra.sweeper.params`` included; at most :data:`MAX_PRECHECK_COMPOSES` compositions, combinations of
    values are left to each job's own check in :func:`main_job`), so a misspelt key or a value out of bounds
    stops the run before any folder is made, any task data read or any model fetched.

    Raises:
        ConfigError: one line per problem.
    """
    argv = list(argv)
    try:
        from hydra._internal.utils import get_args_parser  # Hydra's own command-line parser

        args = get_args_parser().parse_args(argv)
    except (Exception, SystemExit):
        return  # Hydra reports its own usage errors
    check_choices(args.overrides)
    if (args.config_name or args.config_path or args.config_dir or args.help or args.hydra_help or args.info
            or args.shell_completion or args.experimental_rerun):
        return  # another config, or no job: leave it to Hydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode

    try:
        parsed = OverridesParser.create().parse_overrides(args.overrides)
    except Exception:
        return  # a syntax error: Hydra reports it
    plain = [o.input_line for o in parsed if not o.is_sweep_override()]
    base = compose(plain, return_hydra_config=True, check=False)
    multirun = args.multirun or base.hydra.mode == RunMode.MULTIRUN  # experiments set hydra.mode themselves
    if multirun:
        check_launcher(base.hydra.get("launcher"), dict(base.hydra.runtime.choices).get("hydra/launcher"))
    if len(plain) < len(parsed) and not multirun:
        return  # a sweep without -m: Hydra says how to fix it
    if not multirun:
        validate(OmegaConf.masked_copy(base, [k for k in base if k != "hydra"]),
                 choices=dict(base.hydra.runtime.choices))
        return
    params = base.hydra.sweeper.get("params")
    params = OmegaConf.to_container(params, resolve=False) if params is not None else {}
    points = _sweep_points(list(args.overrides), {str(k): str(v) for k, v in params.items()})
    for point in points[:MAX_PRECHECK_COMPOSES]:
        compose(point)


def check_launcher(launcher: Any, choice: str | None) -> None:
    """Refuse, in one line, a Hydra launcher whose requirements this machine lacks (before any job starts).

    A SLURM launcher (``hydra/launcher=slurm_gpu``, submitit's ``submitit_slurm``) submits with ``sbatch``; without
    it submitit fails after the sweep has started, in a 25-line traceback.

    Raises:
        ConfigError: naming the launcher, what is missing and what to use instead.
    """
    target = str((launcher or {}).get("_target_", ""))
    if "SlurmLauncher" in target and shutil.which("sbatch") is None:
        raise ConfigError(f"hydra/launcher={choice or target}: submits SLURM jobs with `sbatch`, which is not on "
                          "this machine's PATH; run on a SLURM login node, or drop the launcher (jobs run here one "
                          "after another) or use hydra/launcher=local_cpu")


def _run_dir(cfg: DictConfig) -> Path:
    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path(cfg.get("output_dir") or "results/unnamed")


def decoder_configs(cfg: DictConfig) -> dict[str, dict[str, Any]]:
    """``cfg.decoder`` (Hydra multi-select: name -> config) as plain dicts, vanilla first (added if missing)."""
    raw = OmegaConf.to_container(cfg.decoder, resolve=True) if cfg.get("decoder") is not None else {}
    if not raw:
        raise ConfigError("no decoder selected: pass e.g. decoder=[vanilla,speculative]")
    if "_target_" in raw:
        raise ConfigError("`decoder` must be a list of decoder names, e.g. decoder=[vanilla,speculative]")
    if "vanilla" not in raw:
        log.info("adding the vanilla decoder: it is the reference for speedup and equality")
        raw = {"vanilla": {"_target_": "decoders.vanilla.VanillaDecoder", "_partial_": True, "uses_draft": False},
               **raw}
    return {"vanilla": raw["vanilla"], **{k: v for k, v in raw.items() if k != "vanilla"}}


def build_task(task_cfg: Any) -> Any:
    """Instantiate ``cfg.task`` (a DictConfig or dict): ``name`` is the config's label, not an argument."""
    raw = OmegaConf.to_container(task_cfg, resolve=True) if isinstance(task_cfg, DictConfig) else dict(task_cfg)
    return hydra.utils.instantiate({k: v for k, v in raw.items() if k != "name"})


def build_task_or_refuse(task_cfg: Any) -> Any:
    """:func:`build_task`, with a task data file that is missing or corrupt refused as :class:`ConfigError` (one
    line, exit status 2 in ``run.py``) instead of Hydra's instantiation traceback."""
    from hydra.errors import InstantiationException

    from tasks.data import DataFormatError, DataNotFoundError

    try:
        return build_task(task_cfg)
    except InstantiationException as e:
        cause = e.__cause__
        if isinstance(cause, (DataNotFoundError, DataFormatError)):
            raise ConfigError(" ".join(str(cause).split())) from None
        raise


def check_selection(task: Any, settings: RunSettings, task_name: str = "task") -> list[Any]:
    """The samples this job would run, checked before any model loads; returns the selection
    (``task.limit`` / ``task.offset`` / ``runner.sample_ids``).

    Raises:
        ConfigError: the task has no samples (an empty data file, or filters that leave none), an id of
            ``runner.sample_ids`` is not among them, or ``runner.shard`` selects none of them.
    """
    samples = list(task.samples())
    if not samples:
        origin = getattr(task, "origin", None) or getattr(task, "data_path", None)
        raise ConfigError(f"task {task_name}: no samples to run: the task data{f' ({origin})' if origin else ''} "
                          "holds no records, or task.offset / task.limit / the task's filters leave none; check the "
                          "data file (an empty or truncated copy?) and the task settings")
    try:
        selected = settings.select(samples)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    shard = parse_shard(settings.shard)
    if shard is not None and not any(i % shard[1] == shard[0] for i in range(len(selected))):
        raise ConfigError(f"runner.shard={settings.shard} selects none of the {len(selected)} selected samples "
                          f"(sample_index % {shard[1]} == {shard[0]}); use fewer shards than samples")
    return selected


def supplied_arguments(pair: Any, eos_token_ids: set[int] | None = None,
                       sampling: SamplingConfig = GREEDY) -> dict[str, Any]:
    """What the runner supplies to decoder constructors (:data:`harness.config.RUNNER_SUPPLIED`); the EOS ids
    default to the tokenizer's and generation config's (:func:`collect_eos_token_ids`), sampling to greedy."""
    if eos_token_ids is None:
        eos_token_ids = collect_eos_token_ids(pair.tokenizer, pair.target.generation_config)
    return {"target_model": pair.target, "draft_model": pair.draft, "eos_token_ids": eos_token_ids,
            "tokenizer": pair.tokenizer, "sampling": sampling}


def build_decoder(dcfg: dict[str, Any], supplied: dict[str, Any]) -> Any:
    """Instantiate one decoder config: ``uses_draft`` stripped, then only the runner-supplied arguments
    (:data:`harness.config.RUNNER_SUPPLIED`) that its constructor names are passed."""
    factory = hydra.utils.instantiate({k: v for k, v in dcfg.items() if k != "uses_draft"})
    params = inspect.signature(factory.func).parameters
    return factory(**{k: v for k, v in supplied.items() if k in params})


def _choices() -> dict[str, Any] | None:
    return dict(HydraConfig.get().runtime.choices) if HydraConfig.initialized() else None


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
    """Run one job; returns the best non-vanilla speedup (for Hydra sweepers) or None.

    Raises:
        ConfigError: the config fails :func:`harness.config.validate`, before task data is read and before
            any model is fetched or loaded.
    """
    cfg = validate(cfg, choices=_choices())
    run_dir = _run_dir(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    _stop_quietly_on_ctrl_c()
    settings = RunSettings(**OmegaConf.to_container(cfg.runner, resolve=True))
    dec_cfgs = decoder_configs(cfg)
    for name, dcfg in dec_cfgs.items():  # before any model loads: a decoder that cannot sample must not
        try:                              # silently decode greedily in a sampled run
            require_sampling_support(name, hydra.utils.get_class(dcfg["_target_"]), settings.sampling)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    need_draft = any(bool(c.get("uses_draft")) for c in dec_cfgs.values())
    try:  # on CUDA: weights that cannot fit are refused before any data or weight loads
        check_fits(OmegaConf.to_container(cfg.model, resolve=True), cfg.get("device", "auto"), need_draft)
    except ModelLoadError as e:
        raise ConfigError(str(e)) from None
    # The task is built before any model: missing, corrupt or empty data, unknown sample ids and an empty shard
    # fail fast, with one line each. `name` is the config's label, not an argument.
    task = build_task_or_refuse(cfg.task)
    check_selection(task, settings, str(cfg.task.get("name") or getattr(task, "name", "task")))
    pair = load_pair(OmegaConf.to_container(cfg.model, resolve=True), device=cfg.get("device", "auto"),
                     need_draft=need_draft)
    eos = collect_eos_token_ids(pair.tokenizer, pair.target.generation_config)
    eos |= task_stop_token_ids(task, pair.tokenizer, cfg.model.get("chat_template"))  # e.g. chat turn markers
    supplied = supplied_arguments(pair, eos, settings.sampling)
    decoders, params = {}, {}
    for name, dcfg in dec_cfgs.items():
        try:
            decoders[name] = build_decoder(dcfg, supplied)
        except ValueError as e:  # a setting this pair cannot honour: one line, nothing measured yet
            raise ConfigError(f"decoder {name}: {e}") from None
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
        "cpu_isa": env["cpu_isa"],
        "native_half_precision": env["native_half_precision"],
    }
    mistuned = tuning_mismatches(list(dec_cfgs), env["dtype"], env["device_name"])  # flagged, not refused
    try:  # checks the folder against this run's identity, then writes meta.json
        runner = Runner(task, pair, decoders, params, settings, run_dir, identity, notes=mistuned,
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
        counts = ", ".join(f"{n} {s}" for s, n in runner.status_counts.items())
        where = (f"{counts}; reasons in the rows' `reason` column of {runner.writer.path}" if counts else
                 f"no cell was run and no row was written; {len(runner.work)} samples were selected")
        print(f"error: nothing was measured ({where}). A prompt_too_long cell needs a smaller runner.max_new_tokens "
              "or a model with a longer context; an empty_prompt cell needs a non-empty prompt in the task's data.",
              file=sys.stderr)
        sys.exit(EXIT_NOTHING_MEASURED)
    if runner.errors:
        log.error("%d (sample, decoder) cells failed; see status/reason in %s", runner.errors, runner.writer.path)
        sys.exit(EXIT_FAILED_CELLS)
    if "speedup" not in summary:
        return None
    others = summary[summary["decoder"] != "vanilla"]["speedup"]
    return float(others.max()) if len(others) and others.notna().any() else None
