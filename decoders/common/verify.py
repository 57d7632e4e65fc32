"""Greedy verification of a linear draft against the target's argmax predictions.

Follows the greedy special case of speculative decoding (Leviathan et al. 2023, arXiv 2211.17192,
Algorithm 1; Chen et al. 2023, arXiv 2302.01318): draft token ``i`` is accepted while it equals the
target's argmax at the previous position; the target's argmax right after the last accepted token is
the bonus (or correction) token. :func:`branch_verify` applies the same rule to several candidate
branches verified in one tree forward (SpecInfer, arXiv 2305.09781; lookahead decoding's verification
branch, arXiv 2402.02057) and keeps the longest accepted one. Sampling verification is not implemented.
"""

from __future__ import annotations

import torch


def greedy_verify(draft_tokens: torch.Tensor, target_argmax: torch.Tensor) -> tuple[int, int]:
    """Count accepted draft tokens and return the bonus token.

    Example:
        ``draft_tokens = [5, 7, 9]``, ``target_argmax = [5, 7, 2, 4]`` -> ``(2, 2)``: 5 and 7 are accepted,
        the target's own token at the third position (2) is emitted as the bonus.

    Args:
        draft_tokens: ``torch.LongTensor`` of shape ``(gamma,)``.
        target_argmax: ``torch.LongTensor`` of shape ``(gamma + 1,)``: the target's argmax after the last
            committed token and after each draft token.

    Returns:
        ``(num_accepted, bonus_token)`` with ``0 <= num_accepted <= gamma``.
    """
    gamma = draft_tokens.shape[0]
    if target_argmax.shape[0] != gamma + 1:
        raise ValueError(f"target_argmax needs gamma + 1 = {gamma + 1} entries, got {target_argmax.shape[0]}")
    mismatch = (draft_tokens != target_argmax[:gamma]).nonzero()
    n = int(mismatch[0, 0]) if mismatch.numel() else gamma
    return n, int(target_argmax[n])


def branch_verify(branch_tokens: torch.Tensor, target_argmax: torch.Tensor) -> tuple[int, int, int]:
    """Greedy verification of several candidate branches; returns the longest accepted one.

    Each branch is a linear draft continuing the same committed prefix (a root-to-leaf path of a token
    tree). Branch ``b``'s token ``j`` is accepted while every earlier token of the branch was accepted and
    it equals the target's argmax after the branch's first ``j`` tokens. The branch with the most accepted
    tokens wins; ties go to the lowest branch index (the accepted tokens are the same: the target's greedy
    continuation). The bonus token is the target's argmax after the winner's accepted tokens.

    Example:
        ``branch_tokens = [[5, 7, 9], [5, 8, 1]]``, ``target_argmax = [[5, 7, 2, 3], [5, 8, 4, 6]]``
        -> ``(0, 2, 2)``: both branches accept 2 tokens, branch 0 wins the tie, its bonus is 2.
        (Row ``b`` of ``target_argmax`` starts with the argmax after the committed prefix, which is the
        same for every branch.)

    Args:
        branch_tokens: ``torch.LongTensor`` of shape ``(num_branches, branch_len)``; shorter branches are
            right-padded with ``-1`` (never accepted).
        target_argmax: ``torch.LongTensor`` of shape ``(num_branches, branch_len + 1)``: column ``j`` is the
            target's argmax after the committed prefix plus the branch's first ``j`` tokens.

    Returns:
        ``(branch_index, num_accepted, bonus_token)``. With one branch this equals :func:`greedy_verify`.

    Raises:
        ValueError: on mismatched shapes or zero branches.
    """
    if branch_tokens.dim() != 2 or branch_tokens.shape[0] == 0:
        raise ValueError(
            f"branch_tokens must have shape (num_branches >= 1, branch_len), got {tuple(branch_tokens.shape)}"
        )
    num_branches, branch_len = branch_tokens.shape
    if tuple(target_argmax.shape) != (num_branches, branch_len + 1):
        raise ValueError(
            f"target_argmax needs shape {(num_branches, branch_len + 1)}, got {tuple(target_argmax.shape)}"
        )
    matches = (branch_tokens == target_argmax[:, :branch_len]).long()
    accepted = matches.cumprod(dim=1).sum(dim=1)  # (num_branches,)
    best = int(accepted.argmax())  # first maximum: the lowest index wins ties
    n = int(accepted[best])
    return best, n, int(target_argmax[best, n])


def tree_verify(tokens: list[int], parents: list[int], target_argmax: list[int]) -> tuple[list[int], int]:
    """Greedy verification of a token tree fed in one forward; returns the longest accepted path.

    Node 0 is the root: the last committed token (always accepted). Node ``k > 0`` is accepted when its parent is
    accepted and its token equals the target's argmax after the parent. The deepest accepted node wins; ties go
    to the lowest index (two accepted nodes at the same depth would spell the same target continuation). The
    bonus token is the target's argmax after the winner. A chain (``parents = [-1, 0, 1, ...]``) reduces to
    :func:`greedy_verify`; a chain with leaves after its end reduces to :func:`branch_verify` on the leaves.

    Example:
        Root ``p``, trunk ``5 7`` (nodes 1-2), and an alternative ``8`` to ``7`` (node 3, parent 1):
        ``tokens = [p, 5, 7, 8]``, ``parents = [-1, 0, 1, 1]``, ``target_argmax = [5, 8, 4, 6]`` -> ``([1, 3], 6)``:
        5 is accepted, 7 is not (the target wanted 8), the alternative 8 is, and the target's token after it is 6.

    Args:
        tokens: token ids of the ``n`` fed nodes, root first.
        parents: ``n`` parent indices (``-1`` for the root, else an earlier index).
        target_argmax: the target's argmax after each node (``n`` ids).

    Returns:
        ``(path, bonus_token)``: the accepted nodes' indices root excluded, in order, and the bonus token.
    """
    n = len(tokens)
    if len(parents) != n or len(target_argmax) != n or n == 0 or parents[0] != -1:
        raise ValueError(f"need n >= 1 tokens, parents and argmax with the root first; got {n}, {len(parents)}, "
                         f"{len(target_argmax)}")
    depth = [0] + [-1] * (n - 1)  # -1 = not accepted
    best = 0
    for k in range(1, n):
        p = parents[k]
        if not 0 <= p < k:
            raise ValueError(f"parents[{k}] = {p}: a node's parent must be an earlier node")
        if depth[p] >= 0 and tokens[k] == target_argmax[p]:
            depth[k] = depth[p] + 1
            if depth[k] > depth[best]:
                best = k
    path = []
    k = best
    while k:
        path.append(k)
        k = parents[k]
    return path[::-1], int(target_argmax[best])
