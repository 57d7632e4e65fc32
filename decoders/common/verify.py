"""Greedy verification of a linear draft against the target's argmax predictions.

Follows the greedy special case of speculative decoding (Leviathan et al. 2023, arXiv 2211.17192,
Algorithm 1; Chen et al. 2023, arXiv 2302.01318): draft token ``i`` is accepted while it equals the
target's argmax at the previous position; the target's argmax right after the last accepted token is
the bonus (or correction) token. Sampling verification is not implemented.
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
