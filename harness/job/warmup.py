"""Warm-up, excluded from timing (docs/measurement.md, "How cells are measured", *Warm-up*): before a job's first
timed cell every decoder makes ``runner.warmup`` untimed calls of ``runner.warmup_tokens`` tokens, made the way a
timed call is made (:func:`harness.job.cell.timed_generate`: the stopwatch's marks, the draft's prefill hooks), so
first forwards, models shared by several decoders and lazy set-up (caches, allocations) are paid before any clock
runs, not by whichever decoder's cell comes first.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Mapping

import torch

from harness.job.cell import timed_generate

log = logging.getLogger(__name__)
#: Samples whose first prompt :meth:`harness.job.runner.Runner._warm_all` tries per decoder before leaving its
#: warm-up to its first cell (a decoder every early prompt is too long for).
WARMUP_SEARCH = 8


class WarmUp:
    """The warm-up of one job (one :class:`harness.job.runner.Runner`): each decoder at most once.

    Args:
        calls: untimed calls per decoder (``runner.warmup``; 0 turns the warm-up off).
        tokens: new tokens per call (``runner.warmup_tokens``, at most the run's ``max_new_tokens``).
        generate_kwargs: returns the ``generate`` keyword arguments of one call (a fresh ``generator`` for sampled
            runs, nothing when greedy).
    """

    def __init__(self, calls: int, tokens: int, generate_kwargs: Callable[[], dict[str, Any]]):
        self.calls = calls
        self.tokens = tokens
        self._generate_kwargs = generate_kwargs
        self.warmed: set[str] = set()

    def decoder(self, name: str, decoder: Any, input_ids: torch.Tensor, draft: torch.nn.Module | None) -> None:
        """Warm ``decoder`` (called ``name``) on ``input_ids`` ((1, prompt_len) int64, a prompt it can run) unless
        it is warm already; ``draft`` is the draft model when the decoder runs it. Then resets the decoder's
        cross-sample state (n-gram pools): the warm-up must not seed it. Errors of the decoder propagate."""
        if name in self.warmed:
            return
        for _ in range(self.calls):
            timed_generate(decoder, input_ids, self.tokens, draft, **self._generate_kwargs())
        if self.calls and hasattr(decoder, "reset"):
            decoder.reset()  # warm-up must not seed cross-sample state (n-gram pools)
        self.warmed.add(name)
        log.debug("warmed up %s", name)

    def every(self, decoders: Mapping[str, Any], prompts: Iterable[tuple[str, torch.Tensor | None]],
              runnable: Callable[[str, str, torch.Tensor], bool], draft: Callable[[str], Any]) -> None:
        """Warm every decoder of ``decoders`` (name -> decoder) not warm yet on the first of ``prompts`` (rendered
        text, its ids or ``None`` for an empty text) that ``runnable(name, text, ids)`` accepts; ``draft(name)``
        is the draft model the decoder runs, or ``None``. A decoder whose warm-up raises is left to its first
        cell, which runs (and records) it again; one without a runnable prompt here is warmed before its first
        cell. Stops reading ``prompts`` once every decoder is warm."""
        pending = [n for n in decoders if n not in self.warmed]
        if not pending:
            return
        for text, input_ids in prompts:
            for name in list(pending):
                if input_ids is None or not runnable(name, text, input_ids):
                    continue
                pending.remove(name)
                try:
                    self.decoder(name, decoders[name], input_ids, draft(name))
                except Exception as e:  # noqa: BLE001 -- the decoder's first cell runs (and records) it again
                    log.warning("warm-up of %s failed (%s: %s); its first cell will say why", name,
                                type(e).__name__, e)
            if not pending:
                return
