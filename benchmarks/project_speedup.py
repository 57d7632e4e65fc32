"""Projected TPOT speedups: a decoder's per-step counters priced on another machine's bare forward costs.

The pricing and what it leaves out: :mod:`harness.rows.projection`. A screening figure, never a measured speedup:
it says which grid points are worth a timed run on the machine that counts, not whether a goal is met; how far
measurement fell from it: docs/measurement.md, "Projected speedups: screening without the machine that counts".
Rows of batched runs are refused; the table notes a curve that is not monotone (timing noise).

Two modes::

    # a run's rows, priced from their per-row counters (aggregates: a mix of short and long steps is priced at
    # its mean, which flatters prompt lookup); transformers' assisted generation is listed, not priced
    .venv/bin/python benchmarks/project_speedup.py --curves CURVE_ROWS.jsonl rows RUN/results.jsonl

    # decode here (any machine, any dtype) and price every step's counters; --split for a task's dev split
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
import os
import statistics
import sys
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.rows.cell_figures import draft_prefill_tokens  # noqa: E402
from harness.rows.projection import (NOT_PRICED, NOT_PRICED_WHY, REDUCED_HEAD, Curves, Refused, Step,  # noqa: E402
                                     load_curves, project_rows, read_rows, sample_cost)


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
            raise Refused(f"decoder {spec!r}: {NOT_PRICED_WHY}")
        if cfg.decoder[key].get("uses_draft"):
            if not model.get("draft"):
                raise Refused(f"decoder {spec!r} runs a draft model and model {args.model} has none")
            if not curves.draft:
                raise Refused(f"decoder {spec!r} runs a draft model and {curves.source} has no draft_cost_curve: "
                              "take the curves from a job that ran a draft")
        decoders.append((spec, name, params))
    try:
        base = [f"task={args.task}", f"task.offset={args.offset}", f"task.limit={args.limit}",
                *([f"data_dir={args.data_dir}"] if args.data_dir else [])]
        if args.split and "split" not in compose_config(base).task:
            raise Refused(f"--split {args.split}: task {args.task} has no splits (leave --split out)")
        cfg = compose_config([*base, *([f"task.split={args.split}"] if args.split else [])])
        args.task_obj = build_task_or_refuse(cfg.task)
    except (ConfigError, ValueError) as e:  # named by the options typed, not by the config keys they set
        raise Refused(str(e).replace("task.split=", "--split ").replace("task.limit=", "--limit ")
                      .replace("task.offset=", "--offset ").replace(" or null", "")) from None
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
            draft_prompt = draft_prefill_tokens(len(ids), int(res.extra.get("draft_window_cut") or 0))
            projected.append(n / sample_cost(decode, curves, draft_prompt, head))
            tokens, steps = tokens + n, steps + len(decode)
            forwards += sum(s.draft_forwards for s in decode)
        out.append({"decoder": spec, "samples": len(projected), "steps": steps,
                    "tokens_per_step": tokens / steps if steps else 0.0,
                    "draft_forwards_per_step": forwards / steps if steps else 0.0,
                    "projected": statistics.mean(projected) if projected else None, "measured": None})
        print(f"{spec}: done", file=sys.stderr, flush=True)
    return out


def table(results: Sequence[dict[str, Any]], curves: Curves, what: str, notes: Sequence[str] = ()) -> str:
    """The printed table: what was priced on what, ``notes``, then one line per decoder."""
    lines = [f"PROJECTED TPOT speedups over vanilla ({what}), priced on the bare costs of {curves.source}; host "
             "work and in-situ overheads left out: a screening figure, not a measurement"
             + ("" if all(r.get("measured") is None for r in results) else
                " ('measured': vanilla's TPOT / the decoder's in those rows)")]
    lines += [f"note: {n}" for n in notes]
    if not curves.prefill_per_token and any(r.get("draft_forwards_per_step") for r in results):
        lines.append("note: the curve job's rows measured no draft prefill: draft prefills are priced at 0")
    if curves.lifted:
        lines.append("note: the curves are not monotone (timing noise in that job), read through their running "
                     f"maximum: {'; '.join(curves.lifted)}; a projection on them is doubtful")
    lines.append(f"{'decoder':<48} {'samples':>7} {'steps':>6} {'tok/step':>8} {'draft fwd/step':>14} "
                 f"{'projected':>9} {'measured':>8}")
    for r in results:
        if "not_priced" in r:
            lines.append(f"{r['decoder']:<48} {r['not_priced']}")
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
    dec.add_argument("--split", default=None, help="the task's split (default: the task's own, e.g. MBPP's test; "
                     "screen on a dev split: MBPP's validation)")
    dec.add_argument("--offset", type=int, default=0)
    dec.add_argument("--limit", type=int, default=5)
    dec.add_argument("--max-new-tokens", type=int, default=128)
    dec.add_argument("--data-dir", default=None)
    args = parser.parse_args(argv)
    try:
        if not 0 < args.reduced_head <= 1:
            raise Refused(f"--reduced-head must be in (0, 1], got {args.reduced_head}")
        curves, notes = load_curves(read_rows(args.curves), args.curves), []
        if args.mode == "rows":
            rows = read_rows(args.results, notes)
            if not any(r["decoder"] == "vanilla" for r in rows):
                notes.append(f"{args.results}: no ok vanilla row, so nothing measured to set beside the projections")
            results, what = project_rows(rows, curves, args.reduced_head), args.results
        else:
            decoders = check_decode_args(args, curves)
            ids = [s.sample_id for s in args.task_obj.samples()]
            split = getattr(args.task_obj, "split", None)
            span = ids[0] if len(ids) == 1 else f"{ids[0]} .. {ids[-1]}"
            what = (f"{args.model} {args.dtype} decoding {args.task}{f' ({split} split)' if split else ''}, "
                    f"{len(ids)} problem{'s' if len(ids) != 1 else ''} ({span}) at {args.max_new_tokens} new tokens "
                    "here")
            results = project_decode(args, curves, decoders)
    except Refused as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(table(results, curves, what, notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
