"""Lookahead decoding and Ouroboros sample from the target's own distribution.

Same method as test_sampling_decoders.py (:mod:`sampling_stats`): tiny float32 models with an 8-id vocabulary,
the exact distribution of the first ``LOOKAHEAD_NEW`` / ``OUROBOROS_NEW`` tokens (cut after the EOS id 7)
enumerated as the product of the target's processed conditional distributions (temperature 0.6, top-k 6,
top-p 0.95), compared with each decoder's outputs over fixed seeds (its configuration's own,
:func:`sampling_stats.seed_base`) by chi-square (whole sequences, each position's marginal and each pair of
neighbouring positions, Bonferroni-combined; false-alarm rate ``ALPHA`` = 1e-3 per test for a random seed;
deterministic with these seeds).

The generation lengths are chosen so that every part of the rules runs within them: lookahead with ``N = 4``
and 5 new tokens verifies 3-token n-grams after the first token (deeper levels continue only along the accepted
candidate; then the bonus token after a whole accepted n-gram); Ouroboros with ``gamma = 2``, ``N = 3``
and 5 new tokens samples a 2-token trunk (the drafter's own lookahead step verifying 1-token n-grams against the
draft's distribution) followed by 1-token pool suffixes, then the bonus token after a whole accepted tree. The
prompt is the target's greedy continuation of token 1 and the pool is seeded with its n-grams, so candidates
(several per node) exist from the first step; each test also checks that candidates were accepted AND rejected
(the rule was exercised, not bypassed). Ouroboros runs in five configurations: pool suffixes, runner-up branches,
free (copied) trunks, every option at once, and a draft window (the draft reads a cut prompt).

Each test is shown to fail on deliberately wrong variants: the wrong rules of :mod:`sampling_stats` swapped in
for every sampling verification entry point (:func:`sampling_stats.swap_rule`: the target's verification and
Ouroboros' drafter alike) -- a target-argmax child always accepted, no residual (resampling from the target),
one uniform shared by a whole verification, a residual not renormalised between siblings, the bonus token drawn
from the last draft position's distribution, and for Ouroboros' sampled trunk its draft distribution recorded
at temperature 1 or without the warpers; and a drafter whose trunk is not drawn from the distribution it reports
(a wrong rule in the drafter's lookahead step only). Treating Ouroboros' sampled trunk as deterministic is NOT
such a variant: it is lossless too (see
test_sampling_verify.py::test_sampled_trunk_verified_as_deterministic_is_lossless_but_accepts_less).

Measured p-values with these seeds (runs in brackets): correct decoders 0.22 .. 1 (lookahead 1, Ouroboros with
suffixes 0.74 [1000], with branches 1, with free drafts 0.25, with every option 1, with a draft window 0.22 [600]).
Wrong rules, lookahead / Ouroboros: ``accept_argmax`` [200] 1e-70 / 5e-42; ``resample_target`` [200] 2e-15 / 2e-13;
``stale_bonus`` [200] 0 / 0 (outcomes of probability 0); ``shared_uniform`` [400] 6e-29 / 4e-11 (branches 2e-20,
free drafts 2e-50, every option 5e-60); ``unnormalised_residual`` 3e-14 [400] / 3e-14 [1000] (branches 1e-13 [600],
every option 5e-10 [600]); Ouroboros' trunk ``draft_temperature`` [800] 4e-11, ``draft_unwarped`` [400] 4e-12; a
drafter over-accepting its own argmax [400] 1e-14. Over four other seed streams the subtle rules stay below 1e-5:
worst 7e-9 (``shared_uniform``), 1e-6 (``unnormalised_residual``), 1e-8 (``draft_temperature``), 2e-8
(``draft_unwarped``).
"""

from __future__ import annotations

import collections

import pytest
import torch

import decoders.common.lookahead_step
from decoders.common.sampling import SamplingConfig
from decoders.lookahead import LookaheadDecoder
from decoders.ouroboros import OuroborosDecoder
from sampling_stats import (ALPHA, DRAFT_MISTAKES, TREE_MISTAKES, LogitsRecordingSampling, distribution_pvalue,
                            exact_sequence_probs, greedy_prompt, sample_counts, seed_base, sharpened, swap_rule,
                            tiny_model, wrong_rule, wrong_tree_verify)
from tests.decoder_checks import one_torch_thread, runs_for  # noqa: F401  (one_torch_thread: pytestmark)

pytestmark = pytest.mark.usefixtures("one_torch_thread")
WARPERS = dict(temperature=0.6, top_p=0.95, top_k=6)
SAMPLING = SamplingConfig(**WARPERS)
EOS = frozenset({7})
RUNS = 600          # correct decoders (more where a wrong rule needs more: runs_for)
WRONG_RUNS = 400    # subtly wrong rules
GROSS_RUNS = 200    # grossly wrong rules (p far below ALPHA at 400 runs)
LOOKAHEAD_NEW = 5
OUROBOROS_NEW = 5

#: Ouroboros configurations: name -> options beyond the common ones (gamma 2, W 2, N 3, G 4, topk 3, prompt
#: n-grams in the pool), and the step-record sources each must show accepted.
OUROBOROS = {
    "ouroboros": ({}, ("suffix",)),
    "ouroboros/branches": (dict(branch_confidence=0.95, max_branches=2), ("suffix", "branch")),
    "ouroboros/free": (dict(free_draft_min_match=2), ("suffix", "free")),
    # Free drafts (a deterministic trunk), a reduced draft vocabulary (ids 0-5 and EOS), a confidence stop and
    # runner-up branches (deterministic siblings tried after the sampled trunk token), all in one run.
    "ouroboros/every-option": (dict(free_draft_min_match=2, draft_vocab_size=6, stop_confidence=0.3,
                                    branch_confidence=0.95, max_branches=2), ("suffix", "free", "branch", "draft")),
    # the draft reads the 10-token prompt's first 4 and last 2 tokens only (its distributions are another's)
    "ouroboros/draft-window": (dict(draft_window=2), ("suffix", "draft")),
}

#: (decoder, wrong rule, runs): every wrong rule that can show in the decoder's verification, with the runs that
#: reject it by a wide margin (the measured p-values above).
WRONG_CASES = [
    *[(name, m, GROSS_RUNS) for name in ("lookahead", "ouroboros") for m in ("accept_argmax", "resample_target",
                                                                             "stale_bonus")],
    *[(name, "shared_uniform", WRONG_RUNS) for name in ("lookahead", *OUROBOROS)],
    ("lookahead", "unnormalised_residual", WRONG_RUNS),
    ("ouroboros", "unnormalised_residual", 1000),
    *[(name, "unnormalised_residual", RUNS) for name in ("ouroboros/branches", "ouroboros/every-option")],
    ("ouroboros", "draft_temperature", 800),
    ("ouroboros", "draft_unwarped", WRONG_RUNS),
]


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=0, logit_scale=30.0)


@pytest.fixture(scope="module")
def draft(target):
    """The target with a perturbed LM head: it agrees often, not always (rejections, residual draws and fully
    accepted trees all happen), and its distributions are spread enough for a wrongly recorded one to show."""
    return sharpened(target, factor=1.0, noise=0.3, seed=1)


@pytest.fixture(scope="module")
def prompt(target):
    return greedy_prompt(target)


@pytest.fixture(scope="module")
def exact(target, prompt):
    return {n: exact_sequence_probs(target, prompt, SAMPLING, n, EOS) for n in {LOOKAHEAD_NEW, OUROBOROS_NEW}}


def _decoder(name, target, draft, sampling=SAMPLING):
    if name == "lookahead":
        return LookaheadDecoder(target, window_size=2, ngram_size=4, guess_set_size=4, pool_from_prompt=True,
                                eos_token_ids=EOS, sampling=sampling)
    return OuroborosDecoder(target, draft, gamma=2, window_size=2, ngram_size=3, guess_set_size=4, topk=3,
                            pool_from_prompt=True, eos_token_ids=EOS, sampling=sampling, **OUROBOROS[name][0])


def _run(name, decoder, prompt, exact, runs):
    """p-value of the decoder's outputs over ``runs`` seeds (the configuration's own), and its summed step
    records' counters."""
    max_new = LOOKAHEAD_NEW if name == "lookahead" else OUROBOROS_NEW
    ids = torch.tensor([prompt])
    stats = collections.Counter()

    def generate(g):
        result = decoder.generate(ids, max_new, generator=g)
        for s in result.steps:
            stats.update(drafted=s.drafted, accepted=s.accepted, **s.source)
        return result.token_ids

    counts = sample_counts(generate, runs, seed=seed_base(f"sampling/{name}"))
    return distribution_pvalue(counts, exact[max_new]), stats


def _exercised(stats, *keys):
    """Candidates were both accepted and rejected (the rule ran, it was not bypassed)."""
    assert 0 < stats["accepted"] < stats["drafted"], stats
    for key in keys:
        assert stats[key] > 0, (key, stats)


def test_lookahead_output_distribution_is_the_targets(target, draft, prompt, exact):
    p, stats = _run("lookahead", _decoder("lookahead", target, draft), prompt, exact,
                    runs_for("lookahead", RUNS, WRONG_CASES))
    _exercised(stats, "ngram")
    assert p > ALPHA


@pytest.mark.parametrize("name", list(OUROBOROS))
def test_ouroboros_output_distribution_is_the_targets(name, target, draft, prompt, exact):
    p, stats = _run(name, _decoder(name, target, draft), prompt, exact, runs_for(name, RUNS, WRONG_CASES))
    _exercised(stats, *OUROBOROS[name][1])
    assert p > ALPHA


# --- the same tests reject deliberately wrong variants ---------------------------------------------------

def test_every_wrong_rule_has_a_case():
    assert {mistake for _, mistake, _ in WRONG_CASES} == set(TREE_MISTAKES + DRAFT_MISTAKES)


@pytest.mark.parametrize("name, mistake, runs", WRONG_CASES)
def test_rejects_wrong_rule(name, mistake, runs, monkeypatch, target, draft, prompt, exact):
    sampling = LogitsRecordingSampling(**WARPERS)  # samples as SAMPLING; lets "draft_unwarped" find the logits
    swap_rule(monkeypatch, wrong_rule(mistake, sampling))
    assert _run(name, _decoder(name, target, draft, sampling), prompt, exact, runs)[0] < ALPHA


def test_ouroboros_test_rejects_trunk_not_drawn_from_its_draft_probs(monkeypatch, target, draft, prompt, exact):
    """The drafter's own lookahead step over-accepts the draft's argmax, so the trunk is not a sample of the
    distribution it reports as ``draft_probs``; the target's verification is right (only the drafter's copy of
    the rule, in :mod:`decoders.common.lookahead_step`, is replaced)."""
    monkeypatch.setattr(decoders.common.lookahead_step, "multi_candidate_tree_verify",
                        wrong_tree_verify("accept_argmax"))
    p, _ = _run("ouroboros", _decoder("ouroboros", target, draft), prompt, exact, WRONG_RUNS)
    assert p < ALPHA
