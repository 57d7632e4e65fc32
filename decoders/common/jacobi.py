"""The Jacobi window of lookahead decoding, as a reusable object.

Fu, Bailis, Stoica & Zhang 2024 (arXiv 2402.02057, section 3.1, Algorithm 1): the *lookahead branch* keeps a
2-D window of ``N - 1`` rows by ``W`` columns of guessed future tokens. Each forward feeds the window (with
the mask of :func:`decoders.common.tree.lookahead_layout`), the model's argmax at the last row becomes a
new row, and once all rows are filled every column read top to bottom plus its new token is an n-gram
harvested into the :class:`~decoders.common.ngram_pool.NGramPool`. The window then shifts up by one row.

What lives here: :class:`JacobiWindow` (initialisation from the prompt, the tokens to feed, the update
after a forward). What does not: the layout with the verification branch
(:class:`decoders.common.lookahead_step.LookaheadBranches`, shared by lookahead on the target, through the
decode driver, and Ouroboros' drafter on its draft model), the forward and the KV cache.
"""

from __future__ import annotations

import random
from typing import Sequence


class JacobiWindow:
    """A lookahead window of ``ngram_size - 1`` rows that fills up over ``ngram_size - 2`` warm-up updates.

    Row 0 column 0 is a placeholder for the *input token* (the last accepted token, fed by the caller in
    front of the window); every other entry is a guess. Row ``k`` column ``i`` sits at position
    ``p + k + i`` when the input token is at ``p`` (:func:`decoders.common.tree.lookahead_layout`).

    Initialisation (as LookaheadDecoding's ``copy_from``): row 0 is the placeholder plus ``W + N - 3``
    tokens drawn from the prompt by a ``random.Random(seed)``. Each warm-up update drops column 0 of every
    row and appends the new row without its column 0, so after ``N - 2`` updates there are ``N - 1`` rows of
    ``W`` columns each; from then on every update harvests ``W`` n-grams.

    Example:
        ``W = 2, N = 3``, prompt ``[5]``: rows ``[[-1, 5, 5]]`` (placeholder + ``W + N - 3 = 2`` tokens).
        After a forward whose last-row argmax is ``[8, 9, 7]``: rows ``[[5, 5], [9, 7]]`` (warm-up, nothing
        harvested). After the next forward with input token ``4`` and new row ``[1, 2]``: harvested n-grams
        ``(4, 9, 1)`` and ``(5, 7, 2)`` (column 0's key is the true input token), rows ``[[-1, 7], [1, 2]]``.

    Args:
        window_size: ``W >= 1`` columns.
        ngram_size: ``N >= 2``; the window has ``N - 1`` rows and harvests ``N``-grams.
        prompt: token ids the initial guesses are drawn from (non-empty).
        seed: seed of the draw.

    Raises:
        ValueError: on ``W < 1``, ``N < 2`` or an empty prompt.
    """

    def __init__(self, window_size: int, ngram_size: int, prompt: Sequence[int], seed: int = 0):
        if window_size < 1 or ngram_size < 2:
            raise ValueError(f"need window_size >= 1 and ngram_size >= 2, got {window_size}, {ngram_size}")
        if len(prompt) == 0:
            raise ValueError("the window is initialised from the prompt, which is empty")
        self.window_size = window_size
        self.ngram_size = ngram_size
        rng = random.Random(seed)
        self.rows: list[list[int]] = [[-1] + [int(rng.choice(prompt)) for _ in range(window_size + ngram_size - 3)]]

    @property
    def row_lengths(self) -> tuple[int, ...]:
        """Tokens per row, column 0 of row 0 (the input token) included."""
        return tuple(len(r) for r in self.rows)

    @property
    def depth(self) -> int:
        """Largest position offset of a window token from the input token (row 0 col 0 is offset 0)."""
        return len(self.rows[0]) - 1 + len(self.rows) - 1

    @property
    def filled(self) -> bool:
        """True once all ``N - 1`` rows exist (updates harvest n-grams from then on)."""
        return len(self.rows) == self.ngram_size - 1

    def tokens(self) -> list[int]:
        """The window tokens to feed after the input token, in :func:`lookahead_layout` flat order."""
        return self.rows[0][1:] + [t for r in self.rows[1:] for t in r]

    def update(self, input_token: int, new_row: Sequence[int]) -> list[tuple[int, ...]]:
        """Shift the window after a forward; return the n-grams harvested (none during warm-up).

        Args:
            input_token: the token that was fed in front of the window (the key of column 0).
            new_row: the model's argmax at each token of the last row (``row_lengths[-1]`` ids).

        Returns:
            ``W`` n-grams ``(key, c_1, ..., c_{N-1})`` once the window is filled, else ``[]``.

        Raises:
            ValueError: if ``new_row`` does not match the last row's length.
        """
        new_row = [int(t) for t in new_row]
        if len(new_row) != len(self.rows[-1]):
            raise ValueError(f"new_row needs {len(self.rows[-1])} tokens, got {len(new_row)}")
        if not self.filled:  # warm-up: drop column 0 of every row, add the new row
            self.rows = [r[1:] for r in self.rows] + [new_row[1:]]
            return []
        self.rows[0][0] = int(input_token)
        ngrams = list(zip(*self.rows, new_row))
        self.rows = (self.rows + [new_row])[1:]
        self.rows[0] = [-1] + self.rows[0][1:]
        return ngrams
