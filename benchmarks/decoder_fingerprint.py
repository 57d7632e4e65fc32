"""Fingerprint of every decoder config's behaviour on tiny random models: outputs, per-step counters, extras.

A refactor of the decoders (the shared decode driver, a proposer's internals) must leave outputs AND counters
exactly as they were, greedy and sampled. Run this on the old commit and on the new code and compare::

    git worktree add /tmp/old <old-commit>
    (cd /tmp/old && /work/main/.venv/bin/python benchmarks/decoder_fingerprint.py > /tmp/old.json)
    .venv/bin/python benchmarks/decoder_fingerprint.py > /tmp/new.json
    .venv/bin/python benchmarks/decoder_fingerprint.py --compare /tmp/old.json /tmp/new.json

Every ``conf/decoder/*.yaml`` (a run's own construction path, :func:`harness.api.build_decoder`) decodes the
test prompts greedily in float32 and, for decoders that sample, at temperature 0.8 / top-k 6 / top-p 0.95 with
fixed seeds. The fingerprint holds each result's token ids, every :class:`~decoders.types.StepRecord` and the
``extra`` scalars. A cost-aware decoder (``opt_tree_cost``) sizes its trees by forward costs it measures, so its
steps and extras differ from run to run by design, and so do its sampled tokens (the tree's shape decides which
draws are made): only its greedy tokens are compared (it is marked ``timing_dependent``). ``--compare`` prints each difference and exits 1 when there is one (decoders present on one
side only are listed, not failed). No weights, no network; ~1 minute on 2 cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import torch  # noqa: E402

MAX_NEW_TOKENS = 40
SEEDS = (0, 1, 2)


def _models():
    from conftest import PROMPTS, TINY, make_noisy_draft
    from decoders.common.stopping import collect_eos_token_ids
    from harness.job.models import build_byte_tokenizer, build_tiny_random

    tok = build_byte_tokenizer()
    target = build_tiny_random(TINY, seed=0, vocab_size=len(tok))
    draft = make_noisy_draft(target)
    eos = collect_eos_token_ids(tok, target.generation_config)
    prompts = [torch.tensor([tok(p, add_special_tokens=False).input_ids]) for p in PROMPTS]
    return tok, target, draft, eos, prompts


def _result(res) -> dict:
    def plain(v):
        return v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)
    return {"tokens": list(res.token_ids),
            "steps": [dataclasses.asdict(s) for s in res.steps],
            "extra": {k: plain(v) for k, v in sorted(res.extra.items()) if not k.endswith("_time_s")}}


def fingerprint() -> dict:
    from decoders.common.sampling import SamplingConfig
    from harness.api import build_decoder
    from harness.config.precheck import available, decoder_key
    from harness.job.models import ModelPair

    torch.set_num_threads(1)
    tok, target, draft, eos, prompts = _models()
    pair = ModelPair(target, draft, tok, "tiny-random", "noisy-draft", target.dtype, target.device)
    out: dict = {}
    sampling = SamplingConfig(temperature=0.8, top_p=0.95, top_k=6)
    for name in available("decoder"):
        decoder = build_decoder(name, pair, eos_token_ids=eos)
        runs = [_result(decoder.generate(ids, MAX_NEW_TOKENS)) for ids in prompts]
        entry = {"greedy": runs}
        if getattr(decoder, "cost_aware", False):  # trees sized by forward costs measured at construction
            entry["timing_dependent"] = True
        if getattr(decoder, "supports_sampling", False) and not decoder_key(name).startswith("hf_"):
            sampler = build_decoder(name, pair, eos_token_ids=eos, sampling=sampling)
            entry["sampled"] = [_result(sampler.generate(ids, 12, generator=torch.Generator().manual_seed(s)))
                                for ids in prompts[:6] for s in SEEDS]
        out[decoder_key(name)] = entry
        print(f"{name}: done", file=sys.stderr)
    return out


def compare(a: dict, b: dict) -> int:
    diffs = 0
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            print(f"{name}: only in {'new' if name not in a else 'old'}")
            continue
        timed = a[name].get("timing_dependent") or b[name].get("timing_dependent")
        for mode in sorted((set(a[name]) | set(b[name])) - {"timing_dependent"}):
            ra, rb = a[name].get(mode), b[name].get(mode)
            if ra is None or rb is None:
                print(f"{name} {mode}: only in {'new' if ra is None else 'old'}")
                continue
            for i, (x, y) in enumerate(zip(ra, rb)):
                for key in ("tokens", "steps", "extra") if not timed else ("tokens",) if mode == "greedy" else ():
                    if x[key] != y[key]:
                        diffs += 1
                        detail = ""
                        if key == "steps":
                            j = next((j for j, (s, t) in enumerate(zip(x["steps"], y["steps"])) if s != t), None)
                            detail = f" first differing step {j}: {x['steps'][j] if j is not None else ''} -> " \
                                     f"{y['steps'][j] if j is not None else len(y['steps'])}"
                        elif key == "extra":
                            detail = " " + str({k: (x["extra"].get(k), y["extra"].get(k))
                                                for k in set(x["extra"]) | set(y["extra"])
                                                if x["extra"].get(k) != y["extra"].get(k)})
                        print(f"{name} {mode} run {i}: {key} differ{detail}")
    print(f"{diffs} difference(s)")
    return 1 if diffs else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"), help="compare two fingerprint files")
    args = parser.parse_args(argv)
    if args.compare:
        old, new = (json.loads(Path(p).read_text()) for p in args.compare)
        return compare(old, new)
    json.dump(fingerprint(), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
