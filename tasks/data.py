"""Where a task's records come from: a local file (``task.data_path`` or the shared ``data_dir``) or the
public source (a Hugging Face hub dataset or a pinned raw file URL), resolved once at task construction.

Rules, the same for every task:

* ``data_path`` set: that file, or a folder holding the task's file (e.g. ``../shared/data/gsm8k``). It must
  exist; an explicit path never falls back to the network (a typo must not silently change the data).
* else ``data_dir`` set: ``<data_dir>/<task's relative path>`` (e.g. ``../shared/data`` +
  ``gsm8k/test.jsonl``). It must exist, same rule.
* else the public source. When ``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE`` is set (before ``datasets``
  is imported) only the local ``datasets`` cache is tried (fails in about a second); otherwise the host
  is probed with a short socket timeout first, so an unreachable hub fails at once instead of after
  ``datasets``' retries.

Every failure raises :class:`DataNotFoundError` naming both fixes (a local copy via ``task.data_path`` /
``data_dir``, or network access to the public source). A corrupt file raises :class:`DataFormatError` naming
the file and the line. What does not live here: prompts, scoring.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import socket
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import getproxies, proxy_bypass

from tasks.base import DataNotFoundError

log = logging.getLogger(__name__)

__all__ = ["DataFormatError", "DataNotFoundError", "DataSource", "load_records", "read_jsonl", "require_fields",
           "resolve_local"]

#: Seconds allowed for the reachability probe of the public source's host.
PROBE_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class DataSource:
    """Where one task's records live.

    Attributes:
        task: the task's display name for messages, e.g. ``"GSM8K"``.
        relpath: the file relative to the shared data directory, e.g. ``"gsm8k/test.jsonl"``; its base
            name is also what a ``data_path`` folder must contain.
        hub_id: Hugging Face dataset id (``"openai/gsm8k"``), or ``None`` when the source is ``url``.
        hub_config: the dataset config name (``"main"``), if any.
        hub_split: the split to load (``"test"``).
        url: a raw JSONL file URL (pinned to a commit), used when ``hub_id`` is ``None``.
    """

    task: str
    relpath: str
    hub_id: str | None = None
    hub_config: str | None = None
    hub_split: str = "test"
    url: str | None = None

    @property
    def filename(self) -> str:
        return Path(self.relpath).name

    def describe_remote(self) -> str:
        if self.hub_id is not None:
            cfg = f", config {self.hub_config!r}" if self.hub_config else ""
            return f"the Hugging Face hub dataset {self.hub_id!r}{cfg}, split {self.hub_split!r}"
        return f"the public file {self.url}"

    def fixes(self) -> str:
        """The two ways to fix a missing source, for error messages."""
        return (
            f"Fix it one of two ways: (1) use a local copy: set task.data_path to the {self.filename} file or a "
            f"folder holding it (e.g. task.data_path=../shared/data/{Path(self.relpath).parent}), or set the "
            f"shared data folder (data_dir=../shared/data, or the environment variable SPECDEC_DATA_DIR) so "
            f"<data_dir>/{self.relpath} is read; or (2) leave both null and give this machine network access to "
            f"{self.describe_remote()} (and unset HF_HUB_OFFLINE / HF_DATASETS_OFFLINE)."
        )


class DataFormatError(ValueError):
    """A data file is not valid JSONL, or a record lacks a field the task needs; the message names the file
    and the line."""


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Records of a ``.jsonl`` or ``.jsonl.gz`` file (blank lines skipped).

    Raises:
        DataFormatError: a line is not a JSON object, or the file is not valid UTF-8 / gzip; the message
            names the file and the line number and says what to do.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    records: list[dict[str, Any]] = []
    lineno = 0
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataFormatError(
                        f"{path}, line {lineno}: not valid JSON ({e.msg}, column {e.colno}): {line.strip()[:80]!r}. "
                        "The file is corrupt or truncated: restore it from its source (see the data folder's "
                        "PROVENANCE.md) or point task.data_path at a good copy.") from e
                if not isinstance(record, dict):
                    raise DataFormatError(f"{path}, line {lineno}: expected a JSON object per line, got "
                                          f"{type(record).__name__}; is this a JSONL file?")
                records.append(record)
    except (UnicodeDecodeError, EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise DataFormatError(f"{path}, after line {lineno}: cannot be read ({type(e).__name__}: {e}). The file "
                              "is corrupt or truncated: restore it from its source or point task.data_path at a "
                              "good copy.") from e
    return records


def require_fields(records: list[dict[str, Any]], fields: tuple[str, ...], origin: str) -> None:
    """Check that every record has ``fields``.

    Raises:
        DataFormatError: naming ``origin``, the record number (1-based; the line number when the file has no
            blank lines) and the missing fields.
    """
    for i, r in enumerate(records, 1):
        missing = [k for k in fields if k not in r]
        if missing:
            raise DataFormatError(f"{origin}, record {i}: missing field(s) {missing} (has {sorted(r)}); this "
                                  f"task needs {list(fields)} in every record. Is task.data_path the right file?")


def _expand(path: str | os.PathLike[str]) -> Path:
    return Path(os.path.expanduser(os.path.expandvars(str(path)))).resolve()


def resolve_local(source: DataSource, data_path: str | None, data_dir: str | None) -> Path | None:
    """The local file to read, or ``None`` when neither setting is given (use the public source).

    Args:
        source: the task's :class:`DataSource`.
        data_path: ``task.data_path``: a file, or a folder holding ``source.filename``.
        data_dir: the shared data folder holding ``source.relpath``.

    Raises:
        DataNotFoundError: a setting is given but the file it points at does not exist.
    """
    if data_path not in (None, ""):
        p = _expand(data_path)
        if p.is_dir():
            candidates = [p / source.filename, p / source.relpath]
            for c in candidates:
                if c.is_file():
                    return c
            raise DataNotFoundError(
                f"{source.task} data not found: task.data_path={data_path!r} is the folder {p}, which holds no "
                f"{source.filename}. {source.fixes()}"
            )
        if p.is_file():
            return p
        raise DataNotFoundError(f"{source.task} data not found: task.data_path={data_path!r} ({p}) does not exist. "
                                f"{source.fixes()}")
    if data_dir not in (None, ""):
        root = _expand(data_dir)
        p = root / source.relpath
        if p.is_file():
            return p
        raise DataNotFoundError(f"{source.task} data not found: data_dir={data_dir!r} ({root}) holds no "
                                f"{source.relpath}. {source.fixes()}")
    return None


def _library_offline() -> bool:
    """Whether ``datasets`` itself is in offline mode (it reads the variables once, at import)."""
    import datasets.config

    return bool(getattr(datasets.config, "HF_HUB_OFFLINE", False) or getattr(datasets.config, "HF_DATASETS_OFFLINE", False))


def _reachable(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """``None`` when a TCP connection to ``url``'s host (or its configured proxy) opens within ``timeout_s``,
    else the reason."""
    parsed = urlparse(url)
    host = parsed.hostname or ""
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    proxy = None if proxy_bypass(host) else getproxies().get(parsed.scheme)
    if proxy:
        p = urlparse(proxy if "://" in proxy else "http://" + proxy)
        host, port = p.hostname or host, p.port or 8080
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as e:
        via = " (the configured proxy)" if proxy else ""
        return f"cannot connect to {host}:{port}{via} ({type(e).__name__}: {e})"


def _load_remote(source: DataSource) -> list[dict[str, Any]]:
    if source.hub_id is None and source.url is None:
        raise ValueError(f"{source.task}: a DataSource needs a hub_id or a url")
    # Offline mode reads only the local datasets cache and fails in about a second. Otherwise probe the
    # host first: datasets retries an unreachable hub for ~25 s before giving up. The probe also runs when
    # HF_HUB_OFFLINE was set after datasets was imported (datasets would still go online then).
    offline = _library_offline()
    if not offline:
        if source.hub_id is not None:
            from huggingface_hub import constants

            probe = constants.ENDPOINT
        else:
            probe = source.url
        reason = _reachable(probe)
        if reason is not None:
            raise DataNotFoundError(f"{source.task} data not available: no task.data_path or data_dir is set and "
                                    f"{source.describe_remote()} is unreachable: {reason}. {source.fixes()} (A copy "
                                    "already in the local datasets cache is used when HF_HUB_OFFLINE=1 is set.)")
    try:
        if source.hub_id is not None:
            import datasets

            ds = datasets.load_dataset(source.hub_id, source.hub_config, split=source.hub_split)
            return [dict(r) for r in ds]
        from datasets.utils.file_utils import cached_path

        return read_jsonl(cached_path(source.url))
    except Exception as e:  # datasets/hub raise many types (ConnectionError, OfflineModeIsEnabled, ...)
        mode = " (offline mode: only the local datasets cache was tried)" if offline else ""
        raise DataNotFoundError(f"{source.task} data not available: no task.data_path or data_dir is set and "
                                f"loading {source.describe_remote()} failed{mode}: {type(e).__name__}: {e}. "
                                f"{source.fixes()}") from e


def load_records(source: DataSource, data_path: str | None, data_dir: str | None) -> tuple[list[dict[str, Any]], str]:
    """Load a task's records from the local copy if configured, else from the public source.

    Args:
        source: the task's :class:`DataSource`.
        data_path: ``task.data_path`` (file or folder) or ``None``.
        data_dir: the shared data folder or ``None``.

    Returns:
        ``(records, origin)``: the records as dicts, and the file path or remote description they came from.

    Raises:
        DataNotFoundError: neither the configured local file nor the public source can be read; the message
            names both fixes.
    """
    local = resolve_local(source, data_path, data_dir)
    if local is not None:
        log.info("%s: reading %s", source.task, local)
        return read_jsonl(local), str(local)
    log.info("%s: loading %s", source.task, source.describe_remote())
    return _load_remote(source), source.describe_remote()
