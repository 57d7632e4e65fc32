"""Settings declared once: each setting's default, bound and meaning in one dataclass field.

A decoder's or task's settings are a dataclass of :func:`setting` fields (``decoders/settings.py``, the task
modules). Three readers share it and nothing else states a default or a bound:

* the Hydra schema (:mod:`harness.config.compose`) subclasses it, so YAMLs and overrides are typed and bounded;
* the constructor takes its defaults from it (``gamma: int = SpeculativeSettings.gamma``) and checks its
  arguments with :func:`check_args`;
* ``python run.py list decoder=NAME`` prints it with :func:`rows`.

Standard library only: :mod:`harness.config.precheck` reads it before torch is imported.

Example::

    @dataclass
    class SpeculativeSettings:
        gamma: int = setting(4, at_least(1), "draft tokens per step")
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import typing
from typing import Any, Mapping

#: The largest integer any setting takes: sizes, budgets and seeds far below it; a larger one would only
#: overflow a C long later or run for ever (``ngram_size=10**20``).
MAX_INT = 2**31 - 1
#: Rule keys a field's metadata may hold (besides ``help``).
RULES = ("ge", "gt", "le", "choices", "contains", "fixed", "or_zero")


def at_least(minimum: float) -> dict[str, Any]:
    """The value must be ``>= minimum``."""
    return {"ge": minimum}


def above(minimum: float) -> dict[str, Any]:
    """The value must be ``> minimum``."""
    return {"gt": minimum}


def between(low: float, high: float) -> dict[str, Any]:
    """The value must lie in ``[low, high]``."""
    return {"ge": low, "le": high}


def zero_or(rule: Mapping[str, Any]) -> dict[str, Any]:
    """The value must be 0 (a setting's "off") or keep ``rule``, e.g. ``zero_or(between(1e-3, 100))``."""
    return {**rule, "or_zero": True}


def one_of(*choices: Any) -> dict[str, Any]:
    """The value must be one of ``choices``."""
    return {"choices": tuple(choices)}


def contains(text: str) -> dict[str, Any]:
    """The value (a string) must contain ``text``, e.g. a template's ``{article}`` slot."""
    return {"contains": text}


#: Fixed by the code, not settable per run (e.g. a decoder's ``uses_draft``).
FIXED = {"fixed": True}


def setting(default: Any, rule: Mapping[str, Any] | None = None, help: str = "") -> Any:
    """A dataclass field: ``default``, its bound ``rule`` (:func:`at_least`, :func:`one_of`, ...) and a one-line
    ``help`` (units, what 0 or null means). The class attribute stays the default, so a constructor can write
    ``gamma: int = SpeculativeSettings.gamma``."""
    return dataclasses.field(default=default, metadata={**(rule or {}), "help": help})


# ------------------------------------------------------------------------------------------------ reading

def _field(cls: type, name: str) -> dataclasses.Field:
    return {f.name: f for f in dataclasses.fields(cls)}[name]


def _type(cls: type, name: str) -> tuple[Any, bool]:
    """(base type, optional?) of field ``name``."""
    tp = typing.get_type_hints(cls)[name]
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    optional = type(None) in typing.get_args(tp)
    return (args[0] if optional and len(args) == 1 else tp), optional


def rule_text(cls: type, name: str) -> str:
    """Plain words for what field ``name`` of ``cls`` allows, e.g. ``"an integer >= 1 or null"``."""
    meta = _field(cls, name).metadata
    base, optional = _type(cls, name)
    kind = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(base, "a value")
    if typing.get_origin(base) is list:
        kind = "a list of strings" if typing.get_args(base) == (str,) else "a list"
    if "choices" in meta:
        text = "one of " + ", ".join(str(c).lower() if isinstance(c, bool) else str(c) for c in meta["choices"])
    elif "ge" in meta and "le" in meta:
        text = f"{kind} in [{meta['ge']}, {meta['le']}]"
    elif "ge" in meta:
        text = f"{kind} >= {meta['ge']}"
    elif "gt" in meta and "le" in meta:
        text = f"{kind} in ({meta['gt']}, {meta['le']}]"
    elif "gt" in meta:
        text = f"{kind} > {meta['gt']}"
    elif "contains" in meta:
        text = f"a string containing {meta['contains']!r}"
    else:
        text = kind
    if meta.get("or_zero"):
        text = f"0 or {text}"
    return text + (" or null" if optional else "")


def out_of_bounds(cls: type, name: str, value: Any) -> bool:
    """Whether ``value`` (already of the field's type, or None) breaks field ``name``'s bound; NaN and the
    infinities break every numeric field (no bound means anything for them), and so does an integer beyond
    :data:`MAX_INT`."""
    meta = _field(cls, name).metadata
    if value is None:
        return False
    if isinstance(value, float) and not math.isfinite(value):
        return True
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and abs(value) > MAX_INT:
        return True
    if meta.get("or_zero") and value == 0:
        return False
    return bool(("choices" in meta and value not in meta["choices"])
                or ("ge" in meta and value < meta["ge"])
                or ("le" in meta and value > meta["le"])
                or ("gt" in meta and value <= meta["gt"])
                or ("contains" in meta and meta["contains"] not in value))


def _of_type(cls: type, name: str, value: Any) -> bool:
    base, optional = _type(cls, name)
    if value is None:
        return optional
    if base is bool:
        return isinstance(value, bool)
    if base is int:  # numpy integers too
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if base is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if base is str:
        return isinstance(value, (str, os.PathLike))  # a file setting may be given a Path from Python
    return True


def check_args(cls: type, values: Mapping[str, Any], prefix: str = "") -> None:
    """Check a constructor's arguments against ``cls``'s declarations; call it first, as
    ``check_args(SpeculativeSettings, locals())`` (only the declared names are read). ``prefix`` names the
    config node in the message (``"task."``).

    Raises:
        ValueError: for the first argument of the wrong type or out of bounds, naming it, its value and what is
            allowed (``gamma=0: must be an integer >= 1 -- draft tokens per step``).
    """
    for f in dataclasses.fields(cls):
        if f.name not in values:
            continue
        value = values[f.name]
        if not _of_type(cls, f.name, value) or out_of_bounds(cls, f.name, value):
            meaning = f" -- {f.metadata['help']}" if f.metadata.get("help") else ""
            raise ValueError(f"{prefix}{f.name}={value!r}: must be {must_be(cls, f.name, value)}{meaning}")


def must_be(cls: type, name: str, value: Any) -> str:
    """What a refused ``value`` of field ``name`` must be: :func:`rule_text`, said to be finite for NaN/inf."""
    text = rule_text(cls, name)
    if isinstance(value, float) and not math.isfinite(value):
        return f"a finite number ({text})"
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and abs(value) > MAX_INT:
        return f"at most {MAX_INT} ({text})"
    return text


def rows(cls: type, values: Mapping[str, Any] | None = None) -> list[tuple[str, str, str, str]]:
    """``(name, value, allowed, meaning)`` per declared field of ``cls``, for ``run.py list``: ``value`` is
    ``values[name]`` where given (a config that overrides the default says ``6 (default 4)``; an OmegaConf
    interpolation, resolved per run, says ``interpolated``), else the default."""
    out = []
    for f in dataclasses.fields(cls):
        if "help" not in f.metadata:  # plumbing of a schema (_target_, name, uses_draft), not a declared setting
            continue
        shown = show(f.default)
        given = values.get(f.name, f.default) if values is not None else f.default
        if isinstance(given, str) and "${" in given:  # an OmegaConf interpolation: resolved per run
            shown = "interpolated"
        elif given != f.default:
            shown = f"{show(given)} (default {shown})"
        out.append((f.name, shown, rule_text(cls, f.name), f.metadata.get("help", "")))
    return out


def show(value: Any) -> str:
    """A value as YAML writes it: ``null``, ``true``, ``'text'``, ``4``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return repr(value) if len(value) < 40 else repr(value[:37] + "...")
    return str(value)
