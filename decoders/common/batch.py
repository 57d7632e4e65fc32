"""Static batches: ``B`` prompts decoded together, one target forward per step for all of them, each row lossless.

Rows of a batch have prompts of different lengths and accept different numbers of tokens each step, so their KV
entries never line up. :class:`BatchCache` keeps them in one transformers ``DynamicCache`` of shape
``(rows, kv_heads, slots, head_dim)`` and lets each row attend only to the slots it holds:

* every forward feeds one *block* per row, left-padded to a common length ``n``; a pad slot attends only to itself
  and no token attends to it;
* a token's position id is the number of tokens its row holds plus its depth in its block's tree (a chain: its
  index), what it is at batch size 1, so rotary embeddings see the same positions;
* a rejected token's slot leaves its row's slot list (the entry stays in the tensor, masked out): a step never
  copies the cache; when dead slots are at least as many as the longest row's live ones (and
  :data:`COMPACT_MIN` or more), every row's live slots are gathered to the front, one gather per layer (amortized
  O(1) per token);
* a row that finished leaves the batch (:meth:`BatchCache.select`); the others run on without it.

This is the padded layout of batched speculative decoding (BASS, Qian et al. 2024, arXiv 2404.15778: ragged rows,
per-row accepted lengths, masks and positions per row). Masked slots get exactly zero attention weight (an additive
dtype-min mask), so a row's tokens are its batch-1 tokens; only the batched matmuls' summation order differs, which
float32 equality tests per row check (tests/test_batch.py).

:func:`decode_batch` is :func:`decoders.common.driver.decode` for a batch: the same proposals
(:class:`~decoders.common.driver.DraftTree`), the same verification rule per row
(:func:`~decoders.common.driver.verify_tree`), the same stop rule and step records. Its proposer is a
:class:`BatchProposer`: :class:`PerRow` (one batch-1 proposer per row, for proposers that run no model: copies from
the context, n-gram pools) or a decoder's own (the draft model batched: speculative decoding). Each row draws from its
own generator, so a row's random draws do not depend on the rows beside it.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable, Protocol, Sequence

import torch
from transformers import PreTrainedModel

from decoders.common.checks import check_input_ids
from decoders.common.driver import DraftTree, Proposer, Verdict, step_record, verify_tree
from decoders.common.forward import forward, new_cache
from decoders.common.sampling import SamplingConfig, check_generator
from decoders.common.stopping import check_max_new_tokens, truncate_at_stop
from decoders.common.tree import ancestors
from decoders.types import NULL_STOPWATCH, DecodeResult, StepRecord, Stopwatch

#: Fewest dead slots worth a compaction (see :class:`BatchCache`).
COMPACT_MIN = 64
#: Row stride of a batch mask, in elements (CUDA attention kernels read masks in aligned vectors; see
#: :func:`decoders.common.tree.tree_attention`).
_MASK_ALIGN = 16


@lru_cache(maxsize=64)
def _chain(k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ancestor_or_self (k, k) bool, depth (k,))`` of a chain of ``k`` tokens; cached, never mutated."""
    return torch.ones((k, k), dtype=torch.bool).tril_(), torch.arange(k)


class BatchCache:
    """One model's KV cache for a batch of rows of different lengths (the layout: this module's docstring).

    Args:
        model: a transformers causal LM whose cache can be edited
            (:func:`decoders.common.kv_cache.check_rollback`).
        rows: the batch size.

    Attributes:
        cache: the ``DynamicCache``; keys and values of shape ``(rows, kv_heads, width, head_dim)``.
        slots: per row, the cache slot of each token it holds, in order (``len(slots[i])`` = the row's length =
            the position id of its next token).
        width: slots in the cache tensors (live or dead).
    """

    def __init__(self, model: PreTrainedModel, rows: int):
        self.model = model
        self.cache = new_cache(model)
        self.slots: list[list[int]] = [[] for _ in range(rows)]
        self.width = 0
        self.device = model.get_input_embeddings().weight.device
        self.dtype = model.dtype  # once: transformers' ``dtype`` walks the parameters on every read

    @property
    def rows(self) -> int:
        return len(self.slots)

    def length(self, row: int) -> int:
        """Tokens row ``row`` holds."""
        return len(self.slots[row])

    def forward(self, blocks: Sequence[Sequence[int]], parents: Sequence[Sequence[int] | None] | None = None,
                keep_last: int = 1) -> tuple[torch.Tensor, list[list[int]]]:
        """Feed each row its block of new tokens in one forward; the new slots are not yet part of any row.

        Args:
            blocks: per row, the token ids to feed (a row with none gets pads only).
            parents: per row, the block's parent array (``-1``: right after what the row holds, else an earlier
                index of the block), or ``None`` for a chain; ``None``: every block is a chain.
            keep_last: the LM head runs on the last ``keep_last`` positions of the padded blocks (blocks are
                left-padded, so a row's last ``len(block)`` positions are its tokens).

        Returns:
            ``(logits, placed)``: ``torch.Tensor`` of shape ``(rows, min(keep_last, n), vocab_size)`` in the model's
            dtype (``n`` the longest block), and per row the cache slot of each of its block's tokens, to hand to
            :meth:`append` or :meth:`keep`.

        Raises:
            ValueError: if ``blocks`` does not have one entry per row, every block is empty, or a parent array is
                bad.
        """
        rows = self.rows
        if len(blocks) != rows:
            raise ValueError(f"{len(blocks)} blocks for a batch of {rows} rows")
        n = max((len(b) for b in blocks), default=0)
        if n == 0:
            raise ValueError("every block is empty: nothing to feed")
        self._compact()
        width = self.width
        allowed = torch.zeros((rows, n, width + n), dtype=torch.bool)
        for i, held in enumerate(self.slots):
            if held:
                allowed[i, :, held] = True
        diag = torch.arange(n)
        allowed[:, diag, width + diag] = True  # a pad sees itself only (no fully masked row)
        ids = torch.zeros((rows, n), dtype=torch.long)
        positions = torch.zeros((rows, n), dtype=torch.long)
        placed = []
        for i, block in enumerate(blocks):
            k, pad, base = len(block), n - len(block), len(self.slots[i])
            if k:
                tree = parents[i] if parents is not None else None
                anc, depth = _chain(k) if tree is None else ancestors(tuple(int(p) for p in tree))
                if anc.shape[0] != k:
                    raise ValueError(f"row {i}: {k} tokens but {anc.shape[0]} parents")
                allowed[i, pad:, width + pad:] = anc
                ids[i, pad:] = torch.tensor(list(block), dtype=torch.long)
                positions[i, pad:] = base + depth
            positions[i, :pad] = base
            placed.append(list(range(width + pad, width + n)))
        dtype = self.dtype
        mask = torch.zeros((rows, 1, n, -(-(width + n) // _MASK_ALIGN) * _MASK_ALIGN), dtype=dtype,
                           device=self.device)[..., : width + n]
        mask.masked_fill_(~allowed.to(self.device).unsqueeze(1), torch.finfo(dtype).min)
        logits = forward(self.model, ids.to(self.device), self.cache, position_ids=positions.to(self.device),
                         attention_mask=mask, logits_to_keep=min(keep_last, n))
        self.width += n
        return logits, placed

    def append(self, row: int, slots: Sequence[int]) -> None:
        """Row ``row`` now also holds the tokens at ``slots`` (from :meth:`forward`), after what it held."""
        self.slots[row].extend(slots)

    def keep(self, row: int, start: int, slots: Sequence[int]) -> None:
        """Row ``row`` keeps its first ``start`` tokens then the tokens at ``slots``; the rest is dropped (the
        batch form of :func:`decoders.common.kv_cache.keep_path`; ``keep(row, k, [])`` is a crop to ``k``)."""
        held = self.slots[row]
        if not 0 <= start <= len(held):
            raise ValueError(f"row {row} holds {len(held)} tokens; cannot keep the first {start}")
        self.slots[row] = held[:start] + list(slots)

    def select(self, keep: Sequence[int]) -> None:
        """Keep only the rows at indices ``keep`` (in that order); the others leave the batch."""
        if list(keep) == list(range(self.rows)):
            return
        if self.width:
            self.cache.batch_select_indices(torch.tensor(list(keep), dtype=torch.long, device=self.device))
        self.slots = [self.slots[i] for i in keep]

    def _compact(self) -> None:
        """Gather every row's live slots to the front when at least as many slots are dead (see the class)."""
        live = max((len(s) for s in self.slots), default=0)
        if self.width - live < max(COMPACT_MIN, live):
            return
        index = torch.zeros((self.rows, live), dtype=torch.long)
        for i, held in enumerate(self.slots):
            if held:
                index[i, : len(held)] = torch.tensor(held, dtype=torch.long)
        with torch.inference_mode():
            for layer in self.cache.layers:
                keys = layer.keys
                idx = index.to(keys.device)[:, None, :, None].expand(-1, keys.shape[1], -1, keys.shape[3])
                layer.keys = keys.gather(2, idx)
                layer.values = layer.values.gather(2, idx)
        self.slots = [list(range(len(s))) for s in self.slots]
        self.width = live


class BatchProposer(Protocol):
    """Where candidates come from, for one batch (a fresh one per :func:`decode_batch` call).

    Rows are named by their index in the batch as given (``rows``); the lists a method gets are in the order of
    the rows still decoding (the same order as the target's :class:`BatchCache` after :meth:`select`).
    """

    def start(self, prompts: list[list[int]]) -> None:
        """Called once before the target's prefill, with every row's prompt."""

    def propose(self, rows: list[int], contexts: list[list[int]], remaining: list[int],
                generators: list[torch.Generator | None]) -> list[DraftTree]:
        """One :class:`~decoders.common.driver.DraftTree` per row still decoding (the rules of
        :meth:`decoders.common.driver.Proposer.propose`, per row)."""

    def accepted(self, rows: list[int], contexts: list[list[int]], trees: list[DraftTree],
                 verdicts: list[Verdict]) -> None:
        """Told what the target accepted in each row (:meth:`decoders.common.driver.Proposer.accepted`)."""

    def select(self, keep: list[int]) -> None:
        """Only the rows at indices ``keep`` of the current list go on (the others finished)."""

    def extra(self, row: int, steps: Sequence[StepRecord], stats: dict[str, float]) -> dict[str, Any]:
        """Row ``row``'s decoder-specific scalars (:meth:`decoders.common.driver.Proposer.extra`)."""


class PerRow:
    """A :class:`BatchProposer` made of one batch-1 :class:`~decoders.common.driver.Proposer` per row, for
    proposers that run no model of their own (copies from the context, n-gram pools, Jacobi windows fed through
    the target): their work is host work per row, the target forward is the batched one.

    Args:
        make: a fresh batch-1 proposer (a decoder's :meth:`~decoders.common.base.DraftingDecoder.proposer`).
        rows: the batch size.
    """

    def __init__(self, make: Callable[[], Proposer], rows: int):
        self.proposers = [make() for _ in range(rows)]

    def start(self, prompts: list[list[int]]) -> None:
        for proposer, prompt in zip(self.proposers, prompts):
            proposer.start(prompt)

    def propose(self, rows: list[int], contexts: list[list[int]], remaining: list[int],
                generators: list[torch.Generator | None]) -> list[DraftTree]:
        return [self.proposers[r].propose(c, k, g) for r, c, k, g in zip(rows, contexts, remaining, generators)]

    def accepted(self, rows: list[int], contexts: list[list[int]], trees: list[DraftTree],
                 verdicts: list[Verdict]) -> None:
        for r, c, t, v in zip(rows, contexts, trees, verdicts):
            self.proposers[r].accepted(c, t, v)

    def select(self, keep: list[int]) -> None:
        pass

    def extra(self, row: int, steps: Sequence[StepRecord], stats: dict[str, float]) -> dict[str, Any]:
        return self.proposers[row].extra(steps, stats)


def check_batch(input_ids: Sequence[torch.Tensor], generators: Sequence[torch.Generator | None] | None,
                sampling: SamplingConfig) -> list[torch.Generator | None]:
    """The input check of every ``generate_batch``: at least one prompt, each a ``(1, prompt_len >= 1)`` tensor
    (:func:`decoders.common.checks.check_input_ids`), one generator per row when sampling.

    Returns:
        the generators, one per row (``None`` entries when greedy and none were given).

    Raises:
        ValueError: no prompt, a bad prompt tensor, or a generator missing or the wrong number of them.
    """
    if len(input_ids) == 0:
        raise ValueError("a batch needs at least one prompt")
    for ids in input_ids:
        check_input_ids(ids)
    gens = list(generators) if generators is not None else [None] * len(input_ids)
    if len(gens) != len(input_ids):
        raise ValueError(f"{len(gens)} generators for {len(input_ids)} prompts: give one per row")
    for g in gens:
        check_generator(sampling, g)
    return gens


def retire(active: list[int], done: Sequence[bool], caches: Sequence[BatchCache | BatchProposer],
           finished: Callable[[int], None] | None) -> list[int]:
    """Drop the rows whose ``done`` flag is set from ``active`` and from each of ``caches`` (a :class:`BatchCache`
    or a :class:`BatchProposer`), calling ``finished(row)`` for each; returns the rows still decoding."""
    keep = [i for i, d in enumerate(done) if not d]
    if finished is not None:
        for i, d in enumerate(done):
            if d:
                finished(active[i])
    if len(keep) < len(active):
        for c in caches:
            c.select(keep)
    return [active[i] for i in keep]


@torch.inference_mode()
def decode_batch(
    target_model: PreTrainedModel,
    proposer: BatchProposer,
    input_ids: Sequence[torch.Tensor],
    max_new_tokens: int,
    *,
    eos_token_ids: frozenset[int],
    sampling: SamplingConfig,
    generators: Sequence[torch.Generator | None] | None = None,
    stopwatch: Stopwatch | None = None,
    finished: Callable[[int], None] | None = None,
) -> list[DecodeResult]:
    """Decode a static batch of prompts with ``proposer``'s candidates, one target forward per step for every row
    still decoding; each row lossless (its tokens are :func:`decoders.common.driver.decode`'s for that prompt).

    Args:
        target_model: the model whose greedy output (or sampling distribution) is reproduced per row.
        proposer: a fresh :class:`BatchProposer` for this batch.
        input_ids: ``B`` tensors, each ``torch.LongTensor`` of shape ``(1, prompt_len_b >= 1)`` on the target's
            device (lengths may differ).
        max_new_tokens: upper bound on new tokens per row, >= 1.
        eos_token_ids: ids that end a row (kept, nothing after them).
        sampling: greedy or the run's sampling settings.
        generators: sampling: one ``torch.Generator`` per row, the only source of that row's randomness.
        stopwatch: the batch's timer, as in :func:`~decoders.common.driver.decode` (``first_token()`` after the
            batched prefill: every row's first token comes from it).
        finished: called with a row's index as soon as its last token is committed (per-request latency).

    Returns:
        One :class:`~decoders.types.DecodeResult` per prompt, in order: its tokens, one
        :class:`~decoders.types.StepRecord` per target forward it took part in (``target_tokens_fed``: its own
        tokens, not the pads) and the proposer's ``extra`` for it.

    Raises:
        ValueError: as :func:`check_batch`, ``max_new_tokens < 1``, or a proposal with a bad parent array.
    """
    gens = check_batch(input_ids, generators, sampling)
    check_max_new_tokens(max_new_tokens)
    watch = stopwatch or NULL_STOPWATCH
    prompts = [ids[0].tolist() for ids in input_ids]
    batch = len(prompts)
    proposer.start(prompts)
    cache = BatchCache(target_model, batch)
    logits, placed = cache.forward(prompts)
    contexts = []
    for i, prompt in enumerate(prompts):
        cache.append(i, placed[i])
        contexts.append([*prompt, sampling.next_token(logits[i, -1], gens[i])])
    watch.lap("verify")
    watch.first_token()
    steps = [[StepRecord(target_tokens_fed=len(p), emitted=1, source={"bonus": 1})] for p in prompts]
    stats: list[dict[str, float]] = [{} for _ in prompts]

    def new(r: int) -> int:
        return len(contexts[r]) - len(prompts[r])

    active = retire(list(range(batch)), [new(r) >= max_new_tokens or contexts[r][-1] in eos_token_ids
                                         for r in range(batch)], (cache, proposer), finished)
    while active:
        remaining = [max_new_tokens - new(r) for r in active]
        trees = proposer.propose(active, [contexts[r] for r in active], remaining, [gens[r] for r in active])
        watch.mark("propose")
        watch.lap("draft")
        blocks = [[contexts[r][-1], *t.tokens] for r, t in zip(active, trees)]
        parents = [None if t.is_chain else [-1, *(p + 1 for p in t.parents)] for t in trees]
        starts = [cache.length(i) for i in range(len(active))]
        n = max(map(len, blocks))
        watch.mark("inputs")
        logits, placed = cache.forward(blocks, parents, keep_last=n)
        watch.mark("forward")
        verdicts = []
        for i, (r, tree) in enumerate(zip(active, trees)):
            rows = logits[i, n - len(blocks[i]):]
            path, token, preds = verify_tree(tree, rows, contexts[r][-1], sampling, gens[r])
            emitted = truncate_at_stop([*(tree.tokens[k] for k in path), token], eos_token_ids, remaining[i])
            verdicts.append(Verdict(path, emitted, min(len(path), len(emitted)), rows, preds))
        watch.mark("rule")
        for i, v in enumerate(verdicts):
            cache.keep(i, starts[i], [placed[i][0], *(placed[i][1 + k] for k in v.path[: v.kept])][: len(v.emitted)])
            contexts[active[i]].extend(v.emitted)
        watch.mark("cache")
        proposer.accepted(active, [contexts[r] for r in active], trees, verdicts)
        watch.mark("update")
        for r, tree, v in zip(active, trees, verdicts):
            steps[r].append(step_record(tree, v))
            for key, value in tree.counts.stats.items():
                stats[r][key] = stats[r].get(key, 0) + value
        active = retire(active, [new(r) >= max_new_tokens or not eos_token_ids.isdisjoint(v.emitted)
                                 for r, v in zip(active, verdicts)], (cache, proposer), finished)
        watch.mark("bookkeeping")
        watch.lap("verify")

    return [DecodeResult(tuple(truncate_at_stop(contexts[r][len(prompts[r]):], eos_token_ids, max_new_tokens)),
                         tuple(steps[r]), proposer.extra(r, steps[r][1:], stats[r])) for r in range(batch)]
