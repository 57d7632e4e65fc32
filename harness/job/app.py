"""What ``run.py`` does once Hydra has composed the config (kept importable for tests)."""

from __future__ import annotations

import inspect
import logging
import shlex
import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from decoders.common.sampling import GREEDY, SamplingConfig, require_sampling_support
from decoders.common.stopping import collect_eos_token_ids
from harness.config.compose import CONF_DIR, ConfigError, tuning_mismatches, validate
from harness.job.models import ModelLoadError, check_fits, load_pair
from harness.job.resume import ResumeMismatchError
from harness.rows.machine import environment
from harness.rows.grouping import NON_PARAM_KEYS
from harness.job.rundir import pin
from harness.job.runlock import FolderBusyError, acquire
from harness.job.batches import BatchRunner
from harness.job.runner import Runner
from harness.job.run_settings import RunSettings, parse_shard

log = logging.getLogger(__name__)
PROJECT_DIR = Path(__file__).resolve().parents[2]

__all__ = ["ConfigError", "RunIOError", "decoder_configs", "main_job", "resume_command", "CONF_DIR"]


class RunIOError(OSError):
    """Writing the run folder failed (a full disk, a file-size limit, a folder that cannot be written); the
    message says what, that the rows written before are kept, and the command that resumes."""


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
    """:func:`build_task`, with a task data file that is missing or corrupt, or a setting the data makes
    impossible (``task.offset`` past the last problem), refused as :class:`ConfigError` (one line, exit status 2
    in ``run.py``) instead of Hydra's instantiation traceback."""
    from hydra.errors import InstantiationException

    from tasks.data import DataFormatError, DataNotFoundError

    try:
        return build_task(task_cfg)
    except InstantiationException as e:
        cause = e.__cause__
        if isinstance(cause, (DataNotFoundError, DataFormatError, ValueError)):  # a missing file, a bad setting
            raise ConfigError(" ".join(str(cause).split())) from None
        raise


def check_selection(task: Any, settings: RunSettings, task_name: str = "task") -> list[Any]:
    """The samples this job would run, checked before any model loads; returns the selection
    (``task.limit`` / ``task.offset`` / ``runner.sample_ids``).

    Raises:
        ConfigError: the task has no samples (an empty data file, or filters that leave none), an id of
            ``runner.sample_ids`` is not among them, ``runner.shard`` selects none of them, or a multi-turn task
            with ``runner.batch_size > 1``.
    """
    samples = list(task.samples())
    if not samples:
        origin = task.origin
        raise ConfigError(f"task {task_name}: no samples to run: the task data{f' ({origin})' if origin else ''} "
                          "holds no records, or task.offset / task.limit / the task's filters leave none; check the "
                          "data file (an empty or truncated copy?) and the task settings")
    try:
        selected = settings.select(samples)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    turns = max((int(task.turns(s)) for s in selected), default=1)
    if settings.batch_size > 1 and turns > 1:
        raise ConfigError(f"runner.batch_size={settings.batch_size}: task {task_name} has multi-turn samples ({turns} "
                          "turns); static batches run single-turn tasks: use runner.batch_size=1 with it")
    shard = parse_shard(settings.shard)
    if shard is not None and not any(i % shard[1] == shard[0] for i in range(len(selected))):
        raise ConfigError(f"runner.shard={settings.shard} selects none of the {len(selected)} selected samples "
                          f"(sample_index % {shard[1]} == {shard[0]}); use fewer shards than samples")
    return selected


def supplied_arguments(pair: Any, eos_token_ids: set[int] | None = None,
                       sampling: SamplingConfig = GREEDY) -> dict[str, Any]:
    """What the runner supplies to decoder constructors (:data:`harness.config.schemas.RUNNER_SUPPLIED`); the EOS ids
    default to the tokenizer's and generation config's (:func:`collect_eos_token_ids`), sampling to greedy."""
    if eos_token_ids is None:
        eos_token_ids = collect_eos_token_ids(pair.tokenizer, pair.target.generation_config)
    return {"target_model": pair.target, "draft_model": pair.draft, "eos_token_ids": eos_token_ids,
            "tokenizer": pair.tokenizer, "sampling": sampling}


def build_decoder(dcfg: dict[str, Any], supplied: dict[str, Any]) -> Any:
    """Instantiate one decoder config: ``uses_draft`` stripped, then only the runner-supplied arguments
    (:data:`harness.config.schemas.RUNNER_SUPPLIED`) that its constructor names are passed."""
    factory = hydra.utils.instantiate({k: v for k, v in dcfg.items() if k != "uses_draft"})
    params = inspect.signature(factory.func).parameters
    return factory(**{k: v for k, v in supplied.items() if k in params})


def resume_command(run_dir: str | Path) -> str:
    """The shell command that resumes this job: this process's command line (``run.py`` and its overrides; the
    job's overrides when not started by ``run.py``) with its folder pinned, ``hydra.sweep.dir=<root>`` for a
    sweep's job, else ``hydra.run.dir=<run_dir>``: the default folder is named by the time it started, so the
    same command alone would start a new one."""
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get() if HydraConfig.initialized() else None
    if hydra_cfg is not None and hydra_cfg.mode == RunMode.MULTIRUN:
        key, folder = "hydra.sweep.dir", Path(str(hydra_cfg.sweep.dir))
    else:
        key, folder = "hydra.run.dir", Path(run_dir)
    if Path(sys.argv[0]).name == "run.py":
        program, args = sys.argv[0], list(sys.argv[1:])
    else:
        program, args = "run.py", list(hydra_cfg.overrides.task) if hydra_cfg is not None else []
    return shlex.join([sys.executable, program, *pin(args, key, str(folder.resolve()))])


def _choices() -> dict[str, Any] | None:
    return dict(HydraConfig.get().runtime.choices) if HydraConfig.initialized() else None


#: Exit statuses of a run (``python run.py``).
EXIT_FAILED_CELLS = 1      # some cells raised (status=error); the others are in the rows and summary
EXIT_REFUSED = 2           # the run folder holds another run's rows (resume refused); nothing was written
EXIT_NOTHING_MEASURED = 3  # no cell was measured (all prompt_too_long / empty_prompt / error)
EXIT_INTERRUPTED = 130     # Ctrl-C; the finished cells are summarised


def _stop_quietly_on_ctrl_c(resume: str) -> None:
    """Ctrl-C outside the runner's cell loop (loading models, building decoders) ends the process with one
    line instead of a traceback (Python then exits by SIGINT, status 130 in the shell). The runner catches
    Ctrl-C itself while it runs cells: it finishes the row being written, summarises the finished cells and
    exits with :data:`EXIT_INTERRUPTED`. ``resume``: the command that resumes (:func:`resume_command`)."""
    previous = sys.excepthook
    if getattr(previous, "quiet_ctrl_c", False):
        previous = previous.previous  # type: ignore[attr-defined]

    def hook(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        if issubclass(exc_type, KeyboardInterrupt):
            print(f"interrupted (Ctrl-C) outside the measurement loop; rows already written are kept; resume: "
                  f"{resume}", file=sys.stderr)
        else:
            previous(exc_type, exc, tb)

    hook.quiet_ctrl_c = True  # type: ignore[attr-defined]
    hook.previous = previous  # type: ignore[attr-defined]
    sys.excepthook = hook


def main_job(cfg: DictConfig) -> float | None:
    """Run one job; returns the best non-vanilla speedup (for Hydra sweepers) or None.

    Raises:
        ConfigError: the config fails :func:`harness.config.compose.validate`, before task data is read and before
            any model is fetched or loaded; or another process writes the run folder (:mod:`harness.job.runlock`).
        RunIOError: the run folder cannot be made or written (a full disk, a file-size limit); the rows written
            before are kept and the message gives the command that resumes.
    """
    cfg = validate(cfg, choices=_choices())
    run_dir = _run_dir(cfg)
    try:  # one writer per folder: a no-op where run.py took this folder's lock before Hydra wrote into it
        lock = acquire(run_dir)
    except FolderBusyError as e:
        raise ConfigError(str(e)) from None
    except OSError as e:
        raise RunIOError(f"hydra.run.dir={run_dir}: the run folder cannot be made or written: "
                         f"{e.strerror or e}") from None
    with lock:
        return _job(cfg, run_dir)


def _rows_in(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def _job(cfg: DictConfig, run_dir: Path) -> float | None:
    """:func:`main_job` once the config is valid and the run folder is this process's."""
    resume = resume_command(run_dir)
    _stop_quietly_on_ctrl_c(resume)
    settings = RunSettings(**OmegaConf.to_container(cfg.runner, resolve=True))
    dec_cfgs = decoder_configs(cfg)
    for name, dcfg in dec_cfgs.items():  # before any model loads: a decoder that cannot sample must not
        try:                              # silently decode greedily in a sampled run
            require_sampling_support(name, hydra.utils.get_class(dcfg["_target_"]), settings.sampling)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if settings.batch_size > 1 and not getattr(hydra.utils.get_class(dcfg["_target_"]), "supports_batch", False):
            raise ConfigError(f"runner.batch_size={settings.batch_size}: decoder {name!r} does not decode batches "
                              "(docs/decoders.md, \"Static batches\"); drop it from the decoder list or use "
                              "runner.batch_size=1")
    need_draft = any(bool(c.get("uses_draft")) for c in dec_cfgs.values())
    try:  # on CUDA: weights that cannot fit are refused before any data or weight loads
        check_fits(OmegaConf.to_container(cfg.model, resolve=True), cfg.get("device", "auto"), need_draft)
    except ModelLoadError as e:
        raise ConfigError(str(e)) from None
    # The task is built before any model: missing, corrupt or empty data, unknown sample ids and an empty shard
    # fail fast, with one line each. `name` is the config's label, not an argument.
    task = build_task_or_refuse(cfg.task)
    check_selection(task, settings, str(cfg.task.get("name") or task.name))
    pair = load_pair(OmegaConf.to_container(cfg.model, resolve=True), device=cfg.get("device", "auto"),
                     need_draft=need_draft)
    eos = collect_eos_token_ids(pair.tokenizer, pair.target.generation_config)
    chat = task.uses_chat(pair.tokenizer, cfg.model.get("chat_template"))
    eos |= task.stop_token_ids(pair.tokenizer, chat)  # e.g. the chat template's turn markers
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
    mistuned = tuning_mismatches(dec_cfgs, env["dtype"], env["device_name"])  # flagged, not refused
    try:  # checks the folder against this run's identity, then writes meta.json; then runs every cell
        runner = (BatchRunner if settings.batch_size > 1 else Runner)(
                        task, pair, decoders, params, settings, run_dir, identity, notes=mistuned,
                        chat=cfg.model.get("chat_template"), config=OmegaConf.to_container(cfg, resolve=True),
                        environment=env, meta={"eos_token_ids": sorted(eos)},
                        draft_users=[n for n, c in dec_cfgs.items() if c.get("uses_draft")])
        summary = runner.run()
    except ResumeMismatchError as e:  # run.py puts Hydra's files of the folder back and exits EXIT_REFUSED
        raise ConfigError(str(e)) from None
    except OSError as e:  # a full disk, a file-size limit: the rows written so far stay, resume goes on from them
        rows = _rows_in(run_dir / "results.jsonl")
        raise RunIOError(f"writing {e.filename or run_dir} failed: {e.strerror or e}; the {rows} rows written "
                         f"before are kept in {run_dir / 'results.jsonl'}; free space (or raise the file-size "
                         f"limit), then resume: {resume}") from None
    print(f"\n{run_dir}/summary.md\n" + (run_dir / "summary.md").read_text())
    if runner.interrupted:
        print(f"interrupted (Ctrl-C): cells measured: {runner.measured}; summary of the finished cells in "
              f"{run_dir}/summary.md; resume: {resume}", file=sys.stderr)
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
