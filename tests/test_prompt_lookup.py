"""Prompt lookup decoding is lossless (token-identical to vanilla in float32)."""

from __future__ import annotations

import functools

import pytest
import torch

from decoders.prompt_lookup import PromptLookupDecoder
from tests.decoder_checks import (assert_refuses_arguments_it_does_not_take, assert_refuses_bad_generate_calls,
                                  memoised_vanilla)

MAX_NEW = 32
GRID = [(3, 10), (1, 1), (2, 4), (5, 3)]  # (max_ngram_size, num_draft_tokens)


@pytest.fixture(scope="module")
def vanilla(target, prompt_ids):
    """Memoised vanilla reference: ``vanilla(i or input_ids, max_new_tokens, eos_ids) -> token ids``."""
    return memoised_vanilla(target, prompt_ids, MAX_NEW)


@pytest.mark.parametrize("max_ngram, k", GRID, ids=[f"n{n}-k{k}" for n, k in GRID])
def test_equals_vanilla(target, prompt_ids, vanilla, max_ngram, k):
    dec = PromptLookupDecoder(target, max_ngram_size=max_ngram, num_draft_tokens=k)
    results = [dec.generate(ids, MAX_NEW) for ids in prompt_ids]
    for i, res in enumerate(results):
        assert res.token_ids == vanilla(i), f"prompt {i}"
        for s in res.steps[1:]:
            assert s.target_tokens_fed == s.drafted + 1 and s.emitted == s.accepted + 1
            assert 0 <= s.accepted <= s.drafted <= k
    # Repetitive prompts: several tokens per step (at most k + 1).
    assert max(r.accept_length for r in results) > min(2.0, 1 + k / 2)


@pytest.mark.parametrize("max_new", [1, 2, 3, 10, 11, 12])
def test_max_new_tokens_exact(target, prompt_ids, vanilla, max_new):
    dec = PromptLookupDecoder(target, max_ngram_size=3, num_draft_tokens=10)
    for i in (2, 8, 11, 0):
        res = dec.generate(prompt_ids[i], max_new)
        assert res.token_ids == vanilla(i, max_new) and len(res.token_ids) == max_new
        assert sum(s.emitted for s in res.steps) == max_new  # never drafts past the limit


def test_eos_inside_accepted_draft(target, prompt_ids, vanilla):
    """Prompts extended with vanilla's own continuation make the first drafts copy tokens from the prompt,
    so a token can be emitted for the first time inside an accepted draft; making it the EOS id, both
    decoders must stop right after it."""
    dec = PromptLookupDecoder(target, max_ngram_size=3, num_draft_tokens=6)
    found = 0
    for i, ids in enumerate(prompt_ids):
        ids = torch.cat([ids, torch.tensor([vanilla(i)])], dim=1)
        res = dec.generate(ids, MAX_NEW)
        out: list[int] = []
        eos = None
        for s in res.steps:
            step_tokens = list(res.token_ids[len(out) : len(out) + s.emitted])
            firsts = [t for j, t in enumerate(step_tokens[:-1]) if t not in out and t not in step_tokens[:j]]
            if firsts:
                eos = firsts[-1]
                break
            out += step_tokens
        if eos is None:
            continue
        found += 1
        eos_ids = frozenset({eos})
        ref = vanilla(ids, MAX_NEW, eos_ids)
        got = PromptLookupDecoder(target, max_ngram_size=3, num_draft_tokens=6, eos_token_ids=eos_ids).generate(
            ids, MAX_NEW
        )
        assert got.token_ids == ref and ref[-1] == eos and eos not in ref[:-1]
        # Drafts are cut just after an EOS: the EOS is the last accepted draft token, the bonus is dropped and
        # not counted, so the steps add up to the kept tokens.
        last = got.steps[-1]
        assert last.accepted >= 1 and last.source["bonus"] == 0 and last.emitted == last.accepted
        assert sum(s.emitted for s in got.steps) == len(ref)
    assert found >= 2


@pytest.mark.parametrize(
    "kwargs",
    [dict(max_ngram_size=0), dict(num_draft_tokens=0), dict(min_ngram_size=0), dict(min_ngram_size=4),
     dict(num_draft_tokens=2.5)],
)
def test_config_errors(target, kwargs):
    with pytest.raises(ValueError):
        PromptLookupDecoder(target, **kwargs)


def test_batch_and_length_errors(target, prompt_ids):
    assert_refuses_bad_generate_calls(PromptLookupDecoder(target), prompt_ids[0])


def test_refuses_arguments_it_does_not_take(target):
    """No **kwargs: a draft model (or a misspelt option) is an error, not silently ignored; the app passes
    only the runner-supplied arguments a constructor names (harness.job.app.build_decoder)."""
    assert_refuses_arguments_it_does_not_take(functools.partial(PromptLookupDecoder, target), "num_draft_token")
