"""Host overhead per decode step: the Python work between model forwards, split by phase.

On a GPU a 1.5B target forward at batch 1 takes a few milliseconds, so host work between forwards (pool
look-ups, tree and mask building, ``.tolist()`` syncs, bookkeeping) can eat a decoder's whole speedup while it
is invisible next to a 200 ms CPU forward. This module measures it on any device:

* :class:`ForwardTimer` times every forward of the given models through PyTorch's public module hooks
  (``register_forward_pre_hook`` / ``register_forward_hook``), synchronizing the device at both ends, so the
  model time (transformers' own Python included) is known exactly;
* :class:`PhaseProfiler` is a :class:`decoders.types.Stopwatch` that records the decoders' fine-grained
  ``mark(phase)`` calls (the runner's stopwatch ignores them) and, per phase, splits the elapsed time into
  model-forward time and host time;
* :func:`profile` decodes prompts under the profiler (one :class:`Run` each) and :func:`summarize` takes the
  medians per decode step (:class:`Overhead`).

Host time = wall time after the first new token minus the synchronized forward time in the same span, divided
by the decode steps (target forwards after the prefill). Phases (the names the decoders mark):
``propose`` (the proposer: draft forwards subtracted), ``inputs`` (ids, tree mask, position ids), ``forward``
(around the target forward: position ids and the LM-head rows; the model call itself subtracted), ``rule``
(the verification rule), ``cache`` (KV compaction), ``update`` (the proposer's update: pools, draft cache,
window), ``bookkeeping`` (step records, counters), and ``other`` (time no mark covers: the end of a sample;
for decoders that mark nothing, e.g. transformers' ``generate``, everything).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import torch

from harness.job.timing import sync

#: Host phases in the order a step runs them (see the module docstring).
PHASES = ("propose", "inputs", "forward", "rule", "cache", "update", "bookkeeping", "other")


class ForwardTimer:
    """Synchronized wall time of every forward of ``models`` (public module hooks; nothing is patched).

    Args:
        models: the causal LMs to time (the same module twice is timed once); calls of their base models
            (``get_decoder()``) count too, a call nested in a timed call once.
        device: the device synchronized before each reading.

    Use as a context manager; the hooks are removed on exit.
    """

    def __init__(self, models: Iterable[torch.nn.Module], device: torch.device):
        self.device = device
        self.total_s = 0.0
        self.calls = 0
        self._t0 = 0.0
        self._depth = 0  # nested timed modules (a causal LM calling its base model): only the outermost counts
        self._handles: list[Any] = []
        # A causal LM and its base model: decoders with their own LM head (a reduced draft vocabulary) call the
        # base model directly.
        modules = [x for m in models if m is not None
                   for x in (m, m.get_decoder() if hasattr(m, "get_decoder") else None) if x is not None]
        self._models = list({id(m): m for m in modules}.values())

    def _pre(self, module: torch.nn.Module, args: Any, kwargs: Any = None) -> None:
        if self._depth == 0:
            sync(self.device)
            self._t0 = time.perf_counter()
        self._depth += 1

    def _post(self, module: torch.nn.Module, args: Any, *rest: Any) -> None:
        self._depth -= 1
        if self._depth == 0:
            sync(self.device)
            self.total_s += time.perf_counter() - self._t0
            self.calls += 1

    def __enter__(self) -> "ForwardTimer":
        for m in self._models:
            self._handles += [m.register_forward_pre_hook(self._pre), m.register_forward_hook(self._post)]
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


class PhaseProfiler:
    """A :class:`decoders.types.Stopwatch` that splits each interval between marks into forward and host time.

    Only the time after ``first_token()`` (the prefill excluded) is counted; each ``mark`` closes an interval.

    Args:
        timer: the :class:`ForwardTimer` active around the decoder's models.
    """

    def __init__(self, timer: ForwardTimer):
        self.timer = timer
        self.host_s: dict[str, float] = {}
        self.forward_s = 0.0
        self._started = False
        self._last_t = 0.0
        self._last_fwd = 0.0

    def _now(self) -> tuple[float, float]:
        sync(self.timer.device)
        return time.perf_counter(), self.timer.total_s

    def first_token(self, tokens: int = 1) -> None:
        if not self._started:
            self._started = True
            self._last_t, self._last_fwd = self._now()

    def mark(self, phase: str) -> None:
        if not self._started:
            return
        t, fwd = self._now()
        spent_fwd = fwd - self._last_fwd
        self.forward_s += spent_fwd
        self.host_s[phase] = self.host_s.get(phase, 0.0) + (t - self._last_t) - spent_fwd
        self._last_t, self._last_fwd = t, fwd

    def lap(self, phase: str) -> None:
        """Nothing: the decoders mark every host phase right before their coarse laps (``draft``, ``verify``),
        so the time since the last mark goes to the next one."""

    def stop(self) -> None:
        """Close the last interval (charged to ``other``)."""
        self.mark("other")


@dataclass(frozen=True)
class Run:
    """One profiled decode: per-decode-step milliseconds (host total, forward, host per phase), decode steps,
    new tokens."""

    host_ms: float
    forward_ms: float
    phases_ms: dict[str, float]
    steps: int
    new_tokens: int


@dataclass
class Overhead:
    """Host overhead of one decoder over some decodes (medians over the runs, per decode step).

    Attributes:
        host_ms: host milliseconds per decode step (all phases).
        forward_ms: synchronized model-forward milliseconds per decode step (target and draft).
        phases_ms: host milliseconds per decode step, per phase of :data:`PHASES` (those seen).
        steps: decode steps (target forwards after the prefill) per run, median.
        tokens_per_step: new tokens per target forward (prefill excluded), median.
        runs: decodes measured.
    """

    host_ms: float
    forward_ms: float
    phases_ms: dict[str, float] = field(default_factory=dict)
    steps: float = 0.0
    tokens_per_step: float = 0.0
    runs: int = 0


def profile(decoder: Any, prompts: Sequence[torch.Tensor], max_new_tokens: int, timer: ForwardTimer) -> list[Run]:
    """Decode each prompt once under a :class:`PhaseProfiler`; decodes without a decode step are skipped.

    Args:
        decoder: anything with ``generate(input_ids, max_new_tokens, stopwatch=...)``.
        prompts: ``torch.LongTensor`` of shape ``(1, prompt_len)`` each, on the models' device.
        max_new_tokens: token budget per decode.
        timer: an active :class:`ForwardTimer` over the decoder's target and draft models.
    """
    out = []
    for ids in prompts:
        prof = PhaseProfiler(timer)
        res = decoder.generate(ids, max_new_tokens, stopwatch=prof)
        prof.stop()
        steps = len(res.steps) - 1
        if steps >= 1:
            out.append(Run(sum(prof.host_s.values()) / steps * 1e3, prof.forward_s / steps * 1e3,
                           {p: s / steps * 1e3 for p, s in prof.host_s.items()}, steps, len(res.token_ids)))
    return out


def summarize(runs: Sequence[Run]) -> Overhead:
    """Medians over ``runs``.

    Raises:
        ValueError: with no runs (every decode ended at its first token).
    """
    if not runs:
        raise ValueError("no decode step was measured (every decode ended at its first token)")
    med = statistics.median
    phases = sorted({p for r in runs for p in r.phases_ms}, key=lambda p: PHASES.index(p) if p in PHASES else 99)
    return Overhead(
        host_ms=med(r.host_ms for r in runs),
        forward_ms=med(r.forward_ms for r in runs),
        phases_ms={p: med(r.phases_ms.get(p, 0.0) for r in runs) for p in phases},
        steps=med(r.steps for r in runs),
        tokens_per_step=med((r.new_tokens - 1) / r.steps for r in runs),
        runs=len(runs),
    )
