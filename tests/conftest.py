"""Shared fixtures: tiny random fp32 models (no weights, no network) and a prompt set.

``target``: a 2-layer Qwen2-style model. ``noisy_draft``: the target with small weight noise, so drafts
are accepted often but not always (a realistic speculative regime). ``other_draft``: an unrelated
Llama-style model (acceptance near zero). ``confident``: target and noisy draft with sharpened LM heads (deep
trees). ``prompts``: 10+ prompts, several highly repetitive so n-gram pools and prompt lookup actually hit.
"""

from __future__ import annotations

import copy
import os

# Tests never touch the network; `datasets` reads this once, at import.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

# Under pytest-xdist each worker process runs its tests on one torch thread: two workers on two cores, no OpenMP
# threads fighting over them (the tiny models are fastest on one thread anyway).
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

from decoders.common.stopping import collect_eos_token_ids
import harness.config.compose  # noqa: F401  registers the base_* schemas every conf/ YAML lists (tests compose conf/ directly)
from harness.job.models import build_byte_tokenizer, build_tiny_random

TINY = dict(
    model_type="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=4096, vocab_size=260,
)

PROMPTS = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog.",
    "abcabcabcabcabcabcabcabcabcabc",
    "1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3,",
    "for i in range(10):\n    print(i)\nfor i in range(10):\n    print(i)\n",
    "x",
    "Once upon a time there was a",
    "<|im_start|>user\nWrite a poem.<|im_end|>\n<|im_start|>assistant\n",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "if x > 0:\n    y = x\nelse:\n    y = -x\nif x > 0:\n    y = x\nelse:\n",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit. Lorem ipsum dolor sit amet,",
    "the the the the the the the the the the the the",
]


@pytest.fixture(scope="session")
def tokenizer():
    return build_byte_tokenizer()


@pytest.fixture(scope="session")
def target(tokenizer):
    return build_tiny_random(TINY, seed=0, vocab_size=len(tokenizer))


def make_noisy_draft(target):
    """A copy of ``target`` with 2 % seeded weight noise: drafts accepted often but not always."""
    draft = copy.deepcopy(target)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02 * (p.std() if p.numel() > 1 else 1.0))
    return draft


@pytest.fixture(scope="session")
def noisy_draft(target):
    return make_noisy_draft(target)


@pytest.fixture(scope="session")
def confident(target, noisy_draft):
    """(target, draft): ``target`` and ``noisy_draft`` with LM heads scaled 25x: peaked distributions, drafts
    accepted often, trees grown deep (the tree decoders' tests)."""
    pair = []
    for m in (target, noisy_draft):
        m = copy.deepcopy(m)
        with torch.no_grad():
            m.get_output_embeddings().weight.mul_(25)
        pair.append(m)
    return tuple(pair)


@pytest.fixture(scope="session")
def other_draft(tokenizer):
    return build_tiny_random(dict(TINY, model_type="llama", hidden_size=32, intermediate_size=64), seed=1,
                             vocab_size=len(tokenizer))


@pytest.fixture(scope="session")
def eos_ids(tokenizer, target):
    return collect_eos_token_ids(tokenizer, target.generation_config)


@pytest.fixture(scope="session")
def prompt_ids(tokenizer):
    return [torch.tensor([tokenizer(p).input_ids]) for p in PROMPTS]
