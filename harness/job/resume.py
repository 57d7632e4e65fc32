"""Run identity and resumable runs: which (sample, decoder, repeat) cells of a run folder are already done,
and whether the rows in a folder may be resumed at all.

**Run identity.** Everything that can change a run's outputs or timing, as one flat dict
(:func:`build_identity`): the full resolved config (model specs with seeds, paths and sha256,
``attn_implementation``, ``chat_template``, dtype; task settings with ``num_fewshot``, ``prompt_style``,
``limit``; runner settings with ``max_new_tokens``, warm-up, seed, repeats, order, ``sample_ids``; every
decoder's hyper-parameters), the data (a sha256 over the selected samples and their rendered prompts, plus
where they were read from), the code version (git commit, dirty flag, sha256 of the uncommitted diff), the
package versions and the machine (device, device name, torch threads on CPU). Only ``runner.resume``,
``runner.shard`` (a column of its own) and the output folder are left out. Its sha256 prefix is the
``run_identity`` column of every row; ``meta.json`` holds the dict. Shards of one run share the identity
and differ in ``shard``, so a report can merge them.

**Resume.** Re-running the same command into the same folder with ``runner.resume=true`` (the default)
skips every cell that already has a row with status ``ok`` (or a deterministic skip: ``prompt_too_long``,
``empty_prompt``) and computes only the rest. When the folder holds rows of another identity (or shard) the
run is refused before anything is written, naming the settings that differ (:class:`ResumeMismatchError`):
rows are never mixed and ``meta.json`` is never rewritten to claim a config its rows do not have. With
``runner.resume=false`` the folder starts over: its files are moved to ``superseded/<time>/`` (nothing is
deleted; the rows file is renamed ``results.superseded.jsonl`` so reports do not pick it up), together with
the old run's record: its ``.hydra/`` and logs as they were before this job's Hydra rewrote them
(:func:`harness.job.rundir.before`), with their times.

**Pairing across processes.** A resumed process adopts the ``run_id`` of the folder's earlier rows, so
tools that pair a decoder with vanilla by ``(run_id, task, sample_id, turn, repeat)`` see one run;
``attempt_id`` (one per process) tells the processes apart. A decoder row paired with a vanilla row of
another process is flagged (``paired_across_processes``; :func:`harness.rows.identity.cross_process_pairs`
recomputes it over a folder), and the summary says how many there are: such a speedup compares timings from
two processes.

Which cell a row fills and when it counts as done (:func:`harness.rows.identity.cell_key`) is row identity, shared
with the report. Pure Python and pandas; no torch.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from harness.config.identity import config_identity, differences, shard_text
from harness.job import rundir
from harness.rows.columns import norm
from harness.rows.identity import DONE_STATUSES, cell_key, latest_rows  # noqa: F401 (latest_rows: for the runner)
from harness.rows.results import read_results

log = logging.getLogger(__name__)

#: Where ``runner.resume=false`` moves a folder's earlier files.
SUPERSEDED_DIR = "superseded"
SUPERSEDED_FILES = {"results.jsonl": "results.superseded.jsonl", "meta.json": "meta.json",
                    "summary.csv": "summary.csv", "summary.md": "summary.md"}


class ResumeMismatchError(ValueError):
    """The run folder holds rows of another run identity; the message names the differing settings and
    the two ways on (a new folder, or ``runner.resume=false``)."""


# ------------------------------------------------------------------------------------------ identity
def build_identity(config: Mapping[str, Any], environment: Mapping[str, Any],
                   data: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The run identity as a flat dict (see the module docstring).

    Args:
        config: the resolved config as plain containers (``OmegaConf.to_container(cfg, resolve=True)``).
        environment: :func:`harness.rows.machine.environment` (packages, git, device, threads).
        data: ``{"fingerprint": ..., "origin": ..., "samples": ...}`` of the selected samples.
    """
    flat = config_identity(config)
    for k in ("git_commit", "git_dirty", "git_diff_sha256"):
        flat[f"code.{k}"] = environment.get(k)
    flat["packages.python"] = environment.get("python")
    for pkg, version in (environment.get("packages") or {}).items():
        flat[f"packages.{pkg}"] = version
    flat["machine.device"] = environment.get("device")
    flat["machine.device_name"] = environment.get("device_name")
    if str(environment.get("device", "cpu")).startswith("cpu"):
        flat["machine.torch_num_threads"] = environment.get("torch_num_threads")
    for k, v in (data or {}).items():
        flat[f"data.{k}"] = v
    return flat


def identity_hash(identity: Mapping[str, Any]) -> str:
    """16 hex digits of the sha256 of the identity (canonical JSON)."""
    blob = json.dumps(dict(identity), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


#: Identity keys left out of :func:`group_identity`: the decoders a run lists (its rows tell them apart by
#: decoder name and hyper-parameters) and the run seed (runs that differ only in ``runner.seed`` are
#: replicates of one setting; sampled runs draw other tokens, which is what a seed is for).
GROUP_IGNORED_PREFIXES = ("decoder.",)
GROUP_IGNORED_KEYS = ("runner.seed",)


def group_identity(identity: Mapping[str, Any]) -> str:
    """The ``group_identity`` row column: 16 hex digits of the sha256 of the run identity without the decoder
    list and ``runner.seed`` (:data:`GROUP_IGNORED_PREFIXES`, :data:`GROUP_IGNORED_KEYS`). Rows that share it
    were measured under one setting, and the report shows them as one group (see :mod:`harness.rows.metrics`):
    the jobs of a decoder sweep, the seeds of a sampled run, the shards of one run.

    Example: two runs that differ only in ``decoder.speculative.gamma`` (or only in ``runner.seed``) have
    different ``run_identity`` and the same ``group_identity``.
    """
    return identity_hash({k: v for k, v in identity.items()
                          if not k.startswith(GROUP_IGNORED_PREFIXES) and k not in GROUP_IGNORED_KEYS})


# ------------------------------------------------------------------------------------------- folder
def repair_trailing_newline(path: str | Path) -> bool:
    """If ``path`` ends in a torn line (a process killed mid-write), cut that line off, so the next
    appended row starts on its own line and ``pandas.read_json(lines=True)`` reads the file again. A torn
    line never was a result (a row is one write followed by fsync).

    Returns:
        True when the file was repaired.
    """
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return False
    data = path.read_bytes()
    if data.endswith(b"\n"):
        return False
    cut = data.rfind(b"\n") + 1
    with open(path, "rb+") as f:
        f.truncate(cut)
    log.warning("%s ended in a torn row (%d bytes, a process killed mid-write); cut off", path, len(data) - cut)
    return True


def supersede(run_dir: str | Path, before: rundir.Snapshot | None = None) -> Path:
    """Move a folder's result files to ``<run_dir>/superseded/<time>/`` (``runner.resume=false``), with the old
    run's ``.hydra/`` and logs.

    Args:
        run_dir: the run folder.
        before: the folder before this job's Hydra wrote into it (:func:`harness.job.rundir.snapshot`): its Hydra
            files and logs go to the superseded folder byte for byte, with their times, and the old part of a
            log is cut from the live one. None: a ``.hydra/`` whose files all predate this process is moved.

    Returns:
        The folder they were moved to.
    """
    run_dir = Path(run_dir)
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    dest = run_dir / SUPERSEDED_DIR / stamp
    n = 1
    while dest.exists():
        n += 1
        dest = run_dir / SUPERSEDED_DIR / f"{stamp}_{n}"
    dest.mkdir(parents=True)
    for name, new_name in SUPERSEDED_FILES.items():
        if (run_dir / name).exists():
            (run_dir / name).rename(dest / new_name)
    _supersede_record(run_dir, dest, before)
    return dest


def _supersede_record(run_dir: Path, dest: Path, before: rundir.Snapshot | None) -> None:
    """The old run's ``.hydra/`` and logs into ``dest`` (see :func:`supersede`)."""
    if before is None:
        hydra = run_dir / ".hydra"
        files = [p for p in hydra.rglob("*") if p.is_file()] if hydra.is_dir() else []
        if files and all(p.stat().st_mtime < rundir.PROCESS_STARTED for p in files):
            hydra.rename(dest / ".hydra")
        return
    job_log = _job_log()
    for rel, old in before.files.items():
        if old is None or not (rel in rundir.HYDRA_FILES or rel == job_log):  # the user's logs stay
            continue
        rundir.put_back(dest / rel, old, before.times.get(rel))
        live = run_dir / rel
        if rel == job_log and live.is_file():  # Hydra appends this job's lines to the old log
            with open(live, "rb+") as f:
                now = f.read()
                if now.startswith(old):
                    f.seek(0)
                    f.write(now[len(old):])
                    f.truncate()


def _in_sweep() -> bool:
    """Whether Hydra runs this job as one job of a sweep (``-m``, or an experiment that sets multirun)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def _job_log() -> str | None:
    """The file name of the job's log (``<hydra.job.name>.log``) when Hydra runs this job."""
    from hydra.core.hydra_config import HydraConfig

    return f"{HydraConfig.get().job.name}.log" if HydraConfig.initialized() else None


def _mismatch_message(run_dir: Path, rows: pd.DataFrame, identity: Mapping[str, Any], run_identity: str,
                      shard: str | None) -> str:
    found = sorted({(norm(r.get("run_identity")), norm(r.get("shard"))) for r in rows.to_dict("records")},
                   key=str)
    head = (f"{run_dir} already holds {len(rows)} result rows of another run; resuming into it would mix "
            "them with this command's, so nothing was run or written.")
    lines = [head]
    if any(i is None for i, _ in found):
        lines.append("Its rows were written by an earlier harness version and carry no run identity, so they "
                     "cannot be checked against this command.")
    else:
        meta_path = run_dir / "meta.json"
        stored = None
        if meta_path.exists():
            try:
                meta = json.loads(meta_path.read_text())
                if (meta.get("run_identity"), shard_text(meta.get("shard"))) in found:
                    stored = meta
            except (OSError, json.JSONDecodeError):
                pass
        diff = []
        if stored is not None:
            diff = differences(stored.get("identity") or {}, identity)
            old_shard = shard_text(stored.get("shard"))
            if old_shard != shard:
                diff.append(f"runner.shard: {old_shard} -> {shard}")
        if diff:
            lines.append("Settings that differ (folder -> this command):")
            lines += [f"  {d}" for d in diff[:25]] + ([f"  ... and {len(diff) - 25} more"] if len(diff) > 25 else [])
        else:
            ids = ", ".join(f"{i} (shard {s})" if s else str(i) for i, s in found)
            lines.append(f"Its rows have run identity {ids}; this command's is {run_identity}"
                         f"{f' (shard {shard})' if shard else ''}. Its meta.json does not describe them, so the "
                         "differing settings cannot be named.")
    folder = "hydra.sweep.dir" if _in_sweep() else "hydra.run.dir"  # a sweep's jobs write under its own folder
    lines.append(f"Choose one: write to a new folder ({folder}=<new folder>), or pass runner.resume=false to "
                 f"start this folder over (its current files move to {run_dir / SUPERSEDED_DIR}/<time>/; nothing "
                 "is deleted).")
    return "\n".join(lines)


@dataclass
class ResumeState:
    """What a run folder already holds for one run identity.

    Attributes:
        done: cell keys (:func:`cell_key`) with a done row.
        vanilla: ``(sample_id, turn)`` -> ``(token_ids, attempt_id)`` of a stored ok vanilla row (any
            repeat): the reference for ``matches_vanilla`` when vanilla's cell is done but another's is not.
        vanilla_attempts: ``(sample_id, turn, repeat)`` -> ``attempt_id`` of the stored ok vanilla row.
        completions: ``(sample_id, turn, repeat, decoder, decoder_params)`` -> stored completion text of a
            done cell (a multi-turn task asks turn k+1 with the decoder's own turn-k answer).
        run_id: the ``run_id`` of the latest earlier row, adopted by the resumed process.
        rows_seen: rows read from the file.
    """

    done: set[tuple] = field(default_factory=set)
    vanilla: dict[tuple, tuple[tuple[int, ...], str | None]] = field(default_factory=dict)
    vanilla_attempts: dict[tuple, str | None] = field(default_factory=dict)
    completions: dict[tuple, str] = field(default_factory=dict)
    run_id: str | None = None
    rows_seen: int = 0


def load_state(rows: pd.DataFrame, run_identity: str) -> ResumeState:
    """Done cells of ``run_identity`` among ``rows``."""
    state = ResumeState(rows_seen=len(rows))
    if rows.empty:
        return state
    for row in rows.to_dict("records"):
        if norm(row.get("run_identity")) != run_identity:
            continue
        if row.get("run_id"):
            state.run_id = row["run_id"]
        if row.get("status") not in DONE_STATUSES:
            continue
        state.done.add(cell_key(row))
        if row.get("status") != "ok":
            continue
        sid, turn, rep = (norm(row.get(k)) for k in ("sample_id", "turn", "repeat"))
        state.completions[(sid, turn, rep, row.get("decoder"), row.get("decoder_params"))] = row.get("completion") or ""
        ids = row.get("token_ids")
        if row.get("decoder") == "vanilla" and isinstance(ids, (list, tuple)):
            state.vanilla.setdefault((sid, turn), (tuple(int(t) for t in ids), row.get("attempt_id")))
            state.vanilla_attempts[(sid, turn, rep)] = row.get("attempt_id")
    return state


def prepare_folder(run_dir: str | Path, identity: Mapping[str, Any], run_identity: str, shard: str | None,
                   resume: bool) -> ResumeState | None:
    """Check a run folder before anything is written to it.

    Args:
        run_dir: the run folder.
        identity: this command's run identity (:func:`build_identity`).
        run_identity: its hash (:func:`identity_hash`).
        shard: ``"i/n"`` or ``None``.
        resume: ``runner.resume``.

    Returns:
        The done cells to skip (``None`` when there is nothing to resume).

    Raises:
        ResumeMismatchError: ``resume`` is on and the folder holds rows of another identity or shard.
    """
    run_dir = Path(run_dir)
    path = run_dir / "results.jsonl"
    if not path.exists() or path.stat().st_size == 0:
        return None
    if not resume:
        dest = supersede(run_dir, rundir.before(run_dir))
        log.warning("runner.resume=false: %s starts over; its earlier files were moved to %s", run_dir, dest)
        return None
    repair_trailing_newline(path)
    rows = read_results([path])
    if rows.empty:
        return None
    found = {(norm(r.get("run_identity")), norm(r.get("shard"))) for r in rows.to_dict("records")}
    if found != {(run_identity, shard)}:
        raise ResumeMismatchError(_mismatch_message(run_dir, rows, identity, run_identity, shard))
    state = load_state(rows, run_identity)
    log.info("resume: %d cells of this run already done in %s (runner.resume=false starts over)", len(state.done),
             path)
    return state
