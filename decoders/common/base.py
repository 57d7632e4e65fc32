"""What every drafting decoder shares: its models, end-of-sequence ids, sampling settings, the draft's vocabulary
bounds and one :meth:`DraftingDecoder.generate` through the shared decode loop.

A drafting decoder is a settings holder (its constructor checks and stores its hyper-parameters) plus a fresh
proposer per prompt (:meth:`DraftingDecoder.proposer`); :func:`decoders.common.driver.decode` does the rest
(docs/decoders.md). :class:`DraftVocab` is the rule a proposer follows when the two models' padded embedding sizes
differ (e.g. 151936 vs 152064): the draft proposes only ids the target can embed and score, and drafts nothing
from a context holding an id it cannot embed itself.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from inspect import Parameter
from typing import Any, Callable, ClassVar, Iterable, Sequence

import torch
from transformers import PreTrainedModel

from decoders.common.batch import BatchProposer, PerRow, decode_batch
from decoders.common.driver import Proposer, decode
from decoders.common.heads import pair_vocab
from decoders.common.kv_cache import check_rollback
from decoders.common.sampling import GREEDY, SamplingConfig
from decoders.types import DecodeResult, Stopwatch
from declare import check_class_line, signature, take


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


#: Prompt tokens a draft window keeps from the prompt's start: StreamingLLM's attention sinks (Xiao et al. 2023,
#: arXiv 2309.17453, keep the first 4).
SINK_TOKENS = 4


def draft_view(prompt: Sequence[int], window: int) -> tuple[list[int], int]:
    """The prompt as a draft with a ``draft_window`` of ``window`` tokens reads it, and the view's offset.

    With ``window`` 0, or a prompt of at most ``window + SINK_TOKENS`` tokens: the whole prompt and 0. Otherwise
    its first :data:`SINK_TOKENS` and last ``window`` tokens, and ``offset = len(prompt) - window - SINK_TOKENS``:
    the draft's cache entry ``j >= SINK_TOKENS`` holds context token ``j + offset`` (positions ``0 ..`` in the
    view), and every token after the prompt follows on, so a proposer whose draft cache covers ``context[:n]``
    holds ``n - offset`` entries. Only the draft's prefill shrinks (to ``window + 4`` tokens; MagicDec, arXiv
    2408.11049, drafts from such a StreamingLLM cache); the target reads the whole prompt and verifies every
    token, so the window changes the drafts, never the output.
    """
    if window <= 0 or len(prompt) <= window + SINK_TOKENS:
        return list(prompt), 0
    return [*prompt[:SINK_TOKENS], *prompt[-window:]], len(prompt) - window - SINK_TOKENS


def windowed(context: Sequence[int], offset: int) -> Sequence[int]:
    """``context`` (the prompt and what followed it) as a draft whose window cut ``offset`` prompt tokens reads it
    (:func:`draft_view`): a new list of its first :data:`SINK_TOKENS`, then everything from ``offset +
    SINK_TOKENS`` on; ``context`` itself (not a copy) when ``offset`` is 0."""
    return [*context[:SINK_TOKENS], *context[offset + SINK_TOKENS:]] if offset else context


class DraftingDecoder:
    """Base of the decoders that run :func:`decoders.common.driver.decode` with a proposer.

    A subclass names its declared settings (a dataclass of :func:`declare.setting` fields in
    ``decoders/settings.py``) and whether it needs the draft model in its class line
    (``class SpeculativeDecoder(DraftingDecoder, settings=SpeculativeSettings, uses_draft=True)``), sets ``name``,
    ``draft_shape`` and ``supports_sampling = True`` if it samples (losslessly: docs/sampling.md), implements
    :meth:`proposer` and, where it derives state from its settings, :meth:`_build`. It writes no constructor: it takes
    ``(target_model[, draft_model], *, eos_token_ids=(), sampling=GREEDY, **settings)`` and shows the declared
    settings as its signature (:func:`declare.signature`), so a setting is declared once.

    Attributes (set by the constructor):
        target_model: the model whose greedy output (or sampling distribution) is reproduced.
        draft_model: the draft model, or ``None`` for a decoder without one.
        eos_token_ids: ids that end generation.
        sampling: greedy or the run's sampling settings.
        vocab: the pair's :class:`DraftVocab` (``None`` without a draft model).
        <setting>: each declared setting, as given (or its declared default).
    """

    name: str = ""
    draft_shape: str = ""
    #: A decoder opts in to sampling (:func:`decoders.common.sampling.require_sampling_support`).
    supports_sampling: bool = False
    #: A decoder opts in to static batches (:meth:`generate_batch`; ``runner.batch_size > 1``).
    supports_batch: bool = False
    #: The declared settings (a dataclass of :func:`declare.setting` fields), from the class line.
    settings: ClassVar[type | None] = None
    #: Whether the decoder needs the pair's draft model (as its ``register_decoder`` line says), from the class line.
    uses_draft: ClassVar[bool] = True

    target_model: PreTrainedModel
    draft_model: PreTrainedModel | None
    eos_token_ids: frozenset[int]
    sampling: SamplingConfig
    vocab: DraftVocab | None

    def __init_subclass__(cls, settings: type | None = None, uses_draft: bool | None = None, **kwargs: Any) -> None:
        """``class MyDecoder(DraftingDecoder, settings=MySettings, uses_draft=True)``: its settings and whether it
        needs the draft model (inherited when not given); its signature is made from them."""
        check_class_line(cls, "DraftingDecoder", settings, kwargs, "settings= and uses_draft=", "_build")
        super().__init_subclass__()
        if settings is not None:
            cls.settings = settings
        if uses_draft is not None:
            cls.uses_draft = uses_draft
        if cls.settings is not None:
            models = ["target_model", "draft_model"] if cls.uses_draft else ["target_model"]
            cls.__signature__ = signature(cls.settings, [
                *(Parameter(m, Parameter.POSITIONAL_OR_KEYWORD, annotation="PreTrainedModel") for m in models),
                Parameter("eos_token_ids", Parameter.KEYWORD_ONLY, default=(), annotation="Iterable[int]"),
                Parameter("sampling", Parameter.KEYWORD_ONLY, default=GREEDY, annotation="SamplingConfig")])

    def __init__(self, target_model: PreTrainedModel, *draft_model: PreTrainedModel | None,
                 eos_token_ids: Iterable[int] = (), sampling: SamplingConfig = GREEDY, **settings: Any) -> None:
        """Check and keep the settings (each as an attribute of the same name), store the models, EOS ids and
        sampling settings, then :meth:`_build`.

        Args:
            target_model: the model whose greedy output (or sampling distribution) is reproduced.
            draft_model: the draft model, positional or by keyword: required (not ``None``) when ``uses_draft``,
                refused otherwise.
            eos_token_ids: ids that end generation.
            sampling: greedy (the default) or the run's sampling settings.
            **settings: the declared settings (``settings``); a missing one takes its declared default.

        Raises:
            TypeError: a setting the decoder does not declare or given positionally, a draft model given to a
                decoder without one, or a class that names no settings.
            ValueError: a setting of the wrong type or out of its bound; ``uses_draft`` and no draft model;
                a model whose KV cache cannot be rolled back (:func:`decoders.common.kv_cache.check_rollback`);
                what :meth:`_build` raises.
        """
        owner = type(self).__name__
        if self.settings is None:
            raise TypeError(f"{owner} names no settings in its class line: class {owner}(DraftingDecoder, "
                            "settings=<a declare.setting dataclass>, uses_draft=...)")
        models = 2 if self.uses_draft else 1
        if len(draft_model) > models - 1:
            what = "the target and the draft model" if models == 2 else "the target model"
            names = ", ".join(f.name for f in fields(self.settings))
            raise TypeError(f"{owner} takes {what} positionally, its settings by keyword ({names})")
        if "draft_model" in settings:
            if not self.uses_draft:
                raise TypeError(f"{owner} got an unexpected argument draft_model: it uses no draft model")
            draft_model = (*draft_model, settings.pop("draft_model"))
        draft = draft_model[0] if self.uses_draft and draft_model else None
        for key, value in take(self.settings, settings, owner).items():
            setattr(self, key, value)
        if self.uses_draft and draft is None:
            raise ValueError(f"the {self.name} decoder needs a draft model: choose a model pair with a draft")
        self.target_model = target_model
        self.draft_model = draft
        check_rollback(target_model, "target model", self.name)
        if self.uses_draft:
            check_rollback(draft, "draft model", self.name)
        self.eos_token_ids = frozenset(eos_token_ids)
        self.sampling = sampling
        self.vocab = DraftVocab.of(target_model, draft) if self.uses_draft else None
        self._build()

    def _build(self) -> None:
        """What the decoder derives from its checked settings and models (a pool, a head, cross-field checks)."""

    def proposer(self) -> Proposer:
        """A fresh proposer for one prompt."""
        raise NotImplementedError

    def batch_proposer(self, rows: int) -> BatchProposer:
        """A fresh proposer for a batch of ``rows`` prompts: by default one :meth:`proposer` per row
        (:class:`decoders.common.batch.PerRow`, right for proposers that run no model); a decoder that drafts with a
        model batches its draft forwards instead."""
        return PerRow(self.proposer, rows)

    def generate_batch(self, input_ids: Sequence[torch.Tensor], max_new_tokens: int,
                       generators: Sequence[torch.Generator | None] | None = None, stopwatch: Stopwatch | None = None,
                       finished: Callable[[int], None] | None = None) -> list[DecodeResult]:
        """Decode a static batch through :func:`decoders.common.batch.decode_batch`: one target forward per step for
        every row still decoding, each row's tokens those :meth:`generate` gives for its prompt.

        Args:
            input_ids: ``B`` tensors, each ``torch.LongTensor`` of shape ``(1, prompt_len_b)`` on the target's device.
            max_new_tokens: upper bound on new tokens per row, >= 1.
            generators: sampling: one ``torch.Generator`` per row.
            stopwatch: the batch's timer (see :func:`~decoders.common.batch.decode_batch`).
            finished: called with a row's index when its last token is committed.

        Returns:
            One :class:`~decoders.types.DecodeResult` per prompt, in order.

        Raises:
            ValueError: a decoder without batch support (``supports_batch``), or what
                :func:`~decoders.common.batch.decode_batch` raises.
        """
        if not self.supports_batch:
            raise ValueError(f"the {self.name} decoder does not decode batches: use runner.batch_size=1 with it")
        return decode_batch(self.target_model, self.batch_proposer(len(input_ids)), input_ids, max_new_tokens,
                            eos_token_ids=self.eos_token_ids, sampling=self.sampling, generators=generators,
                            stopwatch=stopwatch, finished=finished)

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
