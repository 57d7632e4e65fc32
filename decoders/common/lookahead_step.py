"""One lookahead-decoding step of a model on itself: the single implementation behind lookahead decoding (on
the target) and Ouroboros' phrase-level drafting (on the draft).

Fu, Bailis, Stoica & Zhang 2024 (arXiv 2402.02057, ICML 2024), Algorithm 1, greedy. One forward feeds, as one
token tree (:func:`decoders.common.tree.lookahead_layout`):

* the tokens the KV cache lacks, ending with the *input token* (the last known token), as a causal chain
  (:func:`decoders.common.tree.prepend_chain`; lookahead decoding feeds one, Ouroboros' drafter catches up on
  what the target accepted);
* the **lookahead branch**: the Jacobi window (:class:`~decoders.common.jacobi.JacobiWindow`);
* the **verification branch**: up to ``G`` pool n-grams keyed by the input token, cut to the tokens still
  wanted, verified against THIS model's own argmax (:func:`decoders.common.verify.branch_verify`).

It emits the longest accepted n-gram prefix plus the model's own next token, cut just after an EOS id, keeps
only those tokens' KV entries (:func:`decoders.common.kv_cache.keep_path`), advances the window by one row
and harvests its ``W`` n-grams into the pool. The emitted tokens are exactly the model's greedy continuation.

What lives here: :class:`LookaheadStepper` (cache + window + sequence of one model; ``start``, ``prefill``,
``sync``, ``step``), :class:`StepOutput`, and :class:`LookaheadDrafter`, the drafting loop Ouroboros runs on
its draft model with it. What does not: the decoders' loops, statistics and the target verification of
Ouroboros (:mod:`decoders.lookahead`, :mod:`decoders.ouroboros`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch
from transformers import PreTrainedModel

from decoders.common.checks import check_int
from decoders.common.forward import new_cache
from decoders.common.heads import FullHead, ReducedVocabHead
from decoders.common.jacobi import JacobiWindow
from decoders.common.kv_cache import crop, keep_path
from decoders.common.ngram_pool import NGramPool
from decoders.common.stopping import truncate_at_stop
from decoders.common.tree import lookahead_layout, prepend_chain, tree_attention
from decoders.common.verify import branch_verify


def max_depth_after(model: PreTrainedModel, position: int) -> int:
    """How far past ``position`` a tree token may sit without exceeding ``max_position_embeddings``."""
    max_pos = getattr(model.config, "max_position_embeddings", None)
    return max_pos - 1 - position if max_pos else sys.maxsize


@dataclass(frozen=True)
class StepOutput:
    """What one :meth:`LookaheadStepper.step` did.

    Attributes:
        emitted: the tokens appended to ``seq`` (1 .. budget): accepted n-gram tokens, then the model's own next
            token unless an EOS id came first (the list ends just after the first EOS id).
        accepted: n-gram tokens among ``emitted`` (``len(emitted) - accepted`` is 0 or 1, the bonus token).
        guess_len: tokens of each verified n-gram (0 when none was verified).
        num_guesses: n-grams verified.
        tokens_fed: tokens fed in the forward (catch-up chain + window + n-grams).
        top_probs: the model's probability of each emitted token (its softmax maximum), only when the stepper
            was built with ``confidence=True``, else ``None``.
        runner_up: the model's second most likely token at each emitted position (same condition).
    """

    emitted: list[int]
    accepted: int
    guess_len: int
    num_guesses: int
    tokens_fed: int
    top_probs: list[float] | None = None
    runner_up: list[int] | None = None


class LookaheadStepper:
    """A model running lookahead decoding on itself, one forward per :meth:`step`.

    State: ``seq`` (the token sequence being continued), the model's KV cache and its Jacobi window. Cache
    invariant: the cache holds ``seq[:L]`` for some ``L < len(seq)``; the missing tail (at least the input
    token) heads the next forward. The n-gram pool is shared with the caller (Ouroboros also reads and refines
    it).

    Example::

        stepper = LookaheadStepper(model, NGramPool(4, 5), window_size=5, ngram_size=4)
        stepper.start(prompt)            # seq = prompt, empty cache, window drawn from the prompt
        first = stepper.prefill(len(prompt))   # the model's token after the prompt (cache: the prompt)
        stepper.sync(prompt + [first])
        stepper.step(budget=8).emitted   # 1..8 tokens of the model's greedy continuation

    Args:
        model: the model that decodes itself.
        pool: the n-gram pool (n-grams of ``ngram_size``) verified from and filled by the window.
        window_size: ``W >= 1`` Jacobi window columns.
        ngram_size: ``N >= 2``; the window has ``N - 1`` rows and verified n-grams hold ``N - 1`` tokens.
        seed: seed of the window's initialisation from the prompt.
        head: how logits are made (:class:`~decoders.common.heads.FullHead` by default, optionally cut to a
            vocabulary limit, or a :class:`~decoders.common.heads.ReducedVocabHead` for a draft).
        eos_token_ids: ids after which nothing is emitted.
        confidence: also report each emitted token's probability and the runner-up token (one softmax over the
            emitted positions' logits; used by Ouroboros' confidence options).

    Raises:
        ValueError: if the pool's n-gram size differs from ``ngram_size``.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        pool: NGramPool,
        window_size: int,
        ngram_size: int,
        seed: int = 0,
        head: FullHead | ReducedVocabHead | None = None,
        eos_token_ids: Iterable[int] = (),
        confidence: bool = False,
    ):
        if pool.ngram_size != ngram_size:
            raise ValueError(f"the pool holds {pool.ngram_size}-grams, the window makes {ngram_size}-grams")
        self.model = model
        self.pool = pool
        self.window_size = window_size
        self.ngram_size = ngram_size
        self.seed = seed
        self.head = head if head is not None else FullHead(model)
        self.eos_token_ids = frozenset(eos_token_ids)
        self.confidence = confidence
        self.device = model.get_input_embeddings().weight.device
        self.seq: list[int] = []
        self.cache = new_cache(model)
        self.window: JacobiWindow | None = None
        self._stable = 0  # seq[:_stable] is known to be final (committed by the caller)
        self.pool_hits = 0  # steps that verified at least one pool n-gram (this sample)

    def start(self, prompt: Sequence[int]) -> None:
        """Begin a sample: empty cache, fresh window drawn from ``prompt``, ``seq = prompt``."""
        self.seq = [int(t) for t in prompt]
        self.cache = new_cache(self.model)
        self.window = JacobiWindow(self.window_size, self.ngram_size, self.seq, self.seed)
        self._stable = len(self.seq)
        self.pool_hits = 0

    def prefill(self, upto: int) -> int:
        """Feed ``seq[cache_len:upto]`` as one plain causal forward (no tree mask); return the model's next token.

        Args:
            upto: end of the fed span (``<= len(seq)``); ``len(seq) - 1`` leaves the input token for :meth:`step`.

        Returns:
            The model's argmax (through the head) after ``seq[upto - 1]``.
        """
        past = self.cache.get_seq_length()
        ids = torch.tensor([self.seq[past:upto]], device=self.device)
        logits = self.head.logits(ids, self.cache, keep=1)
        return int(self.head.token_ids(logits[-1:].argmax(-1))[0])

    def sync(self, committed: Sequence[int]) -> None:
        """Adopt ``committed`` (the tokens accepted so far) as ``seq``; drop cache entries it contradicts.

        ``committed`` must extend what earlier calls committed. The cache keeps the longest prefix shared by the
        old ``seq`` and ``committed``, minus at least the last token (fed as the next input token).
        """
        common = self._stable
        limit = min(len(self.seq), len(committed))
        while common < limit and self.seq[common] == committed[common]:
            common += 1
        keep = min(self.cache.get_seq_length(), common, len(committed) - 1)
        crop(self.cache, keep)
        self.seq = [int(t) for t in committed]
        self._stable = len(self.seq)

    @torch.inference_mode()
    def step(self, budget: int, advance_window: bool = True) -> StepOutput:
        """One lookahead forward; appends the emitted tokens to ``seq``.

        Args:
            budget: most tokens to emit (>= 1); the verified n-grams are cut to ``budget - 1`` tokens.
            advance_window: feed and advance the Jacobi window (``False`` on a decoder's very last step, where
                the harvest could never be used). The window is also left out when its positions would pass
                ``max_position_embeddings``.

        Returns:
            :class:`StepOutput`.
        """
        assert self.window is not None, "call start() first"
        model, window, device = self.model, self.window, self.device
        past = self.cache.get_seq_length()
        chunk = self.seq[past:]  # tokens the cache lacks; the last one is the input token
        off = len(chunk) - 1  # flat index of the input token
        input_token = chunk[-1]
        max_depth = max_depth_after(model, len(self.seq) - 1)
        guess_len = max(0, min(self.ngram_size - 1, budget - 1, max_depth))
        guesses = list(dict.fromkeys(g[:guess_len] for g in self.pool.get(input_token))) if guess_len else []
        use_window = advance_window and window.depth <= max_depth
        row_lengths = window.row_lengths if use_window else (1,)
        layout = lookahead_layout(row_lengths, len(guesses), guess_len if guesses else 0)
        ids = chunk + (window.tokens() if use_window else []) + [t for g in guesses for t in g]
        last_row = layout.row_starts[-1]
        needed = [off] + [off + i for i in range(last_row, last_row + row_lengths[-1]) if use_window] + [
            off + i for i in range(layout.guess_start, layout.size)
        ]
        mask, position_ids = tree_attention(prepend_chain(layout.parents, off), past, dtype=model.dtype, device=device)
        logits = self.head.logits(torch.tensor([ids], device=device), self.cache, position_ids=position_ids,
                                  attention_mask=mask, keep=torch.tensor(needed, device=device))
        preds = self.head.token_ids(logits.argmax(-1)).cpu()  # aligned with `needed`; one device sync

        best = accepted = 0
        bonus = int(preds[0])
        g_start = len(needed) - len(guesses) * guess_len  # row of the first n-gram token in `needed`
        if guesses:
            self.pool_hits += 1
            g_preds = preds[g_start:].view(len(guesses), guess_len)
            target = torch.cat([preds[:1].expand(len(guesses), 1), g_preds], dim=1)
            best, accepted, bonus = branch_verify(torch.tensor(guesses), target)
        emitted = truncate_at_stop([*guesses[best][:accepted], bonus] if accepted else [bonus], self.eos_token_ids,
                                   budget)
        accepted = min(accepted, len(emitted))
        kept = list(range(past, past + len(chunk))) + [
            past + off + layout.guess_index(best, j) for j in range(len(emitted) - 1)
        ]
        keep_path(self.cache, past, kept)
        self.seq += emitted
        top_probs = runner_up = None
        if self.confidence:  # rows predicting each emitted token: the input token's, then the n-gram's
            rows = torch.tensor([0] + [g_start + best * guess_len + j for j in range(len(emitted) - 1)])
            probs = logits.index_select(0, rows.to(logits.device)).float().softmax(-1)
            top = probs.topk(min(2, probs.shape[-1]), dim=-1)
            top_probs = top.values[:, 0].tolist()
            runner_up = (self.head.token_ids(top.indices[:, 1]).tolist() if top.indices.shape[1] > 1
                         else [-1] * len(emitted))
        if use_window:
            new_row = preds[1 : 1 + row_lengths[-1]].tolist()
            self.pool.insert_ngrams(window.update(input_token, new_row))
        return StepOutput(emitted, accepted, guess_len if guesses else 0, len(guesses), len(ids), top_probs,
                          runner_up)


@dataclass(frozen=True)
class DraftProposal:
    """What :meth:`LookaheadDrafter.propose` returns.

    Attributes:
        tokens: the draft tokens, the draft model's greedy continuation (cut just after an EOS id).
        forwards: draft forwards spent (the first call of a sample includes the prompt prefill).
        tokens_fed: tokens fed over those forwards (prompt prefill + catch-up tokens + window + n-grams).
        top_probs: the draft's probability of each token (only with ``confidence=True``).
        runner_up: the draft's second choice at each token's position (same condition).
    """

    tokens: list[int]
    forwards: int
    tokens_fed: int
    top_probs: list[float] | None = None
    runner_up: list[int] | None = None


class LookaheadDrafter:
    """Lookahead decoding of a draft model on itself: Ouroboros' phrase-level drafting (ALGORITHMS.md 1.3 A).

    A :class:`~decoders.common.lookahead_step.LookaheadStepper` on the draft (its KV cache, Jacobi window and
    ``seq``, the committed tokens followed by what it drafted), plus the drafting loop. Each forward feeds the
    tokens the draft cache lacks, the window and the pool n-grams keyed by the last token, and emits several
    draft tokens when an n-gram matches the draft's own argmax.

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
    ):
        check_int("window_size (W)", window_size, 1)
        check_int("ngram_size (N)", ngram_size, 2)
        head = head or FullHead(model, vocab_limit or model.get_output_embeddings().out_features)
        self.eos_token_ids = frozenset(eos_token_ids)
        self.stepper = LookaheadStepper(model, pool, window_size, ngram_size, seed, head, self.eos_token_ids,
                                        confidence)
        self.prefill_tokens = 0  # tokens of the plain causal prompt prefill (one forward, the first)

    @property
    def cache(self):
        return self.stepper.cache

    @property
    def pool_hits(self) -> int:
        """Draft forwards of this sample that verified at least one pool n-gram."""
        return self.stepper.pool_hits

    def start(self, prompt: Sequence[int]) -> None:
        """Begin a sample: empty cache, fresh window drawn from ``prompt``, ``seq = prompt``."""
        self.stepper.start(prompt)
        self.prefill_tokens = 0

    def sync(self, committed: Sequence[int]) -> None:
        """Adopt the committed tokens (see :meth:`LookaheadStepper.sync`)."""
        self.stepper.sync(committed)

    @torch.inference_mode()
    def propose(self, max_tokens: int, stop_confidence: float = 0.0) -> DraftProposal:
        """Draft up to ``max_tokens`` tokens continuing ``seq`` (fewer at an EOS id or a confidence stop).

        The first call after :meth:`start` also prefills the cache with the prompt (one more forward).

        Args:
            max_tokens: most draft tokens.
            stop_confidence: stop after a forward that emitted a token whose draft probability is below this
                (0 = never; needs ``confidence=True``).
        """
        stepper = self.stepper
        drafted: list[int] = []
        probs: list[float] = []
        runner_up: list[int] = []
        forwards = fed = 0
        if max_tokens > 0 and stepper.cache.get_seq_length() == 0 and len(stepper.seq) > 1:
            # The prompt goes through one plain causal forward (no O(prompt^2) tree mask); the lookahead
            # forwards then only catch up on the few tokens the target accepted since the last step.
            self.prefill_tokens = len(stepper.seq) - 1
            stepper.prefill(len(stepper.seq) - 1)
            forwards, fed = 1, self.prefill_tokens
        while len(drafted) < max_tokens and not (drafted and drafted[-1] in self.eos_token_ids):
            out = stepper.step(max_tokens - len(drafted))
            drafted += out.emitted
            forwards += 1
            fed += out.tokens_fed
            if out.top_probs is not None:
                probs += out.top_probs
                runner_up += out.runner_up or []
                if min(out.top_probs) < stop_confidence:
                    break
        confident = stepper.confidence
        return DraftProposal(drafted, forwards, fed, probs if confident else None, runner_up if confident else None)
