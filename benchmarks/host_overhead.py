"""Host overhead per decode step, per decoder config, on models whose forward is near-free; a CI gate on it.

What a GPU user needs to know before trusting a speedup: the Python work each decoder does between model
forwards (harness/job/overhead.py explains the measurement and the phases). Here every ``conf/decoder/*.yaml`` (a
run's own construction path) decodes the same prompts on a tiny random float32 model pair, the draft a twin of
the target (acceptance 1.0: every step carries a full draft, the worst case for per-token work), EOS ignored,
one torch thread, decoders interleaved round by round. The table gives, per decode step: host milliseconds
(median over the decodes), by phase, the model-forward milliseconds subtracted from it, the ratio to vanilla's
host time, and the budget a decoder family must meet on this CPU::

    .venv/bin/python benchmarks/host_overhead.py                         # the table (~1 min on 2 cores)
    .venv/bin/python benchmarks/host_overhead.py --decoders vanilla,speculative --rounds 5
    .venv/bin/python benchmarks/host_overhead.py --write-baseline benchmarks/baselines/host_overhead.json
    .venv/bin/python benchmarks/host_overhead.py --check benchmarks/baselines/host_overhead.json   # CI gate
    .venv/bin/python benchmarks/host_overhead.py --markdown benchmarks/baselines/host_overhead.json  # as docs/gpu.md

The gate (``--check``) compares each decoder's host time as a ratio to vanilla's host time in the same run
(CPU speed and load cancel) with the baseline's ratio, and fails (exit 1) when the ratio more than doubled
(``--margin 1.0``) while the decoder's own host time also grew by more than half (``--abs-margin 0.5``; see
:func:`check` for why both), naming the decoder and the phase that grew most; a baseline made with other
settings is refused (exit 2). Decoders missing on either side are listed, not gated. Budgets (milliseconds per
step on this CPU, :data:`BUDGET_MS`) are printed as met / MISSED; they are goals, the gate is the ratio.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

#: Host-time budget per decode step, in milliseconds, by decoder class (external references have none).
BUDGET_MS = {
    "VanillaDecoder": 0.3,
    "SpeculativeDecoder": 0.3,
    "PromptLookupDecoder": 0.3,
    "LookaheadDecoder": 1.5,
    "OuroborosDecoder": 1.5,
    "OptTreeDecoder": 1.5,
    "FixedTreeDecoder": 1.5,
}
#: The tiny pair (tests/conftest.py's TINY with a sharper LM head, so drafts and trees run deep).
TINY = dict(model_type="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=4096, logit_scale=16.0)
#: Settings that must match for two runs' ratios to be compared.
SETTINGS = ("max_new_tokens", "prompt_tokens", "prompts", "dtype", "device", "threads")


def _prompts(tok, n: int, length: int, device: torch.device) -> list[torch.Tensor]:
    """``n`` prompts of ``length`` byte tokens: code-like text with repetition (what n-gram drafts feed on)."""
    text = ("def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(add(i, i))\n"
            "The quick brown fox jumps over the lazy dog. ")
    out = []
    for i in range(n):
        ids = tok((text[i * 7 :] + text) * (length // len(text) + 2), add_special_tokens=False).input_ids[:length]
        out.append(torch.tensor([ids], device=device))
    return out


def _decoders(names: list[str], target, draft, tok) -> dict:
    """``{name: decoder}`` for each conf/decoder config in ``names``, built as a run builds them, EOS ignored."""
    from harness.api import build_decoder
    from harness.job.models import ModelPair

    pair = ModelPair(target, draft, tok, "tiny-random", "tiny-random-twin", target.dtype, target.device)
    from harness.config.precheck import decoder_key

    return {decoder_key(name): build_decoder(name, pair, eos_token_ids=frozenset()) for name in names}


def measure(args) -> dict:
    """Profile every decoder; returns the JSON document (settings + one entry per decoder)."""
    from harness.job.models import build_byte_tokenizer, build_tiny_random
    from harness.job.overhead import ForwardTimer, profile, summarize
    from harness.rows.machine import device_name

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    tok = build_byte_tokenizer()
    target = build_tiny_random(TINY, seed=0, vocab_size=len(tok)).to(device=device, dtype=dtype).eval()
    draft = copy.deepcopy(target)  # a twin: every draft token is accepted
    prompts = _prompts(tok, args.prompts, args.prompt_tokens, device)
    decoders = _decoders(_names(args), target, draft, tok)
    runs: dict[str, list] = {name: [] for name in decoders}
    names = list(decoders)
    for dec in decoders.values():  # warm-up, untimed
        dec.generate(prompts[0], args.max_new_tokens)
    with ForwardTimer([target, draft], device) as timer:
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:  # rotated order
                runs[name] += profile(decoders[name], prompts, args.max_new_tokens, timer)
    doc = {"settings": _settings(args),
           "machine": {"device_name": device_name(device), "cores": os.cpu_count(), "load_1m": os.getloadavg()[0],
                       "torch": torch.__version__},
           "decoders": {}}
    vanilla = summarize(runs["vanilla"]).host_ms if "vanilla" in runs else None
    for name, decoder in decoders.items():
        o = summarize(runs[name])
        cls = type(decoder).__name__
        doc["decoders"][name] = {
            "class": cls, "host_ms": o.host_ms, "forward_ms": o.forward_ms, "phases_ms": o.phases_ms,
            "steps": o.steps, "tokens_per_step": o.tokens_per_step, "runs": o.runs,
            "ratio_to_vanilla": o.host_ms / vanilla if vanilla else None, "budget_ms": BUDGET_MS.get(cls),
        }
    return doc


def table(doc: dict) -> str:
    from harness.job.overhead import PHASES

    s = doc["settings"]
    m = doc["machine"]
    lines = [f"host overhead per decode step (ms), tiny twin pair, {s['dtype']} on {s['device']}, {s['threads']} "
             f"thread(s), {s['prompts']} prompts x {s['prompt_tokens']} tokens, {s['max_new_tokens']} new tokens, "
             f"EOS ignored; {m['device_name']}, load {m['load_1m']:.2f}, torch {m['torch']}",
             f"{'decoder':<24} {'tok/step':>8} {'fwd':>6} {'host':>6} {'x van':>6} {'budget':>7}  "
             + " ".join(f"{p[:7]:>7}" for p in PHASES)]
    for name, d in doc["decoders"].items():
        budget = d["budget_ms"]
        verdict = "-" if budget is None else ("met" if d["host_ms"] <= budget else "MISSED")
        ratio = "-" if d["ratio_to_vanilla"] is None else f"{d['ratio_to_vanilla']:.1f}"
        lines.append(f"{name:<24} {d['tokens_per_step']:>8.2f} {d['forward_ms']:>6.2f} {d['host_ms']:>6.3f} "
                     f"{ratio:>6} {('<=' + str(budget)) if budget else '-':>7}  "
                     + " ".join(f"{d['phases_ms'].get(p, 0.0):>7.3f}" for p in PHASES) + f"  {verdict}")
    return "\n".join(lines)


def markdown(doc: dict) -> str:
    """A measurement as the Markdown table of docs/gpu.md (``--markdown``): one row per decoder, milliseconds per
    decode step, the budget met or **missed**."""
    from harness.job.overhead import PHASES
    from harness.report.tables import md_table

    rows = []
    for name, d in doc["decoders"].items():
        budget = d["budget_ms"]
        verdict = "-" if budget is None else f"≤ {budget} " + ("met" if d["host_ms"] <= budget else "**missed**")
        ratio = "-" if d["ratio_to_vanilla"] is None else f"{d['ratio_to_vanilla']:.1f}"
        rows.append([name, f"{d['tokens_per_step']:.2f}", f"{d['forward_ms']:.2f}", f"{d['host_ms']:.3f}", ratio,
                     verdict, *(f"{d['phases_ms'].get(p, 0.0):.3f}" for p in PHASES)])
    header = ["decoder", "tok/step", "fwd ms", "host ms", "× vanilla", "budget", *PHASES]
    return md_table(header, [False] + [True] * 4 + [False] + [True] * len(PHASES), rows)


def check(baseline: dict, current: dict, margin: float, abs_margin: float = 0.5) -> tuple[int, list[str]]:
    """Compare ratios to vanilla. Returns ``(exit status, lines)``: 0 pass, 1 a decoder regressed, 2 the runs are
    not comparable (settings differ, no vanilla).

    A decoder regressed when its ratio to vanilla's host time grew past ``baseline x (1 + margin)`` AND its own
    host time grew past ``baseline x (1 + abs_margin)``. Either alone moves without a change of code: vanilla's
    host time is ~0.05 ms, and from one process to the next it moved by up to 1.6x (five quiet runs on the 2-core
    runner: ratios of one decoder within 1.8x of each other, absolute host times within 1.45x), while a whole
    process running slower moves every absolute time. A decoder whose host work doubles moves both."""
    diff = _settings_diff(baseline["settings"], current["settings"])
    if diff:
        return 2, [f"not comparable: {d}" for d in diff]
    b, c = baseline["decoders"], current["decoders"]
    if "vanilla" not in b or "vanilla" not in c:
        return 2, ["not comparable: vanilla (the ratios' reference) is missing on one side"]
    lines, failed = [], 0
    was, now = baseline.get("machine", {}).get("device_name"), current.get("machine", {}).get("device_name")
    if was != now:
        lines.append(f"note: baseline measured on {was}, this run on {now}; the ratios to vanilla are compared "
                     "(CPU speed cancels), but another instruction set can move them")
    for name in sorted(set(b) | set(c)):
        if name not in b or name not in c:
            lines.append(f"{name}: only in the {'current run' if name in c else 'baseline'} (not gated)")
            continue
        rb, rc = b[name]["ratio_to_vanilla"], c[name]["ratio_to_vanilla"]
        hb, hc = b[name]["host_ms"], c[name]["host_ms"]
        limit = rb * (1 + margin)
        if rc > limit and hc > hb * (1 + abs_margin):
            failed += 1
            grew = max(c[name]["phases_ms"], key=lambda p: c[name]["phases_ms"][p] - b[name]["phases_ms"].get(p, 0.0))
            lines.append(f"{name}: FAIL host time {rc:.2f}x vanilla's, baseline {rb:.2f}x (limit {limit:.2f}x), "
                         f"{hc:.3f} ms/step against {hb:.3f}; phase grown most: {grew} "
                         f"({b[name]['phases_ms'].get(grew, 0.0):.3f} -> {c[name]['phases_ms'][grew]:.3f} ms/step)")
        else:
            lines.append(f"{name}: ok {rc:.2f}x vanilla's host time (baseline {rb:.2f}x, limit {limit:.2f}x), "
                         f"{hc:.3f} ms/step (baseline {hb:.3f})")
    lines.append(f"host-overhead gate: {'FAILED, ' + str(failed) + ' decoder(s)' if failed else 'passed'} "
                 f"(vanilla {c['vanilla']['host_ms']:.3f} ms/step now, {b['vanilla']['host_ms']:.3f} in the baseline)")
    return (1 if failed else 0), lines


def _settings(args) -> dict:
    """The measurement settings that must match for two runs' ratios to be compared (:data:`SETTINGS`)."""
    return {k: getattr(args, k) for k in SETTINGS}


def _settings_diff(baseline: dict, current: dict) -> list[str]:
    """One phrase per setting that differs, e.g. ``max_new_tokens is 64 in the baseline, 32 now``."""
    return [f"{k} is {baseline.get(k)!r} in the baseline, {current.get(k)!r} now" for k in SETTINGS
            if baseline.get(k) != current.get(k)]


def _names(args) -> list[str]:
    """The decoder configs to measure: ``--decoders``, default every one."""
    from harness.config.precheck import available

    return args.decoders.split(",") if args.decoders else available("decoder")


def _refusal(args) -> tuple[str | None, dict | None]:
    """``(one-line problem or None, the baseline document or None)``: every check that needs no measurement."""
    from harness.config.precheck import available as configs

    available, names = configs("decoder"), _names(args)
    unknown = sorted(set(names) - set(available))
    if unknown:
        return f"unknown decoder config(s) {', '.join(unknown)}; choose from {', '.join(available)}", None
    for flag in ("max_new_tokens", "prompt_tokens", "prompts", "rounds", "threads"):
        if getattr(args, flag) < (2 if flag == "max_new_tokens" else 1):
            return f"--{flag.replace('_', '-')} {getattr(args, flag)}: must be >= " \
                   f"{2 if flag == 'max_new_tokens' else 1}", None
    try:
        device = torch.device(args.device)
    except RuntimeError:
        return f"--device {args.device}: not a torch device name (cpu, cuda, cuda:N)", None
    if (device.type == "cuda" and not torch.cuda.is_available()) or (
            device.type == "mps" and not torch.backends.mps.is_available()) or device.type not in ("cpu", "cuda", "mps"):
        return f"--device {args.device}: torch {torch.__version__} has no such device here; use --device cpu", None
    if not args.check:
        return None, None
    if not args.check.is_file():
        return f"baseline {args.check} is not a file; write one with --write-baseline", None
    try:
        baseline = json.loads(args.check.read_text())
        wanted = baseline["settings"]
    except (ValueError, KeyError, TypeError):
        return f"baseline {args.check} is not a host-overhead baseline (JSON with 'settings'); rewrite it with " \
               "--write-baseline", None
    diff = _settings_diff(wanted, _settings(args))
    if diff:
        return f"--check compares runs with the baseline's settings, these differ: {'; '.join(diff)}", None
    if "vanilla" not in names:
        return "--check needs vanilla among --decoders (the ratios' reference)", None
    return None, baseline


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decoders", help="comma list of conf/decoder configs (default: every one)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=400)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="timed passes over every decoder, order rotated")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--json", type=Path, help="also write the measurement here")
    parser.add_argument("--write-baseline", type=Path, help="write the measurement as the gate's baseline")
    parser.add_argument("--check", type=Path, help="gate against this baseline (exit 1 on a regression)")
    parser.add_argument("--margin", type=float, default=1.0, help="allowed growth of a ratio to vanilla")
    parser.add_argument("--abs-margin", type=float, default=0.5, help="allowed growth of a decoder's host time")
    parser.add_argument("--markdown", type=Path, help="print this saved measurement (a baseline) as docs/gpu.md's "
                                                      "table and exit; measures nothing")
    args = parser.parse_args(argv)
    if args.markdown:
        try:
            print(markdown(json.loads(args.markdown.read_text())))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            print(f"error: --markdown {args.markdown}: not a saved measurement ({type(e).__name__}: {e}); give a file "
                  "written by --json or --write-baseline", file=sys.stderr)
            return 2
        return 0
    problem, baseline = _refusal(args)  # before any model is built
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    doc = measure(args)
    print(table(doc))
    for path in (args.json, args.write_baseline):
        if path:
            path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
            print(f"wrote {path}")
    if baseline is not None:
        status, lines = check(baseline, doc, args.margin, args.abs_margin)
        print("\n".join(lines))
        return status
    return 0


if __name__ == "__main__":
    sys.exit(main())
