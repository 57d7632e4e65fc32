"""Every sampling decoder draws from the target's own distribution.

Tiny float32 models with an 8-id vocabulary (:func:`sampling_stats.tiny_model`): the exact distribution of
the first ``MAX_NEW = 3`` tokens (cut after the EOS id 7) is enumerated as the product of the target's
processed conditional distributions (temperature 0.8, top-k 6, top-p 0.95: all three transformers warpers
active) and compared with each decoder's outputs over ``RUNS`` seeds -- whole sequences and each position's
marginal, chi-square, Bonferroni-combined, false-alarm rate ``ALPHA`` = 1e-3 per test (see
:mod:`sampling_stats`). The seeds are fixed, so the outcome is deterministic.

Measured p-values with these seeds: 0.16 .. 1 for the correct decoders; for the wrong variants below (with
``WRONG_RUNS`` / ``GROSS_RUNS`` runs) 1e-11 .. 1e-16 for the swapped speculative verifiers, 1e-15 .. 1e-62 for
prompt lookup's, 1e-31 for the ensemble, and 0 (outcomes of probability 0) for the unwarped variants.

Each test is shown to fail on a deliberately wrong variant: the verifiers of :mod:`sampling_stats` swapped into
the decoder module, transformers' lossy ``assistant_ensemble_weight`` (DIVERSE) for ``hf_assisted``, a
generation config without explicit top-k / top-p for ``hf_greedy`` (transformers' global default top_k=50 would
then apply), and unprocessed logits for vanilla.
"""

from __future__ import annotations

import pytest
import torch

import decoders.prompt_lookup
import decoders.speculative
from decoders.common.sampling import SamplingConfig
from decoders.hf_assisted import HFAssistedDecoder, HFGreedyDecoder
from decoders.prompt_lookup import PromptLookupDecoder
from decoders.speculative import SpeculativeDecoder
from decoders.vanilla import VanillaDecoder
from harness.models import build_tiny_random
from sampling_stats import (ALPHA, MISTAKES, VOCAB, distribution_pvalue, exact_sequence_probs, greedy_prompt,
                            sample_counts, sharpened, tiny_model, wrong_multi_candidate_verify, wrong_rejection_verify)

SAMPLING = SamplingConfig(temperature=0.8, top_p=0.95, top_k=6)
EOS = frozenset({7})
MAX_NEW = 3
RUNS = 600         # correct decoders
WRONG_RUNS = 400   # wrong verifiers swapped in
GROSS_RUNS = 200   # grossly wrong variants


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Forwards of a 16-wide model are fastest on one thread (no OpenMP hand-offs on a busy 2-core CI box)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=0, logit_scale=30.0)


@pytest.fixture(scope="module")
def draft(target):
    """Over-confident in the target's likely tokens: rejections and residual draws both happen."""
    return sharpened(target, factor=3.0, noise=0.3, seed=1)


@pytest.fixture(scope="module")
def prompt(target):
    return greedy_prompt(target)


@pytest.fixture(scope="module")
def exact(target, prompt):
    probs = exact_sequence_probs(target, prompt, SAMPLING, MAX_NEW, EOS)
    assert abs(sum(probs.values()) - 1) < 1e-6
    assert sum(p for s, p in probs.items() if len(s) < MAX_NEW) > 0.01  # the EOS path is exercised
    return probs


def _pvalue(decoder, prompt, exact, runs=RUNS) -> float:
    ids = torch.tensor([prompt])
    counts = sample_counts(lambda g: decoder.generate(ids, MAX_NEW, generator=g).token_ids, runs, seed=10_000)
    return distribution_pvalue(counts, exact)


def _decoders(target, draft):
    return {
        "vanilla": lambda: VanillaDecoder(target, EOS, sampling=SAMPLING),
        "speculative": lambda: SpeculativeDecoder(target, draft, gamma=2, eos_token_ids=EOS, sampling=SAMPLING),
        "prompt_lookup": lambda: PromptLookupDecoder(target, max_ngram_size=2, num_draft_tokens=2,
                                                     eos_token_ids=EOS, sampling=SAMPLING),
        "hf_assisted": lambda: HFAssistedDecoder(target, draft, gamma=2, num_assistant_tokens_schedule="constant",
                                                 assistant_confidence_threshold=0, eos_token_ids=EOS,
                                                 sampling=SAMPLING),
        "hf_greedy": lambda: HFGreedyDecoder(target, EOS, sampling=SAMPLING),
    }


@pytest.mark.parametrize("name", ["vanilla", "speculative", "prompt_lookup", "hf_assisted", "hf_greedy"])
def test_output_distribution_is_the_targets(name, target, draft, prompt, exact):
    assert _pvalue(_decoders(target, draft)[name](), prompt, exact) > ALPHA


def test_speculative_with_a_larger_draft_vocabulary(target, prompt, exact):
    """A draft whose (padded) vocabulary is larger than the target's may only propose ids the target has."""
    wide = build_tiny_random(dict(model_type="llama", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                  vocab_size=VOCAB + 3, logit_scale=30.0), seed=5, vocab_size=VOCAB)
    decoder = SpeculativeDecoder(target, wide, gamma=2, eos_token_ids=EOS, sampling=SAMPLING)
    assert _pvalue(decoder, prompt, exact, runs=RUNS // 2) > ALPHA


# --- the same tests reject deliberately wrong variants ---------------------------------------------------

@pytest.mark.parametrize("mistake", MISTAKES)
def test_speculative_test_rejects_wrong_verifier(mistake, monkeypatch, target, draft, prompt, exact):
    monkeypatch.setattr(decoders.speculative, "rejection_verify", wrong_rejection_verify(mistake))
    decoder = _decoders(target, draft)["speculative"]()
    assert _pvalue(decoder, prompt, exact, WRONG_RUNS) < ALPHA


@pytest.mark.parametrize("mistake", MISTAKES)
def test_prompt_lookup_test_rejects_wrong_verifier(mistake, monkeypatch, target, draft, prompt, exact):
    monkeypatch.setattr(decoders.prompt_lookup, "multi_candidate_verify", wrong_multi_candidate_verify(mistake))
    decoder = _decoders(target, draft)["prompt_lookup"]()
    assert _pvalue(decoder, prompt, exact, WRONG_RUNS) < ALPHA


def test_vanilla_test_rejects_unprocessed_logits(target, prompt, exact):
    """Sampling from softmax(logits) without the warpers (temperature 1, no top-k / top-p) is caught."""
    assert _pvalue(VanillaDecoder(target, EOS, sampling=SamplingConfig(1.0)), prompt, exact, GROSS_RUNS) < ALPHA


class _EnsembleAssisted(HFAssistedDecoder):
    """transformers' DIVERSE ensemble verification: accepts from w * target + (1 - w) * draft (lossy)."""

    def _generation_config(self, max_new_tokens):
        config = super()._generation_config(max_new_tokens)
        config.assistant_ensemble_weight = 0.3
        return config


class _ImplicitWarpers(HFGreedyDecoder):
    """top_k / top_p left unset: transformers fills in its global defaults (top_k=50, top_p=1.0)."""

    def _generation_config(self, max_new_tokens):
        config = super()._generation_config(max_new_tokens)
        config.top_k = config.top_p = None
        return config


def test_hf_assisted_test_rejects_lossy_verification(target, draft, prompt, exact):
    decoder = _EnsembleAssisted(target, draft, gamma=2, num_assistant_tokens_schedule="constant",
                                assistant_confidence_threshold=0, eos_token_ids=EOS, sampling=SAMPLING)
    assert _pvalue(decoder, prompt, exact, GROSS_RUNS) < ALPHA


def test_hf_greedy_test_rejects_implicit_warpers(target, prompt, exact):
    assert _pvalue(_ImplicitWarpers(target, EOS, sampling=SAMPLING), prompt, exact, GROSS_RUNS) < ALPHA
