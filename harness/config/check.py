"""The composed config, checked as a whole: :func:`validate`, and each problem as one line.

Hydra types every node by its schema (:mod:`harness.config.schemas`) while it composes, so a misspelt key or a value
of the wrong type fails there (:func:`harness.config.compose.explain_compose_error` makes that one line). Hydra
lets a ``+key`` override add keys even to a typed node, and experiment files may define decoders inline, so
:func:`validate` checks the composed config again, as a whole, before anything runs: every node against the
schema of its ``_target_`` (unknown keys, types, missing values), then the rules of :mod:`harness.config.rules`
(each field's bound: ``gamma >= 1``, ``pool_scope`` in ``sample|task``, ``task.limit >= 1`` or null, dtype names;
the rules across fields; the device and data paths). Every problem is one line naming the key, the value and
what is allowed, raised as :class:`harness.config.errors.ConfigError`. :func:`override_problems` checks what
the composed config no longer shows of the command line (a boolean given ``-1``, a number that underflows).
"""

from __future__ import annotations

import dataclasses
import re
import typing
from typing import Any, Mapping, Sequence

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from declare import show
from harness.config.errors import (ConfigError, field_names, list_of_group_line, omegaconf_line,
                                   unknown_key_line)
from harness.config.rules import (check_bounds, check_device, check_model_source, check_path, decoder_rules,
                                  draft_rule, is_bool, runner_rules)
from harness.config.schemas import DECODER_SCHEMAS, ROOT_KEYS, TASK_SCHEMAS, ModelConfig, ModelSpec, RunnerConfig
from harness.config.tuned import TUNED_OVERRIDE_MARK, tuned_override_line, tuned_overrides, warn_once


def _is_optional(tp: Any) -> bool:
    return type(None) in typing.get_args(tp)


def _base_type(tp: Any) -> Any:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if _is_optional(tp) and len(args) == 1 else tp


def _hints(schema: type) -> dict[str, Any]:
    return typing.get_type_hints(schema)


def _typed(schema: type, node: Any, path: str, problems: list[str]) -> DictConfig | None:
    """``node`` (plain, resolved) merged onto ``schema``: unknown keys, wrong types, missing values -> lines."""
    if not isinstance(node, Mapping):
        problems.append(f"{path}={show(node)}: must be a mapping of {schema.__name__} fields")
        return None
    known = field_names(schema)
    unknown = [k for k in node if k not in known]
    for k in unknown:
        problems.append(unknown_key_line(path, str(k), schema))
    node = {k: v for k, v in node.items() if k in known}
    hints = _hints(schema)
    not_bool = [f"{path}.{k}={show(v)}: must be true or false" for k, v in node.items()
                if _base_type(hints[k]) is bool and v is not None and not is_bool(v)]
    if not_bool:  # OmegaConf would turn -1, 2147483648 or '5' into true
        problems += not_bool
        return None
    nested_problems: list[str] = []
    for k, v in list(node.items()):  # nested schemas (model.target / model.draft): recurse for key lines
        sub = _base_type(hints[k])
        if dataclasses.is_dataclass(sub) and v is not None:
            typed_sub = _typed(sub, v, f"{path}.{k}", nested_problems)
            node[k] = typed_sub if typed_sub is not None else v
    problems += nested_problems
    if unknown or nested_problems:
        return None
    try:
        typed = OmegaConf.merge(OmegaConf.structured(schema), node)
    except OmegaConfBaseException as e:
        problems.append(omegaconf_line(e, path))
        return None
    missing = sorted(OmegaConf.missing_keys(typed))
    for k in missing:
        problems.append(f"{path}.{k} is missing: set it in the config or on the command line")
    return None if missing else typed


#: A number as a command line writes it (``0.7``, ``1e-400``, ``-3``).
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _declared_type(cfg: DictConfig, key: str) -> Any:
    """The declared base type of setting ``key`` (``runner.score``, ``decoder.opt_tree.cost_aware``,
    ``model.target.seed``) in composed ``cfg``; None when no schema declares it."""
    group, *rest = key.split(".")
    schema: type | None = None
    if group == "runner":
        schema = RunnerConfig
    elif group == "model":
        schema = ModelSpec if len(rest) == 2 and rest[0] in ("target", "draft") else ModelConfig
        rest = rest[1:] if schema is ModelSpec else rest
    elif group == "task":
        schema = TASK_SCHEMAS.get(OmegaConf.select(cfg, "task._target_", default=None))
    elif group == "decoder" and len(rest) == 2:
        schema = DECODER_SCHEMAS.get(OmegaConf.select(cfg, f"decoder.{rest[0]}._target_", default=None))
        rest = rest[1:]
    hint = _hints(schema).get(rest[0]) if schema is not None and len(rest) == 1 else None
    return _base_type(hint) if hint is not None else None


def override_problems(overrides: Sequence[str], cfg: DictConfig) -> list[str]:
    """Problems of command-line values that the composed ``cfg`` no longer shows: a boolean setting given
    anything but true or false (the schema turns ``-1``, ``2147483648`` or ``'5'`` into true), and a number that
    underflows to 0 in floating point (``runner.temperature=1e-400`` would decode greedily, a threshold would
    switch off). Sweeps are checked per job (:func:`harness.config.compose.compose` of each point)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except Exception:  # a syntax error: Hydra reports it
        return []
    problems = []
    for ov in parsed:
        if ov.is_sweep_override() or ov.is_delete() or "${" in ov.input_line:  # interpolations: resolved later
            continue
        key, text = ov.get_key_element().lstrip("+~"), ov.input_line.partition("=")[2].strip()
        if _NUMBER.fullmatch(text) and float(text) == 0 and re.search(r"[1-9]", re.split("[eE]", text)[0]):
            problems.append(f"{key}={text}: underflows to 0 in floating point (0 means off, or greedy for "
                            "runner.temperature); write 0, or a value the setting allows")
        elif _declared_type(cfg, key) is bool and ov.value() is not None and not is_bool(ov.value()):
            problems.append(f"{key}={text}: must be true or false")
    return problems


def _decoder_schema(node: Any) -> type | None:
    return DECODER_SCHEMAS.get(node.get("_target_")) if isinstance(node, Mapping) else None


def validate(cfg: DictConfig | Mapping[str, Any], choices: Mapping[str, Any] | None = None) -> DictConfig:
    """Check a composed config before anything runs; return it resolved, each group typed by its schema.

    Args:
        cfg: the job config (``hydra`` node absent or ignored).
        choices: Hydra's ``hydra.runtime.choices`` when known: a group missing there although the config
            has it was given a list (``task=[humaneval,mbpp]``), which Hydra merges silently.

    Raises:
        ConfigError: one line per problem (unknown key with the valid ones; value with its allowed range).
    """
    problems: list[str] = []
    if choices is not None:
        for group in ("model", "task", "runner"):
            if group in cfg and group not in choices:
                problems.append(list_of_group_line(group))
        if problems:
            raise ConfigError("\n".join(problems))
    if isinstance(cfg, DictConfig):
        plain = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    else:
        plain = dict(cfg)
    plain.pop("hydra", None)
    overridden = class_overrides(cfg) if isinstance(cfg, DictConfig) else {}
    problems += overridden.values()
    for key in plain:
        if key not in ROOT_KEYS:
            problems.append(unknown_key_line("", str(key), None, valid=ROOT_KEYS))
    out: dict[str, Any] = {k: plain.get(k) for k in ("device", "data_dir", "output_dir") if k in plain}
    if "device" in plain:
        problems += check_device(plain["device"])
    problems += check_path("data_dir", plain.get("data_dir"))
    task_dir = plain["task"].get("data_dir") if isinstance(plain.get("task"), Mapping) else None
    if task_dir != plain.get("data_dir"):  # a task's own folder (it defaults to data_dir, checked above)
        problems += check_path("task.data_dir", task_dir)
    for group, check in (("model", _model), ("task", _task), ("runner", _runner)):
        if group in overridden:  # its one line says it all
            continue
        typed = check(plain.get(group), problems)
        if typed is not None:
            out[group] = typed
    if plain.get("decoder") and isinstance(plain["decoder"], Mapping) and "_target_" not in plain["decoder"]:
        out["decoder"] = _decoders({k: v for k, v in plain["decoder"].items() if f"decoder.{k}" not in overridden},
                                   out.get("model"), problems)
    else:
        problems.append("no decoder selected: pass e.g. decoder=[vanilla,speculative]" if not plain.get("decoder")
                        else "`decoder` must be a list of decoder names, e.g. decoder=[vanilla,speculative]")
    if problems:
        raise ConfigError("\n".join(problems))
    return OmegaConf.create(out)


def class_overrides(cfg: DictConfig) -> dict[str, str]:
    """Node path -> one line, per task or decoder node that Hydra typed by a registered schema (its config's first
    defaults entry) but whose ``_target_`` an override changed: a config's class is fixed, or rows labelled
    ``speculative`` (or ``humaneval``) would come from another class. Inline decoders of experiment files (untyped)
    keep theirs."""
    nodes = [("task", cfg.get("task"))]
    decoders = cfg.get("decoder")
    if isinstance(decoders, DictConfig) and "_target_" not in decoders:
        nodes += [(f"decoder.{name}", node) for name, node in decoders.items()]
    problems = {}
    for path, node in nodes:
        schema = OmegaConf.get_type(node) if isinstance(node, DictConfig) else None
        fixed = getattr(schema, "_target_", None) if schema in (*TASK_SCHEMAS.values(), *DECODER_SCHEMAS.values()) \
            else None
        target = node.get("_target_") if fixed else None
        if fixed and target != fixed:
            problems[path] = (f"{path}._target_={show(target)}: fixed by its config (must be {show(fixed)}); remove "
                              "the override and choose the config of the class you want (python run.py list)")
    return problems


def _model(node: Any, problems: list[str]) -> DictConfig | None:
    """``model`` typed, its bounds and each model's source fields checked (problems appended)."""
    model = _typed(ModelConfig, node, "model", problems)
    if model is not None:
        mvals = OmegaConf.to_container(model)
        problems += check_bounds(ModelConfig, mvals, "model")
        for role in ("target", "draft"):
            if mvals.get(role) is not None:
                problems += check_bounds(ModelSpec, mvals[role], f"model.{role}")
                problems += check_model_source(mvals[role], f"model.{role}")
    return model


def _task(node: Any, problems: list[str]) -> DictConfig | None:
    """``task`` typed by the schema of its ``_target_``, its bounds and data path checked."""
    schema = TASK_SCHEMAS.get(node.get("_target_")) if isinstance(node, Mapping) else None
    if schema is None:
        problems.append(f"task._target_={show(node.get('_target_') if isinstance(node, Mapping) else node)}: "
                        f"must be one of {', '.join(TASK_SCHEMAS)} (a new task declares its settings and is "
                        "registered in tasks/__init__.py: register_task)")
        return None
    task = _typed(schema, node, "task", problems)
    if task is not None:
        tvals = OmegaConf.to_container(task)
        problems += check_bounds(schema, tvals, "task")
        problems += check_path("task.data_path", tvals.get("data_path"))
    return task


def _runner(node: Any, problems: list[str]) -> DictConfig | None:
    """``runner`` typed, its bounds and its rules across fields (:func:`harness.config.rules.runner_rules`)."""
    runner = _typed(RunnerConfig, node, "runner", problems)
    if runner is not None:
        rvals = OmegaConf.to_container(runner)
        bounds = check_bounds(RunnerConfig, rvals, "runner")
        problems += bounds
        problems += runner_rules(rvals, bounded=not bounds)
    return runner


def _decoders(decoders: Mapping[str, Any], model: DictConfig | None, problems: list[str]) -> dict[str, Any]:
    """Each decoder node typed by the schema of its ``_target_`` (inline experiment decoders too), its bounds
    checked; a decoder that needs a draft on a pair without one is a problem."""
    typed_decoders: dict[str, Any] = {}
    for name, node in decoders.items():
        schema = _decoder_schema(node)
        if schema is None:
            target = node.get("_target_") if isinstance(node, Mapping) else node
            problems.append(f"decoder.{name}._target_={show(target)}: no decoder schema for it; known targets: "
                            f"{', '.join(DECODER_SCHEMAS)} (a new decoder declares its settings and is "
                            "registered in decoders/settings.py: register_decoder)")
            continue
        typed = _typed(schema, node, f"decoder.{name}", problems)
        if typed is not None:
            dvals = OmegaConf.to_container(typed)
            bounds = check_bounds(schema, dvals, f"decoder.{name}")
            problems += bounds
            if not bounds:
                problems += decoder_rules(schema, dvals, f"decoder.{name}")
            changed = tuned_overrides(name, dvals)
            if changed:  # not the tuned configuration any more: its rows must not claim it
                warn_once(tuned_override_line(name, changed))
                name = name.rstrip(TUNED_OVERRIDE_MARK) + TUNED_OVERRIDE_MARK
            typed_decoders[name] = typed
    problems += draft_rule(typed_decoders, model)
    return typed_decoders
