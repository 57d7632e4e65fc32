"""Verification rules: which draft tokens the target model accepts, and the token it emits next.

Greedy (temperature 0): :func:`tree_verify` follows the greedy special case of speculative decoding
(Leviathan et al. 2023, arXiv 2211.17192, Algorithm 1; Chen et al. 2023, arXiv 2302.01318): a draft token is
accepted while it equals the target's argmax at the previous position; the target's argmax right after the last
accepted token is the bonus (or correction) token. On a token tree (several candidate branches verified in one
forward: SpecInfer, arXiv 2305.09781; lookahead decoding's verification branch, arXiv 2402.02057) it keeps the
longest accepted path.

Sampling (temperature > 0), lossless: the emitted tokens are distributed exactly as if sampled from the
target's processed distribution one at a time.

* :func:`rejection_verify`: a linear draft sampled from the draft model's own distribution -- modified
  rejection sampling (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023, Algorithm 2).
* :func:`multi_candidate_tree_verify`: a token tree of candidates in one forward, deterministic (n-gram, pool
  phrase, copied) drafts and/or a sampled trunk -- SpecInfer's multi-step speculative sampling (Miao et al.
  2024, arXiv 2305.09781, section 4.2), which lookahead decoding's sampling mode also follows (Fu et al. 2024,
  arXiv 2402.02057, section 3.4). Lookahead decoding (its n-grams, on the target; Ouroboros' drafter, on the
  draft) and Ouroboros' target verification (sampled trunk + deterministic suffixes and branches) use it.
  :func:`multi_candidate_verify` is the same rule with the candidates given as branches; one branch of
  deterministic tokens is prompt lookup's case.
* :func:`residual_probs`: the shared residual ``normalize(max(0, target_probs - draft_probs))``.

Names: ``draft_probs`` is the distribution the draft token was drawn from, ``target_probs`` the target
model's processed distribution (:meth:`decoders.common.sampling.SamplingConfig.probs`); never bare p / q,
whose meaning differs between papers and codebases.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import torch


def tree_verify(tokens: list[int], parents: list[int], target_argmax: list[int]) -> tuple[list[int], int]:
    """Greedy verification of a token tree fed in one forward; returns the longest accepted path.

    Node 0 is the root: the last committed token (always accepted). Node ``k > 0`` is accepted when its parent is
    accepted and its token equals the target's argmax after the parent. The deepest accepted node wins; ties go
    to the lowest index (two accepted nodes at the same depth would spell the same target continuation). The
    bonus token is the target's argmax after the winner. On a chain (``parents = [-1, 0, 1, ...]``) it is the
    linear rule: the longest prefix matching the target's argmax.

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


# ---------------------------------------------------------------------------------------------------------
# Sampling (temperature > 0)
# ---------------------------------------------------------------------------------------------------------


def residual_probs(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """The distribution to resample from after a rejection: ``normalize(max(0, target_probs - draft_probs))``.

    Leviathan et al. 2023 (arXiv 2211.17192), Algorithm 1, ``p'(x) = norm(max(0, p(x) - q(x)))`` with their
    ``p`` = ``target_probs`` and ``q`` = ``draft_probs``. With a one-hot ``draft_probs`` at ``x`` (a deterministic
    draft) this is ``target_probs`` with ``x`` removed and renormalised.

    A rejection is only possible where ``target_probs[x] < draft_probs[x]``, so the residual has positive mass in
    exact arithmetic; if rounding leaves none, ``target_probs`` itself is returned (it equals ``draft_probs``
    up to rounding, so nothing better is known).

    Args:
        target_probs: ``torch.FloatTensor`` of shape ``(vocab_size,)``.
        draft_probs: ``torch.FloatTensor`` of shape ``(vocab_size,)``.

    Returns:
        ``torch.FloatTensor`` of shape ``(vocab_size,)`` summing to 1.
    """
    residual = (target_probs - draft_probs).clamp_(min=0)
    total = residual.sum()
    return residual / total if total > 0 else target_probs


def rejection_verify(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator,
) -> tuple[int, int]:
    """Modified rejection sampling of a linear draft sampled from the draft model (lossless sampling).

    Leviathan, Kalman & Matias 2023 (arXiv 2211.17192), Algorithm 1; Chen et al. 2023 (arXiv 2302.01318),
    Algorithm 2. Draft token ``x_i`` (drawn from ``draft_probs[i]``) is accepted with probability
    ``min(1, target_probs[i, x_i] / draft_probs[i, x_i])``, in order, until the first rejection. At a rejected
    position ``n`` the next token is drawn from :func:`residual_probs` ``(target_probs[n], draft_probs[n])``;
    if all ``gamma`` tokens are accepted it is drawn from ``target_probs[gamma]`` (the bonus token). Each
    emitted token is then distributed exactly as ``target_probs`` at its position.

    Example:
        ``draft_probs[0] = [0, 0, .5, .5]``, ``target_probs[0] = [0, .5, .25, .25]``, ``draft_tokens = [3]``: 3 is
        kept with probability ``.25 / .5 = .5``; otherwise the next token is drawn from the residual
        ``[0, 1, 0, 0]``, i.e. it is 1. Over the draft's own draw (2 or 3, each with .5) the emitted token is
        1, 2, 3 with probabilities .5, .25, .25: ``target_probs[0]``.

    Args:
        draft_tokens: ``torch.LongTensor`` of shape ``(gamma,)``, ``gamma >= 0``.
        draft_probs: ``torch.FloatTensor`` of shape ``(gamma, vocab_size)``: the distributions the draft tokens
            were drawn from (the draft model's processed distributions).
        target_probs: ``torch.FloatTensor`` of shape ``(gamma + 1, vocab_size)``: the target's processed
            distribution after the committed prefix and after each draft token.
        generator: source of the uniform draws and of the resampled token.

    Returns:
        ``(num_accepted, next_token)``: ``0 <= num_accepted <= gamma`` and the token emitted after the accepted
        draft tokens (resampled or bonus).

    Raises:
        ValueError: on mismatched shapes.
    """
    gamma = draft_tokens.shape[0]
    if tuple(draft_probs.shape[:1]) != (gamma,) or target_probs.shape[0] != gamma + 1 \
            or draft_probs.shape[-1] != target_probs.shape[-1]:
        raise ValueError(f"need draft_probs (gamma={gamma}, V) and target_probs (gamma + 1, V), got "
                         f"{tuple(draft_probs.shape)} and {tuple(target_probs.shape)}")
    n = gamma
    if gamma:
        positions = torch.arange(gamma, device=draft_tokens.device)
        p_target = target_probs[positions, draft_tokens]
        p_draft = draft_probs[positions, draft_tokens]
        uniform = torch.rand(gamma, generator=generator, device=target_probs.device)
        # u < min(1, p_target / p_draft)  <=>  u * p_draft < p_target  (also when p_draft == 0)
        rejected = (uniform * p_draft >= p_target).nonzero()
        n = int(rejected[0, 0]) if rejected.numel() else gamma
    probs = target_probs[n] if n == gamma else residual_probs(target_probs[n], draft_probs[n])
    return n, int(torch.multinomial(probs, 1, generator=generator))


def multi_candidate_tree_verify(
    tokens: Sequence[int],
    parents: Sequence[int],
    target_probs: torch.Tensor | Callable[[int], torch.Tensor],
    generator: torch.Generator,
    draft_probs: Mapping[int, torch.Tensor] | None = None,
) -> tuple[list[int], int]:
    """Lossless sampling verification of a token tree fed in one forward; the tree form of the rule.

    SpecInfer's multi-step speculative sampling (Miao et al. 2024, arXiv 2305.09781, section 4.2, "MSS"), which
    lookahead decoding's sampling mode follows for its n-gram candidates (Fu et al. 2024, arXiv 2402.02057,
    section 3.4; hao-ai-lab/LookaheadDecoding ``jacobi_sample_multilevel``, "algorithm modified from
    specinfer"). Node 0 is the root (the last committed token). Starting there with
    ``residual = target_probs[root]``, the children of the current node are tried in index order:

    * child ``x`` is accepted with probability ``min(1, residual[x] / draft_probs[x])`` -- for a deterministic
      candidate (no ``draft_probs`` entry: an n-gram, a pool phrase, a copied draft) that is ``residual[x]``;
    * on rejection, ``residual = residual_probs(residual, draft_probs)`` -- for a deterministic candidate, ``x``
      is removed and the rest renormalised -- and the next child is tried. A child whose token was already
      tried at this node is skipped (its residual mass is 0, so it would be rejected).

    An accepted child becomes the current node (``residual`` = the target's distribution after it). Siblings
    spelling the same token are one node of the prefix tree: after ``x`` is accepted, the children of every
    sibling spelling ``x`` are candidates at the next depth (in index order), so two n-grams sharing a prefix
    both stay alive. When every child is rejected, the next token is drawn from ``residual``; after a leaf,
    from the target's distribution there (the bonus token). At every node the emitted token is distributed
    exactly as ``target_probs`` there, so the output keeps the target's distribution.

    Sampled children (with ``draft_probs``, i.e. drawn from that distribution -- Ouroboros' trunk) follow
    Leviathan et al. 2023's rule (arXiv 2211.17192, Alg. 1) at their node and must be the first child tried
    there (checked); deterministic siblings after them are then tried against the residual
    ``normalize(max(0, target_probs - draft_probs))``, which keeps the distribution because the multi-candidate
    rule samples any distribution exactly. Deterministic candidates may depend on anything drawn before this
    call (the sampled trunk included), never on this call's draws.

    Example:
        Root ``r``, candidates ``4`` (node 1) and ``1`` (node 2) as children of the root,
        ``target_probs[0] = [.1, .1, .1, .1, .6]``: 4 is accepted with probability 0.6; otherwise 1 with
        probability ``0.1 / 0.4 = 0.25``; otherwise the token is drawn from ``[1/3, 0, 1/3, 1/3, 0]``. Overall
        token 1 keeps ``0.4 * 0.25 = 0.1``, its target probability.

    Args:
        tokens: token ids of the ``n`` fed nodes, root first (the root's own id is not verified); ``-1`` marks a
            padding node (never accepted).
        parents: ``n`` parent indices (``-1`` for the root, else an earlier index).
        target_probs: ``torch.FloatTensor`` of shape ``(n, vocab_size)``: the target's processed distribution
            after each node (:meth:`decoders.common.sampling.SamplingConfig.probs`); or a function of the node
            index giving that row (``(vocab_size,)``), called only for the nodes the rule reads (the accepted
            path, a handful of the ``n``): top-p sorts the whole vocabulary of every row it processes.
        generator: source of the uniform draws (one per child tried) and of the final draw.
        draft_probs: ``None`` (every node deterministic), or a mapping from node index to the
            ``torch.FloatTensor`` of shape ``(vocab_size,)`` that node's token was drawn from.

    Returns:
        ``(path, next_token)`` like :func:`tree_verify`: the accepted nodes' indices (root excluded, in order):
        the lowest-index node that spells the accepted tokens and its ancestors (one root-to-node chain, the
        nodes whose KV entries a decoder keeps), and the token emitted after them.

    Raises:
        ValueError: on mismatched sizes, a parent that is not an earlier node, or a sampled child that is not
            the first child tried at its node.
    """
    n = len(tokens)
    lazy = callable(target_probs)
    if n == 0 or len(parents) != n or parents[0] != -1 or \
            (not lazy and (target_probs.dim() != 2 or target_probs.shape[0] != n)):
        raise ValueError(f"need n >= 1 tokens and parents with the root first and target_probs (n, V); got "
                         f"{n}, {len(parents)}, {'a function' if lazy else tuple(target_probs.shape)}")
    row = target_probs if lazy else target_probs.__getitem__
    children: list[list[int]] = [[] for _ in range(n)]
    for k in range(1, n):
        if not 0 <= parents[k] < k:
            raise ValueError(f"parents[{k}] = {parents[k]}: a node's parent must be an earlier node")
        children[parents[k]].append(k)
    current = [0]  # nodes spelling the accepted prefix (several when candidates share it)
    while True:
        residual = row(current[0])
        kids = sorted(k for c in current for k in children[c])
        tried: set[int] = set()
        accepted = None
        for k in kids:
            x = int(tokens[k])
            if x < 0 or x in tried:
                continue  # padding, or a token already tried here (rejected: its residual mass is 0)
            q = draft_probs.get(k) if draft_probs is not None else None
            p_draft_x = 1.0 if q is None else float(q[x])
            if p_draft_x < 1.0 and tried:
                raise ValueError(f"node {k}: a sampled draft token must be the first child tried at its node "
                                 "(order sampled candidates before deterministic ones)")
            tried.add(x)
            u = float(torch.rand((), generator=generator, device=residual.device))
            # u < min(1, residual[x] / p_draft_x)  <=>  u * p_draft_x < residual[x]
            if u * p_draft_x < float(residual[x]):
                accepted = x
                break
            if q is None:
                q = torch.zeros_like(residual)
                q[x] = 1.0
            residual = residual_probs(residual, q)
        if accepted is None:
            break
        current = [k for k in kids if int(tokens[k]) == accepted]
    path = []
    k = current[0]
    while k:
        path.append(k)
        k = parents[k]
    return path[::-1], int(torch.multinomial(residual, 1, generator=generator))


def multi_candidate_verify(
    branch_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator,
    draft_probs: torch.Tensor | None = None,
) -> tuple[int, int, int]:
    """Lossless sampling verification of several candidate branches: :func:`multi_candidate_tree_verify` with
    the candidates given as branches (the rule is implemented once, there).

    Each branch is a linear candidate continuing the committed prefix; branches that share a prefix share
    those nodes of the prefix tree, and children are tried in branch order. One branch of deterministic tokens
    is prompt lookup's case (accept ``x`` with ``target_probs[x]``, else draw from ``target_probs`` without
    ``x``); a branch with ``draft_probs`` is a sampled draft (Leviathan et al.'s rule at its nodes).

    Example:
        One deterministic branch ``[[4, 2]]`` (prompt lookup), ``target_probs[0, 0] = [.1, .1, .1, .1, .6]``:
        4 is accepted with probability 0.6; if rejected, the token is drawn from ``[.25, .25, .25, .25, 0]``.
        Two branches ``[[4, 2], [1, 3]]``: 4 is tried first (0.6), then 1 with probability
        ``0.1 / 0.4 = 0.25``, then a draw from ``[1/3, 0, 1/3, 1/3, 0]``: overall token 1 keeps ``0.4 * 0.25 = 0.1``.

    Args:
        branch_tokens: ``torch.LongTensor`` of shape ``(num_branches, branch_len)``; shorter branches are
            right-padded with ``-1``.
        target_probs: ``torch.FloatTensor`` of shape ``(num_branches, branch_len + 1, vocab_size)``: row ``b``
            column ``j`` is the target's processed distribution after the committed prefix plus the branch's
            first ``j`` tokens (column 0 is the same for every branch).
        generator: source of the uniform draws and of the resampled token.
        draft_probs: ``None`` (every candidate deterministic), or ``torch.FloatTensor`` of shape
            ``(num_branches, branch_len, vocab_size)``: the distribution each branch token was drawn from
            (one-hot rows are deterministic tokens).

    Returns:
        ``(branch_index, num_accepted, next_token)``: a branch holding the accepted
        path (the lowest index among those that do), how many of its tokens were accepted, and the token
        emitted after them.

    Raises:
        ValueError: on mismatched shapes, zero branches, or a sampled child that is not tried first.
    """
    if branch_tokens.dim() != 2 or branch_tokens.shape[0] == 0:
        raise ValueError(
            f"branch_tokens must have shape (num_branches >= 1, branch_len), got {tuple(branch_tokens.shape)}"
        )
    num_branches, branch_len = branch_tokens.shape
    if target_probs.dim() != 3 or tuple(target_probs.shape[:2]) != (num_branches, branch_len + 1):
        raise ValueError(f"target_probs needs shape ({num_branches}, {branch_len + 1}, V), "
                         f"got {tuple(target_probs.shape)}")
    vocab = target_probs.shape[-1]
    if draft_probs is not None and tuple(draft_probs.shape) != (num_branches, branch_len, vocab):
        raise ValueError(f"draft_probs needs shape ({num_branches}, {branch_len}, {vocab}), "
                         f"got {tuple(draft_probs.shape)}")
    # Node 0 = the root, node 1 + b * branch_len + j = branch b's token j (parent: its token j - 1, or the root).
    tokens = [-1] + branch_tokens.reshape(-1).tolist()
    parents = [-1] + [0 if j == 0 else b * branch_len + j for b in range(num_branches) for j in range(branch_len)]
    node_probs = (target_probs[0] if num_branches == 1
                  else torch.cat([target_probs[0, :1], target_probs[:, 1:].reshape(-1, vocab)]))
    node_draft = (None if draft_probs is None else
                  {1 + b * branch_len + j: draft_probs[b, j] for b in range(num_branches) for j in range(branch_len)})
    path, next_token = multi_candidate_tree_verify(tokens, parents, node_probs, generator, node_draft)
    branch = (path[-1] - 1) // branch_len if path else 0
    return branch, len(path), next_token
