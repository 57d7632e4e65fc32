"""What every drafting decoder shares: its models, end-of-sequence ids, sampling settings, the draft's vocabulary
bounds and one :meth:`DraftingDecoder.generate` through the shared decode loop.

A drafting decoder is a settings holder (its constructor checks and stores its hyper-parameters) plus a fresh
proposer per prompt (:meth:`DraftingDecoder.proposer`); :func:`decoders.common.driver.decode` does the rest
(docs/decoders.md). :class:`DraftVocab` is the rule a proposer follows when the two models' padded embedding sizes
differ (e.g. 151936 vs 152064): the draft proposes only ids the target can embed and score, and drafts nothing
from a context holding an id it cannot embed itself.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import torch
from transformers import PreTrainedModel

from decoders.common.driver import Proposer, decode
from decoders.common.heads import pair_vocab
from decoders.common.kv_cache import check_rollback
from decoders.common.sampling import GREEDY, SamplingConfig
from decoders.types import DecodeResult, Stopwatch
from declare import check_args


@dataclass(frozen=True)
class DraftVocab:
    """Vocabulary bounds of a target/draft pair (:func:`decoders.common.heads.pair_vocab`).

    Attributes:
        target: columns of the target's logits (its output vocabulary size).
        draft: ids the draft may propose: below what the target can embed and score and what the draft's LM head
            scores.
        embed: ids the draft can embed; a context holding a larger id cannot be drafted from.
    """

    target: int
    draft: int
    embed: int

    @classmethod
    def of(cls, target_model: PreTrainedModel, draft_model: PreTrainedModel) -> "DraftVocab":
        return cls(*pair_vocab(target_model, draft_model))

    def can_embed(self, ids: Iterable[int]) -> bool:
        """Whether the draft can embed every id of ``ids`` (non-empty; ``ValueError`` from ``max`` if empty)."""
        return max(ids) < self.embed


class DraftingDecoder:
    """Base of the decoders that run :func:`decoders.common.driver.decode` with a proposer.

    Subclasses set ``name``, ``draft_shape``, ``supports_sampling``, call :meth:`take_settings` first in their
    constructor (or :meth:`_setup` after their own argument checks) and implement :meth:`proposer`.

    Attributes (set by :meth:`_setup`):
        target_model: the model whose greedy output (or sampling distribution) is reproduced.
        draft_model: the draft model, or ``None`` for a decoder without one.
        eos_token_ids: ids that end generation.
        sampling: greedy or the run's sampling settings.
        vocab: the pair's :class:`DraftVocab` (``None`` without a draft model).
    """

    name: str = ""
    draft_shape: str = ""
    supports_sampling: bool = True

    target_model: PreTrainedModel
    draft_model: PreTrainedModel | None
    eos_token_ids: frozenset[int]
    sampling: SamplingConfig
    vocab: DraftVocab | None

    def take_settings(self, settings: type, arguments: Mapping[str, Any], *, uses_draft: bool) -> None:
        """A constructor's first step: check its ``arguments`` (its ``locals()``) against the decoder's declared
        ``settings`` (:func:`declare.check_args`), keep each declared setting as an attribute of the same name
        (as given: a constructor converts the ones it needs to), then :meth:`_setup` with the arguments
        ``target_model``, ``draft_model`` (``None`` when the constructor has none), ``eos_token_ids`` and
        ``sampling``.

        Raises:
            ValueError: an argument of the wrong type or out of its bound, or what :meth:`_setup` raises.
        """
        check_args(settings, arguments)
        for f in dataclasses.fields(settings):
            setattr(self, f.name, arguments[f.name])
        self._setup(arguments["target_model"], arguments.get("draft_model"), arguments["eos_token_ids"],
                    arguments["sampling"], uses_draft=uses_draft)

    def _setup(self, target_model: PreTrainedModel, draft_model: PreTrainedModel | None,
               eos_token_ids: Iterable[int], sampling: SamplingConfig = GREEDY, *, uses_draft: bool) -> None:
        """Store the models, EOS ids and sampling settings; check both KV caches can be rolled back.

        Raises:
            ValueError: if ``uses_draft`` and ``draft_model`` is ``None``, or a model's KV cache cannot be rolled
                back (:func:`decoders.common.kv_cache.check_rollback`).
        """
        if uses_draft and draft_model is None:
            raise ValueError(f"the {self.name} decoder needs a draft model: choose a model pair with a draft")
        self.target_model = target_model
        self.draft_model = draft_model if uses_draft else None
        check_rollback(target_model, "target model", self.name)
        if uses_draft:
            check_rollback(draft_model, "draft model", self.name)
        self.eos_token_ids = frozenset(eos_token_ids)
        self.sampling = sampling
        self.vocab = DraftVocab.of(target_model, draft_model) if uses_draft else None

    def proposer(self) -> Proposer:
        """A fresh proposer for one prompt."""
        raise NotImplementedError

    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, generator: torch.Generator | None = None,
                 stopwatch: Stopwatch | None = None) -> DecodeResult:
        """Decode one prompt through the shared loop :func:`decoders.common.driver.decode`; same contract as
        :meth:`decoders.vanilla.VanillaDecoder.generate`.

        Args:
            input_ids: ``torch.LongTensor`` of shape ``(1, prompt_len)`` on the target's device.
            max_new_tokens: upper bound on new tokens, >= 1; a step never emits more than what is left (proposals
                are shortened near the end).
            generator: the only source of randomness; required when sampling.
            stopwatch: the runner's timer: ``first_token()`` after the target's prefill; ``lap("draft")`` after
                each proposal and ``lap("verify")`` after the prefill and after each verification (target
                forward, rule, KV compaction, the proposer's update).

        Returns:
            :class:`~decoders.types.DecodeResult`: one :class:`~decoders.types.StepRecord` per target forward
            (what each field counts: the decoder's class docstring) and the proposer's ``extra``.

        Raises:
            ValueError: if the batch size is not 1, the prompt is empty, ``max_new_tokens < 1`` or sampling
                without a generator.
        """
        return decode(self.target_model, self.proposer(), input_ids, max_new_tokens,
                      eos_token_ids=self.eos_token_ids, sampling=self.sampling, generator=generator,
                      stopwatch=stopwatch)
