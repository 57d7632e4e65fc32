"""The runner's stopwatch: the one place that reads clocks around a decoder (docs/measurement.md, "Metric definitions").

:class:`Stopwatch` implements the :class:`decoders.types.Stopwatch` hook that ``generate`` receives: decoders mark
the first new token (``first_token``) and, optionally, phase boundaries (``lap``); the stopwatch synchronizes the
device at each mark, times the draft model's prompt prefill with forward hooks, and turns the marks into result
columns (:meth:`Stopwatch.columns`).
"""

from __future__ import annotations

import os
import resource
import sys
import time
from contextlib import contextmanager
from typing import Any, Iterator

import torch


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA is asynchronous; CPU work is not)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Stopwatch:
    """Wall-clock marks of one ``generate`` call: start, first token, phases, the draft model's prefill, stop
    (``time.perf_counter``, the device synchronized at each reading).

    Args:
        device: the device whose queued work is awaited before each reading.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.t0 = self.last = 0.0
        self.first_token_s: float | None = None
        self.first_tokens = 1
        self.wall_s: float | None = None
        self.phases: dict[str, float] = {}
        self.draft_prefill: tuple[float, float] | None = None  # (start, end) seconds after start()

    def _now(self) -> float:
        sync(self.device)
        return time.perf_counter()

    def start(self) -> None:
        self.t0 = self.last = self._now()

    def first_token(self, tokens: int = 1) -> None:
        """Record the time to the first new token and how many tokens it brought (the first call only)."""
        if self.first_token_s is None:
            self.first_token_s = self._now() - self.t0
            self.first_tokens = max(1, int(tokens))

    def lap(self, phase: str) -> None:
        """Charge the time since the previous mark to ``phase``."""
        now = self._now()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - self.last
        self.last = now

    def mark(self, phase: str) -> None:
        """Ignored: fine-grained host phases are for the profiler (:mod:`harness.job.overhead`); a timed run reads
        no clock and synchronizes nothing for them."""

    @contextmanager
    def timing_draft_prefill(self, draft: torch.nn.Module | None) -> Iterator[None]:
        """Time the draft model's first forward of the call (its prompt prefill, in every decoder that runs a
        draft) with forward hooks on ``draft`` and on its base model (a reduced-vocabulary head calls that one
        directly); nested calls count once. Later forwards cost one attribute test. ``None``: nothing."""
        if draft is None:
            yield
            return
        modules = [draft]
        base = draft.get_decoder() if hasattr(draft, "get_decoder") else None
        if isinstance(base, torch.nn.Module) and base is not draft:
            modules.append(base)
        depth, start = 0, 0.0

        def pre(module: Any, args: Any) -> None:
            nonlocal depth, start
            if self.draft_prefill is None:
                if depth == 0:
                    start = self._now() - self.t0
                depth += 1

        def post(module: Any, args: Any, output: Any) -> None:
            nonlocal depth
            if self.draft_prefill is None and depth:
                depth -= 1
                if depth == 0:
                    self.draft_prefill = (start, self._now() - self.t0)

        handles = [h for m in modules for h in (m.register_forward_pre_hook(pre), m.register_forward_hook(post))]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def elapsed(self) -> float:
        """Seconds since :meth:`start` (the device synchronized): when one request of a batch ends."""
        return self._now() - self.t0

    def stop(self) -> float:
        """Stop; returns the wall seconds since :meth:`start`."""
        self.wall_s = self._now() - self.t0
        return self.wall_s

    def columns(self, new_tokens: int, end_s: float | None = None) -> dict[str, Any]:
        """Result columns (seconds; ``None`` where undefined, e.g. a single new token), for the call or, with
        ``end_s`` (seconds after :meth:`start`), for one request of a batch that ended then:

        * ``ttft_s``: time to the first new token, as a user sees it;
        * ``tpot_s``: time per output token after the first, ``(wall - ttft) / (new_tokens - 1)`` (the serving
          benchmarks' TPOT);
        * ``draft_prefill_s``: the draft model's first forward (its prompt prefill); ``None`` without a draft;
        * ``prefill_s``: the time on the prefill side, the same for every decoder: up to the first token plus
          the draft's prefill where a decoder runs it after the first token (this project's decoders do;
          transformers' assisted generation drafts before its first target forward, so it is inside ``ttft_s``);
        * ``first_tokens``: new tokens known at the first token (assisted generation's first verification
          emits several);
        * ``decode_tokens_per_s``: ``(new_tokens - first_tokens) / (wall - prefill_s)``, tokens/s after both
          prefills: like with like across decoders;
        * one ``<phase>_time_s`` per lapped phase.
        """
        ttft, wall = self.first_token_s, self.wall_s if end_s is None else end_s
        dp = self.draft_prefill
        draft_prefill = dp[1] - dp[0] if dp else None
        prefill = ttft
        if ttft is not None and dp is not None and dp[0] >= ttft:
            prefill = ttft + draft_prefill
        rest = new_tokens - self.first_tokens
        decode = rest / (wall - prefill) if prefill is not None and wall and rest > 0 and wall > prefill else None
        tpot = (wall - ttft) / (new_tokens - 1) if ttft is not None and wall and new_tokens > 1 and wall > ttft \
            else None
        return {"ttft_s": ttft, "tpot_s": tpot, "prefill_s": prefill, "draft_prefill_s": draft_prefill,
                "first_tokens": self.first_tokens if ttft is not None else None, "decode_tokens_per_s": decode,
                **{f"{p}_time_s": t for p, t in self.phases.items()}}


def sched_clock() -> tuple[float, float | None]:
    """The process's clocks that tell waiting for a CPU from computing, in seconds: ``(cpu, run_delay)``.

    ``cpu``: CPU time of the process, all threads, user + system (:func:`time.process_time`). ``run_delay``: time
    its threads spent runnable but waiting on a run queue, summed over threads (Linux: field 2 of
    ``/proc/self/task/<tid>/schedstat``, ns), ``None`` where the OS does not expose it. Only differences of two
    readings in one process mean something; a reading costs ~40 us (outside any timed window). A kernel that
    keeps no such statistics (no file, or zero time on a CPU for every thread) gives ``None``, never 0.
    """
    cpu = time.process_time()
    on_cpu = delay = 0
    try:
        with os.scandir("/proc/self/task") as tasks:
            for task in tasks:
                try:
                    with open(f"/proc/self/task/{task.name}/schedstat", "rb") as f:
                        fields = f.read().split()
                    on_cpu, delay = on_cpu + int(fields[0]), delay + int(fields[1])
                except (OSError, IndexError, ValueError):  # a thread that ended meanwhile
                    continue
    except OSError:
        return cpu, None
    return cpu, (delay / 1e9 if on_cpu > 0 else None)


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory in MiB: on CUDA the most allocated by torch since :func:`reset_peak_memory` (one call, so
    per row); elsewhere the process's peak resident set size (its high-water mark since the process started:
    the weights dominate it, and it never falls)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2 ** 20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2 ** 20 if sys.platform == "darwin" else peak / 2 ** 10  # bytes on macOS, KiB on Linux


def reset_peak_memory(device: torch.device) -> None:
    """Start a new CUDA peak-memory window (nothing to do for the process RSS)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
