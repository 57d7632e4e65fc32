"""Time vanilla vs prompt lookup vs lookahead decoding over a small (W, N, G) grid on HumanEval prompts.

A development sweep (not a test, not the paper-style runner): it loads the configured model pair's
target through :func:`harness.job.models.load_pair`, renders the first HumanEval problems the way the runner
does, and for each decoder reports tokens/s, speedup vs vanilla (ratio of total tokens / total time;
also by process CPU time, which a busy shared machine inflates less than wall time),
accept length (new tokens per target forward, prefill included), mean tokens fed per decode step and whether the output
equals vanilla's (bfloat16 may legitimately differ; float32 must not). It also times one target forward
per fed-token count, the cost curve that decides which lookahead sizes can pay off on this device.

Usage::

    python benchmarks/lookahead_sweep.py --limit 3 --max-new-tokens 128 \\
        --grid 2,3,2 3,4,3 5,4,5 5,4,5,1 --pld 3,10 --out results/lookahead_sweep.json
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

import torch

from decoders.lookahead import LookaheadDecoder
from decoders.prompt_lookup import PromptLookupDecoder
from decoders.vanilla import VanillaDecoder
from harness.job.timing import Stopwatch
from humaneval_prompts import add_model_arguments, load_prompts, log_cost_curve

log = logging.getLogger("lookahead_sweep")


def triple(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(","))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_arguments(parser, limit=3)
    parser.add_argument("--grid", type=triple, nargs="*", default=[(2, 3, 2), (3, 4, 3), (5, 4, 5), (4, 5, 4)],
                        help="lookahead W,N,G triples; a 4th value 1 turns pool_from_prompt on")
    parser.add_argument("--pld", type=triple, nargs="*", default=[(3, 10)],
                        help="prompt lookup max_ngram_size,num_draft_tokens pairs")
    parser.add_argument("--cost-curve", type=int, nargs="*", default=[1, 2, 4, 8, 16, 32, 64],
                        help="fed-token counts for the forward cost curve (empty to skip)")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    return parser.parse_args(argv)


def setup(args: argparse.Namespace) -> tuple[Any, list[tuple[str, torch.Tensor]], dict[str, Any]]:
    """The model pair (its target only), the rendered HumanEval prompts (as the runner renders them) and the
    decoders to compare; logs the forward cost curve when asked."""
    pair, eos, prompts = load_prompts(args, need_draft=False)
    model = pair.target
    log.info("model %s %s on %s, threads %d, %d prompts", pair.target_name, pair.dtype, pair.device,
             torch.get_num_threads(), len(prompts))
    if args.cost_curve:
        log_cost_curve(log, "forward cost", model, args.cost_curve, prompts[0][1])
    decoders: dict[str, Any] = {"vanilla": VanillaDecoder(model, eos_token_ids=eos)}
    for n, k in args.pld:
        decoders[f"prompt_lookup n={n} k={k}"] = PromptLookupDecoder(model, max_ngram_size=n, num_draft_tokens=k,
                                                                      eos_token_ids=eos)
    for w, n, g, *rest in args.grid:
        from_prompt = bool(rest and rest[0])
        decoders[f"lookahead W={w} N={n} G={g}" + (" +prompt" if from_prompt else "")] = LookaheadDecoder(
            model, window_size=w, ngram_size=n, guess_set_size=g, pool_from_prompt=from_prompt, eos_token_ids=eos
        )
    VanillaDecoder(model).generate(prompts[0][1], 4)  # warm-up (allocator, kernels)
    return pair, prompts, decoders


def measure(decoders: dict[str, Any], prompts: list[tuple[str, torch.Tensor]], max_new_tokens: int
            ) -> dict[str, dict[str, float]]:
    """Every decoder on every prompt, interleaved per prompt (vanilla first) so load drift hits them all alike;
    wall time through the runner's synchronized stopwatch, CPU time of the process beside it."""
    totals = {name: dict(tokens=0, steps=0, fed=0, same=0, seconds=0.0, cpu_s=0.0) for name in decoders}
    reference: dict[str, tuple[int, ...]] = {}
    for sample_id, ids in prompts:
        for name, dec in decoders.items():
            watch = Stopwatch(ids.device)
            c0 = time.process_time()
            watch.start()
            res = dec.generate(ids, max_new_tokens, stopwatch=watch)
            seconds, cpu_s = watch.stop(), time.process_time() - c0
            if name == "vanilla":
                reference[sample_id] = res.token_ids
            acc = totals[name]
            acc["seconds"] += seconds
            acc["cpu_s"] += cpu_s
            acc["tokens"] += res.new_tokens
            acc["steps"] += res.num_steps
            acc["fed"] += sum(s.target_tokens_fed for s in res.steps[1:])
            acc["same"] += res.token_ids == reference[sample_id]
            log.info("  %s %-34s %5.1f s (cpu %5.1f s)  %.2f tok/s  tau %.2f", sample_id, name, seconds, cpu_s,
                     res.new_tokens / seconds, res.accept_length)
    return totals


def summarize(totals: dict[str, dict[str, float]], prompts: int) -> list[dict[str, Any]]:
    """One row per decoder: tokens/s, speedup vs vanilla by wall and by CPU time, accept length, tokens fed."""
    rows: list[dict[str, Any]] = []
    for name, acc in totals.items():
        row = {"decoder": name, "new_tokens": acc["tokens"], "seconds": round(acc["seconds"], 2),
               "tokens_per_s": round(acc["tokens"] / acc["seconds"], 2),
               "tokens_per_cpu_s": round(acc["tokens"] / acc["cpu_s"], 2),
               "accept_length": round(acc["tokens"] / acc["steps"], 3),
               "tokens_fed_per_step": round(acc["fed"] / max(acc["steps"] - prompts, 1), 1),
               "matches_vanilla": f"{acc['same']}/{prompts}"}
        row["speedup"] = round(row["tokens_per_s"] / rows[0]["tokens_per_s"], 3) if rows else 1.0
        row["cpu_speedup"] = round(row["tokens_per_cpu_s"] / rows[0]["tokens_per_cpu_s"], 3) if rows else 1.0
        rows.append(row)
        log.info("%-34s %6.2f tok/s  speedup %.2fx (cpu-time %.2fx)  tau %.2f  fed/step %5.1f  equal %s", name,
                 row["tokens_per_s"], row["speedup"], row["cpu_speedup"], row["accept_length"],
                 row["tokens_fed_per_step"], row["matches_vanilla"])
    return rows


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    pair, prompts, decoders = setup(args)
    rows = summarize(measure(decoders, prompts, args.max_new_tokens), len(prompts))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"model": pair.target_name, "dtype": str(pair.dtype), "rows": rows,
                                              "max_new_tokens": args.max_new_tokens, "limit": args.limit}, indent=1))


if __name__ == "__main__":
    main()
