"""Lookahead decoding and Ouroboros sample from the target's own distribution.

Same method as test_sampling_decoders.py (:mod:`sampling_stats`): tiny float32 models with an 8-id vocabulary,
the exact distribution of the first ``LOOKAHEAD_NEW`` / ``OUROBOROS_NEW`` tokens (cut after the EOS id 7)
enumerated as the product of the target's processed conditional distributions (temperature 0.8, top-k 6,
top-p 0.95), compared with each decoder's outputs over fixed seeds by chi-square (whole sequences and each position's marginal,
Bonferroni-combined; false-alarm rate ``ALPHA`` = 1e-3 per test for a random seed; deterministic with these
seeds).

The generation lengths are chosen so that every part of the rules runs within them: lookahead with ``N = 3``
and 4 new tokens verifies 2-token n-grams after the first token (a second depth that continues only along the
accepted candidate); Ouroboros with ``gamma = 2``, ``N = 3`` and 5 new tokens samples a 2-token trunk (the
drafter's own lookahead step verifying 1-token n-grams against the draft's distribution) followed by 1-token
pool suffixes. The prompt is the target's greedy continuation of token 1 and the pool is seeded with its
n-grams, so candidates exist from the first step; each test also checks that candidates were accepted AND
rejected (the rule was exercised, not bypassed).

Each test is shown to fail on deliberately wrong variants (:func:`sampling_stats.wrong_tree_verify` swapped
into the decoder module): accepting a candidate that is the target's most likely token, and not removing a
rejected candidate's mass (resampling from ``target_probs``); for Ouroboros also a drafter whose trunk is not
drawn from the distribution it reports (the wrong rule swapped into the drafter's lookahead step only).
Treating Ouroboros' sampled trunk as deterministic is NOT such a variant: it is lossless too (see
test_sampling_verify.py::test_sampled_trunk_verified_as_deterministic_is_lossless_but_accepts_less).
"""

from __future__ import annotations

import collections

import pytest
import torch

import decoders.common.lookahead_step
import decoders.ouroboros
from decoders.common.sampling import SamplingConfig
from decoders.lookahead import LookaheadDecoder
from decoders.ouroboros import OuroborosDecoder
from sampling_stats import (ALPHA, TREE_MISTAKES, distribution_pvalue, exact_sequence_probs, greedy_prompt,
                            sample_counts, sharpened, tiny_model, wrong_tree_verify)

SAMPLING = SamplingConfig(temperature=0.8, top_p=0.95, top_k=6)
EOS = frozenset({7})
RUNS = 600         # correct decoders
WRONG_RUNS = 400   # a subtly wrong drafter
GROSS_RUNS = 200   # wrong verifiers
LOOKAHEAD_NEW = 4
OUROBOROS_NEW = 5


@pytest.fixture(scope="module", autouse=True)
def one_thread():
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
    return {n: exact_sequence_probs(target, prompt, SAMPLING, n, EOS) for n in (LOOKAHEAD_NEW, OUROBOROS_NEW)}


def _lookahead(target):
    return LookaheadDecoder(target, window_size=2, ngram_size=3, guess_set_size=4, pool_from_prompt=True,
                            eos_token_ids=EOS, sampling=SAMPLING)


def _ouroboros(target, draft, **options):
    return OuroborosDecoder(target, draft, gamma=2, window_size=2, ngram_size=3, guess_set_size=4, topk=3,
                            pool_from_prompt=True, eos_token_ids=EOS, sampling=SAMPLING, **options)


def _run(decoder, prompt, exact, max_new, runs):
    """p-value of the decoder's outputs over ``runs`` seeds, and its summed step records' counters."""
    ids = torch.tensor([prompt])
    stats = collections.Counter()

    def generate(g):
        result = decoder.generate(ids, max_new, generator=g)
        for s in result.steps:
            stats.update(drafted=s.drafted, accepted=s.accepted, **s.source)
        return result.token_ids

    counts = sample_counts(generate, runs, seed=20_000)
    return distribution_pvalue(counts, exact[max_new]), stats


def _exercised(stats, *keys):
    """Candidates were both accepted and rejected (the rule ran, it was not bypassed)."""
    assert 0 < stats["accepted"] < stats["drafted"], stats
    for key in keys:
        assert stats[key] > 0, (key, stats)


# --- lookahead decoding ----------------------------------------------------------------------------------

def test_lookahead_output_distribution_is_the_targets(target, prompt, exact):
    p, stats = _run(_lookahead(target), prompt, exact, LOOKAHEAD_NEW, RUNS)
    _exercised(stats)
    assert p > ALPHA


@pytest.mark.parametrize("mistake", TREE_MISTAKES)
def test_lookahead_test_rejects_wrong_verifier(mistake, monkeypatch, target, prompt, exact):
    monkeypatch.setattr(decoders.common.lookahead_step, "multi_candidate_tree_verify", wrong_tree_verify(mistake))
    p, _ = _run(_lookahead(target), prompt, exact, LOOKAHEAD_NEW, GROSS_RUNS)
    assert p < ALPHA


# --- Ouroboros -------------------------------------------------------------------------------------------

def test_ouroboros_output_distribution_is_the_targets(target, draft, prompt, exact):
    p, stats = _run(_ouroboros(target, draft), prompt, exact, OUROBOROS_NEW, RUNS)
    _exercised(stats, "suffix")
    assert p > ALPHA


def test_ouroboros_with_every_option(target, draft, prompt, exact):
    """Free drafts (a deterministic trunk), a reduced draft vocabulary (ids 0-5 and EOS), a confidence stop and
    runner-up branches (deterministic siblings tried after the sampled trunk token), all in one run."""
    decoder = _ouroboros(target, draft, free_draft_min_match=2, draft_vocab_size=6, stop_confidence=0.3,
                         branch_confidence=0.95, max_branches=2)
    p, stats = _run(decoder, prompt, exact, OUROBOROS_NEW, RUNS)
    _exercised(stats, "suffix", "free", "branch", "draft")
    assert p > ALPHA


@pytest.mark.parametrize("mistake", TREE_MISTAKES)
def test_ouroboros_test_rejects_wrong_verifier(mistake, monkeypatch, target, draft, prompt, exact):
    """The target's verification of trunk, suffixes and branches is wrong (the drafter is right)."""
    monkeypatch.setattr(decoders.ouroboros, "multi_candidate_tree_verify", wrong_tree_verify(mistake))
    p, _ = _run(_ouroboros(target, draft), prompt, exact, OUROBOROS_NEW, GROSS_RUNS)
    assert p < ALPHA


def test_ouroboros_test_rejects_trunk_not_drawn_from_its_draft_probs(monkeypatch, target, draft, prompt, exact):
    """The drafter's own lookahead step over-accepts the draft's argmax, so the trunk is not a sample of the
    distribution it reports as ``draft_probs``; the target's verification is right."""
    monkeypatch.setattr(decoders.common.lookahead_step, "multi_candidate_tree_verify",
                        wrong_tree_verify("accept_argmax"))
    p, _ = _run(_ouroboros(target, draft), prompt, exact, OUROBOROS_NEW, WRONG_RUNS)
    assert p < ALPHA
