"""The config part of a run's identity, in plain Python (no torch, no pandas), so ``run.py``'s precheck can hold a
command against the run folder it would resume before any model loads.

A run identity (:func:`harness.job.resume.build_identity`) is the job's resolved config flattened to dotted keys
(:func:`config_identity`) plus keys under :data:`ENVIRONMENT_PREFIXES` that only the job knows (code version,
packages, machine, data fingerprint). :func:`config_differences` compares the config part of a stored identity
(a run folder's ``meta.json``) with a command's config.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

#: Config keys (dotted) left out of the run identity: they change neither outputs nor timing.
IGNORED_CONFIG_KEYS = ("runner.resume", "runner.shard", "output_dir")
#: Identity keys that are not config settings: the job adds them (code version, packages, machine, data).
ENVIRONMENT_PREFIXES = ("code.", "packages.", "machine.", "data.")
#: Config keys that name a file or folder: the identity holds them as :func:`resolve_path` makes them, so two
#: spellings of one path (``../shared/data``, ``/work/shared/data/``, ``~/data``) are one setting.
PATH_KEYS = ("data_dir", "task.data_dir", "task.data_path", "task.exemplars_path", "model.target.path",
             "model.draft.path")


def resolve_path(value: Any) -> Any:
    """A path setting as one absolute path: ``~`` and ``$VARS`` expanded, relative to the working folder, ``..``,
    a trailing slash and symbolic links undone. Anything but a non-empty string comes back as it is."""
    if not isinstance(value, str) or not value:
        return value
    return str(Path(os.path.expanduser(os.path.expandvars(value))).resolve())


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings -> ``{"a.b.c": value}``; lists stay values.

    Example: ``flatten({"model": {"target": {"seed": 0}}, "device": "auto"})`` is
    ``{"model.target.seed": 0, "device": "auto"}``.
    """
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = list(v) if isinstance(v, tuple) else v
    return out


def config_identity(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config part of a run identity: ``config`` (resolved, plain containers) flattened, without
    :data:`IGNORED_CONFIG_KEYS` and Hydra's own ``hydra.*`` settings; :data:`PATH_KEYS` resolved."""
    return {k: resolve_path(v) if k in PATH_KEYS else v for k, v in flatten(config).items()
            if k not in IGNORED_CONFIG_KEYS and not k.startswith("hydra.")}


def _fmt(value: Any) -> str:
    """A setting as the command line spells it (``null``, not Python's ``None``)."""
    return json.dumps(value) if isinstance(value, (list, dict)) or value is None else str(value)


def differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """``"key: old -> new"`` for every key whose value differs (a missing key shows as ``<absent>``), led by
    ``"decoders: a, b -> a, c"`` when the two hold other decoder configurations (their keys alone would name
    ``decoder.c._partial_`` first)."""
    old_names, new_names = decoder_names(old), decoder_names(new)
    out = [f"decoders: {', '.join(old_names)} -> {', '.join(new_names)}"] if set(old_names) != set(new_names) else []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k, "<absent>"), new.get(k, "<absent>")
        if a != b:
            out.append(f"{k}: {_fmt(a)} -> {_fmt(b)}")
    return out


def shard_text(shard: Any) -> str | None:
    """A shard as ``"i/n"``: ``meta.json``'s ``{"index": i, "count": n}`` or the ``runner.shard`` setting's
    ``"i/n"``; ``None``: no shard."""
    if isinstance(shard, Mapping):
        return f"{shard.get('index')}/{shard.get('count')}" if shard else None
    if isinstance(shard, str) and "/" in shard:
        i, _, n = shard.partition("/")
        return f"{i.strip()}/{n.strip()}"
    return None if shard is None else str(shard)


def decoder_names(flat: Mapping[str, Any]) -> list[str]:
    """The decoder configurations a flattened config or identity holds (``decoder.<name>.*`` keys), in order."""
    return list(dict.fromkeys(k.split(".")[1] for k in flat if k.startswith("decoder.") and k.count(".") >= 2))


def config_differences(identity: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    """:func:`differences` between the config part of a stored run ``identity`` and a command's resolved
    ``config`` (what :func:`config_identity` makes of it)."""
    stored = {k: v for k, v in identity.items() if not k.startswith(ENVIRONMENT_PREFIXES)}
    return differences(stored, config_identity(config))
