"""Every decoder with a draft model or copied drafts samples from the target's own distribution.

Tiny float32 models with an 8-id vocabulary (:func:`sampling_stats.tiny_model`): the exact distribution of the
first ``MAX_NEW = 4`` tokens (cut after the EOS id 7) is enumerated as the product of the target's processed
conditional distributions (temperature 0.6, top-k 6, top-p 0.95: all three transformers warpers active) and
compared with each decoder's outputs over ``RUNS`` seeds -- whole sequences, each position's marginal and each
pair of neighbouring positions, chi-square, Bonferroni-combined, false-alarm rate ``ALPHA`` = 1e-3 per test (see
:mod:`sampling_stats`). Each decoder configuration draws its own seeds (:func:`sampling_stats.seed_base`); the
seeds are fixed, so the outcome is deterministic. With ``gamma = 2`` the first step after the prefill's token
drafts 2 tokens, so the 4th token is the bonus token after a fully accepted draft (checked to happen, with
rejections, for the decoders whose step records show it). OPT-Tree with guessed chains decodes 3 tokens further and
is cut back to its first ``MAX_NEW`` (the same exact distribution), so its first trees are deep enough for guesses
(checked to join them).

Each test is shown to fail on deliberately wrong variants: the wrong rules of :mod:`sampling_stats` swapped in
for every sampling verification entry point (:func:`sampling_stats.swap_rule`) -- a target-argmax child always
accepted, no residual (resampling from the target), one uniform shared by a whole verification, a residual not
renormalised between siblings (trees only), the bonus token drawn from the last draft position's distribution,
and (sampled drafts) the draft's distribution recorded at temperature 1 or without the warpers while the token
was drawn from the warped one; transformers' lossy ``assistant_ensemble_weight`` (DIVERSE) for ``hf_assisted``,
a generation config without explicit top-k / top-p for ``hf_greedy`` (transformers' global default top_k=50
would then apply), and unprocessed logits for vanilla.

Measured p-values with these seeds (runs in brackets; in the order speculative / prompt_lookup / opt_tree /
opt_tree hybrid where several): correct decoders 0.045 .. 1 (vanilla 1, speculative 0.56, speculative with the
close draft 1 [1000], prompt_lookup 0.34, hf_assisted 0.045, hf_greedy 0.78, opt_tree 1, hybrid 1, a larger draft
vocabulary 1 [300]). Wrong rules: ``accept_argmax`` [200] 3e-24 / 2e-50 / 9e-63 / 6e-54; ``resample_target``
[200] 3e-13 / 5e-13 / 1e-11 / 6e-18; ``stale_bonus`` [200] 0 (outcomes of probability 0); ``shared_uniform``
[400] 2e-16 / 9e-21 / 1e-32 / 4e-27; ``unnormalised_residual`` [600] 1e-17 / 9e-6 (trees); with the close draft
``draft_temperature`` [1000] 1e-9 and ``draft_unwarped`` [400] 2e-13. Unprocessed logits (vanilla) [200] 0,
the ensemble (hf_assisted) [200] 3e-42, implicit warpers (hf_greedy) [200] 0. Over four other seed streams the
subtle rules stay below 1e-5: worst 4e-11 (``shared_uniform``), 2e-6 (``unnormalised_residual``), 2e-7
(``draft_temperature``), 2e-9 (``draft_unwarped``).
"""

from __future__ import annotations

import collections

import pytest
import torch

from decoders.common.sampling import SamplingConfig
from decoders.hf_assisted import HFAssistedDecoder, HFGreedyDecoder
from decoders.fixed_tree import FixedTreeDecoder
from decoders.opt_tree import OptTreeDecoder
from decoders.prompt_lookup import PromptLookupDecoder
from decoders.speculative import SpeculativeDecoder
from decoders.vanilla import VanillaDecoder
from harness.job.models import build_tiny_random
from sampling_stats import (ALPHA, DRAFT_MISTAKES, TREE_MISTAKES, VOCAB, LogitsRecordingSampling, distribution_pvalue,
                            exact_sequence_probs, greedy_prompt, sample_counts, seed_base, sharpened, swap_rule,
                            tiny_model, wrong_rule)
from tests.decoder_checks import one_torch_thread, runs_for  # noqa: F401  (one_torch_thread: pytestmark)

pytestmark = pytest.mark.usefixtures("one_torch_thread")
WARPERS = dict(temperature=0.6, top_p=0.95, top_k=6)
SAMPLING = SamplingConfig(**WARPERS)
EOS = frozenset({7})
MAX_NEW = 4
RUNS = 600          # correct decoders (more where a wrong rule needs more: runs_for)
WRONG_RUNS = 400    # subtly wrong rules
GROSS_RUNS = 200    # grossly wrong variants (p far below ALPHA at 400 runs)

#: Decoder configurations: name -> (draft model, constructor (target, draft, sampling)). The over-confident
#: draft makes over-acceptance and a missing residual show; the close draft (acceptance ratios near 1) makes a
#: wrongly recorded draft distribution show.
DECODERS = {
    "vanilla": (None, lambda t, d, s: VanillaDecoder(t, EOS, sampling=s)),
    "speculative": ("confident", lambda t, d, s: SpeculativeDecoder(t, d, gamma=2, eos_token_ids=EOS, sampling=s)),
    "speculative/close-draft": ("close", lambda t, d, s: SpeculativeDecoder(t, d, gamma=2, eos_token_ids=EOS,
                                                                            sampling=s)),
    # the draft reads the 10-token prompt's first 4 and last 2 tokens only (its distributions are another's)
    "speculative/draft-window": ("confident", lambda t, d, s: SpeculativeDecoder(t, d, gamma=2, draft_window=2,
                                                                                 eos_token_ids=EOS, sampling=s)),
    "prompt_lookup": (None, lambda t, d, s: PromptLookupDecoder(t, max_ngram_size=2, num_draft_tokens=2,
                                                                eos_token_ids=EOS, sampling=s)),
    "hf_assisted": ("confident", lambda t, d, s: HFAssistedDecoder(
        t, d, gamma=2, num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0, eos_token_ids=EOS,
        sampling=s)),
    "hf_greedy": (None, lambda t, d, s: HFGreedyDecoder(t, EOS, sampling=s)),
}
#: Draft-tree decoders (deterministic candidates: the draft's most likely tokens, several siblings per node).
TREE_DECODERS = {
    "opt_tree": ("close", lambda t, d, s: OptTreeDecoder(t, d, num_nodes=4, threshold=0.0, max_depth=3,
                                                         eos_token_ids=EOS, sampling=s)),
    "opt_tree/hybrid": ("close", lambda t, d, s: OptTreeDecoder(t, d, num_nodes=4, threshold=0.0, max_depth=3,
                                                                copy_tokens=3, eos_token_ids=EOS, sampling=s)),
    "opt_tree/guess": ("close", lambda t, d, s: OptTreeDecoder(t, d, num_nodes=4, threshold=0.0, max_depth=4,
                                                               guess_tokens=2, eos_token_ids=EOS, sampling=s)),
    "opt_tree/reduced-vocab": ("close", lambda t, d, s: OptTreeDecoder(t, d, num_nodes=4, threshold=0.0, max_depth=3,
                                                                       draft_vocab_size=4, eos_token_ids=EOS,
                                                                       sampling=s)),
    "opt_tree/draft-window": ("close", lambda t, d, s: OptTreeDecoder(t, d, num_nodes=4, threshold=0.0, max_depth=3,
                                                                      draft_window=2, eos_token_ids=EOS, sampling=s)),
    "fixed_tree": ("close", lambda t, d, s: FixedTreeDecoder(t, d, paths=[[0], [1], [0, 0], [0, 1], [1, 0]],
                                                             eos_token_ids=EOS, sampling=s)),
}
#: Configurations decoded this many tokens past ``MAX_NEW`` and cut back to their first ``MAX_NEW`` (which have the
#: same exact distribution): guessed chains need trees deeper than the last tokens' room allows.
HORIZON = {"opt_tree/guess": 3}
#: Tree decoders whose every wrong rule is rejected (the others share their verification and are shown to catch
#: its subtlest mistake).
FULLY_CHECKED_TREES = ("opt_tree", "opt_tree/hybrid")
ALL_DECODERS = {**DECODERS, **TREE_DECODERS}
#: Decoders whose step records show drafts accepted and rejected, and fully accepted drafts followed by a bonus.
LINEAR_DRAFTS = ("speculative", "speculative/close-draft", "prompt_lookup")

#: (decoder, wrong rule, runs): every wrong rule that can show in the decoder's verification, with the runs that
#: reject it by a wide margin (the measured p-values above).
WRONG_CASES = [
    *[(name, m, GROSS_RUNS) for name in ("speculative", "prompt_lookup", *FULLY_CHECKED_TREES)
      for m in ("accept_argmax", "resample_target", "stale_bonus")],
    *[(name, "shared_uniform", WRONG_RUNS) for name in ("speculative", "prompt_lookup", *FULLY_CHECKED_TREES)],
    *[(name, "unnormalised_residual", RUNS) for name in TREE_DECODERS],
    ("speculative/close-draft", "draft_temperature", 1000),
    ("speculative/close-draft", "draft_unwarped", WRONG_RUNS),
]


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=0, logit_scale=30.0)


@pytest.fixture(scope="module")
def drafts(target):
    """``confident``: over-confident in the target's likely tokens (rejections and residual draws both happen);
    ``close``: the target with a perturbed LM head, spread like it (rejections, residual draws and fully accepted
    drafts all happen, at acceptance ratios near 1)."""
    return {"confident": sharpened(target, factor=3.0, noise=0.3, seed=1),
            "close": sharpened(target, factor=1.0, noise=0.3, seed=1)}


def _decoder(name, target, drafts, sampling=SAMPLING):
    draft, make = ALL_DECODERS[name]
    return make(target, drafts.get(draft), sampling)


@pytest.fixture(scope="module")
def prompt(target):
    return greedy_prompt(target)


@pytest.fixture(scope="module")
def exact(target, prompt):
    probs = exact_sequence_probs(target, prompt, SAMPLING, MAX_NEW, EOS)
    assert abs(sum(probs.values()) - 1) < 1e-6
    assert sum(p for s, p in probs.items() if len(s) < MAX_NEW) > 0.01  # the EOS path is exercised
    return probs


def _run(name, decoder, prompt, exact, runs):
    """p-value of the decoder's outputs over ``runs`` seeds (the configuration's own), and its step counters."""
    ids = torch.tensor([prompt])
    stats = collections.Counter()

    def generate(g):
        result = decoder.generate(ids, MAX_NEW + HORIZON.get(name, 0), generator=g)
        for s in result.steps[1:]:
            stats.update(drafted=s.drafted, accepted=s.accepted,
                         full_then_bonus=s.drafted > 0 and s.accepted == s.drafted and s.emitted > s.accepted)
        stats.update(guessed=result.extra.get("guess_kept_per_step", 0) > 0)
        return result.token_ids[:MAX_NEW]

    counts = sample_counts(generate, runs, seed=seed_base(f"sampling/{name}"))
    return distribution_pvalue(counts, exact), stats


@pytest.mark.parametrize("name", list(ALL_DECODERS))
def test_output_distribution_is_the_targets(name, target, drafts, prompt, exact):
    p, stats = _run(name, _decoder(name, target, drafts), prompt, exact, runs_for(name, RUNS, WRONG_CASES))
    if name in LINEAR_DRAFTS or name in TREE_DECODERS:
        assert 0 < stats["accepted"] < stats["drafted"], stats  # the rule ran: drafts accepted and rejected
    if name in LINEAR_DRAFTS:
        assert stats["full_then_bonus"] > 0, stats  # the bonus token after a whole draft is among the tokens tested
    if "guess" in name:
        assert stats["guessed"] > 0, stats  # guessed chains joined the trees the rule verified
    assert p > ALPHA


def test_speculative_with_a_larger_draft_vocabulary(target, prompt, exact):
    """A draft whose (padded) vocabulary is larger than the target's may only propose ids the target has."""
    wide = build_tiny_random(dict(model_type="llama", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                  vocab_size=VOCAB + 3, logit_scale=30.0), seed=5, vocab_size=VOCAB)
    decoder = SpeculativeDecoder(target, wide, gamma=2, eos_token_ids=EOS, sampling=SAMPLING)
    assert _run("speculative/wide-draft", decoder, prompt, exact, runs=RUNS // 2)[0] > ALPHA


# --- the same tests reject deliberately wrong variants ---------------------------------------------------

def test_every_wrong_rule_has_a_case():
    assert {mistake for _, mistake, _ in WRONG_CASES} == set(TREE_MISTAKES + DRAFT_MISTAKES)


@pytest.mark.parametrize("name, mistake, runs", WRONG_CASES)
def test_rejects_wrong_rule(name, mistake, runs, monkeypatch, target, drafts, prompt, exact):
    sampling = LogitsRecordingSampling(**WARPERS)  # samples as SAMPLING; lets "draft_unwarped" find the logits
    swap_rule(monkeypatch, wrong_rule(mistake, sampling))
    assert _run(name, _decoder(name, target, drafts, sampling), prompt, exact, runs)[0] < ALPHA


def test_vanilla_test_rejects_unprocessed_logits(target, prompt, exact):
    """Sampling from softmax(logits) without the warpers (temperature 1, no top-k / top-p) is caught."""
    decoder = VanillaDecoder(target, EOS, sampling=SamplingConfig(1.0))
    assert _run("vanilla", decoder, prompt, exact, GROSS_RUNS)[0] < ALPHA


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


def test_hf_assisted_test_rejects_lossy_verification(target, drafts, prompt, exact):
    decoder = _EnsembleAssisted(target, drafts["confident"], gamma=2, num_assistant_tokens_schedule="constant",
                                assistant_confidence_threshold=0, eos_token_ids=EOS, sampling=SAMPLING)
    assert _run("hf_assisted", decoder, prompt, exact, GROSS_RUNS)[0] < ALPHA


def test_hf_greedy_test_rejects_implicit_warpers(target, prompt, exact):
    assert _run("hf_greedy", _ImplicitWarpers(target, EOS, sampling=SAMPLING), prompt, exact, GROSS_RUNS)[0] < ALPHA
