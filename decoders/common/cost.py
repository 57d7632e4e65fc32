"""Measured forward costs of the models in use, for decoders that size their drafts by hardware cost.

A target forward over ``k`` new tokens costs about one token's forward on a GPU (or a CPU with bf16 units) up to
some ``k``, and ``k`` times more where the matrix units are missing (float32 or emulated bf16 on a CPU). A
cost-aware draft tree (Sequoia, arXiv 2402.12374; the cost-aware option of :mod:`decoders.opt_tree`) needs the
curve of the machine it runs on: :meth:`ForwardCost.measure` times a few points once, at construction, before any
timed cell, and the decoder records them in its rows (:meth:`ForwardCost.describe`).

This is the only place in ``decoders/`` that reads a clock; it never runs inside a timed ``generate``.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from decoders.common.forward import forward, new_cache
from decoders.common.kv_cache import crop

#: Context length behind the measured forwards (tokens), and the token counts measured.
CONTEXT = 128
POINTS = (1, 2, 4, 8, 16, 32, 64, 128)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def batch_cost_curve(model: PreTrainedModel, rows: int, sizes: list[int], repeats: int = 3,
                     context: torch.Tensor | None = None, enough_s: float | None = None) -> dict[int, float]:
    """``{k: median seconds of one forward of k tokens in each of rows rows}`` after a cached context (the same in
    every row; no padding): the bare cost of a batched step, ``rows x k`` tokens. The context is prefilled once and
    each timed forward cropped off again; one warm-up call per size, device synchronized.

    Args:
        model: a causal LM whose cache can be cropped.
        rows: the batch size (>= 1).
        sizes: tokens per row of the timed forwards.
        repeats: timed calls per size at most (the median is returned).
        context: ``(1, n)`` token ids (a real prompt); default :data:`CONTEXT` synthetic ids.
        enough_s: stop timing a size once its timed calls took this many seconds in all (at least one call):
            calls of a second or more are long against the timer and scheduling jitter that repeats average
            out, and the 1.5B target's float32 64-token forward takes ~4 s on a 2-core CPU. None: every repeat.
    """
    device = model.get_input_embeddings().weight.device
    if context is None:
        context = (torch.arange(CONTEXT, device=device).remainder(1000) + 10).unsqueeze(0)
    context = context.repeat(rows, 1)
    cache = new_cache(model)
    forward(model, context, cache, logits_to_keep=1)
    n = context.shape[1]
    curve = {}
    for k in sizes:
        ids = context[:, -1:].repeat(1, k)
        times = []
        for _ in range(repeats + 1):  # the first is a warm-up
            _sync(device)
            start = time.perf_counter()
            forward(model, ids, cache)
            _sync(device)
            times.append(time.perf_counter() - start)
            crop(cache, n)
            if enough_s is not None and len(times) > 1 and sum(times[1:]) >= enough_s:
                break
        curve[k] = sorted(times[1:])[len(times[1:]) // 2]
    return curve


def curve_text(curve: dict[int, float], unit: float) -> str:
    """A timed curve (``{k: seconds}``) as the rows record it: ``"k:ratio,..."``, each time in multiples of ``unit``
    seconds (``harness.rows.cell_figures.cost_curve`` reads it back)."""
    return ",".join(f"{k}:{t / unit:.3f}" for k, t in curve.items())


def forward_cost_curve(model: PreTrainedModel, sizes: list[int], repeats: int = 3,
                       context: torch.Tensor | None = None) -> dict[int, float]:
    """``{k: median seconds of one k-token forward}`` for each ``k`` in ``sizes``, after a cached ``(1, n)`` context
    (default :data:`CONTEXT` synthetic ids): :func:`batch_cost_curve` at one row."""
    return batch_cost_curve(model, 1, sizes, repeats, context)


@dataclass(frozen=True)
class ForwardCost:
    """Seconds of a target forward over ``k`` tokens and of a draft forward over ``m`` tokens, by linear
    interpolation between measured points (flat beyond the last one's slope).

    Attributes:
        points: the token counts measured.
        target_s: target forward seconds at each point.
        draft_s: draft forward seconds at each point.
    """

    points: tuple[int, ...]
    target_s: tuple[float, ...]
    draft_s: tuple[float, ...]

    @classmethod
    def measure(cls, target: PreTrainedModel, draft: PreTrainedModel, max_tokens: int, repeats: int = 3
                ) -> "ForwardCost":
        """Time both models at :data:`POINTS` up to ``max_tokens`` (at least two points), each after one prefill of
        :data:`CONTEXT` synthetic ids that every timed forward is cropped back to (:func:`forward_cost_curve`).

        Raises:
            ValueError: if ``max_tokens < 1``.
        """
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        points = tuple(p for p in POINTS if p <= max(2, max_tokens))
        if points[-1] < max_tokens:
            points += (max_tokens,)
        target_s = forward_cost_curve(target, list(points), repeats)
        draft_s = forward_cost_curve(draft, list(points), repeats)
        return cls(points, tuple(target_s[k] for k in points), tuple(draft_s[k] for k in points))

    @staticmethod
    def _interp(points: tuple[int, ...], values: tuple[float, ...], k: float) -> float:
        i = min(max(bisect_left(points, k), 1), len(points) - 1)
        x0, x1, y0, y1 = points[i - 1], points[i], values[i - 1], values[i]
        return y0 + (y1 - y0) * (k - x0) / (x1 - x0)

    def target_time(self, k: int) -> float:
        """Seconds of a target forward over ``k >= 1`` tokens."""
        return self._interp(self.points, self.target_s, k)

    def draft_time(self, m: int) -> float:
        """Seconds of a draft forward over ``m >= 1`` tokens."""
        return self._interp(self.points, self.draft_s, m)

    def describe(self) -> str:
        """``"k:target_ms/draft_ms,..."``, for a result row."""
        return ",".join(f"{k}:{t * 1e3:.2f}/{d * 1e3:.2f}" for k, t, d in zip(self.points, self.target_s, self.draft_s))
