"""What the development probes (lookahead_sweep.py, ouroboros_probe.py) share: their model and prompt arguments,
the configured model pair with the first HumanEval problems rendered the way the runner renders them, and the
forward cost curve they log."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from decoders.common.cost import forward_cost_curve
from decoders.common.stopping import collect_eos_token_ids
from harness.job.models import load_pair
from tasks.humaneval import HumanEval

ROOT = Path(__file__).resolve().parent.parent


def add_model_arguments(parser: argparse.ArgumentParser, limit: int) -> None:
    """``--model``, ``--dtype``, ``--device``, ``--limit`` (default ``limit``) and ``--max-new-tokens``."""
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", help="conf/model/<name>.yaml")
    parser.add_argument("--dtype", default=None, help="override the model config's dtype")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--limit", type=int, default=limit, help="first N HumanEval problems")
    parser.add_argument("--max-new-tokens", type=int, default=128)


def load_prompts(args: argparse.Namespace, need_draft: bool
                 ) -> tuple[Any, frozenset[int], list[tuple[str, torch.Tensor]]]:
    """The model pair of ``conf/model/<args.model>.yaml`` (``args.dtype`` overriding its dtype; the draft only
    when ``need_draft``), its EOS ids and the first ``args.limit`` HumanEval prompts as ``(sample id,
    (1, prompt_len) token ids on the pair's device)``."""
    model_cfg = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "model" / f"{args.model}.yaml"), resolve=True)
    if args.dtype:
        model_cfg["dtype"] = args.dtype
    pair = load_pair(model_cfg, device=args.device, need_draft=need_draft)
    tok = pair.tokenizer
    eos = collect_eos_token_ids(tok, pair.target.generation_config)
    task = HumanEval(limit=args.limit)
    prompts = []
    for sample in task.samples():
        text = task.render(sample, tok, task.uses_chat(tok, model_cfg.get("chat_template")))
        ids = tok(text, add_special_tokens=False, return_tensors="pt").input_ids.to(pair.device)
        prompts.append((sample.sample_id, ids))
    return pair, eos, prompts


def log_cost_curve(log: logging.Logger, label: str, model: Any, counts: list[int], context: torch.Tensor) -> None:
    """Log ``model``'s forward cost by tokens fed (:func:`decoders.common.cost.forward_cost_curve`, after
    ``context``), each also as a multiple of the first count's: ``<label> (s) by tokens fed: ...``."""
    curve = forward_cost_curve(model, counts, context=context)
    base = curve[counts[0]]
    log.info("%s (s) by tokens fed: %s", label, ", ".join(f"{n}: {t:.3f} ({t / base:.2f}x)" for n, t in curve.items()))
