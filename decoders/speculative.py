"""Draft-model speculative decoding, greedy or sampled.

Leviathan, Kalman & Matias 2023 ("Fast Inference from Transformers via Speculative Decoding",
arXiv 2211.17192, Algorithm 1) and Chen et al. 2023 (arXiv 2302.01318, Algorithm 2): the draft model
proposes ``gamma`` tokens autoregressively, the target model scores all of them in one forward, and
rejected tokens are rolled back from both KV caches.

* Greedy (temperature 0): the longest prefix matching the target's argmax is accepted, then the target's
  own next token (the bonus token) -- :func:`decoders.common.verify.tree_verify` on a chain.
* Sampling (temperature > 0): the draft samples each token from its own processed distribution (the same
  warpers as the target, :class:`decoders.common.sampling.SamplingConfig`), and the target accepts by
  modified rejection sampling -- accept ``x`` with ``min(1, target_probs[x] / draft_probs[x])``, on rejection
  resample from ``normalize(max(0, target_probs - draft_probs))``, a bonus token from ``target_probs`` after a
  fully accepted draft (:func:`decoders.common.verify.rejection_verify`). The output is distributed exactly
  as vanilla sampling's.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from transformers import PreTrainedModel

from decoders.common.base import DraftingDecoder, DraftVocab, draft_view
from decoders.common.batch import BatchCache
from decoders.common.driver import DraftCounts, DraftTree, Verdict
from decoders.common.forward import forward, new_cache
from decoders.common.kv_cache import crop
from decoders.common.sampling import SamplingConfig, argmax_ids, sample_token
from decoders.settings import SpeculativeSettings
from decoders.types import StepRecord


class SpeculativeDecoder(DraftingDecoder, settings=SpeculativeSettings, uses_draft=True):
    """Speculative decoding with a draft model (greedy, or lossless sampling by rejection sampling).

    Cache invariant between steps: both caches hold KV for every committed token except the last one
    (``pending``), which is fed first in the next forward. After a fully accepted draft the draft cache
    also lacks the last draft token; it is fed together with ``pending`` in the next draft forward.

    Each step's :class:`~decoders.types.StepRecord` carries ``drafted`` (tokens proposed), ``accepted``,
    ``draft_forwards`` and the tokens fed to each model; ``source = {"draft": accepted, "bonus": 0 or 1}``.

    Args:
        target_model: the model whose greedy output is reproduced.
        draft_model: a smaller model with the same tokenizer.
        gamma: draft tokens per step (>= 1). Near the end the draft is shortened so a step never
            produces more than ``max_new_tokens``.
        draft_window: ``>= 0``; 0 = off. Otherwise the draft reads only the prompt's first 4 and last
            ``draft_window`` tokens (:func:`~decoders.common.base.draft_view`): a shorter draft prefill on long
            prompts, other drafts, the same output.
        eos_token_ids: ids that end generation. Drafting also stops early at an EOS draft token.
        sampling: greedy (the default) or the sampling settings of the run, applied to both models.

    Raises:
        ValueError: if ``gamma < 1``, ``draft_model`` is missing, or either model's KV cache cannot be rolled
            back (:func:`decoders.common.kv_cache.check_rollback`).
    """

    name = "speculative"
    draft_shape = "chain"
    supports_sampling = True
    supports_batch = True

    def proposer(self) -> "_DraftChain":
        return _DraftChain(self.draft_model, self.vocab, self.gamma, self.eos_token_ids, self.sampling,
                           self.draft_window)

    def batch_proposer(self, rows: int) -> "_BatchDraftChain":
        return _BatchDraftChain(self, rows)


def draft_next(logits: torch.Tensor, vocab: DraftVocab, sampling: SamplingConfig,
               generator: torch.Generator | None) -> tuple[int, torch.Tensor | None]:
    """The draft's next token from its logits at one position, ``torch.Tensor`` of shape ``(draft_vocab,)``, and
    (sampling) the distribution it was drawn from, ``torch.FloatTensor`` of shape ``(target_vocab,)`` (zero beyond
    the shared ids); ``None`` when greedy."""
    logits = logits[: vocab.draft]
    if sampling.greedy:
        return int(argmax_ids(logits)), None
    probs = torch.zeros(vocab.target, dtype=torch.float32, device=logits.device)
    probs[: vocab.draft] = sampling.probs(logits)
    return sample_token(probs, generator), probs


class _DraftChain:
    """The speculative proposer for one sample: ``gamma`` tokens drafted autoregressively by the draft model.

    Draft cache invariant between steps: it holds a prefix of the context (as the draft window shows it,
    :func:`~decoders.common.base.draft_view`: ``offset`` tokens fewer); ``feed`` is the rest except the pending
    token (the prompt before the first step, so the draft's prefill is charged to the first drafting step; the
    last draft token after a fully accepted draft).
    """

    def __init__(self, draft_model: PreTrainedModel, vocab: DraftVocab, gamma: int, eos_token_ids: frozenset[int],
                 sampling: SamplingConfig, draft_window: int = 0):
        self.draft_model, self.vocab, self.gamma = draft_model, vocab, gamma
        self.eos_token_ids, self.sampling, self.window = eos_token_ids, sampling, draft_window
        self.cache = new_cache(draft_model)
        self.device = draft_model.get_input_embeddings().weight.device
        self.feed: list[int] = []
        self.offset = 0

    def start(self, prompt: list[int]) -> None:
        self.feed, self.offset = draft_view(prompt, self.window)

    def propose(self, context: list[int], remaining: int, generator: torch.Generator | None) -> DraftTree:
        gamma = min(self.gamma, remaining - 1)
        tokens: list[int] = []
        probs: dict[int, torch.Tensor] = {}  # sampling only: what each draft token was drawn from
        forwards = fed = 0
        feed = self.feed + [context[-1]]
        if gamma > 0 and self.vocab.can_embed(feed):  # an id the draft cannot embed: draft nothing
            ids = torch.tensor([feed], device=self.device)
            while len(tokens) < gamma:
                logits = forward(self.draft_model, ids, self.cache, logits_to_keep=1)
                forwards += 1
                fed += ids.shape[1]
                if self.sampling.greedy:  # the argmax, already shaped (1, 1) as the next forward's input
                    width = self.vocab.draft
                    ids = argmax_ids(logits if logits.shape[-1] == width else logits[..., :width])
                    token = int(ids)
                else:
                    token, probs[len(tokens)] = draft_next(logits[0, -1], self.vocab, self.sampling, generator)
                    ids = torch.tensor([[token]], device=self.device)
                tokens.append(token)
                if token in self.eos_token_ids:
                    break
        return DraftTree.chain(tokens, draft_probs=probs or None,
                               counts=DraftCounts(labels=("draft",), draft_forwards=forwards, draft_tokens_fed=fed))

    def accepted(self, context: list[int], tree: DraftTree, verdict: Verdict) -> None:
        committed = len(context) - len(verdict.emitted) - 1  # cached target tokens before this step
        if tree.size:
            # Roll back: keep what was committed before the step (old pending included) + accepted drafts.
            keep = min(self.cache.get_seq_length(), committed + 1 + len(verdict.path) - self.offset)
            crop(self.cache, keep)
            self.feed = context[keep + self.offset:-1]  # what the draft cache still lacks, except the new pending one
        else:
            self.feed = self.feed + [context[-2]]

    def extra(self, steps: Sequence[StepRecord], stats: dict[str, float]) -> dict[str, Any]:
        return {"draft_window_cut": self.offset}


class _BatchDraftChain:
    """The speculative proposer for a static batch: ``gamma`` draft forwards per step, each over every row still
    drafting (one :class:`~decoders.common.batch.BatchCache` for the draft model; a row that has its ``gamma``
    tokens, drafted an EOS id or cannot be drafted from is fed pads until the others are done).

    Per row the same rules as :class:`_DraftChain`: the draft cache holds a prefix of the row's context (less
    ``offset[row]`` tokens under a draft window) and ``feed[row]`` the rest except the pending token; rejected
    drafts are dropped from the row (a crop).
    """

    def __init__(self, decoder: SpeculativeDecoder, rows: int):
        self.vocab, self.gamma, self.eos_token_ids = decoder.vocab, decoder.gamma, decoder.eos_token_ids
        self.sampling, self.window = decoder.sampling, decoder.draft_window
        self.draft = BatchCache(decoder.draft_model, rows)
        self.feed: list[list[int]] = [[] for _ in range(rows)]
        self.offset = [0] * rows

    def start(self, prompts: list[list[int]]) -> None:
        views = [draft_view(p, self.window) for p in prompts]
        self.feed, self.offset = [v for v, _ in views], [o for _, o in views]

    def select(self, keep: list[int]) -> None:
        self.draft.select(keep)

    def propose(self, rows: list[int], contexts: list[list[int]], remaining: list[int],
                generators: list[torch.Generator | None]) -> list[DraftTree]:
        gammas = [min(self.gamma, k - 1) for k in remaining]
        blocks = [self.feed[r] + [c[-1]] for r, c in zip(rows, contexts)]
        blocks = [b if g > 0 and self.vocab.can_embed(b) else [] for b, g in zip(blocks, gammas)]
        tokens: list[list[int]] = [[] for _ in rows]
        probs: list[dict[int, torch.Tensor]] = [{} for _ in rows]
        forwards, fed = [0] * len(rows), [0] * len(rows)
        while any(blocks):
            logits, placed = self.draft.forward(blocks)
            for i, block in enumerate(blocks):
                if not block:
                    continue
                self.draft.append(i, placed[i])
                forwards[i] += 1
                fed[i] += len(block)
                token, q = draft_next(logits[i, -1], self.vocab, self.sampling, generators[i])
                if q is not None:
                    probs[i][len(tokens[i])] = q
                tokens[i].append(token)
            blocks = [[t[-1]] if b and len(t) < g and t[-1] not in self.eos_token_ids else []
                      for b, t, g in zip(blocks, tokens, gammas)]
        return [DraftTree.chain(t, draft_probs=p or None, counts=DraftCounts(labels=("draft",), draft_forwards=f,
                                                                             draft_tokens_fed=n))
                for t, p, f, n in zip(tokens, probs, forwards, fed)]

    def accepted(self, rows: list[int], contexts: list[list[int]], trees: list[DraftTree],
                 verdicts: list[Verdict]) -> None:
        for i, (r, context, tree, verdict) in enumerate(zip(rows, contexts, trees, verdicts)):
            if tree.size:
                committed = len(context) - len(verdict.emitted) - 1  # cached target tokens before this step
                keep = min(self.draft.length(i), committed + 1 + len(verdict.path) - self.offset[r])
                self.draft.keep(i, keep, [])
                self.feed[r] = context[keep + self.offset[r]:-1]
            else:
                self.feed[r] = self.feed[r] + [context[-2]]

    def extra(self, row: int, steps: Sequence[StepRecord], stats: dict[str, float]) -> dict[str, Any]:
        return {"draft_window_cut": self.offset[row]}
