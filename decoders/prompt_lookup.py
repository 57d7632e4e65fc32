"""Prompt lookup decoding: drafts copied from the context by n-gram matching, verified in one forward.

Saxena 2023, "Prompt Lookup Decoding" (github.com/apoorvumang/prompt-lookup-decoding; transformers'
``prompt_lookup_num_tokens``): the draft is the text that followed the most recent earlier occurrence of
the context's last n-gram (:func:`decoders.common.ngram_pool.find_prompt_lookup_candidates`), so no draft
model runs. The pending token and the draft go through one target forward and rejected entries are cropped
from the KV cache.

* Greedy (temperature 0): the longest prefix matching the target's argmax is accepted plus the target's own
  next token (greedy case of Leviathan et al. 2023, arXiv 2211.17192, Algorithm 1;
  :func:`decoders.common.verify.tree_verify` on a chain).
* Sampling (temperature > 0): the draft is deterministic (its draft distribution is one-hot), one candidate
  per step: each draft token ``x`` is accepted with probability ``target_probs[x]``; at the first rejection
  the token is drawn from ``target_probs`` with ``x`` removed and renormalised; after a fully accepted draft
  the bonus token is drawn from ``target_probs``. This is the one-candidate case of SpecInfer's multi-step
  speculative sampling (arXiv 2305.09781) as lookahead decoding applies it to n-grams
  (:func:`decoders.common.verify.multi_candidate_verify`), and equally Leviathan et al.'s rule with a one-hot
  draft distribution. The output is distributed exactly as vanilla sampling's.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from decoders.common.base import DraftingDecoder
from decoders.common.driver import DraftCounts, DraftTree, Verdict
from decoders.common.forward import max_depth_after
from decoders.common.ngram_pool import SuffixIndex
from decoders.common.stopping import truncate_at_stop
from decoders.types import StepRecord
from decoders.settings import PromptLookupSettings


class PromptLookupDecoder(DraftingDecoder, settings=PromptLookupSettings, uses_draft=False):
    """Prompt lookup decoding (greedy, or lossless sampling with deterministic drafts).

    Cache invariant between steps: the KV cache holds every committed token except the last one, which is
    fed first in the next forward. A step with no match feeds only that token (a vanilla step).

    Each step's :class:`~decoders.types.StepRecord` has ``drafted`` = draft tokens verified, ``accepted`` = those
    accepted and kept, ``source = {"prompt_lookup": accepted, "bonus": 0 or 1}`` (nothing after an EOS id is
    counted, so the steps' ``emitted`` add up to the output).

    Args:
        target_model: the model whose greedy output is reproduced.
        max_ngram_size: longest suffix n-gram searched for in prompt + generated tokens (>= 1).
        num_draft_tokens: draft length when a match is found (>= 1); shortened near ``max_new_tokens`` and
            cut just after an end-of-sequence id.
        min_ngram_size: shortest suffix n-gram tried (1 <= min_ngram_size <= max_ngram_size).
        eos_token_ids: ids that end generation.
        sampling: greedy (the default) or the sampling settings of the run.

    Raises:
        ValueError: on sizes out of range.
    """

    name = "prompt_lookup"
    draft_shape = "copy"
    supports_sampling = True
    supports_batch = True

    def _build(self) -> None:
        if self.min_ngram_size > self.max_ngram_size:
            raise ValueError(f"min_ngram_size ({self.min_ngram_size}) must be <= max_ngram_size "
                             f"({self.max_ngram_size})")

    def proposer(self) -> "_ContextCopy":
        return _ContextCopy(self)

    def propose(self, context: list[int], remaining: int, index: SuffixIndex) -> list[int]:
        """The draft copied from ``context`` (``context[-1]`` pending): at most ``num_draft_tokens``, at most
        ``remaining - 1``, within the position limit, cut just after an EOS id; empty when nothing matches.
        ``index``: the sample's :class:`~decoders.common.ngram_pool.SuffixIndex` (the match of
        :func:`~decoders.common.ngram_pool.find_prompt_lookup_candidates`, found without scanning the context)."""
        max_depth = max_depth_after(self.target_model, len(context) - 1)  # the pending token is not cached yet
        gamma = max(0, min(self.num_draft_tokens, remaining - 1, max_depth))
        draft = index.candidates(context, gamma, self.min_ngram_size) if gamma else []
        return truncate_at_stop(draft, self.eos_token_ids, len(draft))


class _ContextCopy:
    """The prompt lookup proposer for one sample: the context's n-grams, indexed as the context grows."""

    def __init__(self, decoder: PromptLookupDecoder):
        self.decoder = decoder  # its settings and :meth:`PromptLookupDecoder.propose`
        self.index = SuffixIndex(decoder.max_ngram_size)

    def start(self, prompt: list[int]) -> None:
        self.index = SuffixIndex(self.decoder.max_ngram_size)

    def propose(self, context: list[int], remaining: int, generator: torch.Generator | None) -> DraftTree:
        draft = self.decoder.propose(context, remaining, self.index)
        return DraftTree.chain(draft, counts=DraftCounts(default_origin="prompt_lookup", labels=("prompt_lookup",),
                                                         stats={"lookup_steps": bool(draft)}))

    def accepted(self, context: list[int], tree: DraftTree, verdict: Verdict) -> None:
        pass

    def extra(self, steps: Sequence[StepRecord], stats: dict[str, float]) -> dict[str, Any]:
        return {
            "max_ngram_size": self.decoder.max_ngram_size,
            "num_draft_tokens": self.decoder.num_draft_tokens,
            "lookup_hit_rate": stats.get("lookup_steps", 0) / len(steps) if steps else 0.0,
        }
