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
  verified with :func:`~decoders.common.verify.branch_verify`; the longest accepted prefix plus the target's
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

Only the accepted tokens' KV entries are kept (:func:`~decoders.common.kv_cache.keep_path`). The window
is initialised with tokens drawn from the prompt by a seeded RNG and needs ``N - 2`` warm-up steps to fill
its rows (no harvesting meanwhile). As in the reference implementation, the window shifts by one
position per step whatever the number of accepted tokens: its content is only a guess and never
affects which tokens are emitted. The window's new row is the target's argmax also when sampling (guesses
only; they draw no random numbers).

The step itself is :class:`decoders.common.lookahead_step.LookaheadStepper`, the same code that runs
Ouroboros' draft model on itself; this module is the decoding loop and its statistics.
"""

from __future__ import annotations

from typing import Iterable

import torch
from transformers import PreTrainedModel

from decoders.common.checks import check_bool, check_input_ids, check_int, check_pool_scope
from decoders.common.kv_cache import check_rollback
from decoders.common.lookahead_step import LookaheadStepper
from decoders.common.ngram_pool import NGramPool
from decoders.common.sampling import GREEDY, SamplingConfig, check_generator
from decoders.common.stopping import check_max_new_tokens, truncate_at_stop
from decoders.types import NULL_STOPWATCH, DecodeResult, StepRecord, Stopwatch


class LookaheadDecoder:
    """Lookahead decoding on the target model alone: greedy, or lossless sampling (multi-candidate rule).

    Cache invariant between steps: the KV cache holds every committed token except the last one (the
    input token of the next step).

    Per-step statistics (:class:`~decoders.types.StepRecord`): ``target_tokens_fed`` is the whole layout
    (input token + window + verification n-grams); ``drafted`` is the length of the compared candidate,
    i.e. the n-gram length verified this step (``N - 1``, less near ``max_new_tokens``; 0 when the pool had
    no n-gram for the input token), so ``accepted / drafted`` reads like a linear draft's acceptance rate;
    ``accepted`` is the number of accepted n-gram tokens kept (an n-gram is cut just after an EOS id);
    ``source = {"ngram": accepted, "bonus": 0 or 1}`` and ``emitted`` = the tokens kept, so the steps add up to
    the output. Every verification token fed is counted in ``extra["guess_tokens_fed"]``.

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
    supports_sampling = True

    def __init__(
        self,
        target_model: PreTrainedModel,
        window_size: int = 5,
        ngram_size: int = 4,
        guess_set_size: int = 5,
        pool_scope: str = "sample",
        seed: int = 0,
        pool_from_prompt: bool = False,
        eos_token_ids: Iterable[int] = (),
        sampling: SamplingConfig = GREEDY,
    ):
        self.target_model = target_model
        self.window_size = check_int("window_size (W)", window_size, 1)
        self.ngram_size = check_int("ngram_size (N)", ngram_size, 2)
        self.guess_set_size = check_int("guess_set_size (G)", guess_set_size, 0)
        self.pool_scope = check_pool_scope(pool_scope)
        self.seed = check_int("seed", seed, 0)
        self.pool_from_prompt = check_bool("pool_from_prompt", pool_from_prompt)
        check_rollback(target_model, "target model", self.name)
        self.eos_token_ids = frozenset(eos_token_ids)
        self.sampling = sampling
        self.pool = NGramPool(self.ngram_size, self.guess_set_size)

    def reset(self) -> None:
        """Empty the n-gram pool (start of a task under ``pool_scope="task"``)."""
        self.pool.clear()

    @torch.inference_mode()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, generator: torch.Generator | None = None,
                 stopwatch: Stopwatch | None = None) -> DecodeResult:
        """Decode; same contract as :meth:`decoders.vanilla.VanillaDecoder.generate`.

        Args:
            input_ids: ``torch.LongTensor`` of shape ``(1, prompt_len)`` on the target's device.
            max_new_tokens: upper bound on new tokens, >= 1. A step never emits more than what is left:
                verification n-grams are shortened near the end.
            generator: the only source of randomness; required when sampling.
            stopwatch: the runner's timer; ``first_token()`` is called once the prefill has produced the first
                new token.

        Returns:
            :class:`DecodeResult`; ``extra`` holds the configuration and pool statistics.
        """
        check_input_ids(input_ids)
        check_max_new_tokens(max_new_tokens)
        check_generator(self.sampling, generator)
        watch = stopwatch or NULL_STOPWATCH
        if self.pool_scope == "sample":
            self.pool.clear()
        prompt = input_ids[0].tolist()
        prompt_len = len(prompt)
        if self.pool_from_prompt:
            n = self.ngram_size
            self.pool.insert_ngrams(prompt[i : i + n] for i in range(prompt_len - n + 1))
        stepper = LookaheadStepper(self.target_model, self.pool, self.window_size, self.ngram_size, self.seed,
                                   eos_token_ids=self.eos_token_ids, sampling=self.sampling)
        stepper.start(prompt)
        first = stepper.prefill(prompt_len, generator)
        watch.first_token()
        stepper.sync(prompt + [first])
        steps = [StepRecord(target_tokens_fed=prompt_len, emitted=1, source={"bonus": 1})]
        guess_tokens_fed = 0

        new = 1
        finished = max_new_tokens == 1 or first in self.eos_token_ids
        while not finished:
            remaining = max_new_tokens - new
            out = stepper.step(remaining, advance_window=remaining > 1, generator=generator)
            guess_tokens_fed += out.num_guesses * out.guess_len
            new += len(out.emitted)
            finished = new >= max_new_tokens or not self.eos_token_ids.isdisjoint(out.emitted)
            steps.append(StepRecord(
                target_tokens_fed=out.tokens_fed, emitted=len(out.emitted), drafted=out.guess_len,
                accepted=out.accepted, source={"ngram": out.accepted, "bonus": len(out.emitted) - out.accepted},
            ))

        decode_steps = len(steps) - 1
        extra = {
            "pool_scope": self.pool_scope,
            "window_size": self.window_size,
            "ngram_size": self.ngram_size,
            "guess_set_size": self.guess_set_size,
            "pool_from_prompt": self.pool_from_prompt,
            "pool_hit_rate": stepper.pool_hits / decode_steps if decode_steps else 0.0,
            "guess_tokens_fed": guess_tokens_fed,
            "pool_entries": len(self.pool),
        }
        output = stepper.seq[prompt_len:]
        return DecodeResult(tuple(truncate_at_stop(output, self.eos_token_ids, max_new_tokens)), tuple(steps), extra)
