"""``crop`` and ``keep_path`` leave exactly the KV entries a fresh forward of the kept tokens computes."""

from __future__ import annotations

import pytest
import torch

from decoders.common.forward import forward, new_cache
from decoders.common.kv_cache import crop, keep_path
from decoders.common.tree import tree_attention

PREFIX = [[11, 42, 99, 7, 13, 200, 5, 64]]


def fresh_cache(model, tokens):
    cache = new_cache(model)
    forward(model, torch.tensor([tokens]), cache)
    return cache


def assert_same_cache(a, b):
    assert a.get_seq_length() == b.get_seq_length()
    for la, lb in zip(a.layers, b.layers, strict=True):
        torch.testing.assert_close(la.keys, lb.keys, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(la.values, lb.values, rtol=1e-5, atol=1e-5)


def test_crop_equals_recompute(target):
    tokens = PREFIX[0] + [1, 2, 3, 4, 5]
    cache = fresh_cache(target, tokens)
    crop(cache, 10)
    assert_same_cache(cache, fresh_cache(target, tokens[:10]))
    # The cropped cache continues exactly like a fresh one.
    nxt = torch.tensor([[77, 78]])
    got = forward(target, nxt, cache)
    ref = forward(target, torch.tensor([tokens[:10] + [77, 78]]), new_cache(target))[:, -2:]
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


def test_crop_noop_and_errors(target):
    cache = fresh_cache(target, PREFIX[0])
    crop(cache, 8)
    assert cache.get_seq_length() == 8
    for bad in (-1, 9):
        with pytest.raises(ValueError):
            crop(cache, bad)


def test_keep_path_equals_recompute(target):
    """Docstring example: a 6-token tree [a, b1, b2, c1, c2, d] after the prefix, accepted path a, b2, c2."""
    a, b1, b2, c1, c2, d = 30, 31, 32, 33, 34, 35
    parents = [-1, 0, 0, 1, 2, 0]  # b1, b2, d under a; c1 under b1; c2 under b2
    start = len(PREFIX[0])
    cache = fresh_cache(target, PREFIX[0])
    mask, pos = tree_attention(parents, start)
    forward(target, torch.tensor([[a, b1, b2, c1, c2, d]]), cache, position_ids=pos, attention_mask=mask)
    assert cache.get_seq_length() == start + 6
    keep_path(cache, start, [start + 0, start + 2, start + 4])
    assert_same_cache(cache, fresh_cache(target, PREFIX[0] + [a, b2, c2]))
    got = forward(target, torch.tensor([[9]]), cache)
    ref = forward(target, torch.tensor([PREFIX[0] + [a, b2, c2, 9]]), new_cache(target), logits_to_keep=1)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


def test_keep_path_contiguous_and_empty(target):
    tokens = PREFIX[0] + [1, 2, 3]
    cache = fresh_cache(target, tokens)
    keep_path(cache, 8, [8, 9])  # already in place: a crop
    assert_same_cache(cache, fresh_cache(target, tokens[:10]))
    keep_path(cache, 8, [])
    assert_same_cache(cache, fresh_cache(target, tokens[:8]))
    cache = fresh_cache(target, tokens)
    keep_path(cache, 8, torch.tensor([10]))  # tensor indices; drops 8 and 9
    assert cache.get_seq_length() == 9


@pytest.mark.parametrize("kept", [[7], [9, 9], [10, 9], [11]])
def test_keep_path_rejects_bad_indices(target, kept):
    cache = fresh_cache(target, PREFIX[0] + [1, 2, 3])
    with pytest.raises(ValueError):
        keep_path(cache, 8, kept)
