"""Tree masks / position ids against hand-worked trees, the lookahead layout, and a model-level check
that a tree forward gives every token the logits of a plain forward along its root-to-token path."""

from __future__ import annotations

import random

import pytest
import torch

from decoders.common.forward import forward, new_cache
from decoders.common.tree import lookahead_layout, tree_attention, tree_rows

NEG = torch.finfo(torch.float32).min


def allowed(mask: torch.Tensor) -> torch.Tensor:
    """0/1 int matrix of the tree part (1 = attend)."""
    n = mask.shape[-2]
    return (mask[0, 0, :, -n:] == 0).int()


def test_hand_built_tree():
    # r; a and b children of r; c child of a.
    mask, pos = tree_attention([-1, 0, 0, 1], past_len=2)
    assert mask.shape == (1, 1, 4, 6) and mask.dtype == torch.float32
    assert (mask[0, 0, :, :2] == 0).all()  # the cache is visible to everyone
    assert allowed(mask).tolist() == [
        [1, 0, 0, 0],
        [1, 1, 0, 0],
        [1, 0, 1, 0],
        [1, 1, 0, 1],
    ]
    assert set(mask.unique().tolist()) == {0.0, NEG}
    assert pos.tolist() == [[2, 3, 3, 4]]


def test_chain_is_causal_and_forest_roots_are_independent():
    mask, pos = tree_attention([-1, 0, 1, 2], past_len=0)
    assert allowed(mask).tolist() == torch.tril(torch.ones(4, 4, dtype=torch.int)).tolist()
    assert pos.tolist() == [[0, 1, 2, 3]]
    mask, pos = tree_attention([-1, -1, 1], past_len=5)
    assert allowed(mask).tolist() == [[1, 0, 0], [0, 1, 0], [0, 1, 1]]
    assert pos.tolist() == [[5, 5, 6]]


def test_mask_dtype_and_device():
    mask, pos = tree_attention([-1, 0], past_len=1, dtype=torch.bfloat16)
    assert mask.dtype == torch.bfloat16 and pos.dtype == torch.long
    assert mask[0, 0, 0, 2] == torch.finfo(torch.bfloat16).min


@pytest.mark.parametrize("past_len", [0, 1, 7, 203])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mask_rows_start_aligned(past_len, dtype):
    # CUDA attention kernels read the mask in aligned vectors; a view from a later row (as the tree drafter
    # passes) must start on an aligned address: with row stride past_len + n, bfloat16 tree decoding on an H200
    # failed with "misaligned address"
    mask, _ = tree_attention([-1, 0, 0, 1, 3], past_len, dtype=dtype)
    assert mask.shape == (1, 1, 5, past_len + 5)
    assert mask.stride(-2) % 16 == 0 and mask.stride(-1) == 1
    for start in range(5):
        assert (mask[:, :, start:].data_ptr() - mask.data_ptr()) % (16 * mask.element_size()) == 0
    dense = torch.zeros((1, 1, 5, past_len + 5), dtype=dtype)
    dense[0, 0, :, past_len:] = mask[0, 0, :, past_len:]
    assert torch.equal(mask, dense)  # the same values as a dense mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_built_layer_by_layer_equal_the_full_masks_rows(dtype):
    # the tree drafter builds only a new layer's rows (tree_rows); they must equal those rows of the full mask
    rng = random.Random(0)
    for _ in range(20):
        parents, lines, past_len = [], [], rng.randrange(0, 40)
        while len(parents) < 30:
            start = len(parents)
            for _ in range(rng.randrange(1, 6)):  # a layer: parents among the earlier layers (or the pending token)
                p = rng.randrange(-1, start)
                parents.append(p)
                lines.append([*lines[p], len(lines)] if p >= 0 else [len(lines)])
            mask, pos = tree_rows(lines[start:], past_len, len(parents), dtype=dtype)
            full_mask, full_pos = tree_attention(parents, past_len, dtype=dtype)
            assert torch.equal(mask, full_mask[:, :, start:]) and torch.equal(pos, full_pos[:, start:])
            assert mask.stride(-2) % 16 == 0 and mask.dtype == dtype and pos.dtype == torch.long


@pytest.mark.parametrize("parents", [[0], [-1, 1], [-1, 0, 3, 1], [-2]])
def test_bad_parents(parents):
    with pytest.raises(ValueError):
        tree_attention(parents, past_len=0)


def test_lookahead_layout_docstring_example():
    # W = 3, N = 3 (two rows), one guess of 2 tokens: [x a1 a2 | b0 b1 b2 | g0 g1].
    layout = lookahead_layout((3, 3), 1, 2)
    assert layout.parents == (-1, 0, 1, 0, 1, 2, 0, 6)
    assert layout.row_starts == (0, 3) and layout.guess_start == 6 and layout.size == 8
    mask, pos = tree_attention(layout.parents, past_len=10)
    assert pos.tolist() == [[10, 11, 12, 11, 12, 13, 11, 12]]
    #                             x  a1 a2 b0 b1 b2 g0 g1
    assert allowed(mask).tolist() == [
        [1, 0, 0, 0, 0, 0, 0, 0],  # x
        [1, 1, 0, 0, 0, 0, 0, 0],  # a1
        [1, 1, 1, 0, 0, 0, 0, 0],  # a2
        [1, 0, 0, 1, 0, 0, 0, 0],  # b0
        [1, 1, 0, 0, 1, 0, 0, 0],  # b1
        [1, 1, 1, 0, 0, 1, 0, 0],  # b2
        [1, 0, 0, 0, 0, 0, 1, 0],  # g0
        [1, 0, 0, 0, 0, 0, 1, 1],  # g1
    ]


def test_lookahead_layout_positions_follow_the_paper():
    """Input at p; row 0 column i at p + i; row k column i at p + k + i; guesses at p+1 .. p+N-1."""
    W, N, G, p = 4, 5, 3, 7
    layout = lookahead_layout((W,) * (N - 1), G, N - 1)
    _, pos = tree_attention(layout.parents, past_len=p)
    pos = pos[0].tolist()
    for k in range(N - 1):
        for i in range(W):
            assert pos[layout.row_index(k, i)] == p + k + i
    for b in range(G):
        assert [pos[layout.guess_index(b, j)] for j in range(N - 1)] == list(range(p + 1, p + N))
    assert layout.size == W + (N - 2) * W + G * (N - 1)  # LADE: 1 + (W-1) + (N-2)W + G(N-1)


def test_lookahead_layout_warmup_rows_and_no_guesses():
    layout = lookahead_layout((5, 5), 0, 0)
    assert layout.size == 10 and layout.num_guesses == 0 and layout.guess_start == 10
    single = lookahead_layout((1,), 2, 1)  # input token + two 1-token guesses
    assert single.parents == (-1, 0, 0)


@pytest.mark.parametrize("rows, g, glen", [((), 0, 0), ((0,), 0, 0), ((2, 3), 0, 0), ((2,), 1, 0), ((2,), -1, 1)])
def test_lookahead_layout_rejects_bad_shapes(rows, g, glen):
    with pytest.raises(ValueError):
        lookahead_layout(rows, g, glen)


def test_tree_forward_matches_path_forwards(target):
    """Each tree token's logits equal a fresh causal forward of prefix + its root-to-token path."""
    prefix = torch.tensor([[11, 42, 99, 7, 13, 200, 5]])
    layout = lookahead_layout((4, 4, 4), 2, 3)
    g = torch.Generator().manual_seed(0)
    tree_tokens = torch.randint(0, 256, (1, layout.size), generator=g)
    cache = new_cache(target)
    forward(target, prefix, cache)
    mask, pos = tree_attention(layout.parents, prefix.shape[1])
    tree_logits = forward(target, tree_tokens, cache, position_ids=pos, attention_mask=mask)[0]
    for i in range(layout.size):
        path, j = [], i
        while j >= 0:
            path.append(j)
            j = layout.parents[j]
        seq = torch.cat([prefix, tree_tokens[:, path[::-1]]], dim=1)
        ref = forward(target, seq, new_cache(target), logits_to_keep=1)[0, -1]
        torch.testing.assert_close(tree_logits[i], ref, rtol=1e-4, atol=1e-4)


def test_depth_first_keeps_sibling_order_and_puts_the_first_children_path_first():
    from decoders.common.tree import depth_first

    assert depth_first([-1, -1, 0, 0, 1]) == [0, 2, 3, 1, 4]
    assert depth_first([-1, 0, 1, 2]) == [0, 1, 2, 3]  # a chain stays as it is
    assert depth_first([]) == []
    parents = [-1, -1, 0, 0, 1, 2, 2, 3]
    order = depth_first(parents)
    assert sorted(order) == list(range(len(parents)))
    moved = {old: new for new, old in enumerate(order)}
    new_parents = [moved[parents[i]] if parents[i] >= 0 else -1 for i in order]
    assert all(p < j for j, p in enumerate(new_parents))  # still topological
    assert new_parents[:3] == [-1, 0, 1]  # the first children's path leads: 0 -> 2 -> 5
    with pytest.raises(ValueError, match="not an earlier node"):
        depth_first([-1, 2, 0])


def test_plain_positions_are_views_of_one_growing_arange():
    from decoders.common.forward import positions

    cpu = torch.device("cpu")
    assert positions(5, 3, cpu).tolist() == [[5, 6, 7]] and positions(5, 3, cpu).dtype == torch.long
    assert positions(10_000, 2, cpu).tolist() == [[10_000, 10_001]]  # past the first table: it grows
    assert positions(0, 1, cpu).tolist() == [[0]]
    with torch.inference_mode():
        inside = positions(3, 2, cpu)
    assert inside.tolist() == [[3, 4]] and not inside.is_inference()  # readable outside inference mode too
