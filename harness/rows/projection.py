"""Projected TPOT speedups: a decoder's per-step counters priced on another machine's bare forward costs.

The speed goals are measured on machines a session may not have (a CPU with bf16 units, a GPU). What a drafting
decoder does per step -- tokens verified, draft forwards, tokens fed to them, tokens accepted -- barely depends on
the machine or the dtype; what a forward costs does. This prices a decoder's per-step counters on the bare cost
curves another job measured (``target_cost_curve`` / ``draft_cost_curve`` of its rows, in units of the target's
one-token forward; docs/measurement.md, "In-situ step costs against the bare cost curve"):

* a decode step costs the target's forward of its tokens fed, plus each draft forward at the draft's curve for
  that step's mean tokens per draft forward; the curves are read through their running maximum (a 2-token point
  measured below the 1-token one is noise) and past their last point along its slope;
* the draft's prompt prefill (the first drafting step's first forward: the draft's view of the prompt and the
  pending token, :func:`~harness.rows.cell_figures.draft_prefill_tokens`) costs what the curve job's rows measured
  per token fed (``draft_prefill_s``; the curves stop at 64 tokens);
* with ``draft_vocab_size`` (a reduced draft head) every draft forward but the prefill (which computes one row of
  logits) is scaled by a factor (:data:`REDUCED_HEAD` by default: the 0.5B draft's LM head is 27.5 % of its
  weight bytes, a 32768-id head cuts 22 % of them; in situ on a bf16 Zen 5 a tree's draft forward went from 0.52
  to 0.40);
* vanilla costs one per token, so a sample's projection is ``(new tokens - 1) / its steps' cost``: the speedup of
  TPOT (time per output token after the first, the draft's prompt prefill included), vanilla's TPOT over the
  decoder's. It is compared with the measured TPOT ratio (the reports' ``decode_speedup`` also leaves the draft's
  prefill out, their ``speedup`` counts both prefills).

Host work and whatever a decoder adds to its forwards are left out, so this is a screening figure, never a
measured speedup (docs/measurement.md, "Projected speedups": how far measurement fell from it). The command line
is ``benchmarks/project_speedup.py``.
"""

from __future__ import annotations

import logging
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from harness.rows.cell_figures import cost_curve, draft_prefill_tokens, window_cut
from harness.rows.columns import PAIR_KEYS
from harness.rows.grouping import params_of
from harness.rows.results import read_results

#: Default cost of a reduced-head draft forward, as a fraction of the full head's (see the module docstring).
REDUCED_HEAD = 0.78
#: Decoder classes whose counters cannot be priced, and why.
NOT_PRICED = ("HFAssistedDecoder",)
NOT_PRICED_WHY = "transformers' assisted generation is not priced: its counters include its first, pre-TTFT step"
UNKNOWN_CUT_WHY = ("not priced: its rows have a draft window but no draft_window_cut (written before that column), so "
                   "its draft prefill is unknown")


class Refused(ValueError):
    """Input that cannot be priced: one line saying what to change."""


def not_priced(row: dict[str, Any]) -> bool:
    """A row of a decoder of :data:`NOT_PRICED` (rows without ``decoder_class``, older ones: by its name)."""
    cls = row.get("decoder_class")
    return cls in NOT_PRICED if cls else str(row.get("decoder", "")).startswith("hf_assisted")


def _num(v: Any) -> float:
    """``v`` as a finite float; 0.0 for a missing, unreadable or non-finite value."""
    try:
        v = float(v)
    except (TypeError, ValueError):
        return 0.0
    return v if math.isfinite(v) else 0.0


def read_rows(path: str, notes: list[str] | None = None) -> list[dict[str, Any]]:
    """The ``ok`` rows of a run's results.jsonl (or of a run folder holding one), read and checked by
    :func:`harness.rows.results.read_results`, as dicts without their missing values; how many rows of another
    status (errors, skips) were left out is appended to ``notes``.

    Raises:
        Refused: no such file, a file that cannot be read, a line ``read_results`` would leave out (not UTF-8, not
            JSON, not a valid result row: its warning says which), no ``ok`` row, or rows of a batched run (their
            forwards have another cost curve).
    """
    p = Path(path)
    if p.is_dir():
        p = p / "results.jsonl"
    if not p.is_file():
        runs = sorted(str(f.parent.name) for f in p.parent.glob("*/results.jsonl")) if p.parent.is_dir() else []
        raise Refused(f"{p}: no such file (give a run's results.jsonl or its folder"
                      + (f"; this folder holds runs: {', '.join(runs[:5])}{' ...' if len(runs) > 5 else ''})"
                         if runs else ")"))
    log = logging.getLogger(read_results.__module__)
    level = log.level
    log.setLevel(logging.ERROR)  # what it would warn of comes back as the refusal, not as a second line
    try:
        frame = read_results([p])
    except OSError as e:
        raise Refused(f"{p}: cannot be read ({e.strerror or e})") from None
    finally:
        log.setLevel(level)
    if frame.attrs["warnings"]:  # priced in part, a file would say less than it seems to: refused whole
        warning = frame.attrs["warnings"][0]
        raise Refused(warning.replace(" left out (", " unreadable (", 1) + ": the tool prices whole files only ("
                      + ("resume the run, which cuts a torn line off" if "torn" in warning
                         else "restore or re-run the file") + ")")
    rows = [{k: v for k, v in rec.items() if not (isinstance(v, float) and math.isnan(v))}
            for rec in frame.to_dict("records")]
    ok = [r for r in rows if r.get("status", "ok") == "ok"]
    if not ok:
        raise Refused(f"{path}: " + (f"no row with status ok ({len(rows)} of other statuses)" if rows
                                     else "no result row (an empty file)"))
    if len(ok) < len(rows) and notes is not None:
        n = len(rows) - len(ok)
        notes.append(f"{path}: {n} row{'s' if n > 1 else ''} of a status other than ok (errors, skips) left out")
    rows = ok
    if any(_num(r.get("batch_size")) > 1 for r in rows):
        raise Refused(f"{path}: rows of a batched run (batch_size > 1): their forwards have another cost curve")
    return rows


def envelope(points: Iterable[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """The points sorted by tokens, each cost raised to the highest at fewer tokens (a running maximum)."""
    out, top = [], 0.0
    for k, v in sorted(points):
        top = max(top, v)
        out.append((k, top))
    return tuple(out)


def curve_value(curve: Sequence[tuple[float, float]], k: float) -> float:
    """Linear between points; below the first point, its value; past the last one, along its last segment's slope
    (a prefill of hundreds of tokens needs the slope, where :func:`~harness.rows.cell_figures.curve_at` holds the
    end value).

    Raises:
        Refused: an empty curve (a job without a draft has no draft curve).
    """
    if not curve:
        raise Refused("the curve job's rows have no draft_cost_curve: take the curves from a job that ran a draft")
    if len(curve) < 2 or k <= curve[0][0]:
        return curve[0][1]
    for (k0, v0), (k1, v1) in zip(curve, curve[1:]):
        if k <= k1:
            return v0 + (v1 - v0) * (k - k0) / (k1 - k0)
    (k0, v0), (k1, v1) = curve[-2], curve[-1]
    return v1 + (v1 - v0) * (k - k1) / (k1 - k0)


@dataclass(frozen=True)
class Curves:
    """Bare forward costs of one job, in units of the target's one-token forward.

    Attributes:
        target: ``(k, cost)`` points of the target's forward of ``k`` tokens, running maximum applied.
        draft: the same for the draft model (empty when the job ran no draft).
        prefill_per_token: the draft's prompt prefill per token fed (median over the job's rows; 0 if none).
        unit_s: the target's one-token forward, seconds.
        cost_points: ``(k, target seconds, draft seconds)`` a cost-aware tree of the job measured, or ``()``.
        source: where they came from (the machine, the file).
        lifted: the points a later point's running maximum raised by more than 10 % (``"target 32: 1.65 ->
            2.69"``): a curve timed with noise, which the projection inherits.
    """

    target: tuple[tuple[float, float], ...]
    draft: tuple[tuple[float, float], ...]
    prefill_per_token: float
    unit_s: float
    cost_points: tuple[tuple[int, float, float], ...]
    source: str
    lifted: tuple[str, ...] = ()

    def target_cost(self, k: float) -> float:
        """The target's forward of ``k`` tokens, in target one-token forwards."""
        return curve_value(self.target, k)

    def draft_cost(self, k: float) -> float:
        """The draft's forward of ``k`` tokens, in target one-token forwards. Raises :class:`Refused` without a
        draft curve."""
        return curve_value(self.draft, k)


def _cost_points(rows: Sequence[dict[str, Any]]) -> tuple[tuple[int, float, float], ...]:
    """The first ``cost_points`` (``"k:target_ms/draft_ms,..."``) of two or more points a cost-aware tree recorded."""
    for r in rows:
        try:
            points = tuple((int(k), float(t) / 1e3, float(d) / 1e3) for k, td in
                           (p.split(":") for p in str(r.get("cost_points") or "").split(",") if p)
                           for t, d in [td.split("/")])
        except ValueError:
            continue
        if len(points) >= 2:
            return points
    return ()


def load_curves(rows: Sequence[dict[str, Any]], source: str) -> Curves:
    """The curves of the first of ``rows`` that has them (every row of a job carries the same ones); ``source``
    (the file they came from) names them in refusals and in :attr:`Curves.source`.

    Raises:
        Refused: no row with a ``target_cost_curve``, that row without a positive ``bare_token_s``, or a curve
            cost that is not a positive number.
    """
    row = next((r for r in rows if cost_curve(r.get("target_cost_curve"))), None)
    if row is None:
        raise Refused(f"{source}: no row has a target_cost_curve (rows of a job with a warm-up at batch size 1 have "
                      "one)")
    if not _num(row.get("bare_token_s")) > 0:
        raise Refused(f"{source}: the row with the curves has no positive bare_token_s (the curves' unit)")
    for column in ("target_cost_curve", "draft_cost_curve"):
        if any(not (math.isfinite(v) and v > 0) for _, v in cost_curve(row.get(column))):
            raise Refused(f"{source}: {column} holds a cost that is not a positive number: {row.get(column)}")
    per_token = [_num(r.get("draft_prefill_s")) / _num(r.get("bare_token_s")) / fed for r in rows
                 if _num(r.get("draft_prefill_s")) > 0 and _num(r.get("bare_token_s")) > 0
                 and (fed := draft_prefill_tokens(_num(r.get("prompt_tokens")),
                                                  window_cut(r.get("draft_window_cut"), r.get("decoder_params")))) > 1]
    raw = {m: cost_curve(row.get(f"{m}_cost_curve")) for m in ("target", "draft")}
    # a point above a later one by > 10 % (the 1-token point is the unit: points of 2-4 tokens timed below it lift
    # to it, which only makes short verifies a little dearer)
    lifted = tuple(f"{m} {k:g}: {v:.2f} -> {top:.2f}" for m, curve in raw.items()
                   for (k, v), (_, top) in zip(curve[1:], envelope(curve[1:])) if top > 1.1 * v)
    return Curves(envelope(raw["target"]), envelope(raw["draft"]),
                  statistics.median(per_token) if per_token else 0.0, _num(row["bare_token_s"]), _cost_points(rows),
                  f"{row.get('device_name', '?')} {row.get('dtype', '?')}, {source}", lifted)


@dataclass(frozen=True)
class Step:
    """One decode step's counters (a :class:`~decoders.types.StepRecord`'s, or a row's per-step means)."""

    target_tokens_fed: float
    draft_forwards: float = 0.0
    draft_tokens_fed: float = 0.0


def draft_cost(forwards: float, fed: float, curves: Curves, prefill: float = 0, reduced_head: float = 1.0) -> float:
    """Projected cost, in target one-token forwards, of ``forwards`` draft forwards feeding ``fed`` tokens: the
    first of them a prompt prefill of ``prefill`` tokens (0: none; at the full head's cost, one row of logits), the
    others at their mean tokens each, times ``reduced_head``."""
    cost = 0.0
    if prefill:
        cost, forwards, fed = curves.prefill_per_token * prefill, forwards - 1, fed - prefill
    if forwards > 0:
        cost += forwards * curves.draft_cost(max(1.0, fed / forwards)) * reduced_head
    return cost


def sample_cost(steps: Sequence[Step], curves: Curves, draft_prompt: float, reduced_head: float = 1.0) -> float:
    """Projected cost of a sample's decode steps (the target's prefill excluded), in target one-token forwards.

    Args:
        steps: the decode steps, first to last.
        curves: the machine's bare costs.
        draft_prompt: tokens of the draft's prefill forward (:func:`~harness.rows.cell_figures.draft_prefill_tokens`);
            the first step with draft forwards prefills them in its first forward when it fed that many.
        reduced_head: factor on every draft forward but the prefill (a reduced draft head), 1.0 for the full head.
    """
    total, prefilled = 0.0, False
    for s in steps:
        total += curves.target_cost(s.target_tokens_fed)
        if s.draft_forwards:
            prefill = draft_prompt if not prefilled and draft_prompt and s.draft_tokens_fed >= draft_prompt else 0
            prefilled = True
            total += draft_cost(s.draft_forwards, s.draft_tokens_fed, curves, prefill, reduced_head)
    return total


def project_rows(rows: Sequence[dict[str, Any]], curves: Curves, reduced_head: float) -> list[dict[str, Any]]:
    """Per decoder of a run: ``samples``, ``steps`` (decode steps), ``tokens_per_step``, ``draft_forwards_per_step``,
    ``projected`` (the mean projected TPOT speedup from each row's per-step means, its draft prefill taken out
    first: a mix of short and long steps is priced at its mean, which flatters prompt lookup) and ``measured`` (the
    mean of vanilla's TPOT over the decoder's, vanilla's row of the same run, task, sample, turn and repeat
    (:data:`~harness.rows.columns.PAIR_KEYS`); ``None`` unless every row has one); a decoder of :data:`NOT_PRICED`
    or without a decode step gets ``not_priced`` (a line saying so and why).

    Raises:
        Refused: no decoder could be priced.
    """
    key = lambda r: tuple(r.get(k) for k in PAIR_KEYS)  # noqa: E731
    vanilla = {key(r): r for r in rows if r.get("decoder") == "vanilla"}
    out = []
    for name in dict.fromkeys(r["decoder"] for r in rows):
        if any(not_priced(r) for r in rows if r["decoder"] == name):
            out.append({"decoder": name, "not_priced": NOT_PRICED_WHY})
            continue
        if any(math.isnan(window_cut(r.get("draft_window_cut"), r.get("decoder_params")))
               for r in rows if r["decoder"] == name):
            out.append({"decoder": name, "not_priced": UNKNOWN_CUT_WHY})
            continue
        measured, projected, tokens, steps, forwards_all = [], [], 0, 0, 0.0
        for r in (r for r in rows if r["decoder"] == name):
            n, k = int(_num(r.get("new_tokens"))) - 1, int(_num(r.get("num_steps"))) - 1
            if n < 1 or k < 1:
                continue
            forwards, fed = _num(r.get("draft_forwards_per_step")) * k, _num(r.get("draft_tokens_fed"))
            prompt = draft_prefill_tokens(_num(r.get("prompt_tokens")),
                                          window_cut(r.get("draft_window_cut"), r.get("decoder_params")))
            head = reduced_head if _num(params_of(r.get("decoder_params")).get("draft_vocab_size")) else 1.0
            cost = k * curves.target_cost(_num(r.get("target_tokens_fed_per_step")))
            if forwards:
                cost += draft_cost(forwards, fed, curves, prompt if fed >= prompt else 0, head)
            projected.append(n / cost)
            v = vanilla.get(key(r))
            if v and _num(r.get("tpot_s")) and _num(v.get("tpot_s")):
                measured.append(_num(v["tpot_s"]) / _num(r["tpot_s"]))
            tokens, steps, forwards_all = tokens + n, steps + k, forwards_all + forwards
        if projected:
            out.append({"decoder": name, "samples": len(projected), "steps": steps, "tokens_per_step": tokens / steps,
                        "draft_forwards_per_step": forwards_all / steps, "projected": statistics.mean(projected),
                        "measured": statistics.mean(measured) if len(measured) == len(projected) else None})
        else:
            out.append({"decoder": name, "not_priced": "not priced: no row with a decode step (new_tokens, num_steps)"})
    if not any("projected" in r for r in out):
        raise Refused("no row could be priced (rows need new_tokens, num_steps and the step counters)")
    return out
