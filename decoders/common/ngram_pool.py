"""N-gram sources shared by the n-gram decoders: the lookahead n-gram pool and the prompt-lookup matcher.

What lives here: :class:`NGramPool`, the recency-ordered ``key token -> continuations`` store that
Lookahead decoding (Fu et al. 2024, arXiv 2402.02057, section 3) fills from its Jacobi window and
verifies from (Ouroboros, arXiv 2402.13720, reuses it as its phrase pool), :func:`start_pool` (a sample's
cold or warm start, optionally seeded with the prompt's n-grams), and
:func:`find_prompt_lookup_candidates`, the longest-suffix n-gram match of prompt lookup decoding
(Saxena 2023, github.com/apoorvumang/prompt-lookup-decoding), and :class:`SuffixIndex`, the same match kept
incrementally for a growing context (O(new tokens) per step instead of a scan of the context). What does not:
attention layouts (:mod:`decoders.common.tree`) and verification (:mod:`decoders.common.verify`). Pure Python,
no torch.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np


class NGramPool:
    """For each key token, up to ``guess_set_size`` continuations of ``ngram_size - 1`` tokens.

    An n-gram ``(k, c_1, ..., c_{N-1})`` is stored as the continuation ``(c_1, ..., c_{N-1})`` under the
    key ``k``: a guess for the ``N - 1`` tokens that follow ``k``.

    Eviction rule (LookaheadDecoding's ``update_token_map``, Ouroboros' ``CacheEngine``): each key's
    continuations are kept in recency order, oldest first. Inserting a continuation that is already
    stored moves it to the newest end (it is not duplicated). Inserting a new one when the key already
    holds ``guess_set_size`` continuations evicts the oldest. With ``guess_set_size == 0`` the pool
    stores nothing.

    Example:
        >>> pool = NGramPool(ngram_size=3, guess_set_size=2)
        >>> pool.insert(7, (1, 2)); pool.insert(7, (3, 4)); pool.get(7)
        [(1, 2), (3, 4)]
        >>> pool.insert(7, (1, 2)); pool.get(7)          # re-insertion refreshes (1, 2)
        [(3, 4), (1, 2)]
        >>> pool.insert(7, (5, 6)); pool.get(7)          # full: the oldest, (3, 4), is evicted
        [(1, 2), (5, 6)]
        >>> pool.topk(7, 1)                               # newest first
        [(5, 6)]

    Args:
        ngram_size: ``N >= 2``; continuations hold ``N - 1`` tokens.
        guess_set_size: ``G >= 0``; continuations kept per key.

    Raises:
        ValueError: if ``ngram_size < 2`` or ``guess_set_size < 0``.
    """

    def __init__(self, ngram_size: int, guess_set_size: int):
        if not isinstance(ngram_size, int) or ngram_size < 2:
            raise ValueError(f"ngram_size (N) must be an integer >= 2, got {ngram_size!r}")
        if not isinstance(guess_set_size, int) or guess_set_size < 0:
            raise ValueError(f"guess_set_size (G) must be an integer >= 0, got {guess_set_size!r}")
        self.ngram_size = ngram_size
        self.guess_set_size = guess_set_size
        # key -> {continuation: None}; dicts keep insertion order, so the first item is the oldest.
        self._table: dict[int, dict[tuple[int, ...], None]] = {}

    def insert(self, key: int, continuation: Sequence[int]) -> None:
        """Store ``continuation`` (``ngram_size - 1`` token ids) as the newest guess after ``key``.

        Raises:
            ValueError: if the continuation does not hold ``ngram_size - 1`` tokens.
        """
        cont = tuple(int(t) for t in continuation)
        if len(cont) != self.ngram_size - 1:
            raise ValueError(f"continuations hold ngram_size - 1 = {self.ngram_size - 1} tokens, got {len(cont)}")
        if self.guess_set_size == 0:
            return
        entries = self._table.setdefault(int(key), {})
        if cont in entries:
            del entries[cont]  # re-inserted below as the newest
        elif len(entries) >= self.guess_set_size:
            del entries[next(iter(entries))]  # evict the oldest
        entries[cont] = None

    def insert_ngrams(self, ngrams: Iterable[Sequence[int]]) -> None:
        """Insert whole n-grams ``(key, c_1, ..., c_{N-1})`` in order (the last one ends up newest)."""
        for ngram in ngrams:
            self.insert(ngram[0], ngram[1:])

    def get(self, key: int) -> list[tuple[int, ...]]:
        """Every continuation stored for ``key``, oldest first (empty list for an unknown key)."""
        return list(self._table.get(int(key), ()))

    def topk(self, key: int, k: int) -> list[tuple[int, ...]]:
        """The newest ``k`` continuations for ``key``, newest first (Ouroboros' draft-lengthening lookup)."""
        if k <= 0:
            return []
        return self.get(key)[::-1][:k]

    def replace(self, key: int, old: Sequence[int], new: Sequence[int]) -> None:
        """Overwrite the continuation ``old`` of ``key`` with ``new``, keeping its recency rank.

        Ouroboros' in-place refinement (Zhao et al. 2024, arXiv 2402.13720; reference
        ``CacheEngine.update_in_place``): a phrase the target just verified is replaced by the target's own
        predictions for it, without changing which phrases are newest. If ``old`` is not stored, ``new`` is
        inserted as the newest (:meth:`insert`); if ``new`` is already stored under ``key``, that other copy
        is dropped so nothing is duplicated.

        Example:
            >>> pool = NGramPool(ngram_size=3, guess_set_size=3)
            >>> pool.insert_ngrams([(7, 1, 2), (7, 3, 4), (7, 5, 6)])
            >>> pool.replace(7, (3, 4), (3, 9)); pool.get(7)
            [(1, 2), (3, 9), (5, 6)]
            >>> pool.replace(7, (3, 9), (5, 6)); pool.get(7)   # (5, 6) already stored: no duplicate
            [(1, 2), (5, 6)]

        Raises:
            ValueError: if ``new`` does not hold ``ngram_size - 1`` tokens.
        """
        old_t = tuple(int(t) for t in old)
        new_t = tuple(int(t) for t in new)
        if len(new_t) != self.ngram_size - 1:
            raise ValueError(f"continuations hold ngram_size - 1 = {self.ngram_size - 1} tokens, got {len(new_t)}")
        entries = self._table.get(int(key))
        if entries is None or old_t not in entries:
            self.insert(key, new_t)
            return
        rebuilt: dict[tuple[int, ...], None] = {}
        for cont in entries:
            if cont == old_t:
                rebuilt[new_t] = None
            elif cont != new_t:
                rebuilt[cont] = None
        self._table[int(key)] = rebuilt

    def clear(self) -> None:
        """Forget every n-gram."""
        self._table.clear()

    def __contains__(self, key: object) -> bool:
        return key in self._table

    def __len__(self) -> int:
        """Number of stored continuations over all keys."""
        return sum(len(v) for v in self._table.values())

    @property
    def num_keys(self) -> int:
        return len(self._table)


def start_pool(pool: NGramPool, prompt: Sequence[int], pool_scope: str, from_prompt: bool,
               vocab_limit: int | None = None) -> None:
    """Begin a sample's use of ``pool``: empty it under ``pool_scope="sample"`` (cold start; ``"task"`` keeps it),
    then, with ``from_prompt``, insert the prompt's own n-grams of ``pool.ngram_size`` tokens (LookaheadDecoding's
    ``POOL_FROM_PROMPT``), skipping those holding an id ``>= vocab_limit`` (``None``: no limit)."""
    if pool_scope == "sample":
        pool.clear()
    if from_prompt:
        n = pool.ngram_size
        ngrams = (prompt[i : i + n] for i in range(len(prompt) - n + 1))
        pool.insert_ngrams(ngrams if vocab_limit is None else (g for g in ngrams if max(g) < vocab_limit))


def find_prompt_lookup_candidates(
    tokens: Sequence[int],
    max_ngram_size: int,
    num_draft_tokens: int,
    min_ngram_size: int = 1,
) -> list[int]:
    """Propose draft tokens by matching the context's suffix n-gram earlier in the context.

    For ``n = max_ngram_size`` down to ``min_ngram_size``, the last ``n`` tokens are searched for in the
    earlier context; the first ``n`` with a match wins (longest suffix first, as in Saxena 2023,
    transformers' ``PromptLookupCandidateGenerator`` and vLLM's n-gram proposer). Among the matches for
    that ``n``, the MOST RECENT one is chosen (as vLLM; Saxena's reference code and transformers take the
    earliest): in generated code and prose the latest repetition is usually the most relevant. The draft
    is the up to ``num_draft_tokens`` tokens that follow the match. When they run past the end of the
    context, copying continues over the draft itself (``draft[j] = (tokens + draft)[match_end + j]``),
    i.e. the periodic pattern is extrapolated instead of cutting the draft short: the most recent match of
    a period-``p`` repetition would otherwise yield only ``p`` tokens.

    Example:
        ``tokens = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2]``, ``max_ngram_size=3``, ``num_draft_tokens=3``: no
        3-gram match for ``[5, 1, 2]``; the 2-gram ``[1, 2]`` occurs at 0 and at 4, the most recent is at 4,
        so the draft is ``[3, 5, 1]``. With ``tokens = [7, 8, 8, 8]``, ``max_ngram_size=2``,
        ``num_draft_tokens=4``: ``[8, 8]`` last occurs at 1, followed by ``[8]`` then the draft itself,
        so the draft is ``[8, 8, 8, 8]``.

    Args:
        tokens: prompt + generated token ids so far.
        max_ngram_size: longest suffix n-gram tried (>= ``min_ngram_size``).
        num_draft_tokens: draft length wanted (>= 0).
        min_ngram_size: shortest suffix n-gram tried (>= 1).

    Returns:
        The draft token ids, ``num_draft_tokens`` long, or empty when no suffix n-gram recurs.

    Raises:
        ValueError: on inconsistent sizes.
    """
    if not 1 <= min_ngram_size <= max_ngram_size:
        raise ValueError(f"need 1 <= min_ngram_size <= max_ngram_size, got {min_ngram_size}, {max_ngram_size}")
    if num_draft_tokens < 0:
        raise ValueError(f"num_draft_tokens must be >= 0, got {num_draft_tokens}")
    seq = np.asarray(tokens, dtype=np.int64)
    length = seq.shape[0]
    if num_draft_tokens == 0:
        return []
    for n in range(min(max_ngram_size, length - 1), min_ngram_size - 1, -1):
        # Windows starting at 0 .. length-n-1: every occurrence except the suffix itself.
        windows = np.lib.stride_tricks.sliding_window_view(seq[:-1], n)
        hits = np.flatnonzero((windows == seq[length - n :]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n  # first token after the most recent match; < length
            ext = seq.tolist()
            for j in range(num_draft_tokens):
                ext.append(ext[start + j])
            return ext[length:]
    return []


class SuffixIndex:
    """:func:`find_prompt_lookup_candidates` for one growing context, without rescanning it every step.

    For every n-gram size ``1 .. max_ngram_size`` a dictionary maps each n-gram of the context to the start of its
    most recent occurrence that is not the context's own suffix (a window ending before the last token). Each
    call indexes only the tokens added since the last one, so a step costs O(new tokens x max_ngram_size) plus the
    copy, where the function scans the whole context (~0.1 ms at 500 tokens, ~0.5 ms at 8,000). The context may
    only grow between calls (a decode's context: prompt, then committed tokens): a shorter one is refused, an
    edited one of the same length is not detected (the index keeps what it read). Ids come back as ``int``.

    Example:
        >>> index = SuffixIndex(max_ngram_size=3)
        >>> index.candidates([1, 2, 3, 4, 1, 2, 3, 5, 1, 2], 3)   # as find_prompt_lookup_candidates
        [3, 5, 1]

    Args:
        max_ngram_size: the longest suffix n-gram a call may ask for (``>= 1``).

    Raises:
        ValueError: on a size out of range, or (in :meth:`candidates`) a context shorter than the one indexed.
    """

    def __init__(self, max_ngram_size: int):
        if max_ngram_size < 1:
            raise ValueError(f"max_ngram_size must be >= 1, got {max_ngram_size}")
        self.max_ngram_size = max_ngram_size
        self._last: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_ngram_size + 1)]  # by n-gram size
        self._tokens: list[int] = []
        self._ends = 0  # windows ending at positions < this are indexed

    def candidates(self, tokens: Sequence[int], num_draft_tokens: int, min_ngram_size: int = 1,
                   max_ngram_size: int | None = None) -> list[int]:
        """Exactly ``find_prompt_lookup_candidates(tokens, max_ngram_size, num_draft_tokens, min_ngram_size)``
        (``max_ngram_size`` defaults to the index's and may not exceed it); ``tokens`` extends the context of the
        previous call."""
        top = self.max_ngram_size if max_ngram_size is None else max_ngram_size
        if not 1 <= min_ngram_size <= top <= self.max_ngram_size:
            raise ValueError(f"need 1 <= min_ngram_size <= max_ngram_size <= {self.max_ngram_size}, got "
                             f"{min_ngram_size}, {top}")
        if num_draft_tokens < 0:
            raise ValueError(f"num_draft_tokens must be >= 0, got {num_draft_tokens}")
        length = len(tokens)
        if length < len(self._tokens):
            raise ValueError(f"the context shrank from {len(self._tokens)} to {length} tokens: an index follows one "
                             "growing context")
        self._tokens.extend(int(t) for t in tokens[len(self._tokens):])  # ids as ints (a tensor's hash by identity)
        seq = self._tokens
        for end in range(self._ends, length - 1):  # windows that end before the last token
            for n in range(1, min(self.max_ngram_size, end + 1) + 1):
                self._last[n][tuple(seq[end - n + 1: end + 1])] = end - n + 1
        self._ends = max(self._ends, length - 1)
        if num_draft_tokens == 0:
            return []
        for n in range(min(top, length - 1), min_ngram_size - 1, -1):
            hit = self._last[n].get(tuple(seq[length - n:]))
            if hit is not None:
                start = hit + n  # first token after the most recent match; < length
                draft: list[int] = []
                for i in range(start, start + num_draft_tokens):  # past the context's end: over the draft itself
                    draft.append(seq[i] if i < length else draft[i - length])
                return draft
        return []

    def continuation(self, tail: Sequence[int], num_tokens: int, min_ngram_size: int = 1) -> list[int]:
        """What followed the context indexed so far where it held the longest suffix of ``tail`` (``n`` from
        ``max_ngram_size`` down to ``min_ngram_size`` tokens): up to ``num_tokens`` ids after that occurrence,
        within the indexed context (shorter near its end); ``[]`` when no suffix of those sizes occurred. ``tail``
        need not be part of the context (e.g. the context's last tokens followed by a draft's path); nothing is
        indexed or changed. Call :meth:`candidates` first with the current context, so it is indexed."""
        for n in range(min(self.max_ngram_size, len(tail)), min_ngram_size - 1, -1):
            hit = self._last[n].get(tuple(int(t) for t in tail[len(tail) - n:]))
            if hit is not None:
                return self._tokens[hit + n: hit + n + num_tokens]
        return []
