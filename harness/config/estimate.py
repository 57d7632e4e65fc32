"""How long a command will run, said before it starts: ``run.py`` prints :func:`estimate`'s line after the
precheck, priced by the cost table ``benchmarks/baselines/costs.json`` (measured runs, refreshed by
``python benchmarks/costs.py RUN ...``). Torch-free, like the precheck.

A cost entry is one machine class: the model pair's config name, the dtype, and the CPU's instruction sets
(:func:`harness.rows.machine.cpu_isa`: a Zen 3 without AVX-512 and a Zen 4 with bf16 units run one model several
times apart). It holds vanilla's tokens/s and mean time to the first token (the prefill), per measured task and
over all, and each measured decoder configuration's speedup (and each decoder class's mean). One cell of decoder
``d`` costs ``prefill_s + tokens / (vanilla_tokens_per_s * speedup_d)`` with ``tokens`` the new tokens a call is
expected to emit (:func:`expected_tokens`: from the answer lengths the entry measured for the task, else the whole
budget); a job costs its cells (samples x turns x repeats, for every decoder) and the warm-up calls; a sweep costs
its jobs. A decoder configuration the table has not measured is priced by the mean of its class's measured
configurations, else at vanilla's speed, and the line names it. A CPU is priced by its own generation's entry (its
family/model numbers) where the table has one, else by its instruction-set class's, and the line says so. No
estimate without an entry for the machine class (a GPU, another CPU, another dtype): the line says what would add one.

A job at ``runner.batch_size`` B > 1 is priced by the entry's ``batch`` block (``experiment=batch_sweep`` rows,
:func:`batch_point`), all of it from one sweep on one machine: at the largest measured batch size B' <= B, a request
of ``tokens`` costs ``tokens / base_tokens_per_s`` (vanilla's batch-1 tokens/s in that sweep, prefill included)
divided by vanilla's throughput ratio at B' and by the decoder's speedup at B'. Throughput grows with the batch size,
so pricing B by B' <= B errs long. Without a measured B' the requests are priced as single-request calls (an upper
bound), and the line says which.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

#: The cost table (:mod:`benchmarks.costs` writes it).
COSTS_FILE = Path(__file__).resolve().parents[2] / "benchmarks" / "baselines" / "costs.json"


def machine_key(model: str, dtype: str, cpu_isa: str, cpu: str | None = None) -> str:
    """The cost table's key of a machine class, ``qwen2.5-coder-1.5b|float32|avx2``; with ``cpu`` (a CPU's
    ``family/model`` numbers, :func:`cpu_of`) the key of that CPU generation within its class,
    ``qwen2.5-coder-1.5b|bfloat16|avx2+avx512f+avx512_bf16|26/2`` (a Zen 4 and a Zen 5 share one instruction-set
    class and differ ~2x in speed)."""
    return f"{model}|{dtype}|{cpu_isa}" + (f"|{cpu}" if cpu else "")


def cpu_of(device_name: Any) -> str | None:
    """The ``family/model`` numbers a row's ``device_name`` gives in brackets (``AMD EPYC [26/2] (2 cores, ...)``
    -> ``26/2``, :func:`harness.rows.machine.device_name`); None without them (a GPU, an older row)."""
    m = re.search(r"\[(\d+)/(\d+)\]", str(device_name))
    return f"{m.group(1)}/{m.group(2)}" if m else None


@dataclass(frozen=True)
class Job:
    """What one job will run, read from its composed config.

    Attributes:
        task: the task's name (prefill and vanilla's speed are measured per task where the table has it).
        decoders: decoder config name -> its class's import path (``_target_``).
        cells: timed calls per decoder (samples x turns x repeats).
        tokens: the generation budget per call (new tokens at most).
        warmup_calls: untimed calls per decoder, of ``warmup_tokens`` tokens each.
        warmup_tokens: new tokens of a warm-up call.
        batch_size: ``runner.batch_size`` (priced by the entry's batch costs: the module docstring).
    """

    task: str
    decoders: Mapping[str, str]
    cells: int
    tokens: int
    warmup_calls: int
    warmup_tokens: int
    batch_size: int = 1


def job_of(cfg: Any, task_sizes: Mapping[str, tuple[int, int]]) -> Job | None:
    """The :class:`Job` of a composed config (``decoder``, ``task``, ``runner`` nodes), or None when its size is not
    known before it runs (an explicit list of sample ids is counted; a task whose whole size is not registered,
    with ``task.limit`` null, is not).

    Args:
        cfg: the composed config (a DictConfig or a mapping of mappings).
        task_sizes: task name -> (samples, cells) of the whole task (:data:`TASK_SIZES`).
    """
    task, runner = cfg["task"], cfg["runner"]
    samples, cells = task_sizes.get(str(task["name"]), (None, None))
    ids = runner.get("sample_ids")
    if ids:
        count = len(ids)
    elif task.get("limit") is not None:
        count = int(task["limit"])
        if samples is not None:
            count = max(0, min(count, samples - int(task.get("offset") or 0)))
    elif samples is not None and task.get("split") in (None, "test"):  # the registered size is the test split's
        count = max(0, samples - int(task.get("offset") or 0))
    else:
        return None
    turns = (cells / samples) if samples else 1.0
    tokens = runner.get("max_new_tokens") or task.get("max_new_tokens")
    if not tokens:
        return None
    decoders = {str(k): str(v.get("_target_", "")) for k, v in cfg["decoder"].items()}
    return Job(str(task["name"]), decoders, math.ceil(count * turns) * int(runner.get("repeats") or 1), int(tokens),
               int(runner.get("warmup") or 0), int(runner.get("warmup_tokens") or 0),
               int(runner.get("batch_size") or 1))


def expected_tokens(budget: int, measured: Mapping[str, Any]) -> float:
    """New tokens a call with ``budget`` is expected to emit, from a task's answers measured at budget ``b0``
    (``measured``: ``budget``, ``mean_new_tokens`` and ``capped_share``, the share that reached it; the whole
    ``budget`` where the entry has none). An upper bound of the mean of ``min(L, budget)`` over answer lengths
    ``L`` either way: at most ``budget`` and at most ``mean_new_tokens`` when ``budget <= b0``; beyond ``b0``, at
    most ``mean_new_tokens + capped_share x (budget - b0)`` (only answers that reached ``b0`` can run on).

    Example: answers measured at 96 tokens averaging 80, half of them cut at 96: a budget of 64 is priced at 64,
    96 at 80, 256 at 80 + 0.5 x 160 = 160 (not 256)."""
    b0, mean, capped = (measured.get(k) for k in ("budget", "mean_new_tokens", "capped_share"))
    if b0 is None or mean is None or capped is None:
        return float(budget)
    if budget <= b0:
        return float(min(budget, mean))
    return float(min(budget, mean + capped * (budget - b0)))


def batch_point(entry: Mapping[str, Any], size: int) -> tuple[int, Mapping[str, Any]] | None:
    """``(B', costs)``: the entry's batch costs at the largest measured batch size ``B' <= size``; None at batch
    size 1 or when none was measured."""
    if size <= 1:
        return None
    measured = sorted((int(b), c) for b, c in (entry.get("batch") or {}).items() if int(b) <= size)
    return measured[-1] if measured else None


def price(job: Job, entry: Mapping[str, Any]) -> tuple[float, list[str]]:
    """``(seconds, unmeasured)``: the job's expected wall time on the machine class of ``entry`` (a cost table
    entry), and its decoder configurations that entry has not measured (priced by their class, else as vanilla)."""
    point = batch_point(entry, job.batch_size)
    if point is not None:
        return _batch_price(job, entry, point[1])
    here = entry.get("tasks", {}).get(job.task, {})
    v = float(here.get("vanilla_tokens_per_s", entry["vanilla_tokens_per_s"]))
    prefill = float(here.get("prefill_s", entry["prefill_s"]))
    measured: Mapping[str, float] = entry.get("speedup", {})
    by_class: Mapping[str, float] = entry.get("class_speedup", {})
    tokens = expected_tokens(job.tokens, here)
    total, unmeasured = 0.0, []
    for name, target in job.decoders.items():
        speedup = measured.get(name)
        if speedup is None:
            speedup = by_class.get(target.rsplit(".", 1)[-1], 1.0)
            if name != "vanilla":
                unmeasured.append(name)
        rate = v * max(float(speedup), 1e-3)
        total += job.cells * (prefill + tokens / rate) + job.warmup_calls * (prefill + job.warmup_tokens / rate)
    return total, unmeasured


def _batch_price(job: Job, entry: Mapping[str, Any], point: Mapping[str, Any]) -> tuple[float, list[str]]:
    """:func:`price` of a job at batch size > 1 by the batch costs ``point`` (the module docstring)."""
    here = entry.get("tasks", {}).get(job.task, {})
    v = max(float(point["base_tokens_per_s"]), 1e-3)  # prefill included
    ratio = max(float(point["throughput_ratio"]), 1e-3)
    single = expected_tokens(job.tokens, here) / v  # one request at batch size 1, as vanilla
    warm = job.warmup_calls * job.batch_size * job.warmup_tokens / v
    total, unmeasured = 0.0, []
    for name, target in job.decoders.items():
        speedup = 1.0 if name == "vanilla" else point.get("speedup", {}).get(name)
        if speedup is None:
            speedup = point.get("class_speedup", {}).get(target.rsplit(".", 1)[-1], 1.0)
            unmeasured.append(name)
        total += (job.cells * single + warm) / (ratio * max(float(speedup), 1e-3))
    return total, unmeasured


def load_costs(path: Path | None = None) -> dict[str, Any]:
    """The cost table at ``path`` (default :data:`COSTS_FILE`) as ``{"entries": {key: entry}}``; empty when the file
    is absent or unreadable."""
    try:
        doc = json.loads((path or COSTS_FILE).read_text())
        return doc if isinstance(doc.get("entries"), dict) else {"entries": {}}
    except (OSError, ValueError, AttributeError):
        return {"entries": {}}


def say(minutes: float) -> str:
    """``~7 min``, ``~2.4 h``."""
    return f"~{minutes:.0f} min" if minutes < 90 else f"~{minutes / 60:.1f} h"


def estimate(jobs: Sequence[Job | None], njobs: int, key: str | Sequence[str],
             costs: Mapping[str, Any] | None = None) -> str:
    """One line: the expected wall time of ``njobs`` jobs like ``jobs`` (every composed sweep point; their mean is
    taken for the jobs not composed) on the machine ``key`` (:func:`machine_key`; several keys: the first the table
    has, e.g. this CPU generation's, then its instruction-set class's, the line saying so), or why there is none."""
    keys = [key] if isinstance(key, str) else list(key)
    table = (costs if costs is not None else load_costs())["entries"]
    found = next((k for k in keys if k in table), None)
    entry = table.get(found) if found is not None else None
    if entry is None:
        key = keys[-1]
        return (f"estimated time: unknown (no measured costs for {key.replace('|', ', ')} in "
                f"benchmarks/baselines/{COSTS_FILE.name}; python benchmarks/costs.py <a run folder of this machine> "
                "--write adds them)")
    if not jobs or any(j is None for j in jobs):
        return "estimated time: unknown (a job's size is known only once its task data is read)"
    priced = [price(j, entry) for j in jobs if j is not None]
    seconds = sum(s for s, _ in priced) / len(priced) * njobs
    unmeasured = sorted({n for _, names in priced for n in names})
    first = jobs[0]
    line = (f"estimated time: {say(seconds / 60)} ({njobs} job{'s' if njobs != 1 else ''}; "
            f"{len(first.decoders)} decoders x {first.cells} cell{'s' if first.cells != 1 else ''} x at most "
            f"{first.tokens} tokens per job; costs "
            f"measured on {entry.get('device_name', key)}: {', '.join(entry.get('source', [])) or '?'})")
    if found != keys[0]:
        line += (f"; no costs measured on this CPU ({keys[0].rsplit('|', 1)[-1]}): priced by another CPU of its "
                 "instruction-set class")
    if unmeasured:
        line += f"; not measured, priced by their class or as vanilla: {', '.join(unmeasured)}"
    batched = sorted({j.batch_size for j in jobs if j is not None and j.batch_size > 1})
    points = {b: batch_point(entry, b) for b in batched}
    if any(p is not None for p in points.values()):
        by = [f"{b} by {p[0]}" for b, p in points.items() if p is not None]
        line += (f"; batch size {', '.join(by)} priced by the batch costs measured at that size "
                 f"({', '.join(entry.get('batch_source', entry.get('source', []))) or '?'})")
    single = [b for b, p in points.items() if p is None]
    if single:
        line += (f"; batch size {', '.join(map(str, single))} priced as single-request calls: an upper bound (no "
                 "batched costs measured at or below it)")
    return line


def line(configs: Sequence[Any], njobs: int, cpu_isa: str, native_bf16: bool | None, cpu: str | None = None
         ) -> str:
    """The line ``run.py`` prints before a run: :func:`estimate` of ``njobs`` jobs like the composed ``configs``
    (:class:`harness.config.precheck.Folder`) on this machine (``cpu_isa`` and whether it computes bfloat16
    natively, :mod:`harness.rows.machine`, so ``model.dtype=auto`` resolves as the run will; ``cpu``: its
    ``family/model`` numbers, priced by that CPU generation's entry where the table has one, else by its class's).
    Never raises: an estimate never stops a run that passed its checks."""
    try:
        from omegaconf import OmegaConf

        from harness.config.rules import _no_cuda_without_torch
        from tasks import TASK_SIZES

        cfg = configs[0]
        device, dtype = str(OmegaConf.select(cfg, "device") or "auto"), str(OmegaConf.select(cfg, "model.dtype"))
        if device.startswith(("cuda", "mps", "xpu")) or (device == "auto" and _no_cuda_without_torch() is None):
            return "estimated time: unknown (no cost table for accelerators yet; benchmarks/costs.py adds one)"
        if dtype == "auto":  # harness.job.models.resolve_dtype on a CPU
            dtype = "bfloat16" if native_bf16 else "float32"
        jobs = [job_of(c, TASK_SIZES) for c in configs]
        model = str(OmegaConf.select(cfg, "model.name"))
        keys = [machine_key(model, dtype, cpu_isa, cpu), machine_key(model, dtype, cpu_isa)] if cpu else \
            machine_key(model, dtype, cpu_isa)
        return estimate(jobs, njobs, keys)
    except Exception as e:
        return f"estimated time: unknown ({type(e).__name__}: {e})"
