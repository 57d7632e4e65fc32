"""Lookahead decoding's window and n-gram branches, and one lookahead step of a model on itself.

Fu, Bailis, Stoica & Zhang 2024 (arXiv 2402.02057, ICML 2024), Algorithm 1 (greedy) and section 3.4 (sampling).
One lookahead forward feeds, as one token tree (:func:`decoders.common.tree.lookahead_layout`), after the
*input token* (the last known token):

* the **lookahead branch**: the Jacobi window (:class:`~decoders.common.jacobi.JacobiWindow`);
* the **verification branch**: up to ``G`` pool n-grams keyed by the input token, cut to the tokens still
  wanted.

:class:`LookaheadBranches` is that model-free part, shared by both users: it lays out the window and the
n-grams (:meth:`~LookaheadBranches.plan`) and, once the model has run, advances the window by one row and
harvests its ``W`` n-grams into the pool (:meth:`~LookaheadBranches.absorb`). The window's new row is the
model's **argmax** at its last row in both modes: window entries are only guesses that feed the pool, and never
decide which tokens are emitted (no random draws). Lookahead decoding on the target
(:class:`decoders.lookahead.LookaheadDecoder`) hands the layout to the shared decode loop
(:func:`decoders.common.driver.decode`), which runs the target and verifies the n-grams.

:class:`LookaheadStepper` runs a model on ITSELF (Ouroboros' phrase-level drafting on the draft model): its own
forward, which also feeds, as a causal chain in front (:func:`decoders.common.tree.prepend_chain`), the tokens
its KV cache lacks (the drafter catches up on what the target accepted), and its own verification of the
n-grams against THIS model's predictions. Greedy (temperature 0): an n-gram token is accepted while it equals
the model's argmax; the step emits the longest accepted n-gram
prefix plus the model's own next token, exactly the model's greedy continuation. Sampling (temperature > 0):
the n-grams are deterministic candidates verified against the model's processed distribution
(:meth:`~decoders.common.sampling.SamplingConfig.probs`) by the multi-candidate rule
(:func:`decoders.common.verify.multi_candidate_tree_verify`: SpecInfer's multi-step speculative sampling, as
lookahead decoding's sampling mode applies it, arXiv 2402.02057 section 3.4): the candidates' first tokens are
tried in turn against the residual, the accepted candidate(s) continue at the next depth, and the last token is
drawn from the remaining residual -- so the emitted tokens are a sample of the model's own sampling
distribution, whatever the pool holds. The step also returns the distribution each emitted token was drawn
from (its marginal: the model's processed distribution after the preceding tokens), which Ouroboros' target
verification needs as the draft distribution of its trunk. Either way the emitted tokens are cut just after an
EOS id and only their KV entries are kept (:func:`decoders.common.kv_cache.keep_path`).

What lives here: :class:`LookaheadBranches` and :class:`LookaheadPlan`; :class:`LookaheadStepper` (cache +
branches + sequence of one model; ``start``, ``prefill``, ``sync``, ``step``) and :class:`StepOutput`. What does
not: the drafting loop Ouroboros runs on its draft model with it (:mod:`decoders.common.lookahead_drafter`), the
decode loop, the target's verification and the decoders' statistics (:mod:`decoders.common.driver`,
:mod:`decoders.lookahead`, :mod:`decoders.ouroboros`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import torch
from transformers import PreTrainedModel

from decoders.common.forward import max_depth_after, new_cache
from decoders.common.heads import FullHead, ReducedVocabHead
from decoders.common.jacobi import JacobiWindow
from decoders.common.kv_cache import crop, keep_path
from decoders.common.ngram_pool import NGramPool
from decoders.common.sampling import GREEDY, SamplingConfig, argmax_ids, check_generator, sample_token
from decoders.common.stopping import truncate_at_stop
from decoders.common.tree import LookaheadLayout, lookahead_layout, prepend_chain, tree_attention
from decoders.common.verify import multi_candidate_tree_verify


@dataclass(frozen=True)
class LookaheadPlan:
    """What one lookahead forward feeds after the input token, in :func:`~decoders.common.tree.lookahead_layout`
    order (:meth:`LookaheadBranches.plan`).

    Attributes:
        input_token: the token fed first (layout index 0): the last known token.
        layout: the layout: window rows (row 0 column 0 is the input token), then the verification n-grams.
        tokens: the tokens after the input token (layout indices ``1 .. layout.size - 1``): the window's
            guesses (none when the window is left out), then the n-grams' tokens.
        guesses: the verification n-grams, distinct, ``guess_len`` tokens each.
        guess_len: tokens per n-gram (0 when there is none).
        use_window: the window is fed; :meth:`LookaheadBranches.absorb` then advances it.
    """

    input_token: int
    layout: LookaheadLayout
    tokens: list[int]
    guesses: list[tuple[int, ...]]
    guess_len: int
    use_window: bool

    @property
    def last_row(self) -> range:
        """Layout indices of the window's last row; the model's argmax after them is the window's new row
        (empty when the window is left out)."""
        if not self.use_window:
            return range(0)
        start = self.layout.row_starts[-1]
        return range(start, start + self.layout.row_lengths[-1])


class LookaheadBranches:
    """The two branches of lookahead decoding without the model: the Jacobi window (lookahead branch) and the
    pool n-grams keyed by the input token (verification branch).

    :meth:`plan` lays out one forward's tokens after the input token; once the model has run over them,
    :meth:`absorb` takes its argmax at the window's last row, advances the window by one row and harvests its
    ``W`` n-grams into the pool. Whoever runs the forward verifies the n-grams: the target's decode loop
    (:class:`decoders.lookahead.LookaheadDecoder`, through :func:`decoders.common.driver.decode`) or
    :meth:`LookaheadStepper.step` (a model on itself: Ouroboros' drafter).

    Args:
        pool: the n-gram pool (n-grams of ``ngram_size``), shared with the caller.
        window_size: ``W >= 1`` Jacobi window columns.
        ngram_size: ``N >= 2``; the window has ``N - 1`` rows and verified n-grams hold ``N - 1`` tokens.
        seed: seed of the window's initialisation from the prompt.

    Raises:
        ValueError: if the pool's n-gram size differs from ``ngram_size``.
    """

    def __init__(self, pool: NGramPool, window_size: int, ngram_size: int, seed: int = 0):
        if pool.ngram_size != ngram_size:
            raise ValueError(f"the pool holds {pool.ngram_size}-grams, the window makes {ngram_size}-grams")
        self.pool = pool
        self.window_size = window_size
        self.ngram_size = ngram_size
        self.seed = seed
        self.window: JacobiWindow | None = None
        self.pool_hits = 0  # plans that verify at least one pool n-gram (this sample)

    def start(self, prompt: Sequence[int]) -> None:
        """Begin a sample: a fresh window drawn from ``prompt``, no pool hits."""
        self.window = JacobiWindow(self.window_size, self.ngram_size, prompt, self.seed)
        self.pool_hits = 0

    def plan(self, input_token: int, budget: int, max_depth: int, advance_window: bool = True) -> LookaheadPlan:
        """The tokens of the next forward after ``input_token``.

        Args:
            input_token: the last known token (the n-grams' key).
            budget: most tokens the step may emit (>= 1); the n-grams are cut to ``budget - 1`` tokens.
            max_depth: how far past the input token's position a token may sit
                (:func:`~decoders.common.forward.max_depth_after`); the n-grams are cut to it and the window is left
                out when it would pass it.
            advance_window: feed the window (``False`` on a decoder's very last step, where the harvest could
                never be used).
        """
        assert self.window is not None, "call start() first"
        window = self.window
        guess_len = max(0, min(self.ngram_size - 1, budget - 1, max_depth))
        guesses = list(dict.fromkeys(g[:guess_len] for g in self.pool.get(input_token))) if guess_len else []
        use_window = advance_window and window.depth <= max_depth
        row_lengths = window.row_lengths if use_window else (1,)
        guess_len = guess_len if guesses else 0
        self.pool_hits += bool(guesses)
        return LookaheadPlan(int(input_token), lookahead_layout(row_lengths, len(guesses), guess_len),
                             (window.tokens() if use_window else []) + [t for g in guesses for t in g], guesses,
                             guess_len, use_window)

    def absorb(self, plan: LookaheadPlan, new_row: Sequence[int]) -> None:
        """After the forward of ``plan``: advance the window with ``new_row`` (the model's argmax after each token
        of :attr:`LookaheadPlan.last_row`) and harvest its n-grams into the pool; nothing when the window was
        left out."""
        if plan.use_window:
            self.pool.insert_ngrams(self.window.update(plan.input_token, new_row))


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
        top_probs: the model's probability of each emitted token, only when the stepper was built with
            ``confidence=True``, else ``None``. Greedy: its softmax maximum; sampling: the token's probability
            under the processed distribution it was drawn from.
        runner_up: the model's most likely token other than the emitted one at each emitted position (greedy:
            its second most likely token; same condition).
        probs: sampling only (else ``None``): ``torch.FloatTensor`` of shape ``(len(emitted), vocab_width)``, the
            processed distribution each emitted token was drawn from, in token-id space
            (:attr:`LookaheadStepper.vocab_width` columns).
    """

    emitted: list[int]
    accepted: int
    guess_len: int
    num_guesses: int
    tokens_fed: int
    top_probs: list[float] | None = None
    runner_up: list[int] | None = None
    probs: torch.Tensor | None = None


class LookaheadStepper:
    """A model running lookahead decoding on itself, one forward per :meth:`step`.

    State: ``seq`` (the token sequence being continued), the model's KV cache and its :class:`LookaheadBranches`
    (Jacobi window, pool n-grams). Cache invariant: the cache holds ``seq[:L]`` for some ``L < len(seq)``; the
    missing tail (at least the input token) heads the next forward. The n-gram pool is shared with the caller
    (Ouroboros also reads and refines it).

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
        sampling: greedy (the default) or the sampling settings (:class:`~decoders.common.sampling.SamplingConfig`):
            the processed distribution is taken over the head's columns (a reduced head's ids only) and placed
            in token-id space; :meth:`prefill` and :meth:`step` then need a ``generator``.

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
        sampling: SamplingConfig = GREEDY,
    ):
        self.model = model
        self.branches = LookaheadBranches(pool, window_size, ngram_size, seed)
        self.head = head if head is not None else FullHead(model)
        self.eos_token_ids = frozenset(eos_token_ids)
        self.confidence = confidence
        self.sampling = sampling
        self.device = model.get_input_embeddings().weight.device
        self.dtype = model.dtype  # once: transformers' ``dtype`` walks the parameters on every read
        self._embed = model.get_input_embeddings().num_embeddings
        self._columns: torch.Tensor | None = None  # token id of each head column (sampling; set lazily)
        self._width = 0
        self.seq: list[int] = []
        self.cache = new_cache(model)
        self._stable = 0  # seq[:_stable] is known to be final (committed by the caller)

    def start(self, prompt: Sequence[int]) -> None:
        """Begin a sample: empty cache, fresh window drawn from ``prompt``, ``seq = prompt``."""
        self.seq = [int(t) for t in prompt]
        self.cache = new_cache(self.model)
        self.branches.start(self.seq)
        self._stable = len(self.seq)

    @property
    def vocab_width(self) -> int:
        """Columns of the distributions in token-id space (sampling; known after the first forward)."""
        return self._width

    def _id_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """``(k, columns)`` head logits -> ``(k, vocab_width)`` processed distributions in token-id space.

        The width is at least the model's embedding size (every id the window or the pool can feed), so a
        candidate id always has an entry (0 where the head cannot produce it).
        """
        probs = self.sampling.probs(logits)
        if self._columns is None:
            columns = self.head.token_ids(torch.arange(logits.shape[-1], device=logits.device))
            self._width = max(self._embed, int(columns.max()) + 1)
            identity = self._width == logits.shape[-1] and torch.equal(
                columns, torch.arange(logits.shape[-1], device=columns.device))
            self._columns = torch.empty(0, dtype=torch.long) if identity else columns.to(probs.device)
        if self._columns.numel() == 0:
            return probs
        return probs.new_zeros((probs.shape[0], self._width)).index_copy_(1, self._columns, probs)

    def prefill(self, upto: int, generator: torch.Generator | None = None) -> int:
        """Feed ``seq[cache_len:upto]`` as one plain causal forward (no tree mask); return the model's next token.

        Args:
            upto: end of the fed span (``<= len(seq)``); ``len(seq) - 1`` leaves the input token for :meth:`step`.
            generator: required when sampling.

        Returns:
            After ``seq[upto - 1]``: the model's argmax (through the head) when greedy, a draw from its processed
            distribution when sampling.
        """
        check_generator(self.sampling, generator)
        past = self.cache.get_seq_length()
        ids = torch.tensor([self.seq[past:upto]], device=self.device)
        logits = self.head.logits(ids, self.cache, keep=1)
        if not self.sampling.greedy:
            return sample_token(self._id_probs(logits[-1:])[0], generator)
        return int(self.head.token_ids(argmax_ids(logits[-1:]))[0])

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
    def step(self, budget: int, advance_window: bool = True, generator: torch.Generator | None = None
             ) -> StepOutput:
        """One lookahead forward; appends the emitted tokens to ``seq``.

        Args:
            budget: most tokens to emit (>= 1); the verified n-grams are cut to ``budget - 1`` tokens.
            advance_window: feed and advance the Jacobi window (``False`` on a decoder's very last step, where
                the harvest could never be used). The window is also left out when its positions would pass
                ``max_position_embeddings``.
            generator: the only source of randomness; required when sampling.

        Returns:
            :class:`StepOutput`.
        """
        check_generator(self.sampling, generator)
        model, device = self.model, self.device
        past = self.cache.get_seq_length()
        chunk = self.seq[past:]  # tokens the cache lacks; the last one is the input token
        off = len(chunk) - 1  # flat index of the input token
        input_token = chunk[-1]
        plan = self.branches.plan(input_token, budget, max_depth_after(model, len(self.seq) - 1), advance_window)
        layout, guesses, guess_len = plan.layout, plan.guesses, plan.guess_len
        ids = chunk + plan.tokens
        needed = [off] + [off + i for i in plan.last_row] + [off + i for i in range(layout.guess_start, layout.size)]
        mask, position_ids = tree_attention(prepend_chain(layout.parents, off), past, dtype=self.dtype, device=device)
        logits = self.head.logits(torch.tensor([ids], device=device), self.cache, position_ids=position_ids,
                                  attention_mask=mask, keep=torch.tensor(needed, device=device))
        preds = self.head.token_ids(argmax_ids(logits)).tolist()  # aligned with `needed`; one device sync

        best = accepted = 0
        bonus = preds[0]
        g_start = len(needed) - len(guesses) * guess_len  # row of the first n-gram token in `needed`
        drawn_from = None
        if not self.sampling.greedy:
            # Tree of the input token (node 0) and the n-grams (node 1 + b * guess_len + j), verified against
            # the processed distribution after each node (the rows of `needed` predicting them).
            rows = torch.tensor([0, *range(g_start, len(needed))], device=logits.device)
            node_probs = self._id_probs(logits.index_select(0, rows))
            tokens = [input_token] + [t for g in guesses for t in g]
            parents = [-1] + [0 if j == 0 else b * guess_len + j for b in range(len(guesses))
                              for j in range(guess_len)]
            path, bonus = multi_candidate_tree_verify(tokens, parents, node_probs, generator)
            accepted = len(path)
            best = (path[-1] - 1) // guess_len if path else 0
            drawn_from = node_probs[[0, *path]]  # the row each emitted token was drawn from
        elif guesses:  # the greedy rule over parallel n-grams, on plain lists (a handful of ints: cheaper than tensors)
            for b, guess in enumerate(guesses):
                row, n, pred = g_start + b * guess_len, 0, preds[0]
                while n < guess_len and guess[n] == pred:
                    pred = preds[row + n]
                    n += 1
                if n > accepted:  # the first longest branch wins
                    best, accepted, bonus = b, n, pred
        emitted = truncate_at_stop([*guesses[best][:accepted], bonus] if accepted else [bonus], self.eos_token_ids,
                                   budget)
        accepted = min(accepted, len(emitted))
        kept = list(range(past, past + len(chunk))) + [
            past + off + layout.guess_index(best, j) for j in range(len(emitted) - 1)
        ]
        keep_path(self.cache, past, kept)
        self.seq += emitted
        top_probs = runner_up = None
        if drawn_from is not None:
            drawn_from = drawn_from[: len(emitted)]
            if self.confidence:  # the drawn token's probability; the most likely other token
                picked = torch.tensor(emitted, device=drawn_from.device)[:, None]
                top_probs = drawn_from.gather(1, picked)[:, 0].tolist()
                runner_up = drawn_from.scatter(1, picked, -1.0).argmax(-1).tolist()
        elif self.confidence:  # rows predicting each emitted token: the input token's, then the n-gram's
            rows = torch.tensor([0] + [g_start + best * guess_len + j for j in range(len(emitted) - 1)])
            probs = logits.index_select(0, rows.to(logits.device)).float().softmax(-1)
            top = probs.topk(min(2, probs.shape[-1]), dim=-1)
            top_probs = top.values[:, 0].tolist()
            runner_up = (self.head.token_ids(top.indices[:, 1]).tolist() if top.indices.shape[1] > 1
                         else [-1] * len(emitted))
        self.branches.absorb(plan, preds[1 : 1 + len(plan.last_row)])
        return StepOutput(emitted, accepted, guess_len, len(guesses), len(ids), top_probs, runner_up, drawn_from)
