"""The runner's stopwatch: the one place that reads clocks around a decoder (DESIGN.md 2b).

:class:`Stopwatch` implements the :class:`decoders.types.Stopwatch` hook that ``generate`` receives: decoders mark
the first new token (``first_token``) and, optionally, phase boundaries (``lap``); the stopwatch synchronizes the
device at each mark and turns the marks into result columns (:meth:`Stopwatch.columns`).
"""

from __future__ import annotations

import time
from typing import Any

import torch


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA is asynchronous; CPU work is not)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Stopwatch:
    """Wall-clock marks of one ``generate`` call: start, first token, phases, stop (``time.perf_counter``).

    Args:
        device: the device whose queued work is awaited before each reading.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.t0 = self.last = 0.0
        self.first_token_s: float | None = None
        self.wall_s: float | None = None
        self.phases: dict[str, float] = {}

    def _now(self) -> float:
        sync(self.device)
        return time.perf_counter()

    def start(self) -> None:
        self.t0 = self.last = self._now()

    def first_token(self) -> None:
        """Record the time to the first new token (the first call only)."""
        if self.first_token_s is None:
            self.first_token_s = self._now() - self.t0

    def lap(self, phase: str) -> None:
        """Charge the time since the previous mark to ``phase``."""
        now = self._now()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - self.last
        self.last = now

    def mark(self, phase: str) -> None:
        """Ignored: fine-grained host phases are for the profiler (:mod:`harness.overhead`); a timed run reads
        no clock and synchronizes nothing for them."""

    def stop(self) -> float:
        """Stop; returns the wall seconds since :meth:`start`."""
        self.wall_s = self._now() - self.t0
        return self.wall_s

    def columns(self, new_tokens: int) -> dict[str, Any]:
        """Result columns: ``ttft_s`` (seconds to the first new token), ``decode_tokens_per_s`` (new tokens after
        the first / seconds after the first; ``None`` with a single new token or no first-token mark) and one
        ``<phase>_time_s`` per lapped phase."""
        ttft, wall = self.first_token_s, self.wall_s
        decode = (new_tokens - 1) / (wall - ttft) if ttft is not None and wall and new_tokens > 1 and wall > ttft \
            else None
        return {"ttft_s": ttft, "decode_tokens_per_s": decode, **{f"{p}_time_s": t for p, t in self.phases.items()}}
