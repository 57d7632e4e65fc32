"""NGramPool (recency order, eviction, top-k) and the prompt-lookup matcher."""

from __future__ import annotations

import doctest
import random

import pytest

from decoders.common import ngram_pool
from decoders.common.ngram_pool import NGramPool, SuffixIndex, find_prompt_lookup_candidates


def test_docstring_examples():
    result = doctest.testmod(ngram_pool, verbose=False)
    assert result.attempted > 0 and result.failed == 0


def test_recency_order_and_eviction():
    pool = NGramPool(ngram_size=3, guess_set_size=3)
    for cont in [(1, 2), (3, 4), (5, 6)]:
        pool.insert(9, cont)
    assert pool.get(9) == [(1, 2), (3, 4), (5, 6)]
    pool.insert(9, (3, 4))  # refresh: moves to the newest end, no duplicate
    assert pool.get(9) == [(1, 2), (5, 6), (3, 4)]
    pool.insert(9, (7, 8))  # full: evicts the oldest, (1, 2)
    assert pool.get(9) == [(5, 6), (3, 4), (7, 8)]
    assert pool.topk(9, 2) == [(7, 8), (3, 4)]
    assert pool.topk(9, 10) == [(7, 8), (3, 4), (5, 6)]
    assert pool.topk(9, 0) == []
    assert len(pool) == 3 and pool.num_keys == 1 and 9 in pool


def test_keys_are_independent_and_clear():
    pool = NGramPool(ngram_size=2, guess_set_size=1)
    pool.insert_ngrams([(1, 5), (2, 6), (1, 7)])
    assert pool.get(1) == [(7,)]
    assert pool.get(2) == [(6,)]
    assert pool.get(3) == []
    pool.clear()
    assert len(pool) == 0 and pool.get(1) == []


def test_zero_guess_set_stores_nothing():
    pool = NGramPool(ngram_size=4, guess_set_size=0)
    pool.insert(1, (2, 3, 4))
    assert pool.get(1) == [] and len(pool) == 0


def test_get_returns_a_copy():
    pool = NGramPool(ngram_size=2, guess_set_size=2)
    pool.insert(1, (2,))
    pool.get(1).append((3,))
    assert pool.get(1) == [(2,)]


@pytest.mark.parametrize("ngram_size, guess_set_size", [(1, 2), (0, 2), (3, -1), (2.0, 2), (3, None)])
def test_pool_rejects_bad_sizes(ngram_size, guess_set_size):
    with pytest.raises(ValueError):
        NGramPool(ngram_size, guess_set_size)


def test_pool_rejects_wrong_continuation_length():
    pool = NGramPool(ngram_size=3, guess_set_size=2)
    with pytest.raises(ValueError, match="ngram_size - 1"):
        pool.insert(1, (2,))


# ---------------------------------------------------------------------------------------------------
# Prompt lookup matcher
# ---------------------------------------------------------------------------------------------------

def test_matcher_docstring_examples():
    assert find_prompt_lookup_candidates([1, 2, 3, 4, 1, 2, 3, 5, 1, 2], 3, 3) == [3, 5, 1]
    assert find_prompt_lookup_candidates([7, 8, 8, 8], 2, 4) == [8, 8, 8, 8]


def test_matcher_prefers_longest_ngram_over_recency():
    # Suffix [1, 2, 3]: the 3-gram occurs at 0 (-> 9), the 1-gram [3] also occurs later at 6 (-> 4).
    tokens = [1, 2, 3, 9, 9, 5, 3, 4, 1, 2, 3]
    assert find_prompt_lookup_candidates(tokens, 3, 2) == [9, 9]
    assert find_prompt_lookup_candidates(tokens, 1, 2) == [4, 1]


def test_matcher_takes_most_recent_match():
    tokens = [5, 1, 10, 11, 5, 1, 20, 21, 5, 1]
    assert find_prompt_lookup_candidates(tokens, 2, 2) == [20, 21]


def test_matcher_extends_periodically_past_the_end():
    # Most recent match of [1, 2] starts at 4; what follows is [3, 1, 2] then the draft itself.
    tokens = [1, 2, 3, 1, 2, 3, 1, 2]
    assert find_prompt_lookup_candidates(tokens, 2, 7) == [3, 1, 2, 3, 1, 2, 3]


def test_matcher_no_match_and_edge_sizes():
    assert find_prompt_lookup_candidates([1, 2, 3, 4], 3, 5) == []
    assert find_prompt_lookup_candidates([1], 3, 5) == []
    assert find_prompt_lookup_candidates([], 3, 5) == []
    assert find_prompt_lookup_candidates([1, 2, 1, 2], 2, 0) == []
    # min_ngram_size excludes the only (1-gram) match.
    assert find_prompt_lookup_candidates([4, 9, 5, 4], 3, 2, min_ngram_size=2) == []
    assert find_prompt_lookup_candidates([4, 9, 5, 4], 3, 2, min_ngram_size=1) == [9, 5]


@pytest.mark.parametrize("max_n, k, min_n", [(0, 3, 1), (2, 3, 3), (2, -1, 1), (2, 3, 0)])
def test_matcher_rejects_bad_sizes(max_n, k, min_n):
    with pytest.raises(ValueError):
        find_prompt_lookup_candidates([1, 2, 1, 2], max_n, k, min_n)


def test_suffix_index_equals_the_matcher_on_growing_contexts():
    """SuffixIndex (incremental) returns exactly find_prompt_lookup_candidates' draft at every step of random
    growing contexts: small vocabularies (many repeats and periodic tails), every size, steps adding 0-4 tokens."""
    rng = random.Random(0)
    for _ in range(300):
        vocab, max_n = rng.choice([2, 3, 5, 50]), rng.randint(1, 5)
        index = SuffixIndex(max_n)
        context = [rng.randrange(vocab) for _ in range(rng.randint(1, 6))]
        for _ in range(25):
            k, top = rng.randint(0, 12), rng.randint(1, max_n)
            low = rng.randint(1, top)
            assert index.candidates(context, k, low, top) == find_prompt_lookup_candidates(context, top, k, low)
            context = context + [rng.randrange(vocab) for _ in range(rng.randint(0, 4))]


def test_suffix_index_refuses_a_shrinking_context_and_bad_sizes():
    index = SuffixIndex(3)
    assert index.candidates([1, 2, 3, 1, 2], 2) == [3, 1]
    with pytest.raises(ValueError, match="shrank"):
        index.candidates([1, 2, 3], 2)
    with pytest.raises(ValueError):
        index.candidates([1, 2, 3, 1, 2, 3], 2, max_ngram_size=4)  # beyond what the index keeps
    with pytest.raises(ValueError):
        SuffixIndex(0)
    import torch  # a tensor's elements hash by identity: the index reads them as ints
    assert SuffixIndex(3).candidates(torch.tensor([1, 2, 3, 1, 2]), 2) == [3, 1]


def _continuation_reference(context, tail, k, max_n, min_n):
    """What followed the most recent occurrence in ``context`` (a window ending before its last token) of the
    longest suffix of ``tail``: the brute-force definition of SuffixIndex.continuation."""
    for n in range(min(max_n, len(tail)), min_n - 1, -1):
        key = list(tail[len(tail) - n:])
        for start in range(len(context) - n - 1, -1, -1):
            if context[start: start + n] == key:
                return context[start + n: start + n + k]
    return []


def test_suffix_index_continuation_is_the_match_of_a_tail_outside_the_context():
    """continuation(tail) looks a tail that is not part of the context (a draft's path after it) up in what was
    indexed, without indexing it: randomized against the brute-force definition, and the index is unchanged."""
    rng = random.Random(1)
    for _ in range(300):
        vocab, max_n = rng.choice([2, 3, 5, 50]), rng.randint(1, 4)
        index = SuffixIndex(max_n)
        context = [rng.randrange(vocab) for _ in range(rng.randint(1, 30))]
        index.candidates(context, 0)
        for _ in range(5):
            tail = [rng.randrange(vocab) for _ in range(rng.randint(1, 5))]
            k, low = rng.randint(0, 8), rng.randint(1, max_n)
            assert index.continuation(tail, k, low) == _continuation_reference(context, tail, k, max_n, low)
        assert index.candidates(context, 3) == find_prompt_lookup_candidates(context, max_n, 3)
    index = SuffixIndex(3)
    index.candidates([1, 2, 3, 4, 9, 2, 3, 5, 8], 0)
    assert index.continuation([7, 2, 3], 2) == [5, 8]   # the most recent [2, 3]
    assert index.continuation([6, 3, 4], 4) == [9, 2, 3, 5]
    assert index.continuation([7, 7], 3) == []
