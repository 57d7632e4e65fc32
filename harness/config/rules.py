"""The rules a composed config must keep beyond each field's type: every field's declared bound
(:func:`check_bounds`), the rules across fields (:func:`runner_rules`, :func:`decoder_rules`,
:func:`draft_rule`, :func:`check_model_source`), all in this one module, and what the machine must offer
(:func:`check_device`, :func:`check_path`). Each returns the problems as lines (:mod:`harness.config.errors`);
:func:`harness.config.check.validate` calls them. Torch is imported only to check a CUDA or MPS device.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import sys
from pathlib import Path
from typing import Any, Mapping

from omegaconf import OmegaConf

from decoders.settings import FixedTreeSettings, PromptLookupSettings, tree_shape_problem
from declare import must_be, out_of_bounds, show
from harness.config.identity import resolve_path
from harness.config.schemas import SOURCE_FIELDS

_SHA256 = re.compile(r"[0-9a-f]{64}")


def check_bounds(schema: type, values: Mapping[str, Any], path: str) -> list[str]:
    """One line per field of ``values`` outside its bound (types were checked by OmegaConf)."""
    problems = []
    defaults = {f.name: f.default for f in dataclasses.fields(schema)}
    for f in dataclasses.fields(schema):
        value, meta = values.get(f.name), f.metadata
        if value is None:
            continue
        if meta.get("fixed") and value != defaults[f.name]:
            problems.append(f"{path}.{f.name}={show(value)}: fixed by {values.get('_target_') or schema.__name__} "
                            f"(must be {show(defaults[f.name])}); remove the override")
        elif out_of_bounds(schema, f.name, value):
            problems.append(f"{path}.{f.name}={show(value)}: must be {must_be(schema, f.name, value)}")
    return problems


def is_bool(value: Any) -> bool:
    """A boolean setting's value: true or false (YAML's, or the words as strings), nothing else."""
    return isinstance(value, bool) or (isinstance(value, str) and value.lower() in ("true", "false"))


# --------------------------------------------------------------------------------------------------
# Rules across fields (one place)
# --------------------------------------------------------------------------------------------------

def runner_rules(rvals: Mapping[str, Any], bounded: bool) -> list[str]:
    """The runner's sample ids and shard, and settings that only apply when sampling given to a greedy run
    (``bounded``: the runner's fields keep their bounds, so the values can be compared)."""
    problems = check_sample_ids(rvals.get("sample_ids")) + check_shard(rvals.get("shard"))
    off = {k: rvals.get(k) for k, v in (("top_p", 1.0), ("top_k", 0)) if rvals.get(k) != v}
    if bounded and rvals.get("temperature") == 0 and off:
        problems.append(f"{' / '.join(f'runner.{k}={v}' for k, v in off.items())}: only applies when sampling; "
                        "set runner.temperature > 0 (greedy decoding would ignore it)")
    return problems


def decoder_rules(schema: type, dvals: Mapping[str, Any], path: str) -> list[str]:
    """Rules across one decoder's settings (its fields keep their bounds): prompt lookup's shortest n-gram is
    at most its longest; a fixed tree's paths make a tree."""
    if issubclass(schema, PromptLookupSettings) and dvals["min_ngram_size"] > dvals["max_ngram_size"]:
        return [f"{path}.min_ngram_size={dvals['min_ngram_size']}: must be <= max_ngram_size "
                f"({dvals['max_ngram_size']})"]
    if issubclass(schema, FixedTreeSettings):
        problem = tree_shape_problem(dvals["paths"])
        if problem:
            return [f"{path}.paths: {problem}"]
    return []


def draft_rule(decoders: Mapping[str, Any], model: Any) -> list[str]:
    """Decoders (typed nodes) that need a draft model (``uses_draft``) on a typed ``model`` pair without one."""
    if model is None or OmegaConf.select(model, "draft") is not None:
        return []
    users = [n for n, d in decoders.items() if d.uses_draft]
    if not users:
        return []
    return [f"decoders {users} need a draft model but model={OmegaConf.select(model, 'name')} has "
            "none; choose a pair with a draft (e.g. model=qwen2.5-coder-1.5b) or drop those decoders"]


def check_model_source(spec: Mapping[str, Any], path: str) -> list[str]:
    """One model of a pair (``model.target`` / ``model.draft``, at ``path``): the fields its ``source`` needs
    (:data:`harness.config.schemas.SOURCE_FIELDS`), none it does not use, a well-formed ``sha256``."""
    source = spec.get("source")
    if source not in SOURCE_FIELDS:
        return []  # reported by the bounds check
    required, optional = SOURCE_FIELDS[source]
    problems = [f"{path}.{k} is missing: source {source} needs {', '.join(required)}"
                for k in required if spec.get(k) in (None, [], {})]
    allowed = {"name", "source", *required, *optional}
    for k, v in spec.items():
        if v is not None and k not in allowed:
            problems.append(f"{path}.{k}={show(v)}: not used by source {source} (it takes "
                            f"{', '.join(sorted(allowed - {'name', 'source'}))}); remove it")
    sha = spec.get("sha256")
    if sha is not None and not _SHA256.fullmatch(str(sha)):
        problems.append(f"{path}.sha256={show(sha)}: must be 64 lowercase hex digits or null")
    return problems


# --------------------------------------------------------------------------------------------------
# What the machine must offer, what a run must be given
# --------------------------------------------------------------------------------------------------

def check_path(key: str, value: Any) -> list[str]:
    """A data path that is given but does not exist (before any model loads; the task's own loader says what a
    folder lacks)."""
    if value in (None, "") or not isinstance(value, str):
        return []
    p = Path(resolve_path(value))
    if p.exists():
        return []
    if key in ("data_dir", "task.data_dir"):
        return [f"{key}={value}: no such folder ({p}); point {key} (or SPECDEC_DATA_DIR) at the folder that "
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


def check_device(device: Any) -> list[str]:
    """A device name torch knows, and one this machine has (CUDA refused without importing torch when the torch
    build or the machine rules it out)."""
    if not isinstance(device, str) or not re.fullmatch(r"auto|cpu|mps|(cuda|xpu|npu|hpu)(:\d+)?", device):
        return [f"device={show(device)}: must be auto, cpu, cuda, cuda:<index> (or another torch device name)"]
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


def check_sample_ids(sample_ids: Any) -> list[str]:
    """``runner.sample_ids``: null or a non-empty list of ids."""
    if sample_ids is None:
        return []
    if isinstance(sample_ids, (list, tuple)) and sample_ids and all(isinstance(i, (str, int)) for i in sample_ids):
        return []
    return [f"runner.sample_ids={show(sample_ids)}: must be a non-empty list of sample ids, e.g. "
            "'runner.sample_ids=[HumanEval/1,HumanEval/8]' (or null)"]


def check_shard(shard: Any) -> list[str]:
    """``runner.shard``: null or ``'i/n'`` with ``0 <= i < n``."""
    if shard is None:
        return []
    m = re.fullmatch(r"(\d+)/(\d+)", str(shard))
    if m and int(m.group(1)) < int(m.group(2)):
        return []
    return [f"runner.shard={show(shard)}: must be 'i/n' with 0 <= i < n (shard i of n, counted from 0), e.g. "
            "runner.shard=0/4"]
