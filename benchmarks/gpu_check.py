"""The steps of benchmarks/gpu_check.sh that run Python: environment, equality on the device, timing.

    python benchmarks/gpu_check.py env      --out DIR
    python benchmarks/gpu_check.py equality --out DIR --device cuda --dtype float32   # exit 1 on a divergence
    python benchmarks/gpu_check.py equality --out DIR --device cuda --dtype bfloat16  # first-divergence figures
    python benchmarks/gpu_check.py timing   --out DIR --device cuda --shapes qwen2.5-1.5b

* ``equality``: every ``conf/decoder/*.yaml`` (a run's construction path) decodes 12 prompts greedily with the
  tests' tiny random pair (the draft a noisy copy of the target) on the device; each output is compared over
  the whole sequence with vanilla's. Rows: ``equality_<dtype>.jsonl``. float32 is the losslessness contract
  (exit 1 on any difference); bfloat16 reports, per decoder, how many outputs equal vanilla's and the first
  divergent token index (batched and one-token forwards round differently in half precision). In either dtype a
  config that raises, or cannot run after another's CUDA error, fails the step (exit 1).
* ``timing``: a randomly initialised target of the real target's shape (``qwen2.5-1.5b``: Qwen2.5(-Coder) 1.5B;
  or ``tiny`` for a dry run), bfloat16 on CUDA, EOS ignored, one config per decoder family (:data:`TIMED`, their
  defaults). Per decoder: tokens/s over timed decodes (synchronized :class:`harness.job.timing.Stopwatch`, warm-up
  excluded, order rotated), speedup over vanilla, accept length, and host overhead per step
  (:mod:`harness.job.overhead`). The draft is a copy of the target (self-draft: every model-drafted token accepted):
  the ceiling of acceptance, at a 1.5B draft's cost (the real pair's 0.5B draft would be cheaper and less often
  right). ``hf_greedy`` beside ``vanilla`` shows whether our plain loop is handicapped. Rows: ``timing.jsonl``.

Every step writes its rows and a few summary lines under ``--out``; nothing is read from the network.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402

#: Target shapes of the real pair (the converted Qwen2.5-Coder 1.5B config), for randomly initialised models; the
#: draft is a copy of the target (self-draft), so no draft shape is needed.
QWEN = dict(model_type="qwen2", vocab_size=151936, max_position_embeddings=32768, rms_norm_eps=1e-6,
            rope_theta=1_000_000.0, tie_word_embeddings=False, use_sliding_window=False,
            num_key_value_heads=2)
SHAPES = {
    "qwen2.5-1.5b": dict(QWEN, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12),
    "tiny": dict(QWEN, vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4),
}
#: One config per decoder family (their defaults), for the timing step.
TIMED = ["vanilla", "hf_greedy", "speculative", "prompt_lookup", "lookahead", "ouroboros", "opt_tree",
         "opt_tree_hybrid", "hf_assisted"]


def _write(out: Path, name: str, rows: list[dict]) -> None:
    with open(out / name, "w") as f:
        for r in rows:
            f.write(json.dumps(r, sort_keys=True) + "\n")


def _build(name: str, target, draft, eos, tok):
    """The decoder of ``conf/decoder/<name>.yaml`` on these models, built as a run builds it."""
    from harness.api import build_decoder
    from harness.job.models import ModelPair

    return build_decoder(name, ModelPair(target, draft, tok, "random", "random-draft", target.dtype, target.device),
                         eos_token_ids=eos)


def env(args) -> int:
    import transformers

    info = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "cuda_available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda,
            "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()}
    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        info.update(device=torch.cuda.get_device_name(0), device_count=torch.cuda.device_count(),
                    memory_free_gib=round(free / 2**30, 1), memory_total_gib=round(total / 2**30, 1))
    (args.out / "env.json").write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
    print(" ".join(f"{k}={v}" for k, v in sorted(info.items())))
    return 0


def equality(args) -> int:
    from conftest import PROMPTS, TINY, make_noisy_draft

    from decoders.common.stopping import collect_eos_token_ids
    from harness.config.precheck import available
    from harness.job.models import build_byte_tokenizer, build_tiny_random

    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    tok = build_byte_tokenizer()
    base = build_tiny_random(TINY, seed=0, vocab_size=len(tok))
    target = base.to(device=device, dtype=dtype).eval()
    draft = make_noisy_draft(build_tiny_random(TINY, seed=0, vocab_size=len(tok))).to(device=device, dtype=dtype).eval()
    eos = collect_eos_token_ids(tok, target.generation_config)
    chosen = PROMPTS[:args.equality_prompts] if args.equality_prompts else PROMPTS
    prompts = [torch.tensor([tok(p, add_special_tokens=False).input_ids], device=device) for p in chosen]
    names = [n for n in available("decoder") if not args.only or n in args.only.split(",")]
    vanilla_dec = _build("vanilla", target, draft, eos, tok)
    ref = [vanilla_dec.generate(ids, args.max_new_tokens).token_ids for ids in prompts]
    rows, lines, differ, broke = [], [], 0, 0  # broke: configs that raised or never ran (fail in every dtype)
    txt = args.out / f"equality_{args.dtype}.txt"
    def head(checked: int) -> str:
        done = "" if checked == len(names) else f" of {checked} checked so far ({len(names) - checked} not reached)"
        return (f"whole-sequence equality with vanilla, {args.dtype} on {device}, {len(prompts)} prompts x "
                f"{args.max_new_tokens} new tokens, tiny random pair: {checked - differ}/{len(names)} configs "
                f"equal{done}")

    lost = None  # the config whose CUDA error left the context unusable: every later call would fail too
    for name in names:
        if lost:
            rows.append({"decoder": name, "dtype": args.dtype, "error": f"not run: CUDA context lost ({lost})"})
            lines.append(f"{name:<24} NOT RUN (the CUDA context was lost in {lost})")
            differ += 1
            broke += 1
            continue
        try:
            dec = _build(name, target, draft, eos, tok)
            outs = [dec.generate(ids, args.max_new_tokens).token_ids for ids in prompts]
        except Exception as e:  # noqa: BLE001 -- a decoder that fails on the device is a finding, reported
            rows.append({"decoder": name, "dtype": args.dtype, "error": f"{type(e).__name__}: {e}"})
            lines.append(f"{name:<24} ERROR {type(e).__name__}: {str(e).splitlines()[0][:120]}")
            print(lines[-1], flush=True)
            differ += 1
            broke += 1
            if "CUDA error" in str(e):  # sticky: the process cannot use the device again
                lost = name
            continue
        firsts = []
        for i, (a, b) in enumerate(zip(ref, outs)):
            first = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
            if first is None and len(a) != len(b):
                first = min(len(a), len(b))
            firsts.append(first)
            rows.append({"decoder": name, "dtype": args.dtype, "prompt": i, "equal": first is None,
                         "first_divergence": first, "new_tokens": len(b), "vanilla_tokens": len(a)})
        bad = [f for f in firsts if f is not None]
        differ += bool(bad)
        lines.append(f"{name:<24} {len(firsts) - len(bad):>2}/{len(firsts)} equal"
                     + (f", first divergence at token {min(bad)} (median {sorted(bad)[len(bad) // 2]})" if bad else ""))
        print(lines[-1], flush=True)  # as it goes: a step stopped at its time limit keeps what it checked
        _write(args.out, f"equality_{args.dtype}.jsonl", rows)
        txt.write_text("\n".join([head(len(lines)), *lines]) + "\n")
    _write(args.out, f"equality_{args.dtype}.jsonl", rows)
    text = "\n".join([head(len(names)), *lines])
    txt.write_text(text + "\n")
    print(text)
    # float32: any difference fails (the losslessness contract); bfloat16: divergent tokens are reported, but a
    # config that raised or could not run fails the step in every dtype
    return 1 if broke or (differ and args.dtype == "float32") else 0


def _random_model(config: dict, dtype: torch.dtype, device: torch.device, seed: int):
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(config)
    cfg = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(seed)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()


def timing(args) -> int:
    from harness.job.models import build_byte_tokenizer
    from harness.job.overhead import ForwardTimer, profile, summarize
    from harness.job.timing import Stopwatch

    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    t0 = time.perf_counter()
    target = _random_model(SHAPES[args.shapes], dtype, device, seed=0)
    # Self-draft: a copy of the target (its own module, so hooks and transformers' assisted generation count the
    # draft's calls apart), every model-drafted token accepted: the ceiling of what drafting can give.
    draft = copy.deepcopy(target)
    build_s = time.perf_counter() - t0
    tok = build_byte_tokenizer()  # decoders that want a tokenizer get one; ids come from the prompts below
    g = torch.Generator().manual_seed(0)
    vocab = 256  # byte ids: every tokenizer-reading decoder can decode the prompt
    # Code-like repetition so the n-gram decoders find matches: a random 24-token phrase repeated.
    phrase = torch.randint(0, vocab, (24,), generator=g).tolist()
    prompts = [torch.tensor([(phrase * (args.prompt_tokens // 24 + 1))[i: i + args.prompt_tokens]], device=device)
               for i in range(args.prompts)]
    decoders = {}
    for name in args.decoders.split(","):
        try:
            decoders[name] = _build(name, target, draft, frozenset(), tok)
        except Exception as e:  # noqa: BLE001
            print(f"{name}: could not be built: {type(e).__name__}: {e}")
    rows: list[dict] = []
    names = list(decoders)
    for name in list(names):  # warm-up (kernels, caches), untimed; a decoder that fails here is reported, dropped
        try:
            w0 = time.perf_counter()
            decoders[name].generate(prompts[0], args.max_new_tokens)
            print(f"{name}: warm-up decode {time.perf_counter() - w0:.1f} s", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"{name}: failed on the device, left out: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
            rows.append({"decoder": name, "error": f"{type(e).__name__}: {e}"})
            names.remove(name)
    for r in range(args.repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:
            for i, ids in enumerate(prompts):
                watch = Stopwatch(device)
                watch.start()
                res = decoders[name].generate(ids, args.max_new_tokens, stopwatch=watch)
                wall = watch.stop()
                rows.append({"decoder": name, "prompt": i, "repeat": r, "new_tokens": res.new_tokens,
                             "wall_s": wall, "tokens_per_s": res.new_tokens / wall,
                             "accept_length": res.accept_length, **watch.columns(res.new_tokens)})
    with ForwardTimer([target, draft], device) as timer:
        overhead = {name: summarize(profile(decoders[name], prompts, args.max_new_tokens, timer)) for name in names}
    for name, o in overhead.items():
        rows.append({"decoder": name, "host_ms_per_step": o.host_ms, "forward_ms_per_step": o.forward_ms,
                     "phases_ms": o.phases_ms, "kind": "overhead"})
    _write(args.out, "timing.jsonl", rows)
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    tps = {n: med([r["tokens_per_s"] for r in rows if r.get("decoder") == n and "wall_s" in r]) for n in names}
    acc = {n: med([r["accept_length"] for r in rows if r.get("decoder") == n and "wall_s" in r]) for n in names}
    van = tps.get("vanilla")
    lines = [f"timing: random {args.shapes} shapes, {args.dtype} on {device} (built in {build_s:.1f} s), "
             f"{args.prompts} prompts x {args.prompt_tokens} tokens, {args.max_new_tokens} new tokens, EOS ignored, "
             f"self-draft, {args.repeats} timed repeats (median)",
             f"{'decoder':<18} {'tok/s':>8} {'x vanilla':>9} {'accept':>7} {'host ms/step':>12} {'fwd ms/step':>11}"]
    for n in names:
        lines.append(f"{n:<18} {tps[n]:>8.1f} {tps[n] / van if van else float('nan'):>9.2f} {acc[n]:>7.2f} "
                     f"{overhead[n].host_ms:>12.3f} {overhead[n].forward_ms:>11.2f}")
    if van and "hf_greedy" in tps:
        lines.append(f"vanilla / hf_greedy tokens/s: {van / tps['hf_greedy']:.3f} (goal >= 1.0)")
    text = "\n".join(lines)
    (args.out / "timing.txt").write_text(text + "\n")
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=["env", "equality", "timing"])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--shapes", default="qwen2.5-1.5b", choices=sorted(SHAPES))
    parser.add_argument("--prompts", type=int, default=2, help="timing: prompts per decoder")
    parser.add_argument("--equality-prompts", type=int, default=0,
                        help="equality: the first N test prompts (0: all of them)")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--decoders", default=",".join(TIMED), help="timing: decoder configs")
    parser.add_argument("--only", default="", help="equality: these decoder configs only (comma-separated)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"error: --device {args.device} but torch {torch.__version__} sees no CUDA device "
              "(run with --dry-run on a machine without one)", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    return {"env": env, "equality": equality, "timing": timing}[args.step](args)


if __name__ == "__main__":
    sys.exit(main())
