"""Lookahead decoding: Jacobi-window n-gram generation and n-gram verification in one target forward.

Fu, Bailis, Stoica & Zhang 2024, "Break the Sequential Dependency of LLM Inference Using Lookahead
Decoding" (arXiv 2402.02057, ICML 2024), Algorithm 1 (greedy) and section 3.4 (sampling). No draft model:
every step feeds the target model, in one forward with a tree attention mask
(:func:`decoders.common.tree.lookahead_layout`),

* the last accepted token (the *input token*);
* the **lookahead branch**: a Jacobi window of ``N - 1`` rows by ``W`` columns of guessed tokens, row 0
  starting with the input token. The target's argmax at the last row yields a new row; each column read
  top to bottom plus its new token is an n-gram, and the ``W`` n-grams are harvested into the
  :class:`~decoders.common.ngram_pool.NGramPool`;
* the **verification branch**: up to ``G`` pool n-grams keyed by the input token. Greedy (temperature 0):
  verified with :func:`~decoders.common.verify.tree_verify` (chains under the input token: a token is
  accepted while it equals the target's argmax); the longest accepted prefix plus the target's
  own next token is emitted, so every step emits at least one token and the output is the target's greedy
  output. Sampling (temperature > 0), lossless: the n-grams are deterministic drafts (one-hot draft
  distribution) verified with the multi-candidate rule (:func:`~decoders.common.verify.multi_candidate_tree_verify`;
  SpecInfer's multi-step speculative sampling, Miao et al. 2024, arXiv 2305.09781, as lookahead decoding's
  sampling mode applies it, arXiv 2402.02057 section 3.4): at each depth the candidates' tokens are tried in
  turn, token ``x`` accepted with probability ``residual[x]`` (``residual`` starts as the target's processed
  distribution), a rejected ``x``'s mass removed and the residual renormalised; later depths continue only
  along the accepted candidate(s); the token after them is drawn from the remaining residual (or, after a
  whole accepted n-gram, from the target's distribution). The output is distributed exactly as vanilla
  sampling's.

The decode loop is the shared :func:`decoders.common.driver.decode` (target prefill, the verification forward,
the rule, KV compaction, stop rule, statistics); this module is its proposer, which hands it the window and the
n-grams as one :class:`~decoders.common.driver.DraftTree` in the lookahead layout, the window's nodes marked
unverified. The target's cache always holds every committed token but the input token, so the forward feeds
nothing in front of the layout.

Only the accepted tokens' KV entries are kept (:func:`~decoders.common.kv_cache.keep_path`). The window
is initialised with tokens drawn from the prompt by a seeded RNG and needs ``N - 2`` warm-up steps to fill
its rows (no harvesting meanwhile). As in the reference implementation, the window shifts by one
position per step whatever the number of accepted tokens: its content is only a guess and never
affects which tokens are emitted. The window's new row is the target's argmax also when sampling (guesses
only; they draw no random numbers).

The window and the n-gram lookup are :class:`decoders.common.lookahead_step.LookaheadBranches`, the same code
that Ouroboros' draft model runs on itself (:class:`~decoders.common.lookahead_step.LookaheadStepper`).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from decoders.common.base import DraftingDecoder
from decoders.common.batch import PerRow
from decoders.common.driver import DraftCounts, DraftTree, Verdict
from decoders.common.forward import max_depth_after
from decoders.common.lookahead_step import LookaheadBranches, LookaheadPlan
from decoders.common.ngram_pool import NGramPool, start_pool
from decoders.types import StepRecord
from decoders.settings import LookaheadSettings


class LookaheadDecoder(DraftingDecoder, settings=LookaheadSettings, uses_draft=False):
    """Lookahead decoding on the target model alone: greedy, or lossless sampling (multi-candidate rule).

    Decoding runs in :func:`decoders.common.driver.decode` with a fresh :class:`_WindowAndPool` per sample.

    Per-step statistics (:class:`~decoders.types.StepRecord`): ``target_tokens_fed`` is the whole layout
    (input token + window + verification n-grams); ``drafted`` is the length of the compared candidate,
    i.e. the n-gram length verified this step (``N - 1``, less near ``max_new_tokens``; 0 when the pool had
    no n-gram for the input token), so ``accepted / drafted`` reads like a linear draft's acceptance rate;
    ``accepted`` is the number of accepted n-gram tokens kept (an n-gram is cut just after an EOS id);
    ``source = {"ngram": accepted, "bonus": 0 or 1}`` and ``emitted`` = the tokens kept, so the steps add up to
    the output. Every verification token fed is counted in ``extra["guess_tokens_fed"]``.

    Timing (the ``stopwatch`` of :meth:`generate`): ``lap("draft")`` after each proposal (n-gram lookup, window
    layout), ``lap("verify")`` after the prefill and after each verification (target forward, rule, KV
    compaction, window update and harvest). ``extra`` holds the configuration and pool statistics.

    Args:
        target_model: the model whose greedy output (or sampling distribution) is reproduced.
        window_size: ``W >= 1``, Jacobi window columns (n-grams harvested per step).
        ngram_size: ``N >= 2``, n-gram length; the window has ``N - 1`` rows and a step emits up to ``N``
            tokens (``N - 1`` verified + 1 bonus).
        guess_set_size: ``G >= 0``, n-grams kept per key token in the pool and verified per step
            (independent of ``W``; ``G = 0`` verifies nothing: Jacobi overhead, no gain, for ablations).
        pool_scope: ``"sample"`` clears the pool at every :meth:`generate` (cold start); ``"task"`` keeps it
            across calls (warm start, as in Ouroboros' benchmarks) until :meth:`reset`. Outputs are
            identical either way; speed depends on sample order under ``"task"``.
        seed: seed of the window initialisation (tokens drawn from the prompt); reseeded at every call.
        pool_from_prompt: also insert the prompt's own n-grams into the pool before decoding
            (LookaheadDecoding's ``POOL_FROM_PROMPT`` option, off in the paper's experiments): the pool then
            also proposes copies of prompt text, as prompt lookup decoding does.
        eos_token_ids: ids that end generation.
        sampling: greedy (the default) or the sampling settings of the run.

    Raises:
        ValueError: on ``W < 1``, ``N < 2``, ``G < 0``, a non-integer seed, an unknown ``pool_scope``, or a
            target whose KV cache cannot be rolled back (:func:`~decoders.common.kv_cache.check_rollback`).
    """

    name = "lookahead"
    draft_shape = "n-grams"
    supports_sampling = True
    supports_batch = True

    def _build(self) -> None:
        self.pool = NGramPool(self.ngram_size, self.guess_set_size)

    def reset(self) -> None:
        """Empty the n-gram pool (start of a task under ``pool_scope="task"``)."""
        self.pool.clear()

    def proposer(self) -> "_WindowAndPool":
        return _WindowAndPool(self, self.pool)

    def batch_proposer(self, rows: int) -> PerRow:
        """One proposer per row; under ``pool_scope="sample"`` each row has a pool of its own (every request starts
        cold, as at batch size 1), under ``"task"`` the rows share the task's pool (a request also sees the
        n-grams its batch mates harvest as they are made)."""
        if self.pool_scope == "task":
            return PerRow(self.proposer, rows)
        return PerRow(lambda: _WindowAndPool(self, NGramPool(self.ngram_size, self.guess_set_size)), rows)


class _WindowAndPool:
    """The lookahead proposer for one sample (:class:`~decoders.common.driver.Proposer`): the Jacobi window and
    the pool n-grams keyed by the pending token, in the lookahead layout (the pending token is layout index 0,
    so node ``i`` of the tree is layout index ``i + 1``)."""

    def __init__(self, decoder: LookaheadDecoder, pool: NGramPool):
        self.decoder = decoder  # its settings
        self.pool = pool  # the decoder's (kept across samples under ``pool_scope="task"``), or a batch row's own
        self.branches = LookaheadBranches(pool, decoder.window_size, decoder.ngram_size, decoder.seed)
        self.plan: LookaheadPlan | None = None

    def start(self, prompt: list[int]) -> None:
        """Clear the pool (``pool_scope="sample"``), seed it from the prompt (``pool_from_prompt``), draw the
        window from the prompt."""
        start_pool(self.pool, prompt, self.decoder.pool_scope, self.decoder.pool_from_prompt)
        self.branches.start(prompt)

    def propose(self, context: list[int], remaining: int, generator: torch.Generator | None) -> DraftTree:
        """Window (unverified, left out on the last step) and n-grams (origin ``"ngram"``; ``drafted`` = their
        length)."""
        max_depth = max_depth_after(self.decoder.target_model, len(context) - 1)
        plan = self.plan = self.branches.plan(context[-1], remaining, max_depth, advance_window=remaining > 1)
        layout = plan.layout
        n_window, n_guess = layout.guess_start - 1, layout.size - layout.guess_start
        return DraftTree(tokens=plan.tokens, parents=[p - 1 for p in layout.parents[1:]],
                         verified=[False] * n_window + [True] * n_guess, logits_for=[i - 1 for i in plan.last_row],
                         counts=DraftCounts(default_origin="ngram", labels=("ngram",), drafted=plan.guess_len,
                                            stats={"guess_tokens_fed": n_guess}))

    def accepted(self, context: list[int], tree: DraftTree, verdict: Verdict) -> None:
        """Advance the window with the target's argmax at its last row; harvest its n-grams into the pool."""
        self.branches.absorb(self.plan, [verdict.preds[i] for i in self.plan.last_row])

    def extra(self, steps: Sequence[StepRecord], stats: dict[str, float]) -> dict[str, Any]:
        d = self.decoder
        return {
            "pool_scope": d.pool_scope,
            "window_size": d.window_size,
            "ngram_size": d.ngram_size,
            "guess_set_size": d.guess_set_size,
            "pool_from_prompt": d.pool_from_prompt,
            "pool_hit_rate": self.branches.pool_hits / len(steps) if steps else 0.0,
            "guess_tokens_fed": stats.get("guess_tokens_fed", 0),
            "pool_entries": len(self.pool),
        }
