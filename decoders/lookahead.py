"""Lookahead decoding: Jacobi-window n-gram generation and n-gram verification in one target forward.

Fu, Bailis, Stoica & Zhang 2024, "Break the Sequential Dependency of LLM Inference Using Lookahead
Decoding" (arXiv 2402.02057, ICML 2024), Algorithm 1 (greedy). No draft model: every step feeds the
target model, in one forward with a tree attention mask (:func:`decoders.common.tree.lookahead_layout`),

* the last accepted token (the *input token*);
* the **lookahead branch**: a Jacobi window of ``N - 1`` rows by ``W`` columns of guessed tokens, row 0
  starting with the input token. The target's argmax at the last row yields a new row; each column read
  top to bottom plus its new token is an n-gram, and the ``W`` n-grams are harvested into the
  :class:`~decoders.common.ngram_pool.NGramPool`;
* the **verification branch**: up to ``G`` pool n-grams keyed by the input token, verified greedily with
  :func:`~decoders.common.verify.branch_verify`. The longest accepted prefix plus the target's own next
  token is emitted, so every step emits at least one token and the output is the target's greedy output.

Only the accepted tokens' KV entries are kept (:func:`~decoders.common.kv_cache.keep_path`). The window
is initialised with tokens drawn from the prompt by a seeded RNG and needs ``N - 2`` warm-up steps to fill
its rows (no harvesting meanwhile). As in the reference implementation, the window shifts by one
position per step whatever the number of accepted tokens: its content is only a guess and never
affects which tokens are emitted.
"""

from __future__ import annotations

import random
import sys
from typing import Iterable

import torch
from transformers import PreTrainedModel

from decoders.common.checks import check_int, check_pool_scope
from decoders.common.forward import forward, new_cache
from decoders.common.kv_cache import keep_path
from decoders.common.ngram_pool import NGramPool
from decoders.common.stopping import check_max_new_tokens, truncate_at_stop
from decoders.common.tree import lookahead_layout, tree_attention
from decoders.common.verify import branch_verify
from decoders.types import DecodeResult, StepRecord



class LookaheadDecoder:
    """Greedy lookahead decoding on the target model alone.

    Cache invariant between steps: the KV cache holds every committed token except the last one (the
    input token of the next step).

    Per-step statistics (:class:`~decoders.types.StepRecord`): ``target_tokens_fed`` is the whole layout
    (input token + window + verification n-grams); ``drafted`` is the length of the compared candidate,
    i.e. the n-gram length verified this step (``N - 1``, less near ``max_new_tokens``; 0 when the pool had
    no n-gram for the input token), so ``accepted / drafted`` reads like a linear draft's acceptance rate;
    ``accepted`` is the number of accepted n-gram tokens; ``source = {"ngram": accepted, "bonus": 1}``.
    Every verification token fed is counted in ``extra["guess_tokens_fed"]``.

    Args:
        target_model: the model whose greedy output is reproduced.
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

    Raises:
        ValueError: on ``W < 1``, ``N < 2``, ``G < 0``, a non-integer seed or an unknown ``pool_scope``.
    """

    name = "lookahead"

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
    ):
        self.target_model = target_model
        self.window_size = check_int("window_size (W)", window_size, 1)
        self.ngram_size = check_int("ngram_size (N)", ngram_size, 2)
        self.guess_set_size = check_int("guess_set_size (G)", guess_set_size, 0)
        self.pool_scope = check_pool_scope(pool_scope)
        self.seed = check_int("seed", seed, 0)
        if not isinstance(pool_from_prompt, bool):
            raise ValueError(f"pool_from_prompt must be true or false, got {pool_from_prompt!r}")
        self.pool_from_prompt = pool_from_prompt
        self.eos_token_ids = frozenset(eos_token_ids)
        self.pool = NGramPool(self.ngram_size, self.guess_set_size)
        self._max_positions = getattr(target_model.config, "max_position_embeddings", None)

    def reset(self) -> None:
        """Empty the n-gram pool (start of a task under ``pool_scope="task"``)."""
        self.pool.clear()

    def _init_window(self, prompt: list[int]) -> list[list[int]]:
        """Row 0 of the window: a placeholder for the input token + ``W + N - 3`` prompt tokens.

        The ``N - 2`` extra columns are consumed by the warm-up steps (one per step) so that the rows
        have exactly ``W`` columns once all ``N - 1`` are filled.
        """
        rng = random.Random(self.seed)
        return [[-1] + [rng.choice(prompt) for _ in range(self.window_size + self.ngram_size - 3)]]

    @torch.inference_mode()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int) -> DecodeResult:
        """Decode; same contract as :meth:`decoders.vanilla.VanillaDecoder.generate`.

        Args:
            input_ids: ``torch.LongTensor`` of shape ``(1, prompt_len)`` on the target's device.
            max_new_tokens: upper bound on new tokens, >= 1. A step never emits more than what is left:
                verification n-grams are shortened near the end.

        Returns:
            :class:`DecodeResult`; ``extra`` holds the configuration and pool statistics.
        """
        check_max_new_tokens(max_new_tokens)
        if input_ids.shape[0] != 1:
            raise ValueError(f"batch size must be 1, got {input_ids.shape[0]}")
        if self.pool_scope == "sample":
            self.pool.clear()
        model, device, n_rows = self.target_model, input_ids.device, self.ngram_size - 1
        prompt = input_ids[0].tolist()
        prompt_len = len(prompt)
        if self.pool_from_prompt:
            n = self.ngram_size
            self.pool.insert_ngrams(prompt[i : i + n] for i in range(prompt_len - n + 1))
        cache = new_cache(model)
        logits = forward(model, input_ids, cache, logits_to_keep=1)
        out = [int(logits[0, -1].argmax())]
        steps = [StepRecord(target_tokens_fed=prompt_len, emitted=1, source={"bonus": 1})]
        rows = self._init_window(prompt)
        pool_hits = guess_tokens_fed = 0

        finished = max_new_tokens == 1 or out[0] in self.eos_token_ids
        while not finished:
            pending, past_len = out[-1], prompt_len + len(out) - 1
            remaining = max_new_tokens - len(out)
            # Tree depths up to max_depth keep positions (past_len + depth) inside the model's range.
            max_depth = self._max_positions - 1 - past_len if self._max_positions else sys.maxsize
            guess_len = max(0, min(n_rows, remaining - 1, max_depth))
            guesses = list(dict.fromkeys(g[:guess_len] for g in self.pool.get(pending))) if guess_len else []
            window_depth = len(rows[0]) - 1 + len(rows) - 1
            use_window = remaining > 1 and window_depth <= max_depth
            row_lengths = tuple(len(r) for r in rows) if use_window else (1,)
            layout = lookahead_layout(row_lengths, len(guesses), guess_len if guesses else 0)

            ids = [pending]
            if use_window:
                ids += rows[0][1:] + [t for r in rows[1:] for t in r]
            ids += [t for g in guesses for t in g]
            last_row = layout.row_starts[-1]
            needed = [0] + list(range(last_row, last_row + row_lengths[-1]) if use_window else []) + list(
                range(layout.guess_start, layout.size)
            )
            mask, position_ids = tree_attention(layout.parents, past_len, dtype=model.dtype, device=device)
            logits = forward(model, torch.tensor([ids], device=device), cache, position_ids=position_ids,
                             attention_mask=mask, logits_to_keep=torch.tensor(needed, device=device))
            preds = logits[0].argmax(-1).cpu()  # (len(needed),) aligned with `needed`; one device sync per step

            # Verification branch: column 0 of each row of `target` is the argmax after the input token.
            best = accepted = 0
            bonus = int(preds[0])
            if guesses:
                pool_hits += 1
                guess_tokens_fed += len(guesses) * guess_len
                g_preds = preds[len(needed) - len(guesses) * guess_len :].view(len(guesses), guess_len)
                target = torch.cat([preds[:1].expand(len(guesses), 1), g_preds], dim=1)
                best, accepted, bonus = branch_verify(torch.tensor(guesses), target)
            kept = [past_len] + [past_len + layout.guess_index(best, j) for j in range(accepted)]
            keep_path(cache, past_len, kept)
            emitted = [*guesses[best][:accepted], bonus] if accepted else [bonus]
            out.extend(emitted)
            finished = len(out) >= max_new_tokens or not self.eos_token_ids.isdisjoint(emitted)
            steps.append(StepRecord(
                target_tokens_fed=layout.size, emitted=accepted + 1, drafted=guess_len if guesses else 0,
                accepted=accepted, source={"ngram": accepted, "bonus": 1},
            ))

            # Lookahead branch: the new row, then harvest (full window) or grow (warm-up), then shift.
            if use_window:
                new_row = preds[1 : 1 + row_lengths[-1]].tolist()
                if len(rows) < n_rows:  # warm-up: drop column 0 of every row, add the new row
                    rows = [r[1:] for r in rows] + [new_row[1:]]
                else:
                    rows[0][0] = pending  # the key of column 0 is the (true) input token
                    self.pool.insert_ngrams(zip(*rows, new_row))
                    rows = (rows + [new_row])[1:]
                    rows[0] = [-1] + rows[0][1:]

        decode_steps = len(steps) - 1
        extra = {
            "pool_scope": self.pool_scope,
            "window_size": self.window_size,
            "ngram_size": self.ngram_size,
            "guess_set_size": self.guess_set_size,
            "pool_from_prompt": self.pool_from_prompt,
            "pool_hit_rate": pool_hits / decode_steps if decode_steps else 0.0,
            "guess_tokens_fed": guess_tokens_fed,
            "pool_entries": len(self.pool),
        }
        return DecodeResult(tuple(truncate_at_stop(out, self.eos_token_ids, max_new_tokens)), tuple(steps), extra)
