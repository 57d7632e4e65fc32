"""The composed config, checked: :func:`validate` and :func:`compose`, and each problem as one line.

Hydra types every node by its schema (:mod:`harness.config.schemas`) while it composes, so a misspelt key or a value
of the wrong type fails there (:func:`explain_compose_error` makes that one line). Hydra lets a ``+key``
override add keys even to a typed node, and experiment files may define decoders inline, so
:func:`validate` checks the composed config again, as a whole, before anything runs: every node against the
schema of its ``_target_`` (unknown keys, types, missing values), then value bounds (``gamma >= 1``,
``pool_scope`` in ``sample|task``, ``task.limit >= 1`` or null, dtype names, ...). Every problem is one line
naming the key, the value and what is allowed, raised as :class:`ConfigError`.

Where it runs:
    * ``run.py`` composes and validates every job of the command line (each value of a sweep too) before
      Hydra starts (:func:`harness.job.app.precheck`), and prints ``error: ...`` lines and exits 2;
    * :func:`harness.job.app.main_job` validates its config first, before task data is read and before any
      model is fetched or loaded (jobs swept by an experiment's ``hydra.sweeper.params``, Python callers);
    * :func:`compose` (the compose API plus the same translation and validation) serves tests and scripts.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
import shutil
import sys
import typing
from pathlib import Path
from typing import Any, Mapping, Sequence

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from declare import must_be, out_of_bounds
from harness.config.schemas import (BY_CLASS_NAME, DECODER_SCHEMAS, ROOT_KEYS, SOURCE_FIELDS, TASK_SCHEMAS, ModelConfig,
                             ModelSpec, PromptLookupConfig, RunnerConfig)

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
#: The folder of ``conf/decoder`` that holds the generated configs (benchmarks/tune.py's ``<family>_tuned.yaml``),
#: apart from the hand-written ones; selected as ``decoder=[vanilla,tuned/speculative_tuned]``.
TUNED_GROUP = "tuned"
#: The machine-readable provenance line that benchmarks/tune.py writes into each ``*_tuned.yaml`` (JSON:
#: dtype, device_name, cpu_isa, task, and what ``--combine`` admitted); read back by :func:`tuned_on`.
TUNED_ON_PREFIX = "# tuned-on: "


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
            out.append(f"{f.name}={_show(values[f.name])} (tuned: {_show(tuned)})")
    return out


def tuned_override_line(name: str, changed: Sequence[str]) -> str:
    """The one warning for a tuned decoder run with ``changed`` settings (:func:`tuned_overrides`)."""
    base = name.rstrip(TUNED_OVERRIDE_MARK)
    return (f"decoder {base}: {', '.join(changed)} overrides its tuned setting (conf/decoder/{TUNED_GROUP}/{base}"
            f".yaml), so its rows are labelled {base}{TUNED_OVERRIDE_MARK}: not the tuned configuration")


_WARNED: set[str] = set()


def _warn_once(line: str) -> None:
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


# --------------------------------------------------------------------------------------------------
# The configs there are (conf/<group>/*.yaml), by the names a command line selects them with
# --------------------------------------------------------------------------------------------------

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


class ConfigError(ValueError):
    """The composed configuration cannot run; each line of the message names a key and what to change."""

_SHA256 = re.compile(r"[0-9a-f]{64}")


# --------------------------------------------------------------------------------------------------
# Validation of a composed config
# --------------------------------------------------------------------------------------------------

def _is_optional(tp: Any) -> bool:
    return type(None) in typing.get_args(tp)


def _base_type(tp: Any) -> Any:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if _is_optional(tp) and len(args) == 1 else tp


def _hints(schema: type) -> dict[str, Any]:
    return typing.get_type_hints(schema)


def field_names(schema: type) -> list[str]:
    """The keys a node of ``schema`` may hold, in declaration order."""
    return [f.name for f in dataclasses.fields(schema)]


def _key_list(schema: type) -> str:
    """``"gamma (and _target_, _partial_, uses_draft)"``: the settings first, the plumbing after."""
    names = field_names(schema)
    meta = [n for n in names if n in ("_target_", "_partial_", "uses_draft", "name")]
    shown = [n for n in names if n not in meta] or ["no other key"]
    return ", ".join(shown) + (f" (and {', '.join(meta)})" if meta else "")


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return repr(value)
    return str(value)


def _check_bounds(schema: type, values: Mapping[str, Any], path: str) -> list[str]:
    """One line per field of ``values`` outside its bound (types were checked by OmegaConf)."""
    problems = []
    defaults = {f.name: f.default for f in dataclasses.fields(schema)}
    for f in dataclasses.fields(schema):
        value, meta = values.get(f.name), f.metadata
        if value is None:
            continue
        if meta.get("fixed") and value != defaults[f.name]:
            problems.append(f"{path}.{f.name}={_show(value)}: fixed by {values.get('_target_') or schema.__name__} "
                            f"(must be {_show(defaults[f.name])}); remove the override")
        elif out_of_bounds(schema, f.name, value):
            problems.append(f"{path}.{f.name}={_show(value)}: must be {must_be(schema, f.name, value)}")
    return problems


def _unknown_key_line(path: str, key: str, schema: type | None, valid: Sequence[str] | None = None,
                      where: str = "") -> str:
    what = f"{path}.{key}" if path else key
    names = ", ".join(valid) if valid is not None else _key_list(schema)  # type: ignore[arg-type]
    owner = f"{path} ({getattr(schema, '_target_', None) or getattr(schema, '__name__', '')})" if schema else (path or "the top level")
    line = f"unknown key {what}{where}: {owner} takes {names}"
    if key in _SAMPLING_KEYS and not path.startswith("runner"):
        line += ("; sampling settings are set once for every decoder of a run: runner.temperature, runner.top_p, "
                 "runner.top_k, runner.seed (e.g. runner.temperature=0.7)")
    return line


# Keys users reach for on a decoder or model when they mean the run's sampling settings (docs/sampling.md).
_SAMPLING_KEYS = frozenset({"temperature", "top_p", "top_k", "do_sample", "seed", "sampling"})


def _typed(schema: type, node: Any, path: str, problems: list[str]) -> DictConfig | None:
    """``node`` (plain, resolved) merged onto ``schema``: unknown keys, wrong types, missing values -> lines."""
    if not isinstance(node, Mapping):
        problems.append(f"{path}={_show(node)}: must be a mapping of {schema.__name__} fields")
        return None
    known = field_names(schema)
    unknown = [k for k in node if k not in known]
    for k in unknown:
        problems.append(_unknown_key_line(path, str(k), schema))
    node = {k: v for k, v in node.items() if k in known}
    hints = _hints(schema)
    not_bool = [f"{path}.{k}={_show(v)}: must be true or false" for k, v in node.items()
                if _base_type(hints[k]) is bool and v is not None and not _is_bool(v)]
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
        problems.append(_omegaconf_line(e, path))
        return None
    missing = sorted(OmegaConf.missing_keys(typed))
    for k in missing:
        problems.append(f"{path}.{k} is missing: set it in the config or on the command line")
    return None if missing else typed


def _is_bool(value: Any) -> bool:
    """A boolean setting's value: true or false (YAML's, or the words as strings), nothing else."""
    return isinstance(value, bool) or (isinstance(value, str) and value.lower() in ("true", "false"))


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
    switch off). Sweeps are checked per job (:func:`compose` of each point)."""
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
        elif _declared_type(cfg, key) is bool and ov.value() is not None and not _is_bool(ov.value()):
            problems.append(f"{key}={text}: must be true or false")
    return problems


def _omegaconf_line(e: OmegaConfBaseException, path: str = "") -> str:
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
    for key in plain:
        if key not in ROOT_KEYS:
            problems.append(_unknown_key_line("", str(key), None, valid=ROOT_KEYS))
    out: dict[str, Any] = {k: plain.get(k) for k in ("device", "data_dir", "output_dir") if k in plain}
    if "device" in plain:
        problems += _check_device(plain["device"])
    problems += _check_path("data_dir", plain.get("data_dir"))
    for group, check in (("model", _model), ("task", _task), ("runner", _runner)):
        typed = check(plain.get(group), problems)
        if typed is not None:
            out[group] = typed
    if plain.get("decoder") and isinstance(plain["decoder"], Mapping) and "_target_" not in plain["decoder"]:
        out["decoder"] = _decoders(plain["decoder"], out.get("model"), problems)
    else:
        problems.append("no decoder selected: pass e.g. decoder=[vanilla,speculative]" if not plain.get("decoder")
                        else "`decoder` must be a list of decoder names, e.g. decoder=[vanilla,speculative]")
    if problems:
        raise ConfigError("\n".join(problems))
    return OmegaConf.create(out)


def _model(node: Any, problems: list[str]) -> DictConfig | None:
    """``model`` typed, its bounds and each model's source fields checked (problems appended)."""
    model = _typed(ModelConfig, node, "model", problems)
    if model is not None:
        mvals = OmegaConf.to_container(model)
        problems += _check_bounds(ModelConfig, mvals, "model")
        for role in ("target", "draft"):
            if mvals.get(role) is not None:
                problems += _check_bounds(ModelSpec, mvals[role], f"model.{role}")
                problems += _check_model_source(mvals[role], f"model.{role}")
    return model


def _task(node: Any, problems: list[str]) -> DictConfig | None:
    """``task`` typed by the schema of its ``_target_``, its bounds and data path checked."""
    schema = TASK_SCHEMAS.get(node.get("_target_")) if isinstance(node, Mapping) else None
    if schema is None:
        problems.append(f"task._target_={_show(node.get('_target_') if isinstance(node, Mapping) else node)}: "
                        f"must be one of {', '.join(TASK_SCHEMAS)} (a new task declares its settings and gets a "
                        "schema in harness/config/schemas.py)")
        return None
    task = _typed(schema, node, "task", problems)
    if task is not None:
        tvals = OmegaConf.to_container(task)
        problems += _check_bounds(schema, tvals, "task")
        problems += _check_path("task.data_path", tvals.get("data_path"))
    return task


def _runner(node: Any, problems: list[str]) -> DictConfig | None:
    """``runner`` typed, its bounds, sample ids, shard and sampling-only settings checked."""
    runner = _typed(RunnerConfig, node, "runner", problems)
    if runner is not None:
        rvals = OmegaConf.to_container(runner)
        bounds = _check_bounds(RunnerConfig, rvals, "runner")
        problems += bounds
        problems += _check_sample_ids(rvals.get("sample_ids"))
        problems += _check_shard(rvals.get("shard"))
        off = {k: rvals.get(k) for k, v in (("top_p", 1.0), ("top_k", 0)) if rvals.get(k) != v}
        if not bounds and rvals.get("temperature") == 0 and off:
            problems.append(f"{' / '.join(f'runner.{k}={v}' for k, v in off.items())}: only applies when sampling; "
                            "set runner.temperature > 0 (greedy decoding would ignore it)")
    return runner


def _decoders(decoders: Mapping[str, Any], model: DictConfig | None, problems: list[str]) -> dict[str, Any]:
    """Each decoder node typed by the schema of its ``_target_`` (inline experiment decoders too), its bounds
    checked; a decoder that needs a draft on a pair without one is a problem."""
    typed_decoders: dict[str, Any] = {}
    for name, node in decoders.items():
        schema = _decoder_schema(node)
        if schema is None:
            target = node.get("_target_") if isinstance(node, Mapping) else node
            problems.append(f"decoder.{name}._target_={_show(target)}: no decoder schema for it; known targets: "
                            f"{', '.join(DECODER_SCHEMAS)} (a new decoder declares its settings in "
                            "decoders/settings.py and gets a schema in harness/config/schemas.py)")
            continue
        typed = _typed(schema, node, f"decoder.{name}", problems)
        if typed is not None:
            dvals = OmegaConf.to_container(typed)
            bounds = _check_bounds(schema, dvals, f"decoder.{name}")
            problems += bounds
            if schema is PromptLookupConfig and not bounds and dvals["min_ngram_size"] > dvals["max_ngram_size"]:
                problems.append(f"decoder.{name}.min_ngram_size={dvals['min_ngram_size']}: must be <= "
                                f"max_ngram_size ({dvals['max_ngram_size']})")
            changed = tuned_overrides(name, dvals)
            if changed:  # not the tuned configuration any more: its rows must not claim it
                _warn_once(tuned_override_line(name, changed))
                name = name.rstrip(TUNED_OVERRIDE_MARK) + TUNED_OVERRIDE_MARK
            typed_decoders[name] = typed
    if model is not None and OmegaConf.select(model, "draft") is None:
        users = [n for n, d in typed_decoders.items() if d.uses_draft]
        if users:
            problems.append(f"decoders {users} need a draft model but model={OmegaConf.select(model, 'name')} has "
                            "none; choose a pair with a draft (e.g. model=qwen2.5-coder-1.5b) or drop those decoders")
    return typed_decoders


def _check_path(key: str, value: Any) -> list[str]:
    """A data path that is given but does not exist (before any model loads; the task's own loader says what a
    folder lacks)."""
    if value in (None, "") or not isinstance(value, str):
        return []
    p = Path(os.path.expanduser(os.path.expandvars(value))).resolve()
    if p.exists():
        return []
    if key == "data_dir":
        return [f"data_dir={value}: no such folder ({p}); point data_dir (or SPECDEC_DATA_DIR) at the folder that "
                "holds <task>/<file>, e.g. ../shared/data, or set task.data_path to the task's file"]
    return [f"{key}={value}: no such file or folder ({p}); point it at the task's data file or its folder (e.g. "
            f"../shared/data/<task>), or leave it unset to use data_dir / SPECDEC_DATA_DIR"]


def _no_cuda_without_torch() -> str | None:
    """Why CUDA cannot work here, when that is known without importing torch: a CPU build of torch (its
    version says ``+cpu``), or a Linux machine without an NVIDIA driver. ``None``: ask torch."""
    from importlib import metadata

    try:
        version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return "torch is not installed"
    if version.endswith("+cpu"):
        return f"torch {version} is a CPU build"
    if sys.platform.startswith("linux") and not Path("/proc/driver/nvidia/version").exists() \
            and not Path("/dev/nvidiactl").exists() and shutil.which("nvidia-smi") is None:
        return "this machine has no NVIDIA driver (no /proc/driver/nvidia, /dev/nvidiactl or nvidia-smi)"
    return None


def _check_device(device: Any) -> list[str]:
    if not isinstance(device, str) or not re.fullmatch(r"auto|cpu|mps|(cuda|xpu|npu|hpu)(:\d+)?", device):
        return [f"device={_show(device)}: must be auto, cpu, cuda, cuda:<index> (or another torch device name)"]
    if device.startswith("cuda"):  # refused here, before any task data or weights load
        fast = _no_cuda_without_torch()
        if fast:  # known without importing torch (seconds)
            return [f"device={device}: {fast}; use device=cpu, or device=auto (CUDA when present, else CPU)"]
        import torch

        index = int(device.split(":")[1]) if ":" in device else 0
        if not torch.cuda.is_available():
            return [f"device={device}: torch {torch.__version__} sees no CUDA device (a CPU build of torch, or no "
                    "driver); use device=cpu, or device=auto (CUDA when present, else CPU)"]
        if index >= torch.cuda.device_count():
            return [f"device={device}: only {torch.cuda.device_count()} CUDA device(s) visible (cuda:0.."
                    f"cuda:{torch.cuda.device_count() - 1}); check CUDA_VISIBLE_DEVICES"]
    if device == "mps":
        import torch

        if not torch.backends.mps.is_available():
            return ["device=mps: this torch build or machine has no MPS (Apple GPU) backend; use device=cpu"]
    return []


def _check_sample_ids(sample_ids: Any) -> list[str]:
    if sample_ids is None:
        return []
    if isinstance(sample_ids, (list, tuple)) and sample_ids and all(isinstance(i, (str, int)) for i in sample_ids):
        return []
    return [f"runner.sample_ids={_show(sample_ids)}: must be a non-empty list of sample ids, e.g. "
            "'runner.sample_ids=[HumanEval/1,HumanEval/8]' (or null)"]


def _check_shard(shard: Any) -> list[str]:
    if shard is None:
        return []
    m = re.fullmatch(r"(\d+)/(\d+)", str(shard))
    if m and int(m.group(1)) < int(m.group(2)):
        return []
    return [f"runner.shard={_show(shard)}: must be 'i/n' with 0 <= i < n (shard i of n, counted from 0), e.g. "
            "runner.shard=0/4"]


def _check_model_source(spec: Mapping[str, Any], path: str) -> list[str]:
    source = spec.get("source")
    if source not in SOURCE_FIELDS:
        return []  # reported by the bounds check
    required, optional = SOURCE_FIELDS[source]
    problems = [f"{path}.{k} is missing: source {source} needs {', '.join(required)}"
                for k in required if spec.get(k) in (None, [], {})]
    allowed = {"name", "source", *required, *optional}
    for k, v in spec.items():
        if v is not None and k not in allowed:
            problems.append(f"{path}.{k}={_show(v)}: not used by source {source} (it takes "
                            f"{', '.join(sorted(allowed - {'name', 'source'}))}); remove it")
    sha = spec.get("sha256")
    if sha is not None and not _SHA256.fullmatch(str(sha)):
        problems.append(f"{path}.sha256={_show(sha)}: must be 64 lowercase hex digits or null")
    return problems


# --------------------------------------------------------------------------------------------------
# Composition: group lists, Hydra's errors in one line
# --------------------------------------------------------------------------------------------------

#: Groups that take one config per job.
SINGLE_GROUPS = ("model", "task", "runner")


def list_of_group_line(group: str, names: Sequence[str] = ()) -> str:
    shown = ",".join(names) if names else "a,b"
    return (f"{group}=[{shown}]: {group} takes one name per run (Hydra would merge the list silently); "
            f"to run several, sweep them: python run.py -m {group}={shown}")


def refuse_group_lists(overrides: Sequence[str]) -> None:
    """Raise :class:`ConfigError` for ``task=[a,b]`` / ``model=[a,b]`` (a list where one name is taken)."""
    for arg in overrides:
        key, sep, value = arg.lstrip("+~").partition("=")
        key = key.split("@")[0]
        if sep and key in SINGLE_GROUPS and value.strip().startswith("["):
            names = [v.strip() for v in value.strip().strip("[]").split(",") if v.strip()]
            raise ConfigError(list_of_group_line(key, names))


def explain_compose_error(exc: BaseException) -> ConfigError:
    """Hydra's composition error as a :class:`ConfigError` of one line that names the key and the valid keys."""
    texts = []
    e: BaseException | None = exc
    while e is not None and len(texts) < 4:
        texts.append(str(e))
        e = e.__cause__ or e.__context__
    text = "\n".join(texts)
    m_from = re.search(r"In '([\w/.\-]+)'", text)
    where = f" (in conf/{m_from.group(1)}.yaml)" if m_from else ""
    if re.search(r"Could not (override|append|delete)", text) or "override" in text.split("\n")[0]:
        where = " (on the command line)"
    m_group = re.search(r"In '(task|model|runner)/[^']*'.*not a subclass of", text, re.S)
    if m_group:
        return ConfigError(list_of_group_line(m_group.group(1)))
    m_unselected = re.search(r"Could not override '(decoder\.([^.']+)\.[^']*)'.*Key '\2' is not in struct", text, re.S)
    if m_unselected:
        key, name = m_unselected.groups()
        hint = suggestion(name, available("decoder"))
        if hint and decoder_key(hint) != name:  # a misspelt node name
            return ConfigError(f"{key}: no decoder {name!r} in this run; did you mean decoder.{decoder_key(hint)}"
                               f"{key[len(f'decoder.{name}'):]}? (settings apply to the selected decoders; "
                               "python run.py list decoder)")
        return ConfigError(f"{key}: no decoder {name!r} in this run; select it first "
                           f"(decoder=[vanilla,{hint or name}]) or fix the name (python run.py list decoder)")
    m_key = re.search(r"Key '([^']+)' (?:is )?not in (?:'(\w+)'|struct)", text)
    m_full = re.search(r"full_key: (\S+)", text)
    if m_key:
        key = m_key.group(1)
        full = m_full.group(1) if m_full else key
        path = full.rsplit(".", 1)[0] if "." in full else ""
        schema = BY_CLASS_NAME.get(m_key.group(2) or "")
        if schema is not None:
            return ConfigError(_unknown_key_line(path, key, schema, where=where))
        if not path:
            return ConfigError(_unknown_key_line("", key, None, valid=ROOT_KEYS, where=where))
    m_val = re.search(r"Value '(.*)' of type '(\w+)' could not be converted to (\w+)", text)
    if m_val or "is not Optional" in text:
        full = m_full.group(1) if m_full else "?"
        kind = {"Integer": "an integer", "Float": "a number", "Boolean": "true or false", "String": "a string"}
        if m_val:
            return ConfigError(f"{full}={m_val.group(1)!r}{where}: must be {kind.get(m_val.group(3), m_val.group(3))}")
        return ConfigError(f"{full}=null{where}: must not be null")
    lines = [ln.strip() for ln in text.split("\n") if ln.strip() and not ln.strip().startswith("object_type")]
    return ConfigError(" ".join(dict.fromkeys(lines)))


def compose(overrides: Sequence[str] = (), *, config_name: str = "config", config_dir: Path | str = CONF_DIR,
            return_hydra_config: bool = False, check: bool = True) -> DictConfig:
    """Compose ``conf/`` like ``run.py`` does, then :func:`validate` (when ``check``).

    Returns the config as composed (interpolations unresolved; the ``hydra`` node only when asked for).

    Raises:
        ConfigError: a list for a single-choice group, an unknown key, a wrong type or a value out of bounds.
    """
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    refuse_group_lists(overrides)

    def _compose() -> DictConfig:
        try:
            return hydra_compose(config_name=config_name, overrides=list(overrides), return_hydra_config=True)
        except Exception as e:  # Hydra's ConfigCompositionException, OmegaConf's errors, MissingConfigException
            raise explain_compose_error(e) from e

    if GlobalHydra.instance().is_initialized():
        cfg = _compose()
    else:
        with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
            cfg = _compose()
    choices = dict(cfg.hydra.runtime.choices)
    if check:
        problems = override_problems(overrides, cfg)
        if problems:
            raise ConfigError("\n".join(problems))
        job = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
        validate(job, choices=choices)
    if not return_hydra_config:
        from omegaconf import open_dict

        with open_dict(cfg):
            del cfg["hydra"]
    return cfg
