"""Time vanilla vs draft-model speculative decoding vs Ouroboros settings on a few HumanEval prompts.

A development probe (not a test, not the paper-style runner) used to pick the CPU defaults of
``conf/decoder/ouroboros.yaml``: it loads the configured model pair (:func:`harness.job.models.load_pair`),
renders the first HumanEval problems the way the runner does, interleaves the decoders per prompt (vanilla
first) and reports tokens/s, speedup vs vanilla (ratio of total tokens / total time), accept length tau (new
tokens per target forward, prefill included), draft forwards per target forward, tokens fed per draft and per
target forward, the drafting / verifying time split and whether the output equals vanilla's (bfloat16 may
legitimately differ; float32 must not). Optionally it first times one forward per fed-token count for both
models, the cost curve that decides how large draft and verification forwards may grow on this device.

Usage::

    python benchmarks/ouroboros_probe.py --limit 2 --max-new-tokens 128 --spec 4 \\
        --ouro 6,4,4,4,3 8,3,3,3,3 --cost-curve 1 8 16 32 --out results/ouroboros_probe.json

Each ``--ouro`` item is ``gamma,W,N,G,topk`` optionally followed by ``,key=value`` options of
:class:`decoders.ouroboros.OuroborosDecoder` (e.g. ``6,4,4,4,3,free_draft_min_match=3,draft_vocab_size=32768``).
``--untimed`` prints only the counters (draft forwards per step, tokens per draft forward, accept length, target
tokens fed per step, free / branch statistics): what a shared, noisy CPU can still measure. Timing goes
through the runner's stopwatch (:class:`harness.job.timing.Stopwatch`), as in a real run.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

import torch

from decoders.ouroboros import OuroborosDecoder
from decoders.speculative import SpeculativeDecoder
from decoders.vanilla import VanillaDecoder
from harness.job.timing import Stopwatch
from humaneval_prompts import add_model_arguments, load_prompts, log_cost_curve

log = logging.getLogger("ouroboros_probe")


def ouro_spec(text: str) -> tuple[tuple[int, ...], dict[str, float]]:
    """``gamma,W,N,G,topk[,key=value...]`` -> ((gamma, W, N, G, topk), options)."""
    parts = text.split(",")
    options = {}
    for item in parts[5:]:
        key, _, value = item.partition("=")
        options[key] = {"true": True, "false": False}.get(value.lower(), None)
        if options[key] is None:
            options[key] = float(value) if "." in value else int(value)
    return tuple(int(v) for v in parts[:5]), options


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_arguments(parser, limit=2)
    parser.add_argument("--spec", type=int, nargs="*", default=[4], help="speculative decoding gammas")
    parser.add_argument("--ouro", type=ouro_spec, nargs="*", default=[((6, 4, 4, 4, 3), {})],
                        help="Ouroboros gamma,W,N,G,topk[,key=value...] items")
    parser.add_argument("--skip-vanilla", action="store_true", help="no vanilla reference (counters only)")
    parser.add_argument("--untimed", action="store_true", help="report counters only (a shared CPU)")
    parser.add_argument("--cost-curve", type=int, nargs="*", default=[],
                        help="fed-token counts for both models' forward cost curves (empty to skip)")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    return parser.parse_args(argv)


def setup(args: argparse.Namespace) -> tuple[Any, frozenset[int], list[tuple[str, torch.Tensor]], dict[str, Any]]:
    """The model pair, its EOS ids, the rendered HumanEval prompts (as the runner renders them) and the decoders
    to compare; logs the forward cost curves when asked."""
    pair, eos, prompts = load_prompts(args, need_draft=True)
    target, draft = pair.target, pair.draft
    log.info("target %s, draft %s, %s on %s, threads %d, %d prompts", pair.target_name, pair.draft_name,
             pair.dtype, pair.device, torch.get_num_threads(), len(prompts))
    if args.cost_curve:
        for role, model in (("target", target), ("draft", draft)):
            log_cost_curve(log, f"{role} forward cost", model, args.cost_curve, prompts[0][1])
    decoders: dict[str, Any] = {"vanilla": VanillaDecoder(target, eos_token_ids=eos)}
    for gamma in args.spec:
        decoders[f"speculative g={gamma}"] = SpeculativeDecoder(target, draft, gamma=gamma, eos_token_ids=eos)
    if args.skip_vanilla:
        decoders = {}
    for (gamma, w, n, g, k), options in args.ouro:
        label = f"ouroboros g={gamma} W={w} N={n} G={g} k={k}" + "".join(f" {o}={v}" for o, v in options.items())
        decoders[label] = OuroborosDecoder(
            target, draft, gamma=gamma, window_size=w, ngram_size=n, guess_set_size=g, topk=k, eos_token_ids=eos,
            **options,
        )
    VanillaDecoder(target).generate(prompts[0][1], 4)  # warm-up (allocator, kernels)
    VanillaDecoder(draft).generate(prompts[0][1], 4)
    return pair, eos, prompts, decoders


KEYS = ("seconds", "tokens", "steps", "fed", "same", "draft_fwd", "draft_fed", "draft_s", "verify_s", "suffix",
        "model_drafted", "lookahead_fwd", "free_steps", "free_acc", "branch_fed", "branch_acc")


def measure(decoders: dict[str, Any], prompts: list[tuple[str, torch.Tensor]], args: argparse.Namespace
            ) -> dict[str, dict[str, float]]:
    """Run every decoder on every prompt (decoders interleaved per prompt); per decoder, the summed counters."""
    totals = {name: dict.fromkeys(KEYS, 0) for name in decoders}
    reference: dict[str, tuple[int, ...]] = {}
    for sample_id, ids in prompts:
        for name, dec in decoders.items():
            watch = Stopwatch(ids.device)
            watch.start()
            res = dec.generate(ids, args.max_new_tokens, stopwatch=watch)
            seconds = watch.stop()
            reference.setdefault(sample_id, res.token_ids)  # vanilla's, or the first decoder's with --skip-vanilla
            acc = totals[name]
            acc["seconds"] += seconds
            acc["tokens"] += res.new_tokens
            acc["steps"] += res.num_steps
            acc["fed"] += sum(s.target_tokens_fed for s in res.steps[1:])
            acc["same"] += res.token_ids == reference[sample_id]
            acc["draft_fwd"] += res.draft_forwards
            acc["draft_fed"] += sum(s.draft_tokens_fed for s in res.steps[1:]) - ids.shape[1]  # prompt excluded
            acc["draft_s"] += watch.phases.get("draft", 0.0)
            acc["verify_s"] += watch.phases.get("verify", 0.0)
            acc["suffix"] += sum((s.source or {}).get("suffix", 0) for s in res.steps)
            model_steps = [s for s in res.steps[1:] if not (s.source or {}).get("free") and s.draft_forwards]
            acc["model_drafted"] += sum(s.drafted for s in model_steps)
            acc["lookahead_fwd"] += sum(s.draft_forwards for s in model_steps) - (1 if model_steps else 0)
            acc["free_steps"] += res.extra.get("free_steps", 0)
            acc["free_acc"] += res.extra.get("free_tokens_accepted", 0)
            acc["branch_fed"] += res.extra.get("branch_tokens_fed", 0)
            acc["branch_acc"] += res.extra.get("branch_tokens_accepted", 0)
            decode = res.steps[1:]
            log.info("  %s %-36s tau %.2f  new %d  steps %d  target fed/step %.1f  draft fwd/step %.2f  "
                     "model-drafted/lookahead fwd %s  free acc %s  branch acc/fed %s/%s  same %s%s", sample_id, name,
                     res.accept_length, res.new_tokens, res.num_steps,
                     sum(s.target_tokens_fed for s in decode) / max(len(decode), 1),
                     res.draft_forwards / max(len(decode), 1),
                     f"{sum(s.drafted for s in model_steps)}/{sum(s.draft_forwards for s in model_steps) - 1}"
                     if model_steps else "-", res.extra.get("free_tokens_accepted", "-"),
                     res.extra.get("branch_tokens_accepted", "-"), res.extra.get("branch_tokens_fed", "-"),
                     res.token_ids == reference[sample_id],
                     "" if args.untimed else f"  {seconds:5.1f} s  {res.new_tokens / seconds:.2f} tok/s")
    return totals


def summarize(totals: dict[str, dict[str, float]], prompts: int, untimed: bool) -> list[dict[str, Any]]:
    """One row per decoder: tokens/s, speedup vs the first decoder, accept length and the drafting counters."""
    rows = []
    base_tps = None
    for name, acc in totals.items():
        decode_steps = max(acc["steps"] - prompts, 1)
        row = {
            "decoder": name, "new_tokens": acc["tokens"], "seconds": round(acc["seconds"], 2),
            "tokens_per_s": round(acc["tokens"] / acc["seconds"], 2),
            "accept_length": round(acc["tokens"] / acc["steps"], 3),
            "target_fed_per_step": round(acc["fed"] / decode_steps, 1),
            "draft_fwd_per_step": round(acc["draft_fwd"] / decode_steps, 2),
            "draft_fed_per_fwd": round(acc["draft_fed"] / max(acc["draft_fwd"], 1), 1) if acc["draft_fwd"] else 0.0,
            "draft_share": round(acc["draft_s"] / acc["seconds"], 3) if acc["draft_s"] else None,
            "verify_share": round(acc["verify_s"] / acc["seconds"], 3) if acc["verify_s"] else None,
            "suffix_tokens": acc["suffix"],
            "draft_tokens_per_draft_fwd": round(acc["model_drafted"] / acc["lookahead_fwd"], 2)
            if acc["lookahead_fwd"] else None,
            "free_steps_share": round(acc["free_steps"] / decode_steps, 3),
            "free_tokens_accepted": acc["free_acc"],
            "branch_tokens_fed": acc["branch_fed"],
            "branch_tokens_accepted": acc["branch_acc"],
            "matches_reference": f"{acc['same']}/{prompts}",
        }
        base_tps = base_tps or row["tokens_per_s"]  # the first decoder's (vanilla's unless --skip-vanilla)
        row["speedup"] = round(row["tokens_per_s"] / base_tps, 3)
        if untimed:
            for key in ("seconds", "tokens_per_s", "draft_share", "verify_share", "speedup"):
                row.pop(key)
        rows.append(row)
        log.info("%-36s %s", name, "  ".join(f"{k} {v}" for k, v in row.items() if k != "decoder"))
    return rows


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    pair, _, prompts, decoders = setup(args)
    rows = summarize(measure(decoders, prompts, args), len(prompts), args.untimed)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"target": pair.target_name, "draft": pair.draft_name,
                                              "dtype": str(pair.dtype), "rows": rows, "limit": args.limit,
                                              "max_new_tokens": args.max_new_tokens}, indent=1))


if __name__ == "__main__":
    main()
