"""Checks of a command line before anything heavy is imported or run (``run.py`` calls :func:`precheck` first):
group names, experiment presets whose decoder configs are missing, the composed config of every job
(:func:`harness.config.check.validate`), the Hydra launcher. Imports Hydra, OmegaConf and :mod:`harness.config`
only (no torch, transformers or pandas), so a refusal takes well under two seconds; ``python run.py list`` lives
here for the same reason.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any, NamedTuple, Sequence

from omegaconf import OmegaConf

import declare
from harness.config.compose import (CONF_DIR, TUNED_GROUP, ConfigError, available, compose, decoder_key,
                            override_problems, refuse_group_lists, suggestion, validate)
from harness.config.schemas import SCHEMAS

GROUPS = ("model", "task", "decoder", "runner", "experiment")
#: Groups whose settings are declared (:mod:`declare`), so ``run.py list GROUP=NAME`` prints them.
SETTINGS_GROUPS = ("decoder", "task", "runner")
#: Sweep points composed by :func:`precheck` at most (each compose takes ~0.2 s).
MAX_PRECHECK_COMPOSES = 64


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


def list_configs(args: list[str] | None = None) -> str:
    """``python run.py list [GROUP ...] [GROUP=NAME ...]``: every model, decoder, task, runner and experiment
    config with its one-line description; ``GROUP=NAME`` prints that config's settings instead
    (:func:`settings_table`).

    Raises:
        ConfigError: an unknown group or name (``run.py`` prints it as one ``error:`` line, exit 2).
    """
    named = [a for a in args or [] if "=" in a]
    groups = [a for a in args or [] if "=" not in a]
    unknown = [g for g in groups + [a.split("=")[0] for a in named] if g not in GROUPS]
    if unknown:
        raise ConfigError(f"unknown config group {', '.join(unknown)}; groups: {', '.join(GROUPS)}")
    lines = []
    for arg in named:
        lines += [settings_table(*arg.split("=", 1)), ""]
    for group in groups or ([] if named else GROUPS):
        entries = describe(group)
        width = max((len(n) for n, _ in entries), default=0)
        settings = f"; its settings: python run.py list {group}=NAME" if group in SETTINGS_GROUPS else ""
        lines.append(f"{group} ({group}=NAME{settings}):")
        lines += [f"  {name.ljust(width)}  {text}".rstrip() for name, text in entries]
        lines.append("")
    if named and not groups:
        return "\n".join(lines).rstrip()
    return "\n".join(lines) + "Use: python run.py model=NAME task=NAME 'decoder=[vanilla,NAME]' [experiment=NAME]"


def settings_table(group: str, name: str) -> str:
    """The settings of ``conf/<group>/<name>.yaml``: one line per setting with its value in this config (and
    the default where the config changes it), what is allowed and what it means, all read from the declaration
    its schema is built on (``decoders/settings.py``, the task modules; :mod:`declare`).

    Raises:
        ConfigError: the config does not exist, or its group has no declared settings (models, experiments).
    """
    if name not in available(group):
        hint = suggestion(name, available(group))
        raise ConfigError(f"unknown {group} {name!r}" + (f" (did you mean {hint}?)" if hint else "")
                          + f". Valid choices for {group}: {', '.join(available(group))}")
    node = OmegaConf.to_container(OmegaConf.load(CONF_DIR / group / f"{name}.yaml"))
    first = next((d for d in node.pop("defaults", []) if isinstance(d, str)), "")
    first = first.split("@")[0].removeprefix(f"/{group}/")  # tuned/ configs: /decoder/base_decoder_x@_here_
    schema = SCHEMAS.get(group, {}).get(first)
    if schema is None or group not in SETTINGS_GROUPS:
        raise ConfigError(f"{group}={name}: settings are listed for {', '.join(SETTINGS_GROUPS)}; read "
                          f"conf/{group}/{name}.yaml for the rest")
    rows = [("setting", "value", "allowed", "meaning")] + declare.rows(schema, node)
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    head = describe(group)[available(group).index(name)][1]
    target = getattr(schema, "_target_", "")
    out = [f"{group}={name}" + (f" ({target})" if target else "") + (f": {head}" if head else "")]
    out += [f"  {r[0].ljust(widths[0])}  {r[1].ljust(widths[1])}  {r[2].ljust(widths[2])}  {r[3]}".rstrip()
            for r in rows]
    if len(rows) == 1:
        out.append("  (no settings of its own)")
    main_job = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "config.yaml")).get(group)
    if isinstance(main_job, dict) and main_job:  # the main job's own values beat the file's (e.g. task.limit)
        given = ", ".join(f"{k}={declare.show(v, cut=True)}" for k, v in main_job.items())
        out.append(f"  The main job (conf/config.yaml) sets {given}; an experiment or the command line may set others.")
    return "\n".join(out)


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
        if sep and key.startswith("decoder.") and "/" in key.split(".")[1]:  # Hydra: a 4-line grammar error
            node = decoder_key(key.split(".")[1])
            rest = ".".join(key.split(".")[2:])
            raise ConfigError(f"{arg}: a decoder's settings sit under its node name, not its config path: "
                              f"decoder.{node}{'.' + rest if rest else ''}={value}")
        if not sep or key not in GROUPS:
            continue
        names = [v.strip() for v in value.strip("[]").split(",") if v.strip()]
        choices = available(key)
        unknown = [n for n in names if n not in choices and not any(c in n for c in "*?$()")]
        if unknown and value not in ("null",):
            hints = [h for n in unknown if (h := suggestion(n, choices))]
            raise ConfigError(f"unknown {key} {', '.join(map(repr, unknown))}"
                              + (f" (did you mean {', '.join(hints)}?)" if hints else "")
                              + f". Valid choices for {key}: {', '.join(choices)}")
        if key == "decoder":
            nodes = [decoder_key(n) for n in names]
            twice = sorted({n for n in nodes if nodes.count(n) > 1})
            if twice:  # Hydra would merge them into one node silently
                raise ConfigError(f"{arg}: {', '.join(twice)} selected twice (configs "
                                  f"{', '.join(n for n in names if decoder_key(n) in twice)} fill the same decoder "
                                  "node); keep one")
        missing = [m for n in names for m in missing_decoder_configs(n)] if key == "experiment" else []
        if missing and not any(a.lstrip("+~").startswith("decoder=") for a in argv):
            raise ConfigError(f"{arg}: decoder configs {', '.join(missing)} do not exist yet in conf/decoder/. "
                              f"{TUNED_GROUP}/*_tuned configs are written by benchmarks/tune.py from the dev-split "
                              "tuning runs "
                              "(docs/experiments.md, \"Tuning protocol\").")


def _sweeper_overrides(overrides: list[str], sweeper_params: dict[str, str]) -> list[str]:
    """A sweep's overrides in the order Hydra's basic sweeper reads them: ``hydra.sweeper.params`` first, then the
    command line (which wins)."""
    return [f"{k}={v}" for k, v in sweeper_params.items()] + overrides


def _job_config(cfg: Any) -> Any:
    """The validated job config (:func:`validate`) of a config composed with ``return_hydra_config=True``."""
    return validate(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]),
                    choices=dict(cfg.hydra.runtime.choices))


def _sweep_points(overrides: list[str], sweeper_params: dict[str, str]) -> tuple[list[list[str]], int]:
    """Override lists covering every value of every sweep once (not the cross product): the first point takes
    each sweep's first value, each further point changes one sweep to one other value; and the number of jobs
    (the cross product's size)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    fixed: list[str] = []
    sweeps: dict[str, list[str]] = {}
    for ov in parser.parse_overrides(_sweeper_overrides(overrides, sweeper_params)):
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
    return points, math.prod(len(v) for v in sweeps.values() if v)


class Folder(NamedTuple):
    """Where a command's jobs write: the single run's folder, or (``multirun``) the sweep's root; and what prices
    them (:func:`harness.config.estimate.line`): the composed config of each job checked and the number of jobs."""

    path: Path
    multirun: bool = False
    configs: tuple = ()
    njobs: int = 1


def precheck(argv: Sequence[str]) -> Folder | None:
    """What ``run.py`` does before Hydra starts: check group names, then compose and :func:`validate` the
    config of every job the command line asks for (each value of each sweep, the experiment's
    ``hydra.sweeper.params`` included; at most :data:`MAX_PRECHECK_COMPOSES` compositions, combinations of
    values are left to each job's own check in :func:`main_job`), so a misspelt key or a value out of bounds
    stops the run before any folder is made, any task data read or any model fetched.

    Returns:
        The run folder of a single run, or the root folder of a sweep (as composed now), else None (a command
        that runs no job, or a folder only Hydra's runtime resolves).

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
        run_dir = next((o for o in parsed if o.get_key_element().lstrip("+~") == "hydra.run.dir"), None)
        if run_dir is not None:  # Hydra would ignore it and write into the preset's own sweep folder
            raise ConfigError(f"{run_dir.input_line}: a sweep (-m, or an experiment that sets hydra.mode=MULTIRUN) "
                              "writes under hydra.sweep.dir, one subfolder per job; write "
                              f"hydra.sweep.dir={run_dir.input_line.partition('=')[2]} instead")
    else:
        launcher = next((o for o in parsed if o.get_key_element().lstrip("+~") == "hydra/launcher"), None)
        if launcher is not None:  # Hydra runs a single job in-process and ignores the launcher silently
            raise ConfigError(f"{launcher.input_line}: a launcher runs the jobs of a multirun only; add -m "
                              f"(python run.py -m {launcher.input_line} ...) or drop it")
    if len(plain) < len(parsed) and not multirun:  # a sweep without -m (Hydra's 6-line advice misleads for groups)
        sweep = next(o for o in parsed if o.is_sweep_override())
        key = sweep.get_key_element().lstrip("+~")
        if key in GROUPS and key != "decoder":
            raise ConfigError(f"{sweep.input_line}: one {key} per job; add -m to run one job per {key} "
                              f"(python run.py -m {sweep.input_line} ...)")
        raise ConfigError(f"{sweep.input_line}: a comma-separated value is a sweep; add -m to run one job per value, "
                          f"or use brackets for a list ({key}=[...])")
    if not multirun:
        problems = override_problems(plain, base)
        if problems:
            raise ConfigError("\n".join(problems))
        job = _job_config(base)
        try:  # the folder the single run will use (harness.job.rundir snapshots it before Hydra writes into it)
            run_dir = Path(str(base.hydra.run.dir))
        except Exception:  # an interpolation only Hydra's runtime resolves
            return None
        check_run_dir(run_dir)
        check_resume(run_dir, job)
        return Folder(run_dir, configs=(base,))
    params = base.hydra.sweeper.get("params")
    params = OmegaConf.to_container(params, resolve=False) if params is not None else {}
    params = {str(k): str(v) for k, v in params.items()}
    points, njobs = _sweep_points(list(args.overrides), params)
    configs = [compose(point) for point in points[:MAX_PRECHECK_COMPOSES]]
    try:
        sweep_dir = Path(str(base.hydra.sweep.dir))
    except Exception:  # an interpolation only Hydra's runtime resolves
        return None
    if str(base.hydra.sweeper.get("_target_", "")).endswith(".BasicSweeper"):
        check_sweep_resume(sweep_dir, list(args.overrides), params)
    return Folder(sweep_dir, multirun=True, configs=tuple(configs), njobs=njobs)


def check_sweep_resume(sweep_dir: Path, overrides: list[str], sweeper_params: dict[str, str]) -> None:
    """:func:`check_resume` for each job of a sweep whose folder holds rows, before any job runs (each job would
    refuse its own folder, but only after the jobs before it ran and its models loaded). The jobs are Hydra's
    basic sweeper's own enumeration (``BasicSweeper.split_arguments``: job ``n`` is the ``n``-th combination) and
    each one's folder is ``hydra.sweep.dir/hydra.sweep.subdir`` composed with ``hydra.job.num = n``; at most
    :data:`MAX_PRECHECK_COMPOSES` jobs are checked, the others check themselves.

    Raises:
        ConfigError: as :func:`check_resume`, naming the job's folder.
    """
    if not sweep_dir.is_dir() or not any(sweep_dir.glob("*/results.jsonl")):
        return  # a new sweep (the common case): nothing to compose
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import open_dict

    try:
        jobs = BasicSweeper.split_arguments(
            OverridesParser.create().parse_overrides(_sweeper_overrides(overrides, sweeper_params)), None)[0]
    except Exception:  # a sweep the basic sweeper refuses (ranges): Hydra says so
        return
    for num, job_overrides in enumerate(jobs[:MAX_PRECHECK_COMPOSES]):
        cfg = compose(job_overrides, return_hydra_config=True, check=False)
        with open_dict(cfg):
            cfg.hydra.job.num = num
        try:
            folder = Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)
        except Exception:  # an interpolation only Hydra's runtime resolves
            continue
        if (folder / "results.jsonl").is_file():
            check_resume(folder, _job_config(cfg), new_folder="hydra.sweep.dir")


def check_run_dir(run_dir: Path) -> None:
    """Refuse a run folder that cannot be one: a file, a dangling symlink, or a path through a file (Hydra would
    stop with a FileExistsError traceback)."""
    probe = run_dir
    while not probe.exists() and not probe.is_symlink() and probe != probe.parent:
        probe = probe.parent
    if probe.is_symlink() and not probe.exists():
        raise ConfigError(f"hydra.run.dir={run_dir}: {probe} is a symlink to nothing; point hydra.run.dir at a folder")
    if not probe.is_dir():
        raise ConfigError(f"hydra.run.dir={run_dir}: {probe} is a file, not a folder; point hydra.run.dir at a folder")


def check_resume(run_dir: Path, job: Any, new_folder: str = "hydra.run.dir") -> None:
    """Refuse, in one line, to resume a folder whose rows were measured under other settings (its ``meta.json``
    names them): the job would refuse it too (:func:`harness.job.resume.prepare_folder`), but only after loading
    the models. Differences only the job can see (code version, packages, machine, data) are left to it.

    Args:
        run_dir: the single run's folder, or a sweep job's.
        job: the command's validated config (:func:`harness.config.compose.validate`).
        new_folder: the setting that names another folder (a sweep's jobs write under ``hydra.sweep.dir``).

    Raises:
        ConfigError: naming the first differing setting and the two ways on.
    """
    import json

    from harness.config.identity import config_differences, shard_text

    if not job.runner.get("resume", True):
        return
    try:
        if not _holds_a_row(run_dir / "results.jsonl"):
            return  # nothing to resume (blank lines, a torn first row: the job cuts it off and starts)
        stored = json.loads((run_dir / "meta.json").read_text())
        identity = stored.get("identity")
    except (OSError, ValueError, AttributeError):
        return  # no readable meta.json: the job's own check decides
    if not isinstance(identity, dict):
        return
    diff = config_differences(identity, OmegaConf.to_container(job, resolve=True))
    old_shard, new_shard = shard_text(stored.get("shard")), shard_text(job.runner.get("shard"))
    if old_shard != new_shard:  # not in the identity: the shards of one run share it
        diff.insert(0, f"runner.shard: {old_shard} -> {new_shard}")
    if diff:
        more = f" and {len(diff) - 1} more" if len(diff) > 1 else ""
        raise ConfigError(f"{run_dir} holds rows measured with other settings ({diff[0]}{more}; folder -> this "
                          f"command), so nothing was run: write to a new folder ({new_folder}=<new folder>) or pass "
                          f"runner.resume=false to start it over (its files move to {run_dir / 'superseded'}/<time>/)")


def _holds_a_row(path: Path) -> bool:
    """Whether ``path`` holds a complete row (a JSON object on a line); reads up to the first."""
    import json

    with open(path, "rb") as f:
        for line in f:
            try:
                if isinstance(json.loads(line), dict):
                    return True
            except (ValueError, RecursionError):  # as harness.rows.results.read_results: not a row
                continue
    return False


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
