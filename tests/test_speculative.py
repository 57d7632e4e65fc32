"""Speculative decoding is lossless: whole sequences equal vanilla greedy in float32."""

import pytest
import torch

from decoders.common.forward import forward, new_cache
from decoders.common.kv_cache import crop
from decoders.speculative import SpeculativeDecoder
from decoders.vanilla import VanillaDecoder

MAX_NEW = 40


@pytest.fixture(scope="module")
def vanilla_outputs(target, eos_ids, prompt_ids):
    decoder = VanillaDecoder(target, eos_token_ids=eos_ids)
    return [decoder.generate(ids, MAX_NEW).token_ids for ids in prompt_ids]


@pytest.mark.parametrize("draft_kind", ["noisy", "other", "same"])
@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_speculative_equals_vanilla(request, draft_kind, gamma, target, eos_ids, prompt_ids, vanilla_outputs):
    draft = {"noisy": request.getfixturevalue("noisy_draft"), "other": request.getfixturevalue("other_draft"),
             "same": target}[draft_kind]
    decoder = SpeculativeDecoder(target, draft, gamma=gamma, eos_token_ids=eos_ids)
    for ids, expected in zip(prompt_ids, vanilla_outputs, strict=True):
        result = decoder.generate(ids, MAX_NEW)
        assert result.token_ids == expected
        assert sum(s.emitted for s in result.steps) >= result.new_tokens
        assert all(s.accepted <= s.drafted for s in result.steps)


def test_noisy_draft_actually_accepts(target, noisy_draft, eos_ids, prompt_ids):
    decoder = SpeculativeDecoder(target, noisy_draft, gamma=4, eos_token_ids=eos_ids)
    rates = [decoder.generate(ids, MAX_NEW).acceptance_rate for ids in prompt_ids]
    assert 0.3 < sum(rates) / len(rates) < 1.0  # a realistic regime: many but not all drafts accepted


@pytest.mark.parametrize("max_new", [1, 2, 4, 5, 6])
def test_speculative_edge_lengths(max_new, target, noisy_draft, eos_ids, prompt_ids):
    """max_new_tokens of 1, gamma and gamma + 1 (gamma = 4 and 5) stop exactly."""
    for gamma in (4, 5):
        decoder = SpeculativeDecoder(target, noisy_draft, gamma=gamma, eos_token_ids=eos_ids)
        vanilla = VanillaDecoder(target, eos_token_ids=eos_ids)
        for ids in prompt_ids[:6]:
            assert decoder.generate(ids, max_new).token_ids == vanilla.generate(ids, max_new).token_ids


def test_same_draft_accepts_every_token(target, eos_ids, prompt_ids):
    gamma = 4
    decoder = SpeculativeDecoder(target, target, gamma=gamma, eos_token_ids=eos_ids)
    result = decoder.generate(prompt_ids[0], 41)  # 1 (prefill) + 8 steps x 5 tokens
    assert result.acceptance_rate == 1.0
    assert [s.accepted for s in result.steps[1:]] == [gamma] * 8
    assert [s.emitted for s in result.steps[1:]] == [gamma + 1] * 8
    assert result.accept_length == 41 / 9


def test_eos_inside_accepted_draft(target, eos_ids, prompt_ids):
    """An EOS id met in the middle of a fully accepted draft stops generation right after it."""
    gamma = 4
    ids = prompt_ids[1]
    full = VanillaDecoder(target, eos_token_ids=eos_ids).generate(ids, 30).token_ids
    # Token 7 is emitted inside the second step (tokens 6..10) when every draft is accepted.
    stop = full[7]
    first = full.index(stop)
    expected = full[: first + 1]
    decoder = SpeculativeDecoder(target, target, gamma=gamma, eos_token_ids={stop})
    result = decoder.generate(ids, 30)
    assert result.token_ids == expected
    assert VanillaDecoder(target, eos_token_ids={stop}).generate(ids, 30).token_ids == expected
    # It was accepted as a draft token, not as the step's bonus token, and decoding stopped right there: the bonus
    # token after it is neither kept nor counted, so the steps add up to the kept tokens.
    last = result.steps[-1]
    assert last.source == {"draft": last.accepted, "bonus": 0} and last.emitted == last.accepted >= 1
    assert sum(s.emitted for s in result.steps) == len(expected)
    assert sum(s.emitted for s in result.steps[:-1]) < len(expected)


def test_kv_rollback_equals_fresh_recompute(target, prompt_ids):
    """Cropping a cache that holds rejected tokens gives the same next-token logits as a fresh cache."""
    ids = prompt_ids[0]
    extra = torch.tensor([[5, 6, 7, 8, 9]])
    cache = new_cache(target)
    forward(target, ids, cache)
    forward(target, extra, cache)  # 5 speculative tokens ...
    crop(cache, ids.shape[1] + 2)  # ... 2 accepted
    probe = torch.tensor([[42]])
    rolled = forward(target, probe, cache)
    fresh_cache = new_cache(target)
    fresh = forward(target, torch.cat([ids, extra[:, :2], probe], dim=1), fresh_cache)[:, -1:]
    torch.testing.assert_close(rolled, fresh, rtol=1e-5, atol=1e-5)
    assert cache.get_seq_length() == ids.shape[1] + 3


@pytest.mark.parametrize("gamma", [0, -1, 2.5])
def test_gamma_refused(gamma, target, noisy_draft):
    with pytest.raises(ValueError, match="gamma"):
        SpeculativeDecoder(target, noisy_draft, gamma=gamma)


def test_needs_draft(target):
    with pytest.raises(ValueError, match="draft model"):
        SpeculativeDecoder(target, None)
