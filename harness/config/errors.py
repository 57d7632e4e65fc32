"""How a config problem is said: :class:`ConfigError`, and the one-line forms every check shares (an unknown key
with the keys its node takes, an OmegaConf type error, a list given to a group that takes one name); a value is
shown as YAML writes it by :func:`declare.show`. Torch-free; used by :mod:`harness.config.check`,
:mod:`harness.config.compose` and the precheck.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

from omegaconf.errors import OmegaConfBaseException


class ConfigError(ValueError):
    """The composed configuration cannot run; each line of the message names a key and what to change."""


def field_names(schema: type) -> list[str]:
    """The keys a node of ``schema`` may hold, in declaration order."""
    return [f.name for f in dataclasses.fields(schema)]


def key_list(schema: type) -> str:
    """``"gamma (and _target_, _partial_, uses_draft)"``: the settings first, the plumbing after."""
    names = field_names(schema)
    meta = [n for n in names if n in ("_target_", "_partial_", "uses_draft", "name")]
    shown = [n for n in names if n not in meta] or ["no other key"]
    return ", ".join(shown) + (f" (and {', '.join(meta)})" if meta else "")


# Keys users reach for on a decoder or model when they mean the run's sampling settings (docs/sampling.md).
SAMPLING_KEYS = frozenset({"temperature", "top_p", "top_k", "do_sample", "seed", "sampling"})


def unknown_key_line(path: str, key: str, schema: type | None, valid: Sequence[str] | None = None,
                     where: str = "") -> str:
    """The refusal of ``key`` under ``path``: the keys its node (``schema``, or ``valid``) takes, and the runner's
    sampling settings for a sampling key given to a decoder or model."""
    what = f"{path}.{key}" if path else key
    names = ", ".join(valid) if valid is not None else key_list(schema)  # type: ignore[arg-type]
    owner = (f"{path} ({getattr(schema, '_target_', None) or getattr(schema, '__name__', '')})" if schema
             else (path or "the top level"))
    line = f"unknown key {what}{where}: {owner} takes {names}"
    if key in SAMPLING_KEYS and not path.startswith("runner"):
        line += ("; sampling settings are set once for every decoder of a run: runner.temperature, runner.top_p, "
                 "runner.top_k, runner.seed (e.g. runner.temperature=0.7)")
    return line


def omegaconf_line(e: OmegaConfBaseException, path: str = "") -> str:
    """One line from an OmegaConf type / key error (its message minus the full_key/object_type lines)."""
    full_key = getattr(e, "full_key", None) or ""
    key = f"{path}.{full_key}" if path and full_key else (full_key or path)
    msg = str(e).split("\n")[0].strip()
    m = re.match(r"Value '(.*)' of type '(\w+)' could not be converted to (\w+)", msg)
    if m:
        kind = {"Integer": "an integer", "Float": "a number", "Boolean": "true or false", "String": "a string"}
        return f"{key}={m.group(1)!r}: must be {kind.get(m.group(3), m.group(3))}"
    if "is not Optional" in msg:
        return f"{key}=null: must not be null"
    return f"{key}: {msg}"


#: Groups that take one config per job.
SINGLE_GROUPS = ("model", "task", "runner")


def list_of_group_line(group: str, names: Sequence[str] = ()) -> str:
    """The refusal of a list given to a group that takes one name (``task=[a,b]``), pointing to a sweep."""
    shown = ",".join(names) if names else "a,b"
    return (f"{group}=[{shown}]: {group} takes one name per run (Hydra would merge the list silently); "
            f"to run several, sweep them: python run.py -m {group}={shown}")
