"""Lookahead decoding is lossless (token-identical to vanilla in float32) over a grid of W, N, G."""

from __future__ import annotations

import functools
import random

import pytest
import torch

from decoders.lookahead import LookaheadDecoder
from tests.decoder_checks import (assert_positions_stay_below_max_position_embeddings,
                                  assert_refuses_arguments_it_does_not_take, assert_refuses_bad_generate_calls,
                                  memoised_vanilla)

MAX_NEW = 32
# (W, N, G): N from 2 to 7, W != G, G = 1, G = 0, W = 1, and the paper's 7B setting (W = G = 15, N = 5).
GRID = [(4, 2, 2), (3, 3, 1), (5, 4, 2), (2, 5, 4), (6, 6, 3), (3, 7, 5), (4, 4, 0), (1, 3, 1), (15, 5, 15)]


@pytest.fixture(scope="module")
def vanilla(target, prompt_ids):
    """Memoised vanilla reference: ``vanilla(i or input_ids, max_new_tokens, eos_ids) -> token ids``."""
    return memoised_vanilla(target, prompt_ids, MAX_NEW)


@pytest.mark.parametrize("W, N, G", GRID, ids=[f"W{w}-N{n}-G{g}" for w, n, g in GRID])
def test_equals_vanilla(target, prompt_ids, vanilla, W, N, G):
    dec = LookaheadDecoder(target, window_size=W, ngram_size=N, guess_set_size=G)
    multi_token_steps = 0
    for i, ids in enumerate(prompt_ids):
        res = dec.generate(ids, MAX_NEW)
        assert res.token_ids == vanilla(i), f"prompt {i}"
        assert res.steps[0].target_tokens_fed == ids.shape[1]
        assert res.num_steps == 1 + sum(1 for s in res.steps[1:])
        for s in res.steps[1:]:
            assert 1 <= s.emitted <= N and s.accepted == s.emitted - 1 <= s.drafted <= N - 1
            assert s.source == {"ngram": s.accepted, "bonus": 1}
        assert sum(s.emitted for s in res.steps) == res.new_tokens
        multi_token_steps += sum(s.accepted > 0 for s in res.steps)
    if G > 0:  # the pool path is exercised: some steps emit more than one token
        assert multi_token_steps > 0
    else:
        assert multi_token_steps == 0


def test_pool_from_prompt_equals_vanilla(target, prompt_ids, vanilla):
    dec = LookaheadDecoder(target, window_size=3, ngram_size=4, guess_set_size=3, pool_from_prompt=True)
    results = [dec.generate(ids, MAX_NEW) for ids in prompt_ids]
    assert all(r.token_ids == vanilla(i) for i, r in enumerate(results))
    assert all(r.extra["pool_from_prompt"] for r in results)
    # Vanilla's output copied into the prompt: the prompt's n-grams now predict the continuation.
    ids = torch.cat([prompt_ids[0], torch.tensor([vanilla(0)])], dim=1)
    res = dec.generate(ids, MAX_NEW)
    assert res.token_ids == vanilla(ids) and res.extra["pool_hit_rate"] > 0


def test_repetitive_prompts_accept_more_than_one_token_per_step(target, prompt_ids, vanilla):
    dec = LookaheadDecoder(target, window_size=5, ngram_size=4, guess_set_size=5)
    results = [dec.generate(ids, MAX_NEW) for ids in prompt_ids]
    assert all(r.token_ids == vanilla(i) for i, r in enumerate(results))
    assert max(r.accept_length for r in results) > 2.0
    assert all(0.0 <= r.extra["pool_hit_rate"] <= 1.0 for r in results)
    assert {"pool_scope", "window_size", "ngram_size", "guess_set_size", "guess_tokens_fed"} <= set(results[0].extra)


@pytest.mark.parametrize("max_new", [1, 2, 3, 4, 5, 6])
def test_max_new_tokens_exact(target, prompt_ids, vanilla, max_new):
    dec = LookaheadDecoder(target, window_size=3, ngram_size=4, guess_set_size=3)
    for i in (2, 8, 11, 0):  # repetitive prompts: n-grams accepted near the limit
        res = dec.generate(prompt_ids[i], max_new)
        assert res.token_ids == vanilla(i, max_new)
        assert len(res.token_ids) == max_new
        assert sum(s.emitted for s in res.steps) == max_new  # never emits more than needed


def _eos_inside_accepted_ngram(res) -> int | None:
    """A token first emitted strictly inside a step's accepted n-gram (so it is not the bonus token)."""
    out: list[int] = []
    for s in res.steps:
        step_tokens = list(res.token_ids[len(out) : len(out) + s.emitted])
        for j, t in enumerate(step_tokens[:-1]):
            if t not in out and t not in step_tokens[:j]:
                return t
        out += step_tokens
    return None


def test_eos_inside_accepted_ngram(target, prompt_ids, vanilla):
    dec = LookaheadDecoder(target, window_size=4, ngram_size=5, guess_set_size=4)
    found = 0
    for i, ids in enumerate(prompt_ids):
        eos = _eos_inside_accepted_ngram(dec.generate(ids, MAX_NEW))
        if eos is None:
            continue
        found += 1
        eos_ids = frozenset({eos})
        ref = vanilla(i, MAX_NEW, eos_ids)
        res = LookaheadDecoder(target, window_size=4, ngram_size=5, guess_set_size=4, eos_token_ids=eos_ids).generate(
            ids, MAX_NEW
        )
        assert res.token_ids == ref and ref[-1] == eos and eos not in ref[:-1]
        # The EOS arrived inside an accepted n-gram: the n-gram is cut just after it, no bonus token follows, and
        # the per-step counters add up to the kept tokens.
        last = res.steps[-1]
        assert last.source == {"ngram": last.accepted, "bonus": 0} and last.emitted == last.accepted
        assert sum(s.emitted for s in res.steps) == len(res.token_ids)
        assert sum(s.accepted for s in res.steps[1:]) + sum(s.source["bonus"] for s in res.steps) == len(ref)
    assert found >= 2


def test_eos_as_first_token(target, prompt_ids, vanilla):
    first = vanilla(3)[0]
    res = LookaheadDecoder(target, eos_token_ids={first}).generate(prompt_ids[3], MAX_NEW)
    assert res.token_ids == (first,) and res.num_steps == 1


def test_task_scope_warm_start_any_order_any_pool(target, prompt_ids, vanilla):
    dec = LookaheadDecoder(target, window_size=4, ngram_size=4, guess_set_size=3, pool_scope="task")
    order = list(range(len(prompt_ids)))
    for perm in (order, order[::-1]):
        for i in perm:
            assert dec.generate(prompt_ids[i], MAX_NEW).token_ids == vanilla(i)
    assert len(dec.pool) > 0
    # Fill the pool with junk for every key: outputs do not change.
    rng = random.Random(0)
    for key in range(target.config.vocab_size):
        for _ in range(3):
            dec.pool.insert(key, [rng.randrange(target.config.vocab_size) for _ in range(3)])
    shuffled = order[:]
    random.Random(1).shuffle(shuffled)
    for i in shuffled:
        assert dec.generate(prompt_ids[i], MAX_NEW).token_ids == vanilla(i)
    dec.reset()
    assert len(dec.pool) == 0


def test_task_scope_pool_persists_and_sample_scope_does_not(target, prompt_ids):
    warm = LookaheadDecoder(target, window_size=4, ngram_size=4, guess_set_size=3, pool_scope="task")
    cold = LookaheadDecoder(target, window_size=4, ngram_size=4, guess_set_size=3, pool_scope="sample")
    first = cold.generate(prompt_ids[2], MAX_NEW)
    warm.generate(prompt_ids[2], MAX_NEW)
    entries = len(warm.pool)
    again_warm = warm.generate(prompt_ids[2], MAX_NEW)
    assert len(warm.pool) >= entries and again_warm.extra["pool_scope"] == "task"
    assert again_warm.num_steps <= first.num_steps  # the warm pool already knows this text
    cold.generate(prompt_ids[5], MAX_NEW)
    again_cold = cold.generate(prompt_ids[2], MAX_NEW)
    assert again_cold.steps == first.steps  # a cold decoder forgets everything between calls


def test_deterministic_given_seed(target, prompt_ids):
    a = LookaheadDecoder(target, window_size=4, ngram_size=4, guess_set_size=3, seed=7).generate(prompt_ids[0], MAX_NEW)
    b = LookaheadDecoder(target, window_size=4, ngram_size=4, guess_set_size=3, seed=7).generate(prompt_ids[0], MAX_NEW)
    assert a.steps == b.steps and a.token_ids == b.token_ids


def test_positions_stay_below_max_position_embeddings(tokenizer, prompt_ids):
    """Near the end of the context window the lookahead window and n-grams are cut, not overflowed."""
    assert_positions_stay_below_max_position_embeddings(  # prompt 2: 30 tokens
        tokenizer, prompt_ids[2], lambda model: LookaheadDecoder(model, window_size=6, ngram_size=5, guess_set_size=4))


@pytest.mark.parametrize(
    "kwargs",
    [dict(window_size=0), dict(ngram_size=1), dict(guess_set_size=-1), dict(pool_scope="prompt"),
     dict(window_size=2.0), dict(ngram_size=True), dict(seed=-1), dict(pool_from_prompt="yes")],
)
def test_config_errors(target, kwargs):
    with pytest.raises(ValueError):
        LookaheadDecoder(target, **kwargs)


def test_batch_and_length_errors(target, prompt_ids):
    assert_refuses_bad_generate_calls(LookaheadDecoder(target), prompt_ids[0])


def test_refuses_arguments_it_does_not_take(target):
    """No **kwargs: a draft model (or a misspelt option) is an error, not silently ignored; the app passes
    only the runner-supplied arguments a constructor names (harness.job.app.build_decoder)."""
    assert_refuses_arguments_it_does_not_take(functools.partial(LookaheadDecoder, target), "window")
