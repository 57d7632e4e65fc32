"""Token-tree layouts: 4-D attention masks and position ids from parent indices, and the lookahead layout.

A *token tree* is a block of ``n`` new tokens appended after ``past_len`` cached tokens in one forward.
Token ``i`` has a parent ``parents[i]`` among the earlier new tokens, or ``-1`` when it directly follows
the cached prefix. Each token attends to the whole cache, to its ancestors and to itself; its position
id is ``past_len + depth`` (roots have depth 0). A linear draft is the chain ``[-1, 0, 1, ...]``;
speculative trees (SpecInfer, Medusa) and the lookahead layout (Fu et al. 2024, arXiv 2402.02057,
Figure 2 / LookaheadDecoding ``j_make_causal_mask_multilevel``) are other parent arrays.

What lives here: :func:`tree_attention` (mask + positions) and :func:`lookahead_layout` (the parent
array of input token + Jacobi window + verification n-grams). What does not: running the model
(:mod:`decoders.common.forward`), choosing the accepted path (:mod:`decoders.common.verify`) and
compacting its KV entries (:func:`decoders.common.kv_cache.keep_path`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import torch


@lru_cache(maxsize=64)
def ancestors(parents: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ancestor_or_self (n, n) bool, depth (n,) int64)`` on the CPU for a parent array (``-1``: a root); cached,
    never mutated. Raises ``ValueError`` if a parent is not ``-1`` or an earlier index.

    The ancestor lists are built in plain Python and scattered into the matrix by one indexed write (a draft
    tree changes every step, so the cache rarely hits; one tensor op per node cost ~5 us each)."""
    n = len(parents)
    lines: list[list[int]] = []
    depth = [0] * n
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"parents[{i}] = {p}: a parent must be -1 or an earlier index (< {i})")
        if p >= 0:
            lines.append([*lines[p], i])
            depth[i] = depth[p] + 1
        else:
            lines.append([i])
    anc = torch.zeros((n, n), dtype=torch.bool)
    anc[[i for i, line in enumerate(lines) for _ in line], [j for line in lines for j in line]] = True
    return anc, torch.tensor(depth, dtype=torch.long)


@lru_cache(maxsize=64)
def _layout(parents: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(blocked (n, n) bool, depth (1, n) int64)`` on the CPU: the complement of :func:`ancestors`' matrix and its
    depths as a row, what :func:`tree_attention` writes (cached like it: a lookahead layout repeats every step)."""
    anc, depth = ancestors(parents)
    return ~anc, depth.unsqueeze(0)


#: Row stride of a tree mask, in elements (see :func:`tree_attention`).
_MASK_ALIGN = 16


def tree_attention(
    parents: Sequence[int],
    past_len: int,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Additive attention mask and position ids for a token tree that follows ``past_len`` cached tokens.

    Example:
        ``parents = [-1, 0, 0, 1]`` (a root ``r``, two children ``a``, ``b`` and ``c`` under ``a``),
        ``past_len = 2``. Rows are queries; columns are the 2 cached tokens then ``r, a, b, c``
        (``0`` = attend, ``-`` = dtype min)::

            r: 0 0 | 0 - - -      position 2
            a: 0 0 | 0 0 - -      position 3
            b: 0 0 | 0 - 0 -      position 3
            c: 0 0 | 0 0 - 0      position 4

    Args:
        parents: ``n`` parent indices, each ``-1`` or smaller than its own index.
        past_len: number of tokens already in the KV cache (all visible to every tree token).
        dtype: the model's dtype (the mask is added to attention scores).
        device: where the mask and positions are built.

    Returns:
        ``(attention_mask, position_ids)``: a float tensor of shape ``(1, 1, n, past_len + n)`` in ``dtype``
        (``0`` where attention is allowed, ``torch.finfo(dtype).min`` elsewhere; a view whose row stride is a
        multiple of 16 elements, which CUDA attention kernels need) and a
        ``torch.LongTensor`` of shape ``(1, n)`` with ``past_len + depth``.

    Raises:
        ValueError: if a parent index is not ``-1`` or an earlier index, or ``past_len < 0``.
    """
    if past_len < 0:
        raise ValueError(f"past_len must be >= 0, got {past_len}")
    blocked, depth = _layout(parents if type(parents) is tuple else tuple(int(p) for p in parents))
    n = blocked.shape[0]
    # Rows start on a 16-element boundary (a view of a wider buffer), so a view from a later row (the tree
    # drafter feeds mask[:, :, start:]) starts on an aligned address too: CUDA attention kernels read the mask in
    # aligned vectors. With row stride past_len + n, bfloat16 tree decoding on an H200 stopped with "CUDA error:
    # misaligned address" (results/reference/gpu_h200)
    mask = _mask_rows(n, past_len + n, dtype, device)
    mask[0, 0, :, past_len:].masked_fill_(blocked.to(device), torch.finfo(dtype).min)
    return mask, depth.to(device) + past_len


def _mask_rows(rows: int, width: int, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """A ``(1, 1, rows, width)`` tensor of zeros: a view of a buffer whose rows are ``_MASK_ALIGN`` elements apart
    (see :func:`tree_attention`)."""
    stride = -(-width // _MASK_ALIGN) * _MASK_ALIGN
    return torch.zeros((1, 1, rows, stride), dtype=dtype, device=device)[..., :width]


def tree_rows(lines: Sequence[Sequence[int]], past_len: int, n: int, *, dtype: torch.dtype = torch.float32,
              device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Some rows of :func:`tree_attention`'s mask and positions, built without the others: for a tree fed layer
    by layer, whose earlier tokens' rows never change (:class:`~decoders.common.tree_draft.TreeDrafter`).

    Args:
        lines: for each of the ``m`` tokens wanted, its ancestor-or-self indices among the tree's ``n`` tokens,
            root first and the token itself last (so its depth is ``len(line) - 1``).
        past_len: number of tokens already in the KV cache (all visible to every tree token).
        n: the tree's tokens so far (the mask's columns after the cache).
        dtype: the model's dtype. device: where the mask and positions are built.

    Returns:
        ``(attention_mask, position_ids)``: ``(1, 1, m, past_len + n)`` in ``dtype`` (rows 16-element aligned) and
        ``(1, m)`` int64, equal to rows ``lines``' tokens of ``tree_attention(parents, past_len)``.
    """
    mask = _mask_rows(len(lines), past_len + n, dtype, device)
    mask[..., past_len:] = torch.finfo(dtype).min  # the tree part only: the cache part stays 0, written once
    mask[0, 0, [r for r, line in enumerate(lines) for _ in line], [past_len + j for line in lines for j in line]] = 0
    position_ids = torch.tensor([[past_len + len(line) - 1 for line in lines]], dtype=torch.long, device=device)
    return mask, position_ids


@dataclass(frozen=True)
class LookaheadLayout:
    """Where each token of a lookahead forward sits in the flat input (see :func:`lookahead_layout`).

    Attributes:
        parents: the tree's parent array, for :func:`tree_attention`.
        row_starts: flat index of column 0 of each window row; row ``k`` column ``i`` is at
            ``row_starts[k] + i``. Row 0 column 0 (flat index 0) is the input token.
        row_lengths: tokens per row.
        guess_start: flat index of the first verification n-gram token.
        num_guesses: verification n-grams (branches).
        guess_len: tokens per verification n-gram; branch ``b`` token ``j`` is at
            ``guess_start + b * guess_len + j``.
    """

    parents: tuple[int, ...]
    row_starts: tuple[int, ...]
    row_lengths: tuple[int, ...]
    guess_start: int
    num_guesses: int
    guess_len: int

    @property
    def size(self) -> int:
        """Tokens fed in the forward."""
        return len(self.parents)

    def row_index(self, k: int, i: int) -> int:
        return self.row_starts[k] + i

    def guess_index(self, b: int, j: int) -> int:
        return self.guess_start + b * self.guess_len + j


@lru_cache(maxsize=64)
def lookahead_layout(row_lengths: tuple[int, ...], num_guesses: int, guess_len: int) -> LookaheadLayout:
    """The lookahead decoding layout as a token tree (Fu et al. 2024, arXiv 2402.02057, section 3.3).

    Flat order: window row 0 (its column 0 is the input token, i.e. the last accepted token), rows
    1, 2, ..., then ``num_guesses`` verification n-grams of ``guess_len`` tokens each.

    * Row 0 is a causal chain: column ``i`` follows column ``i - 1``.
    * Row ``k >= 1`` column ``i`` follows row ``k - 1`` column ``i``. So it attends to row 0 columns
      ``0..i`` and to column ``i`` of rows ``1..k``, and sits at depth ``i + k``: the "diagonal" links of
      the paper's mask. Column ``i`` read top to bottom is a consecutive-position n-gram guess.
    * Verification n-grams are chains hanging off the input token (depths ``1..guess_len``).

    With the input token at position ``p``, row 0 column ``i`` (``i >= 1``) is at ``p + i`` (the paper's
    first lookahead row at ``p + 1 + (i - 1)``), row ``k`` column ``i`` at ``p + k + i``, and every
    verification n-gram at ``p + 1 .. p + guess_len``, as in LookaheadDecoding's ``jforward_multilevel``.

    Example:
        ``row_lengths = (3, 3)`` (W = 3, N = 3), one guess of 2 tokens. Flat tokens
        ``[x a1 a2 | b0 b1 b2 | g0 g1]``::

            parents = (-1, 0, 1,  0, 1, 2,  0, 6)
            depths  = ( 0, 1, 2,  1, 2, 3,  1, 2)
            b2 attends to x, a1, a2, b2;  b0 to x, b0;  g1 to x, g0, g1.

    Args:
        row_lengths: tokens per window row, non-increasing, row 0 at least 1 (the input token).
        num_guesses: verification n-grams (>= 0).
        guess_len: tokens per verification n-gram (>= 1 when ``num_guesses > 0``).

    Returns:
        A :class:`LookaheadLayout`.

    Raises:
        ValueError: on an empty row 0, increasing row lengths or negative counts.
    """
    if not row_lengths or row_lengths[0] < 1:
        raise ValueError(f"row 0 must hold at least the input token, got row_lengths={row_lengths}")
    if any(b > a for a, b in zip(row_lengths, row_lengths[1:])):
        raise ValueError(f"row lengths must not increase (each column needs the row above), got {row_lengths}")
    if num_guesses < 0 or guess_len < 0 or (num_guesses and guess_len < 1):
        raise ValueError(f"bad verification branch shape: {num_guesses} guesses of {guess_len} tokens")
    parents: list[int] = []
    row_starts: list[int] = []
    for k, length in enumerate(row_lengths):
        row_starts.append(len(parents))
        for i in range(length):
            if k == 0:
                parents.append(i - 1)  # -1 for the input token
            else:
                parents.append(row_starts[k - 1] + i)
    guess_start = len(parents)
    for _ in range(num_guesses):
        first = len(parents)
        parents.extend([0] + [first + j for j in range(guess_len - 1)])
    return LookaheadLayout(tuple(parents), tuple(row_starts), tuple(row_lengths), guess_start, num_guesses, guess_len)


def prepend_chain(parents: Sequence[int], chain_len: int) -> tuple[int, ...]:
    """Parent array of ``chain_len`` linear tokens followed by a tree whose roots hang off the chain's end.

    Used when a tree forward must also feed tokens the KV cache lacks (e.g. a draft model catching up on
    tokens the target accepted): those tokens form a causal chain, and the tree (``parents``, with ``-1``
    for its roots) continues after the chain's last token. Tree index ``i`` moves to ``chain_len + i``.

    Example:
        ``prepend_chain([-1, 0, 0], 2)`` -> ``(-1, 0, 1, 2, 2)``: chain ``c0 -> c1``, then the tree's root at
        index 2 under ``c1`` and its two children under the root.

    Args:
        parents: the tree's parent array (``-1`` = root).
        chain_len: tokens in the leading chain (>= 0; 0 returns ``parents`` unchanged).

    Returns:
        The combined parent array, ``chain_len + len(parents)`` long.

    Raises:
        ValueError: if ``chain_len < 0``.
    """
    if chain_len < 0:
        raise ValueError(f"chain_len must be >= 0, got {chain_len}")
    root_parent = chain_len - 1  # -1 when there is no chain
    return tuple(range(-1, chain_len - 1)) + tuple(
        p + chain_len if p >= 0 else root_parent for p in (int(p) for p in parents)
    )


def chain_with_branches(chain_len: int, branch_lengths: Sequence[int]) -> tuple[int, ...]:
    """Parent array of a linear chain plus parallel branches that all continue after the chain's end.

    The verification tree of Ouroboros (Zhao et al. 2024, arXiv 2402.13720, section 3.2; reference
    ``j_make_causal_mask_with_guess``): the trunk is the pending token plus the draft, and each candidate
    suffix is a chain hanging off the trunk's last token. Branches see the whole trunk and themselves, never
    each other; with :func:`tree_attention` every branch restarts at the position right after the trunk.

    Example:
        ``chain_with_branches(3, [2, 2])`` -> ``(-1, 0, 1, 2, 3, 2, 5)``: trunk ``t0 t1 t2``, branch A at
        indices 3-4 and branch B at 5-6, both rooted under ``t2`` (positions ``p+3, p+4`` for each).

    Args:
        chain_len: trunk tokens (>= 1).
        branch_lengths: tokens per branch (each >= 1), in flat order after the trunk.

    Returns:
        The parent array, ``chain_len + sum(branch_lengths)`` long.

    Raises:
        ValueError: if ``chain_len < 1`` or a branch is empty.
    """
    if chain_len < 1:
        raise ValueError(f"chain_len must be >= 1, got {chain_len}")
    if any(n < 1 for n in branch_lengths):
        raise ValueError(f"branches must hold at least one token, got lengths {list(branch_lengths)}")
    parents = list(range(-1, chain_len - 1))
    for n in branch_lengths:
        first = len(parents)
        parents.extend([chain_len - 1] + [first + j for j in range(n - 1)])
    return tuple(parents)


def depth_first(parents: Sequence[int]) -> list[int]:
    """A tree's nodes in depth-first pre-order, siblings kept in their given order: the order in which the draft
    trees lay out a verified tree, so that the path through each node's first child (their most likely one) is the
    tree's leading nodes. When that path is accepted, the KV entries to keep are already in place after
    verification (:func:`decoders.common.kv_cache.keep_path` moves only the entries after the part in place);
    in breadth-first order only the first node would be.

    Example:
        ``depth_first([-1, -1, 0, 0, 1])`` -> ``[0, 2, 3, 1, 4]``: the first root, its two children, the second
        root, its child.

    Args:
        parents: each node's parent index (an earlier node) or ``-1`` for a root.

    Returns:
        the node indices in the new order (``order[j]`` = the node placed at ``j``).

    Raises:
        ValueError: if a parent is not an earlier node.
    """
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"node {i}: parent {p} is not an earlier node")
        children.setdefault(int(p), []).append(i)
    order: list[int] = []
    stack = list(reversed(children.get(-1, [])))
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(reversed(children.get(node, [])))
    return order
