"""The configs under ``conf/`` by the names a command line selects them with, and the generated tuned decoder
configs (``conf/decoder/tuned/<family>_tuned.yaml``, written by ``benchmarks/tune.py``): their ``# tuned-on:``
provenance, a tuned decoder run with a setting of its own (its rows are then labelled ``<name>*``), and a tuned
config run on another dtype or machine than it was tuned on (docs/experiments.md, "Tuning protocol").
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from omegaconf import OmegaConf

from declare import show
from harness.config.schemas import DECODER_SCHEMAS

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"

#: The folder of ``conf/decoder`` that holds the generated configs (benchmarks/tune.py's ``<family>_tuned.yaml``),
#: apart from the hand-written ones; selected as ``decoder=[vanilla,tuned/speculative_tuned]``.
TUNED_GROUP = "tuned"

#: The machine-readable provenance line that benchmarks/tune.py writes into each ``*_tuned.yaml`` (JSON:
#: dtype, device_name, cpu_isa, task, and what ``--combine`` admitted); read back by :func:`tuned_on`.
TUNED_ON_PREFIX = "# tuned-on: "


def available(group: str) -> list[str]:
    """Names of the configs in ``conf/<group>/``; for ``decoder``, also the generated ones in ``tuned/``
    (named ``tuned/<family>_tuned``)."""
    names = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
    if group == "decoder":
        names += sorted(f"{TUNED_GROUP}/{p.stem}" for p in (CONF_DIR / group / TUNED_GROUP).glob("*.yaml"))
    return names


def suggestion(name: str, choices: Sequence[str]) -> str | None:
    """The valid choice a misspelt or moved ``name`` most likely means: ``tuned/<name>`` for a generated
    config named without its folder, else the closest spelling (None when nothing is close)."""
    if f"{TUNED_GROUP}/{name}" in choices:
        return f"{TUNED_GROUP}/{name}"
    close = difflib.get_close_matches(name, choices, n=1)
    return close[0] if close else None


def decoder_key(name: str) -> str:
    """The decoder node a selected config fills, the name its rows and overrides use:
    ``tuned/speculative_tuned`` -> ``speculative_tuned`` (its YAML's ``# @package decoder.speculative_tuned``)."""
    return name.rsplit("/", 1)[-1]


def tuned_on(text: str) -> dict[str, Any] | None:
    """The ``# tuned-on:`` record of a decoder config's text, or None when it has none (a hand-written config,
    or a tuned one written before the line existed)."""
    for line in text.splitlines():
        if line.startswith(TUNED_ON_PREFIX):
            return json.loads(line[len(TUNED_ON_PREFIX):])
    return None


#: Appended to a tuned decoder's node name when one of its settings differs from its tuned config's
#: (``speculative_tuned*``): its rows, tables and figures then do not claim the tuned configuration.
TUNED_OVERRIDE_MARK = "*"


def tuned_overrides(name: str, values: Mapping[str, Any], conf_dir: Path = CONF_DIR) -> list[str]:
    """The settings of decoder node ``name`` whose ``values`` differ from its generated tuned config
    (``conf/decoder/tuned/<name>.yaml``: the file's values over the schema's declared defaults), as
    ``["gamma=3 (tuned: 6)"]``; empty for a node that is no tuned config or keeps every tuned value."""
    path = conf_dir / "decoder" / TUNED_GROUP / f"{name.rstrip(TUNED_OVERRIDE_MARK)}.yaml"
    if not path.is_file():
        return []
    node = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    schema = DECODER_SCHEMAS.get(node.get("_target_"))
    if schema is None:
        return []
    out = []
    for f in dataclasses.fields(schema):
        tuned = node.get(f.name, f.default)
        if "help" in f.metadata and f.name in values and values[f.name] != tuned:
            out.append(f"{f.name}={show(values[f.name])} (tuned: {show(tuned)})")
    return out


def tuned_override_line(name: str, changed: Sequence[str]) -> str:
    """The one warning for a tuned decoder run with ``changed`` settings (:func:`tuned_overrides`)."""
    base = name.rstrip(TUNED_OVERRIDE_MARK)
    return (f"decoder {base}: {', '.join(changed)} overrides its tuned setting (conf/decoder/{TUNED_GROUP}/{base}"
            f".yaml), so its rows are labelled {base}{TUNED_OVERRIDE_MARK}: not the tuned configuration")


_WARNED: set[str] = set()


def warn_once(line: str) -> None:
    """Print ``warning: line`` to stderr once per process (the command line and each job validate)."""
    if line not in _WARNED:
        _WARNED.add(line)
        print(f"warning: {line}", file=sys.stderr)


def tuning_mismatches(decoders: Sequence[str] | Mapping[str, Mapping[str, Any]], dtype: str, device_name: str,
                      conf_dir: Path = CONF_DIR) -> list[str]:
    """One warning per decoder of this run whose config was tuned (``# tuned-on:``) on another dtype or machine
    than this run's ``dtype`` / ``device_name``: its setting was chosen for other hardware, so a race with it
    is not the tuned race it claims to be. Given the decoders' configs (name -> settings), also one per tuned
    decoder run with a setting of its own (:func:`tuned_overrides`). Empty when every tuned config matches (or
    none is tuned)."""
    out = []
    if isinstance(decoders, Mapping):
        out += [tuned_override_line(n, changed) for n, c in decoders.items()
                if (changed := tuned_overrides(n, c, conf_dir))]
    for name in (n.rstrip(TUNED_OVERRIDE_MARK) for n in decoders):
        paths = [conf_dir / "decoder" / f"{name}.yaml", conf_dir / "decoder" / TUNED_GROUP / f"{name}.yaml"]
        path = next((p for p in paths if p.is_file()), None)
        record = tuned_on(path.read_text()) if path is not None else None
        if not record:
            continue
        differ = [f"{k} {record.get(k)!r} (this run: {v!r})" for k, v in (("dtype", dtype), ("device_name", device_name))
                  if record.get(k) != v]
        if differ:
            out.append(f"decoder {name} was tuned on another setup: {'; '.join(differ)}; its setting may not be "
                       f"this machine's best. Re-tune here (python run.py experiment=tune_all, then "
                       f"python benchmarks/tune.py <tuning folder> --force) before calling this a tuned race")
    return out
