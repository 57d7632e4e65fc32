"""Ouroboros' phrase-level drafting: lookahead decoding of a draft model on itself, as a drafting loop.

:class:`LookaheadDrafter` runs a :class:`~decoders.common.lookahead_step.LookaheadStepper` on the draft model until
it has the tokens asked for (or an EOS id, or a confidence stop) and returns them as a :class:`DraftProposal`
(docs/decoders.md, "Ouroboros"). What does not live here: the lookahead step itself
(:mod:`decoders.common.lookahead_step`) and the target's side (:mod:`decoders.ouroboros`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import torch
from transformers import PreTrainedModel

from decoders.common.checks import check_int
from decoders.common.heads import FullHead, ReducedVocabHead
from decoders.common.lookahead_step import LookaheadStepper
from decoders.common.ngram_pool import NGramPool
from decoders.common.sampling import GREEDY, SamplingConfig, check_generator


@dataclass(frozen=True)
class DraftProposal:
    """What :meth:`LookaheadDrafter.propose` returns.

    Attributes:
        tokens: the draft tokens (cut just after an EOS id): the draft model's greedy continuation, or, when
            sampling, a sample of its own processed distribution.
        forwards: draft forwards spent (the first call of a sample includes the prompt prefill).
        tokens_fed: tokens fed over those forwards (prompt prefill + catch-up tokens + window + n-grams).
        top_probs: the draft's probability of each token (only with ``confidence=True``).
        runner_up: the draft's most likely other token at each token's position (same condition).
        probs: sampling only: ``torch.FloatTensor`` of shape ``(len(tokens), vocab_width)``, the distribution
            each token was drawn from (the draft's processed distribution after the preceding tokens, in
            token-id space).
    """

    tokens: list[int]
    forwards: int
    tokens_fed: int
    top_probs: list[float] | None = None
    runner_up: list[int] | None = None
    probs: torch.Tensor | None = None


class LookaheadDrafter:
    """Lookahead decoding of a draft model on itself: Ouroboros' phrase-level drafting
    (docs/decoders.md, "Ouroboros").

    A :class:`~decoders.common.lookahead_step.LookaheadStepper` on the draft (its KV cache, Jacobi window and
    ``seq``, the committed tokens followed by what it drafted), plus the drafting loop. Each forward feeds the
    tokens the draft cache lacks, the window and the pool n-grams keyed by the last token, and emits several
    draft tokens when an n-gram matches the draft's own argmax (greedy) or is accepted by the multi-candidate rule
    against the draft's own processed distribution (sampling: the drafted tokens are then a sample of the draft
    model's sampling distribution, and :attr:`DraftProposal.probs` holds the distribution each was drawn from,
    which Ouroboros' target verification uses as the draft distribution).

    Example::

        drafter = LookaheadDrafter(draft_model, NGramPool(4, 5), window_size=5, ngram_size=4)
        drafter.start(prompt)                  # seq = prompt, empty cache, fresh window
        drafter.propose(6).tokens              # the draft model's next 6 greedy tokens
        drafter.sync(prompt + accepted)        # roll back to what the target kept, then propose again

    Args:
        model: the draft model.
        pool: the phrase pool (n-grams of ``ngram_size``) read for verification and filled from the window.
        window_size: ``W >= 1`` Jacobi window columns.
        ngram_size: ``N >= 2``; the window has ``N - 1`` rows and verified n-grams hold ``N - 1`` tokens.
        seed: seed of the window's initialisation from the prompt.
        vocab_limit: only ids below this are proposed (e.g. what the target can embed); ``None`` = the draft's
            whole output vocabulary. Ignored when ``head`` is given.
        eos_token_ids: ids that end a draft.
        head: the draft's head (default: :class:`~decoders.common.heads.FullHead` cut at ``vocab_limit``).
        confidence: also report each draft token's probability and runner-up.
        sampling: greedy (the default) or the sampling settings; :meth:`propose` then needs a ``generator``.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        pool: NGramPool,
        window_size: int,
        ngram_size: int,
        seed: int = 0,
        vocab_limit: int | None = None,
        eos_token_ids: Iterable[int] = (),
        head: FullHead | ReducedVocabHead | None = None,
        confidence: bool = False,
        sampling: SamplingConfig = GREEDY,
    ):
        check_int("window_size (W)", window_size, 1)
        check_int("ngram_size (N)", ngram_size, 2)
        head = head or FullHead(model, vocab_limit or model.get_output_embeddings().out_features)
        self.eos_token_ids = frozenset(eos_token_ids)
        self.stepper = LookaheadStepper(model, pool, window_size, ngram_size, seed, head, self.eos_token_ids,
                                        confidence, sampling)
        self.prefill_tokens = 0  # tokens of the plain causal prompt prefill (one forward, the first)

    @property
    def cache(self):
        return self.stepper.cache

    @property
    def pool_hits(self) -> int:
        """Draft forwards of this sample that verified at least one pool n-gram."""
        return self.stepper.branches.pool_hits

    def start(self, prompt: Sequence[int]) -> None:
        """Begin a sample: empty cache, fresh window drawn from ``prompt``, ``seq = prompt``."""
        self.stepper.start(prompt)
        self.prefill_tokens = 0

    def sync(self, committed: Sequence[int]) -> None:
        """Adopt the committed tokens (see :meth:`LookaheadStepper.sync`)."""
        self.stepper.sync(committed)

    @torch.inference_mode()
    def propose(self, max_tokens: int, stop_confidence: float = 0.0, generator: torch.Generator | None = None
                ) -> DraftProposal:
        """Draft up to ``max_tokens`` tokens continuing ``seq`` (fewer at an EOS id or a confidence stop).

        The first call after :meth:`start` also prefills the cache with the prompt (one more forward).

        Args:
            max_tokens: most draft tokens.
            stop_confidence: stop after a forward that emitted a token whose draft probability is below this
                (0 = never; needs ``confidence=True``). Whether drafting goes on depends only on tokens already
                drawn, so under sampling it is a stopping rule that keeps each token's draft distribution.
            generator: required when sampling.
        """
        stepper = self.stepper
        check_generator(stepper.sampling, generator)
        drafted: list[int] = []
        probs: list[float] = []
        runner_up: list[int] = []
        drawn_from: list[torch.Tensor] = []
        forwards = fed = 0
        if max_tokens > 0 and stepper.cache.get_seq_length() == 0 and len(stepper.seq) > 1:
            # The prompt goes through one plain causal forward (no O(prompt^2) tree mask); the lookahead
            # forwards then only catch up on the few tokens the target accepted since the last step.
            self.prefill_tokens = len(stepper.seq) - 1
            stepper.prefill(len(stepper.seq) - 1, generator)  # (its next token is not used)
            forwards, fed = 1, self.prefill_tokens
        while len(drafted) < max_tokens and not (drafted and drafted[-1] in self.eos_token_ids):
            out = stepper.step(max_tokens - len(drafted), generator=generator)
            drafted += out.emitted
            if out.probs is not None:
                drawn_from.append(out.probs)
            forwards += 1
            fed += out.tokens_fed
            if out.top_probs is not None:
                probs += out.top_probs
                runner_up += out.runner_up or []
                if min(out.top_probs) < stop_confidence:
                    break
        confident = stepper.confidence
        return DraftProposal(drafted, forwards, fed, probs if confident else None, runner_up if confident else None,
                             torch.cat(drawn_from) if drawn_from else None)
