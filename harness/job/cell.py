"""One measured cell: the timed ``generate`` call (:func:`timed_generate`: the runner's stopwatch, the draft's
prefill, peak memory, the contention it met: CPU time and run-queue wait), the machine load around it, the
comparison with vanilla's tokens (:func:`first_divergence`) and the finished row (:func:`cell_row`). The columns
are declared in :mod:`harness.rows.columns`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from decoders.types import DecodeResult
from harness.job.timing import Stopwatch, peak_memory_mb, reset_peak_memory, sched_clock


def first_divergence(a: tuple[int, ...] | list[int], b: tuple[int, ...] | list[int]) -> int | None:
    """Index of the first differing token of two whole sequences (a length difference counts), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def timed_generate(decoder: Any, input_ids: torch.Tensor, max_new_tokens: int,
                   draft: torch.nn.Module | None = None,
                   **generate_kwargs: Any) -> tuple[DecodeResult, float, dict[str, Any]]:
    """Run ``decoder.generate`` with the runner's stopwatch (device synchronized at each mark); return the result,
    wall seconds and the measured columns (:meth:`harness.job.timing.Stopwatch.columns`: ``ttft_s``, ``tpot_s``,
    ``prefill_s``, ``draft_prefill_s``, ``decode_tokens_per_s``, phase times; ``peak_memory_mb``; and
    :func:`contention_columns` of the call: ``cpu_time_s``, ``run_delay_s``).

    Args:
        draft: the draft model when the decoder runs it (its prompt prefill is timed), else ``None``.
        generate_kwargs: passed through (e.g. ``generator`` for sampled runs).
    """
    watch = Stopwatch(input_ids.device)
    reset_peak_memory(input_ids.device)
    with watch.timing_draft_prefill(draft):
        before = sched_clock()
        watch.start()
        result = decoder.generate(input_ids, max_new_tokens, stopwatch=watch, **generate_kwargs)
        wall = watch.stop()
        after = sched_clock()
    return result, wall, {**watch.columns(result.new_tokens), "peak_memory_mb": peak_memory_mb(input_ids.device),
                          **contention_columns(before, after)}


def timed_generate_batch(decoder: Any, input_ids: list[torch.Tensor], max_new_tokens: int,
                         draft: torch.nn.Module | None = None, generators: list[torch.Generator] | None = None
                         ) -> tuple[list[DecodeResult], float, list[dict[str, Any]]]:
    """Run ``decoder.generate_batch`` on a static batch with one stopwatch; return the results, the batch's wall
    seconds and, per row, the measured columns: :meth:`harness.job.timing.Stopwatch.columns` up to the moment the
    row's last token was known (``latency_s``; ``ttft_s`` is the batched prefill's, the same for every row), the
    batch's throughput ``batch_tokens_per_s`` and ``batch_rows``, ``peak_memory_mb`` and :func:`contention_columns`
    of the whole call.

    Args:
        input_ids: the batch's prompts, each ``(1, prompt_len)`` int64 on the device.
        draft: the draft model when the decoder runs it (its prefill is timed), else ``None``.
        generators: sampled runs: one generator per row.
    """
    device = input_ids[0].device
    watch = Stopwatch(device)
    reset_peak_memory(device)
    ends: dict[int, float] = {}
    kwargs = {} if generators is None else {"generators": generators}
    with watch.timing_draft_prefill(draft):
        before = sched_clock()
        watch.start()
        results = decoder.generate_batch(input_ids, max_new_tokens, stopwatch=watch,
                                         finished=lambda row: ends.setdefault(row, watch.elapsed()), **kwargs)
        wall = watch.stop()
        after = sched_clock()
    shared = {"batch_rows": len(results), "batch_tokens_per_s": sum(r.new_tokens for r in results) / wall,
              "peak_memory_mb": peak_memory_mb(device), **contention_columns(before, after)}
    return results, wall, [{**watch.columns(r.new_tokens, ends.get(i, wall)), "latency_s": ends.get(i, wall),
                            **shared} for i, r in enumerate(results)]


def contention_columns(before: tuple[float, float | None], after: tuple[float, float | None]) -> dict[str, Any]:
    """``{"cpu_time_s", "run_delay_s"}`` between two :func:`harness.job.timing.sched_clock` readings around a timed
    call: CPU seconds the process used, and seconds its threads waited for a CPU (``None`` where not exposed).
    ``run_delay_s / wall_time_s`` is the contention the call met, measured rather than inferred from a load
    average (which lags by a minute): the regression gate judges speed only on calls that barely waited."""
    delay = None if before[1] is None or after[1] is None else max(0.0, after[1] - before[1])
    return {"cpu_time_s": max(0.0, after[0] - before[0]), "run_delay_s": delay}


def load_1m() -> float | None:
    """The 1-minute load average (``None`` where the OS has none)."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return None


@dataclass
class Cell:
    """A measured cell waiting for its row to be written."""

    row: dict[str, Any]
    result: DecodeResult
    wall: float
    completion: str
    measured: dict[str, Any]  # machine load around the call and the stopwatch's columns


def cell_row(cell: Cell, ref: tuple[int, ...] | None, greedy: bool, cross_process: bool,
             scores: Mapping[str, Any]) -> dict[str, Any]:
    """The ``ok`` row of a measured cell.

    Args:
        cell: the cell (its base row, result, wall seconds, completion and measured columns).
        ref: vanilla's token ids on the same sample and turn, or ``None`` (vanilla gave no output).
        greedy: a greedy run (a sampled run is compared in distribution by the tests, never token by token).
        cross_process: the vanilla row it pairs with was written by another process (a resumed run).
        scores: the task's quality columns of the completion.
    """
    result = cell.result
    ids = tuple(result.token_ids)
    compared = ref is not None and greedy
    return {
        **cell.row,
        **result.summary(),
        "wall_time_s": cell.wall,
        "tokens_per_s": result.new_tokens / cell.wall if cell.wall > 0 else None,
        "matches_vanilla": ids == ref if compared else None,
        # a greedy row without vanilla's answer to compare with makes no equality claim
        "equality_check": ("exact" if ref is not None else None) if greedy else "n/a (sampled)",
        "first_divergence": first_divergence(ids, ref) if compared else None,
        "paired_across_processes": cross_process,
        **cell.measured,
        **scores,
        "status": "ok",
        "completion": cell.completion,
        "token_ids": list(ids),
    }
