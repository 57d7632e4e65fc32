"""The result file: ``results.jsonl`` of a run folder (one row per (sample, decoder, repeat), appended and
flushed the moment it is computed), written by :class:`ResultWriter` and read back by :func:`read_results` (one
file, each row checked) and :func:`load_rows` (every file under some folders, one row per cell, prepared for
aggregation). The facts about the code, packages and machine that go into ``meta.json`` and every row are in
:mod:`harness.rows.machine`.

Rows are never rewritten: an interrupted run keeps every row already written. :func:`read_results` skips (with
a warning) a torn line left by a process killed mid-write. Pure Python and pandas; no torch.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd

from harness.rows import cells as coverage
from harness.rows import grouping, legacy
from harness.rows.columns import fmt_value, invalid_row, row_problem
from harness.rows.identity import latest_rows

log = logging.getLogger(__name__)


def _clean(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    return value


class ResultWriter:
    """Appends rows to ``<run_dir>/results.jsonl``, flushing and fsyncing each one."""

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / "results.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, row: dict[str, Any]) -> None:
        """Append ``row`` as one JSON line, whole or not at all.

        Raises:
            OSError: the line could not be written (a full disk: ``ENOSPC``; a file-size limit: ``EFBIG``);
                the part that did get written is cut off again, so the file ends with the last whole row and a
                resumed run appends after it.
        """
        line = (json.dumps({k: _clean(v) for k, v in row.items()}, ensure_ascii=False) + "\n").encode("utf-8")
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            view = memoryview(line)
            try:
                while view:  # a write stopped by a size limit returns short; the next one raises
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            except OSError as e:
                try:
                    os.ftruncate(fd, size)
                except OSError:
                    pass  # the torn tail is cut by the next resume (harness.job.resume.repair_trailing_newline)
                e.filename = e.filename or str(self.path)
                raise
        finally:
            os.close(fd)


#: How many left-out lines of one file are named one by one before the rest are counted.
SHOWN_BAD_LINES = 10


def read_results(paths: Iterable[str | Path]) -> pd.DataFrame:
    """The rows of one or more ``results.jsonl`` files (or run folders holding one) as a DataFrame, each one
    checked against the rows schema.

    Each line is read as bytes and decoded on its own, so one line of bad bytes costs that line only. A line
    is left out, with a warning naming the file, the line number and why, when it is not UTF-8, not JSON (a torn
    last line left by a process killed mid-write is said to be one), not a JSON object, or not a valid result
    row (:func:`harness.rows.columns.row_problem`: required columns, each value's type and range, ``NaN`` and
    ``Infinity`` refused, ``tokens_per_s`` equal to ``new_tokens / wall_time_s``). An invalid row that names
    its cell (decoder and sample) keeps that cell without its measurement, as status ``invalid`` with the
    reason (:func:`harness.rows.columns.invalid_row`): tables count it as not measured. The rows before and after
    it are kept. The warnings are logged and kept in ``attrs["warnings"]`` for the report to print; a
    file without a valid row gives invalid cells only, or an empty frame (the caller says so). (A resumed run
    cuts a torn tail off, see :func:`harness.job.resume.repair_trailing_newline`, and re-measures invalid cells.)

    Raises:
        FileNotFoundError: a path does not exist. OSError: a file cannot be read.
    """
    rows, warnings = [], []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            p = p / "results.jsonl"
        lines = p.read_bytes().split(b"\n")
        bad: list[str] = []
        for i, raw in enumerate(lines, 1):
            if not raw.strip():
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                bad.append(f"line {i}: not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})")
                continue
            try:
                row = json.loads(line)
            except (ValueError, RecursionError):
                torn = i == len(lines)  # no newline after it: the writer was killed mid-line
                bad.append(f"line {i}: " + (f"a torn last line ({len(raw)} bytes; a process killed while writing it)"
                                            if torn else "not JSON"))
                continue
            why = row_problem(row)
            if why:
                bad.append(f"line {i}: {why}")
                kept = invalid_row(row, why)  # the cell it names, counted as not measured
                if kept is not None:
                    rows.append(kept)
                continue
            rows.append(row)
        if bad:
            shown = "; ".join(bad[:SHOWN_BAD_LINES]) + (f"; ... ({len(bad)} in all)" if len(bad) > SHOWN_BAD_LINES
                                                        else "")
            warnings.append(f"{p}: {len(bad)} line{'s' if len(bad) > 1 else ''} left out ({shown})")
    for w in warnings:
        log.warning("%s", w)
    frame = pd.DataFrame(rows)
    frame.attrs["warnings"] = warnings
    return frame


def find_result_files(paths: Iterable[str | Path], repeated: list[str] | None = None) -> list[Path]:
    """``results.jsonl`` files named by ``paths``: files as given, folders searched recursively (a
    multirun sweep folder holds one per job), each file once.

    Args:
        repeated: when given, one line is appended per file named more than once (a folder given twice, a
            folder and a file or subfolder of it): the caller warns, rather than drop the repeat silently.

    Raises:
        FileNotFoundError: a path does not exist, or nothing is found.
    """
    paths = list(paths)
    found: dict[Path, list[str]] = {}
    for p in map(Path, paths):
        if p.is_file():
            hits = [p]
        elif p.is_dir():
            hits = sorted(p.rglob("results.jsonl"), key=lambda q: (len(q.parts), str(q)))
        else:
            raise FileNotFoundError(f"{p} does not exist")
        for f in hits:
            found.setdefault(f.resolve(), []).append(str(p))
    if not found:
        aside = [q for p in map(Path, paths) if p.is_dir() for q in sorted(p.rglob("results.superseded.jsonl"))]
        hint = (f"; rows that runner.resume=false moved aside are read when their file is named, e.g. {aside[0]}"
                if aside else "")
        raise FileNotFoundError(f"no results.jsonl under {', '.join(map(str, paths))}{hint}")
    if repeated is not None:
        repeated += [f"repeated input: {f} is named {len(given)} times ({', '.join(dict.fromkeys(given))}): "
                     "its rows are read once" for f, given in found.items() if len(given) > 1]
    return list(found)


def load_rows(paths: Iterable[str | Path], pool: bool = False) -> pd.DataFrame:
    """All valid rows of the result files under ``paths``, one row per cell
    (:func:`harness.rows.identity.latest_rows`), prepared for aggregation (:func:`harness.rows.grouping.prepare`:
    ``model_pair``, ``label``, ``group``).

    ``run_id`` becomes a key of (run folder, run identity), so a decoder pairs with the vanilla of its own
    folder and configuration whichever process of a resumed run wrote the rows, and never with another
    folder's. A file not named ``results.jsonl`` counts as a folder of its own. Folders that hold the same
    cells of one run (a run and a copy of it) are one run, each cell counted once
    (:func:`harness.rows.cells.fold_copies`). ``attrs["warnings"]`` names each file named twice, each copy, each
    line left out as invalid (:func:`read_results`), each run read in part (one shard of n,
    :func:`harness.rows.cells.shard_warnings`) and each note a run recorded in its ``meta.json`` (settings tuned on
    another dtype or machine: what its own summary.md says above its table).

    Raises:
        FileNotFoundError: a path does not exist. ValueError: no valid row (every line was left out: the
            warnings say why).
    """
    frames, warnings, settings = [], [], []
    noted: dict[str, list[str]] = {}
    files = find_result_files(paths, warnings)
    for w in warnings:
        log.warning("%s", w)
    for f in files:
        rows = read_results([f])
        warnings += rows.attrs.get("warnings", [])
        if rows.empty:
            continue
        rows["run_dir"] = str(f.parent if f.name == "results.jsonl" else f)
        meta = _meta(f.parent) if f.name == "results.jsonl" else None
        settings.append((meta or {}).get("identity"))
        notes = (meta or {}).get("notes")
        for n in notes if isinstance(notes, list) else []:  # the job's own notes, one line per note
            noted.setdefault(str(n), []).append(_shown(f.parent))
        frames.append(legacy.upgrade(rows, meta))
    if not frames:
        if warnings:
            raise ValueError(f"no valid result row under {', '.join(map(str, paths))}: " + "; ".join(warnings))
        return pd.DataFrame()
    warnings += [f"{n} (runs: {', '.join(runs)})" for n, runs in noted.items()]
    for frame, text in zip(frames, run_settings(settings)):
        frame["run_settings"] = text
    rows = _finish(pd.concat(frames, ignore_index=True), pool)
    rows.attrs["warnings"] = [*warnings, *rows.attrs["warnings"]]
    return rows


#: Run-identity keys (``meta.json`` ``identity``) never used to tell run groups apart: each decoder's own settings
#: (a configuration's label shows them), versions and machine (row columns), the data's fingerprint and size.
UNSHOWN_SETTINGS = ("decoder.", "code.", "packages.", "machine.", "data.", "runner.seed", "runner.shard")


def run_settings(identities: Sequence[Mapping[str, Any] | None]) -> list[str | None]:
    """Per run (its ``meta.json`` run identity, or None): the settings that differ among the runs read together,
    as ``runner.warmup=0, task.prompt_style=plain`` -- what names two run groups that the rows' own columns leave
    alike (:func:`harness.rows.grouping.run_groups`); None for a run without an identity."""
    known = [i for i in identities if isinstance(i, Mapping)]
    keys = sorted({k for i in known for k in i if not k.startswith(UNSHOWN_SETTINGS)})
    differ = [k for k in keys if len({json.dumps(i.get(k), sort_keys=True, default=str) for i in known}) > 1]
    return [", ".join(f"{k}={fmt_value(i.get(k))}" for k in differ) if isinstance(i, Mapping) else None
            for i in identities]


def _meta(run_dir: Path) -> dict[str, Any]:
    """A run folder's ``meta.json`` (empty when it has none or it cannot be read: a row's own columns still hold)."""
    try:
        meta = json.loads((run_dir / "meta.json").read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _finish(rows: pd.DataFrame, pool: bool) -> pd.DataFrame:
    ident = grouping.identity_fields(rows)
    # one folder measuring a cell twice (before copies are folded), a run read in part (some of its shards)
    said = [*coverage.repeated_cells(rows), *coverage.shard_warnings(rows)]
    for w in said:
        log.warning("%s", w)
    rows, warnings = coverage.fold_copies(rows)  # a run and a copy of it: one run (warned there)
    warnings = [*said, *warnings]
    # one row per cell of one run identity (a retried error row or a resumed process repeats a cell)
    rows = latest_rows(rows, extra_keys=("run_dir", *ident)) if "run_dir" in rows else rows
    key = rows[["run_dir", *ident]].astype(str).agg("|".join, axis=1) if "run_dir" in rows else \
        rows["run_id"].astype(str)
    rows = rows.assign(run_id=[hashlib.sha1(k.encode()).hexdigest()[:12] for k in key])
    for c in ("label", "group"):
        if c in rows:
            rows = rows.drop(columns=c)
    rows = grouping.prepare(rows, pool)
    rows.attrs["warnings"] = warnings
    return rows


def _shown(path: Path) -> str:
    """A run folder as a note names it: relative to the working directory when inside it (a report then reads the
    same from every checkout), else as given."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
