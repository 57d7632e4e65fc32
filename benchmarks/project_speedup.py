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
  pending token) costs what the curve job's rows measured per token fed (``draft_prefill_s``; the curves stop at
  64 tokens);
* with ``draft_vocab_size`` (a reduced draft head) every draft forward but the prefill (which computes one row of
  logits) is scaled by ``--reduced-head`` (default 0.78: the 0.5B draft's LM head is 27.5 % of its weight bytes, a
  32768-id head cuts 22 % of them; in situ on a bf16 Zen 5 a tree's draft forward went from 0.52 to 0.40);
* vanilla costs one per token, so a sample's projection is ``(new tokens - 1) / its steps' cost``: the speedup of
  TPOT (time per output token after the first, the draft's prompt prefill included), vanilla's TPOT over the
  decoder's; the table gives the mean over samples. It is compared with the measured TPOT ratio (the reports'
  ``decode_speedup`` also leaves the draft's prefill out, their ``speedup`` counts both prefills).

Host work and whatever a decoder adds to its forwards are left out, so this is a screening figure, never a
measured speedup: it says which grid points are worth a timed run on the machine that counts, not whether a goal
is met. Checked against measurement (``rows`` mode, each race's rows priced on its own curves,
``results/reference/heldout_rerun_bf16_zen4``): held-out HumanEval measured 0.92-0.99 of the projection per
decoder; held-out MBPP 0.98-1.16. A projection inherits its curve's timing noise: on noisy curves (a point more
than 10 % below an earlier one, which the table notes) committed jobs were measured at 0.8x-2.2x their
projections (docs/measurement.md, "Projected speedups"). Rows of batched runs are refused.

Two modes::

    # a run's rows, priced from their per-row counters (aggregates: a mix of short and long steps is priced at
    # its mean, which flatters prompt lookup); transformers' assisted generation is not priced (its counters
    # include its first, pre-TTFT step)
    .venv/bin/python benchmarks/project_speedup.py --curves CURVE_ROWS.jsonl rows RUN/results.jsonl

    # decode here (any machine, any dtype) and price every step's counters
    .venv/bin/python benchmarks/project_speedup.py --curves CURVE_ROWS.jsonl decode --model qwen2.5-coder-1.5b \\
        --dtype float32 --task humaneval --offset 0 --limit 5 --max-new-tokens 128 \\
        opt_tree_cost_hybrid:num_nodes=32 opt_tree_cost_hybrid:num_nodes=32,draft_vocab_size=32768

A decoder is a ``conf/decoder`` name, optionally ``:key=value,...`` overrides. A cost-aware tree sizes its trees by
forward costs; in ``decode`` mode it is given the curve job's costs instead of measuring this machine's: the cost
points a cost-aware tree of that job recorded (``cost_points``) where its rows have one, else the bare curves; so
it draws about the trees it drew there. Bad input is refused in one line (exit 2) before any model loads.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: Default cost of a reduced-head draft forward, as a fraction of the full head's (see the module docstring).
REDUCED_HEAD = 0.78
#: Decoder classes whose counters this cannot price (transformers' assisted generation: see the module docstring).
NOT_PRICED = ("HFAssistedDecoder",)


def _not_priced(row: dict[str, Any]) -> bool:
    """A row of a decoder of :data:`NOT_PRICED` (rows without ``decoder_class``, older ones: by its name)."""
    cls = row.get("decoder_class")
    return cls in NOT_PRICED if cls else str(row.get("decoder", "")).startswith("hf_assisted")


class Refused(ValueError):
    """Bad input: one line for the user, exit status 2."""


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
        return _at(self.target, k)

    def draft_cost(self, k: float) -> float:
        """The draft's forward of ``k`` tokens, in target one-token forwards. Raises :class:`Refused` without a
        draft curve."""
        return _at(self.draft, k)


def _envelope(points: Iterable[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    out, top = [], 0.0
    for k, v in sorted(points):
        top = max(top, v)
        out.append((k, top))
    return tuple(out)


def _at(curve: Sequence[tuple[float, float]], k: float) -> float:
    """Linear between points; past the last one, along its last segment's slope."""
    if not curve:
        raise Refused("the curve job's rows have no draft_cost_curve: take the curves from a job that ran a draft")
    if len(curve) < 2 or k <= curve[0][0]:
        return curve[0][1]
    for (k0, v0), (k1, v1) in zip(curve, curve[1:]):
        if k <= k1:
            return v0 + (v1 - v0) * (k - k0) / (k1 - k0)
    (k0, v0), (k1, v1) = curve[-2], curve[-1]
    return v1 + (v1 - v0) * (k - k1) / (k1 - k0)


def _rows(path: str) -> list[dict[str, Any]]:
    """The ``ok`` rows of a results.jsonl. Raises :class:`Refused` for a missing or unreadable file."""
    p = Path(path)
    if not p.is_file():
        raise Refused(f"{path}: {'a directory' if p.is_dir() else 'no such file'} (give a run's results.jsonl)")
    rows = []
    try:
        for number, line in enumerate(p.read_text().splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise Refused(f"{path}: line {number} is not JSON ({e.msg})") from None
    except UnicodeDecodeError:
        raise Refused(f"{path}: not a text file (give a run's results.jsonl)") from None
    rows = [r for r in rows if isinstance(r, dict) and r.get("status", "ok") == "ok" and "decoder" in r]
    if not rows:
        raise Refused(f"{path}: no result row (objects with a decoder and status ok)")
    if any(_num(r.get("batch_size")) > 1 for r in rows):
        raise Refused(f"{path}: rows of a batched run (batch_size > 1): their forwards have another cost curve")
    return rows


def _num(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return 0.0


def _params(row: dict[str, Any]) -> dict[str, Any]:
    try:
        params = json.loads(row.get("decoder_params") or "{}")
    except (TypeError, json.JSONDecodeError):
        return {}
    return params if isinstance(params, dict) else {}


def _draft_prompt(prompt_tokens: float, window_cut: float) -> int:
    """Tokens of the draft's prefill forward: its view of the prompt (less a draft window's cut) and the pending
    token (Ouroboros' drafter prefills the prompt alone: one token more than it fed, ~0.5 % of its prefill)."""
    return int(prompt_tokens - window_cut) + 1


def load_curves(path: str) -> Curves:
    """The curves of the first row of ``path`` that has them (every row of a job carries the same ones).

    Raises:
        Refused: no such file, no row with a ``target_cost_curve``, or that row without ``bare_token_s``.
    """
    from harness.rows.cell_figures import cost_curve

    rows = _rows(path)
    row = next((r for r in rows if cost_curve(r.get("target_cost_curve"))), None)
    if row is None:
        raise Refused(f"{path}: no row has a target_cost_curve (rows of a job with a warm-up at batch size 1 have one)")
    if not _num(row.get("bare_token_s")) > 0 or not math.isfinite(_num(row.get("bare_token_s"))):
        raise Refused(f"{path}: the row with the curves has no positive bare_token_s (the curves' unit)")
    for column in ("target_cost_curve", "draft_cost_curve"):
        if any(not (math.isfinite(v) and v > 0) for _, v in cost_curve(row.get(column))):
            raise Refused(f"{path}: {column} holds a cost that is not a positive number: {row.get(column)}")
    per_token = [_num(r["draft_prefill_s"]) / _num(r["bare_token_s"])
                 / _draft_prompt(_num(r["prompt_tokens"]), _num(r.get("draft_window_cut")))
                 for r in rows if _num(r.get("draft_prefill_s")) > 0 and _num(r.get("bare_token_s")) > 0
                 and _num(r.get("prompt_tokens")) > 0]
    per_token = [v for v in per_token if math.isfinite(v)]
    points: tuple[tuple[int, float, float], ...] = ()
    for r in rows:  # "k:target_ms/draft_ms,..." of a cost-aware tree
        try:
            points = tuple((int(k), float(t) / 1e3, float(d) / 1e3) for k, td in
                           (p.split(":") for p in str(r.get("cost_points") or "").split(",") if p)
                           for t, d in [td.split("/")])
        except ValueError:
            points = ()
        if len(points) >= 2:
            break
    raw = {m: cost_curve(row.get(f"{m}_cost_curve")) for m in ("target", "draft")}
    # a point above a later one by > 10 % (the 1-token point is the unit: points of 2-4 tokens timed below it lift
    # to it, which only makes short verifies a little dearer)
    lifted = tuple(f"{m} {k:g}: {v:.2f} -> {top:.2f}" for m, curve in raw.items()
                   for (k, v), (_, top) in zip(curve[1:], _envelope(curve[1:])) if top > 1.1 * v)
    return Curves(_envelope(raw["target"]), _envelope(raw["draft"]),
                  statistics.median(per_token) if per_token else 0.0, _num(row["bare_token_s"]), points,
                  f"{row.get('device_name', '?')} {row.get('dtype', '?')}, {path}", lifted)


@dataclass(frozen=True)
class Step:
    """One decode step's counters (a :class:`~decoders.types.StepRecord`'s, or a row's per-step means)."""

    target_tokens_fed: float
    draft_forwards: float = 0.0
    draft_tokens_fed: float = 0.0


def draft_cost(forwards: float, fed: float, curves: Curves, prefill: int = 0, reduced_head: float = 1.0) -> float:
    """Projected cost, in target one-token forwards, of ``forwards`` draft forwards feeding ``fed`` tokens: the
    first of them a prompt prefill of ``prefill`` tokens (0: none; at the full head's cost, one row of logits), the
    others at their mean tokens each, times ``reduced_head``."""
    cost = 0.0
    if prefill:
        cost, forwards, fed = curves.prefill_per_token * prefill, forwards - 1, fed - prefill
    if forwards > 0:
        cost += forwards * curves.draft_cost(max(1.0, fed / forwards)) * reduced_head
    return cost


def sample_cost(steps: Sequence[Step], curves: Curves, draft_prompt: int, reduced_head: float = 1.0) -> float:
    """Projected cost of a sample's decode steps (the target's prefill excluded), in target one-token forwards.

    Args:
        steps: the decode steps, first to last.
        curves: the machine's bare costs.
        draft_prompt: tokens of the draft's prefill forward (:func:`_draft_prompt`); the first step with draft
            forwards prefills them in its first forward when it fed that many.
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
    """Per decoder of a run (decoders of :data:`NOT_PRICED` left out): ``samples``, ``steps`` (decode steps),
    ``tokens_per_step``, ``draft_forwards_per_step``, ``projected`` (the mean projected TPOT speedup from each row's
    per-step means, its draft prefill taken out first) and ``measured`` (the mean of vanilla's TPOT over the
    decoder's, vanilla's row of the same sample, turn and repeat; ``None`` unless every row has one)."""
    key = lambda r: (r.get("sample_id"), r.get("turn"), r.get("repeat"))  # noqa: E731
    vanilla = {key(r): r for r in rows if r.get("decoder") == "vanilla"}
    out = []
    for name in dict.fromkeys(r["decoder"] for r in rows):
        if any(_not_priced(r) for r in rows if r["decoder"] == name):
            out.append({"decoder": name, "not_priced": "transformers' assisted generation: its counters include its "
                                                      "first, pre-TTFT step"})
            continue
        measured, projected, tokens, steps, forwards_all = [], [], 0, 0, 0.0
        for r in (r for r in rows if r["decoder"] == name):
            n, k = int(_num(r.get("new_tokens"))) - 1, int(_num(r.get("num_steps"))) - 1
            if n < 1 or k < 1:
                continue
            forwards, fed = _num(r.get("draft_forwards_per_step")) * k, _num(r.get("draft_tokens_fed"))
            prompt = _draft_prompt(_num(r.get("prompt_tokens")), _num(r.get("draft_window_cut")))
            head = reduced_head if _num(_params(r).get("draft_vocab_size")) else 1.0
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
            out.append({"decoder": name, "not_priced": "no row with a decode step (new_tokens, num_steps)"})
    if not any("projected" in r for r in out):
        raise Refused("no row could be priced (rows need new_tokens, num_steps and the step counters)")
    return out


def parse_decoder(spec: str) -> tuple[str, dict[str, Any]]:
    """``name[:key=value,...]`` -> ``(name, overrides)``; values read as YAML scalars (``8``, ``true``, ``0.5``).

    Raises:
        Refused: an override not written ``key=value``, or a value YAML cannot read.
    """
    import yaml

    name, _, rest = spec.partition(":")
    params: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise Refused(f"decoder {spec!r}: write overrides as name:key=value,key=value")
        try:
            params[key] = yaml.safe_load(value)
        except yaml.YAMLError:
            raise Refused(f"decoder {spec!r}: {value!r} is not a value (a number, true/false, a word)") from None
    return name, params


def check_decode_args(args: argparse.Namespace, curves: Curves) -> list[tuple[str, str, dict[str, Any]]]:
    """Every decoder, the model, its dtype and the task checked as run.py checks them, and the curves and the pair
    for what the decoders run, before any model loads. Returns ``(spec, name, overrides)`` per decoder; sets
    ``args.task_obj`` and ``args.model_chat``.

    Raises:
        Refused: with the one line that says what to change.
    """
    from harness.api import _value, compose_config
    from harness.config.compose import ConfigError
    from harness.config.precheck import available, decoder_key
    from harness.job.app import build_task_or_refuse

    if args.max_new_tokens < 2:
        raise Refused(f"--max-new-tokens must be >= 2 (a decode step after the first token), got {args.max_new_tokens}")
    if args.model not in available("model"):
        raise Refused(f"unknown model {args.model!r}; choose from {', '.join(available('model'))}")
    try:
        model = compose_config([f"model={args.model}", f"model.dtype={args.dtype}", "decoder=[vanilla]"]).model
    except ConfigError as e:
        raise Refused(str(e)) from None
    args.model_chat = model.get("chat_template")
    decoders = []
    for spec in args.decoders:
        name, params = parse_decoder(spec)
        if name not in available("decoder"):
            raise Refused(f"unknown decoder {name!r}; choose from {', '.join(available('decoder'))}")
        key = decoder_key(name)
        try:  # the overrides as harness.api.build_decoder writes them
            cfg = compose_config([f"decoder=[{name}]", *(f"decoder.{key}.{k}={_value(v)}" for k, v in params.items())])
        except ConfigError as e:
            raise Refused(f"decoder {spec!r}: {e}") from None
        if cfg.decoder[key].get("_target_", "").rsplit(".", 1)[-1] in NOT_PRICED:
            raise Refused(f"decoder {spec!r}: transformers' assisted generation is not priced (its counters include "
                          "its first, pre-TTFT step)")
        if cfg.decoder[key].get("uses_draft"):
            if not model.get("draft"):
                raise Refused(f"decoder {spec!r} runs a draft model and model {args.model} has none")
            if not curves.draft:
                raise Refused(f"decoder {spec!r} runs a draft model and {curves.source} has no draft_cost_curve: "
                              "take the curves from a job that ran a draft")
        decoders.append((spec, name, params))
    try:
        cfg = compose_config([f"task={args.task}", f"task.offset={args.offset}", f"task.limit={args.limit}",
                              *([f"data_dir={args.data_dir}"] if args.data_dir else [])])
        args.task_obj = build_task_or_refuse(cfg.task)
    except (ConfigError, ValueError) as e:
        raise Refused(str(e)) from None
    return decoders


def given_costs(curves: Curves) -> Any:
    """The :class:`~decoders.common.cost.ForwardCost` a cost-aware tree gets in ``decode`` mode: the curve job's
    tree's own cost points where it recorded some, else the bare curves (seconds, through ``unit_s``)."""
    from decoders.common.cost import POINTS, ForwardCost

    if curves.cost_points:
        k, t, d = zip(*curves.cost_points)
        return ForwardCost(tuple(k), tuple(t), tuple(d))
    points = tuple(p for p in POINTS if p <= 64)
    return ForwardCost(points, tuple(curves.target_cost(k) * curves.unit_s for k in points),
                       tuple((curves.draft_cost(k) if curves.draft else 0.0) * curves.unit_s for k in points))


def build(name: str, params: dict[str, Any], pair: Any, eos: frozenset[int], curves: Curves) -> Any:
    """The decoder as run.py builds it; a cost-aware tree's measured costs replaced by :func:`given_costs`.

    Raises:
        Refused: the decoder refused its settings (its own message).
    """
    from harness.api import build_decoder

    try:
        decoder = build_decoder(name, pair, eos_token_ids=eos, **params)
    except ValueError as e:
        raise Refused(f"decoder {name}: {e}") from None
    if getattr(decoder, "cost", None) is not None:  # OptTreeDecoder(cost_aware=True): read at every step
        decoder.cost = given_costs(curves)
    return decoder


def project_decode(args: argparse.Namespace, curves: Curves, decoders: list[tuple[str, str, dict[str, Any]]]
                   ) -> list[dict[str, Any]]:
    """Decode the task's prompts with each decoder here and price every step; the keys of :func:`project_rows`
    (``measured`` is ``None``: nothing here is timed)."""
    import torch

    from decoders.common.stopping import collect_eos_token_ids
    from harness.api import load_pair_by_name
    from tasks.base import encode_prompt

    pair = load_pair_by_name(args.model, device="cpu", need_draft=True, dtype=args.dtype)
    task = args.task_obj
    chat = task.uses_chat(pair.tokenizer, args.model_chat)  # as run.py decides it
    eos = collect_eos_token_ids(pair.tokenizer, pair.target.generation_config) | task.stop_token_ids(pair.tokenizer,
                                                                                                    chat)
    prompts = [encode_prompt(pair.tokenizer, task.render(s, pair.tokenizer, chat), chat) for s in task.samples()]
    out = []
    for spec, name, params in decoders:
        decoder = build(name, params, pair, eos, curves)
        head = args.reduced_head if getattr(decoder, "draft_vocab_size", 0) else 1.0
        projected, tokens, steps, forwards = [], 0, 0, 0.0
        for ids in prompts:
            res = decoder.generate(torch.tensor([ids]), args.max_new_tokens)
            decode = [Step(s.target_tokens_fed, s.draft_forwards, s.draft_tokens_fed) for s in res.steps[1:]]
            if not decode:
                continue
            n = len(res.token_ids) - 1
            draft_prompt = _draft_prompt(len(ids), _num(res.extra.get("draft_window_cut")))
            projected.append(n / sample_cost(decode, curves, draft_prompt, head))
            tokens, steps = tokens + n, steps + len(decode)
            forwards += sum(s.draft_forwards for s in decode)
        out.append({"decoder": spec, "samples": len(projected), "steps": steps,
                    "tokens_per_step": tokens / steps if steps else 0.0,
                    "draft_forwards_per_step": forwards / steps if steps else 0.0,
                    "projected": statistics.mean(projected) if projected else None, "measured": None})
        print(f"{spec}: done", file=sys.stderr, flush=True)
    return out


def table(results: Sequence[dict[str, Any]], curves: Curves, what: str) -> str:
    """The printed table: what was priced on what, then one line per decoder."""
    lines = [f"PROJECTED TPOT speedups over vanilla ({what}), priced on the bare costs of {curves.source}; host "
             "work and in-situ overheads left out: a screening figure, not a measurement ('measured': vanilla's "
             "TPOT / the decoder's in those rows)"]
    if not curves.prefill_per_token and any(r.get("draft_forwards_per_step") for r in results):
        lines.append("note: the curve job's rows measured no draft prefill: draft prefills are priced at 0")
    if curves.lifted:
        lines.append("note: the curves are not monotone (timing noise in that job), read through their running "
                     f"maximum: {'; '.join(curves.lifted)}; a projection on them is doubtful")
    lines.append(f"{'decoder':<48} {'samples':>7} {'steps':>6} {'tok/step':>8} {'draft fwd/step':>14} "
                 f"{'projected':>9} {'measured':>8}")
    for r in results:
        if "not_priced" in r:
            lines.append(f"{r['decoder']:<48} not priced: {r['not_priced']}")
            continue
        proj = "-" if r["projected"] is None else f"{r['projected']:.2f}"
        meas = "-" if r["measured"] is None else f"{r['measured']:.2f}"
        lines.append(f"{r['decoder']:<48} {r['samples']:>7} {r['steps']:>6} {r['tokens_per_step']:>8.2f} "
                     f"{r['draft_forwards_per_step']:>14.2f} {proj:>9} {meas:>8}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--curves", required=True, help="results.jsonl of the job whose bare costs price the steps")
    parser.add_argument("--reduced-head", type=float, default=REDUCED_HEAD,
                        help="cost of a reduced-head draft forward / the full head's (default %(default)s)")
    sub = parser.add_subparsers(dest="mode", required=True)
    rows = sub.add_parser("rows", help="price a run's rows")
    rows.add_argument("results", help="the run's results.jsonl")
    dec = sub.add_parser("decode", help="decode here and price every step")
    dec.add_argument("decoders", nargs="+", help="conf/decoder names, optionally name:key=value,...")
    dec.add_argument("--model", default="qwen2.5-coder-1.5b")
    dec.add_argument("--dtype", default="float32")
    dec.add_argument("--task", default="humaneval")
    dec.add_argument("--offset", type=int, default=0)
    dec.add_argument("--limit", type=int, default=5)
    dec.add_argument("--max-new-tokens", type=int, default=128)
    dec.add_argument("--data-dir", default=None)
    args = parser.parse_args(argv)
    try:
        if not 0 < args.reduced_head <= 1:
            raise Refused(f"--reduced-head must be in (0, 1], got {args.reduced_head}")
        curves = load_curves(args.curves)
        if args.mode == "rows":
            results, what = project_rows(_rows(args.results), curves, args.reduced_head), args.results
        else:
            decoders = check_decode_args(args, curves)
            what = (f"{args.model} {args.dtype} decoding {args.task} problems {args.offset}.."
                    f"{args.offset + args.limit - 1} at {args.max_new_tokens} new tokens here")
            results = project_decode(args, curves, decoders)
    except Refused as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(table(results, curves, what))
    return 0


if __name__ == "__main__":
    sys.exit(main())
