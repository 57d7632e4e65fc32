"""Ouroboros: phrase-level drafting by a lookahead-decoding draft model, lengthened drafts, recycled verification.

Zhao, Huang, Han, Xu, Xiao, Zhang, Fang, Zhang, Liu & Sun 2024, "Ouroboros: Generating Longer Drafts Phrase
by Phrase for Faster Speculative Decoding" (arXiv 2402.13720, EMNLP 2024; reference code thunlp/Ouroboros,
restated in ALGORITHMS.md section 1). One target forward per step, greedy, lossless:

1. **Phrase-level drafting** (:class:`LookaheadDrafter`): the draft model runs lookahead decoding on itself
   (Fu et al. 2024, arXiv 2402.02057): each draft forward feeds the tokens its cache lacks, a Jacobi window
   (:class:`~decoders.common.jacobi.JacobiWindow`, kept across steps within a sample) and the phrase pool's
   n-grams keyed by the last token, verified against the DRAFT's argmax. Several draft tokens per draft
   forward, and exactly the draft model's greedy text, until ``gamma`` tokens are drafted.
2. **Lengthened drafts**: the newest ``topk`` pool phrases keyed by the last draft token are candidate
   suffixes. One target forward verifies the draft (the trunk) and every suffix (leaves that cannot see each
   other, each restarting at the position after the draft;
   :func:`~decoders.common.tree.chain_with_branches`).
3. **Acceptance**: the longest draft prefix matching the target's argmax; if the whole draft is accepted,
   the best-matching suffix continues it (:func:`~decoders.common.verify.branch_verify`). The target's next
   token after the accepted path is always emitted -- also after a fully matched suffix, which the reference
   code drops. The accepted path's KV entries are kept (:func:`~decoders.common.kv_cache.keep_path`); the
   draft cache is cropped to the tokens the draft and the output still share.
4. **Recycling the target's verification** (ALGORITHMS.md 1.5): the suffixes just verified are refined in
   place with the target's predictions for them (one Jacobi step of the target), and after a rejection the
   target's predictions over the rejected draft tail become new phrases (self-consistent chains only).
5. **Warm start**: ``pool_scope="task"`` keeps the phrase pool across samples until :meth:`reset`;
   ``"sample"`` is cold start. Outputs are identical either way.

Every emitted token is the target's argmax given the accepted prefix, so the output equals vanilla greedy
decoding (exactly in float32). Stock transformers models of any causal-LM family, no patched code.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch
from transformers import PreTrainedModel

from decoders.common.checks import check_int, check_pool_scope
from decoders.common.forward import forward, new_cache
from decoders.common.jacobi import JacobiWindow
from decoders.common.kv_cache import crop, keep_path
from decoders.common.ngram_pool import NGramPool
from decoders.common.stopping import check_max_new_tokens, truncate_at_stop
from decoders.common.tree import chain_with_branches, lookahead_layout, prepend_chain, tree_attention
from decoders.common.verify import branch_verify, greedy_verify
from decoders.types import DecodeResult, StepRecord



def _clock(device: torch.device) -> float:
    """``time.perf_counter()`` after the device's queued work is done (CUDA is asynchronous)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _max_depth(model: PreTrainedModel, position: int) -> int:
    """How far past ``position`` a tree token may sit without exceeding ``max_position_embeddings``."""
    max_pos = getattr(model.config, "max_position_embeddings", None)
    return max_pos - 1 - position if max_pos else sys.maxsize


def recycle_verification(
    pool: NGramPool,
    key: int,
    suffixes: Sequence[Sequence[int]],
    draft: Sequence[int],
    preds: Sequence[int],
    accepted: int,
    vocab_limit: int | None = None,
) -> None:
    """Feed one target verification back into the phrase pool (ALGORITHMS.md 1.5, item 2).

    * **In-place suffix refinement** (reference ``update_in_place``): each verified suffix ``s`` of full
      length ``N - 1`` is replaced under ``key`` by ``[t after d_g, t after s_1, ..., t after s_{N-2}]`` --
      one Jacobi step of the target applied to the phrase. Done whether or not the draft was accepted, as in
      the reference (a rejected draft only makes the refined phrase's context partly wrong, which affects the
      hit rate, never the output). Runs first, so the rejected-tail insertions cannot evict a phrase being
      refined.
    * **Rejected-tail phrases** (reference ``add_extra_ngram``): for each rejected draft token ``d_i``
      (``i > a``), the phrase keyed by ``d_i`` starts with the target's token after ``d_i`` and is extended with
      the target's token after ``d_{i+1}`` only while ``d_{i+1}`` equals the phrase's previous token (a chain
      the target would produce itself, "correct but misplaced" text); kept once it reaches ``N - 1`` tokens.

    Example:
        ``N = 4``, ``draft = [9, 5, 6, 8, 3]``, target argmax after ``[p, 9, 5, 6, 8, 3]`` =
        ``[9, 2, 6, 8, 3, 1]``, so ``accepted = 1`` (5 is rejected for 2; the target would go on
        ``2 6 8 3 1``). New phrases: ``5 -> (6, 8, 3)`` (the draft's 6 and 8 agree with the target's
        predictions), ``6 -> (8, 3, 1)``; after 8 and after 3 fewer than 3 tokens are available, so nothing
        is kept for them.

    Args:
        pool: the phrase pool (``ngram_size`` N).
        key: the last draft token, under which the suffixes were looked up.
        suffixes: the candidate suffixes verified this step (all the same length); shorter than ``N - 1``
            (cut near ``max_new_tokens``) they are not refined.
        draft: the draft tokens ``d_1 .. d_g``.
        preds: the target's argmax after each fed token, flat: trunk ``[pending, d_1 .. d_g]`` (``g + 1``
            entries) then each suffix's tokens.
        accepted: draft tokens accepted (``a``).
        vocab_limit: phrases with an id ``>= vocab_limit`` (which the draft could not embed) are skipped.
    """
    n_cont, g = pool.ngram_size - 1, len(draft)
    limit = sys.maxsize if vocab_limit is None else vocab_limit
    for b, s in enumerate(suffixes):
        if len(s) != n_cont:
            break
        start = g + 1 + b * n_cont  # flat index of the suffix's first token
        refined = [preds[g], *preds[start : start + n_cont - 1]]
        if max(refined) < limit:
            pool.replace(key, s, refined)
    for i in range(accepted, g):  # draft[i] is d_{i+1}; preds[i + 1] is the target's token after it
        phrase = [preds[i + 1]]
        j = i + 1
        while len(phrase) < n_cont and j < g and draft[j] == preds[j]:
            phrase.append(preds[j + 1])
            j += 1
        if len(phrase) == n_cont and max(phrase) < limit:
            pool.insert(draft[i], phrase)


@dataclass(frozen=True)
class DraftProposal:
    """What :meth:`LookaheadDrafter.propose` returns.

    Attributes:
        tokens: the draft tokens, the draft model's greedy continuation (cut just after an EOS id).
        forwards: draft forwards spent.
        tokens_fed: tokens fed over those forwards (catch-up tokens + window + verified n-grams).
    """

    tokens: list[int]
    forwards: int
    tokens_fed: int


class LookaheadDrafter:
    """Lookahead decoding of a draft model on itself: Ouroboros' phrase-level drafting (ALGORITHMS.md 1.3 A).

    State (per sample): the draft's KV cache, its Jacobi window and ``seq``, the token sequence the draft
    is working on (committed tokens followed by the tokens it drafted). Cache invariant: the cache holds
    ``seq[:L]`` for some ``L < len(seq)``; the missing tail (at least the last token, the *input token*) is
    fed at the front of the next forward as a causal chain, with the lookahead layout hanging off its last
    token (:func:`~decoders.common.tree.prepend_chain`). The phrase pool is shared with the caller.

    One forward (Fu et al. 2024, Algorithm 1, applied to the draft):

    * feeds ``seq[L:]`` + the window + up to ``G`` pool n-grams keyed by the input token, each cut to the
      tokens still wanted;
    * emits the longest n-gram prefix matching the draft's argmax plus the draft's own next token (cut just
      after an EOS id), keeping only those tokens' KV entries;
    * advances the window by one row and harvests its ``W`` n-grams into the pool.

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
        vocab_limit: only ids below this are proposed (the draft's argmax is taken over ``[:vocab_limit]``,
            e.g. what the target can embed); ``None`` = the draft's whole output vocabulary.
        eos_token_ids: ids that end a draft.
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
    ):
        if pool.ngram_size != ngram_size:
            raise ValueError(f"the pool holds {pool.ngram_size}-grams, the window makes {ngram_size}-grams")
        self.model = model
        self.pool = pool
        self.window_size = check_int("window_size (W)", window_size, 1)
        self.ngram_size = check_int("ngram_size (N)", ngram_size, 2)
        self.seed = seed
        self.vocab_limit = vocab_limit or model.get_output_embeddings().out_features
        self.eos_token_ids = frozenset(eos_token_ids)
        self.seq: list[int] = []
        self.cache = new_cache(model)
        self.window: JacobiWindow | None = None
        self._stable = 0  # seq[:_stable] is known to be final (committed by the caller)
        self.pool_hits = 0  # lookahead forwards that verified at least one pool n-gram
        self.prefill_tokens = 0  # tokens of the plain causal prompt prefill (one forward, the first)

    def start(self, prompt: Sequence[int]) -> None:
        """Begin a sample: empty cache, fresh window drawn from ``prompt``, ``seq = prompt``."""
        self.seq = [int(t) for t in prompt]
        self.cache = new_cache(self.model)
        self.window = JacobiWindow(self.window_size, self.ngram_size, self.seq, self.seed)
        self._stable = len(self.seq)

    def sync(self, committed: Sequence[int]) -> None:
        """Adopt ``committed`` (the tokens accepted so far) as ``seq``; drop cache entries it contradicts.

        ``committed`` must extend what earlier calls committed. The cache keeps the longest prefix shared by
        the old ``seq`` and ``committed``, minus at least the last token (fed as the next input token).
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
    def propose(self, max_tokens: int) -> DraftProposal:
        """Draft up to ``max_tokens`` tokens (fewer only at an EOS id) continuing ``seq``; they join ``seq``.

        The first call after :meth:`start` also prefills the cache with the prompt (one more forward).
        """
        drafted: list[int] = []
        forwards = fed = 0
        if max_tokens > 0 and self.cache.get_seq_length() == 0 and len(self.seq) > 1:
            # The prompt goes through one plain causal forward (no O(prompt^2) tree mask); the lookahead
            # forwards then only catch up on the few tokens the target accepted since the last step.
            self.prefill_tokens = len(self.seq) - 1
            forward(self.model, torch.tensor([self.seq[:-1]], device=self.cache_device), self.cache,
                    logits_to_keep=1)
            forwards, fed = 1, self.prefill_tokens
        while len(drafted) < max_tokens and not (drafted and drafted[-1] in self.eos_token_ids):
            emitted, n_fed = self._step(max_tokens - len(drafted))
            drafted += emitted
            forwards += 1
            fed += n_fed
        return DraftProposal(drafted, forwards, fed)

    def _step(self, budget: int) -> tuple[list[int], int]:
        """One lookahead forward of the draft; returns ``(emitted tokens (1..budget), tokens fed)``."""
        assert self.window is not None, "call start() first"
        model, device, window = self.model, self.cache_device, self.window
        past = self.cache.get_seq_length()
        chunk = self.seq[past:]  # tokens the cache lacks; the last one is the input token
        off = len(chunk) - 1  # flat index of the input token
        input_token = chunk[-1]
        max_depth = _max_depth(model, len(self.seq) - 1)
        guess_len = max(0, min(self.ngram_size - 1, budget - 1, max_depth))
        guesses = list(dict.fromkeys(g[:guess_len] for g in self.pool.get(input_token))) if guess_len else []
        use_window = window.depth <= max_depth
        row_lengths = window.row_lengths if use_window else (1,)
        layout = lookahead_layout(row_lengths, len(guesses), guess_len if guesses else 0)
        ids = chunk + (window.tokens() if use_window else []) + [t for g in guesses for t in g]
        last_row = layout.row_starts[-1]
        needed = [off] + [off + i for i in range(last_row, last_row + row_lengths[-1]) if use_window] + [
            off + i for i in range(layout.guess_start, layout.size)
        ]
        parents = prepend_chain(layout.parents, off)
        mask, position_ids = tree_attention(parents, past, dtype=model.dtype, device=device)
        logits = forward(model, torch.tensor([ids], device=device), self.cache, position_ids=position_ids,
                         attention_mask=mask, logits_to_keep=torch.tensor(needed, device=device))
        preds = logits[0, :, : self.vocab_limit].argmax(-1)  # aligned with `needed`

        best = accepted = 0
        bonus = int(preds[0])
        if guesses:
            self.pool_hits += 1
            g_preds = preds[len(needed) - len(guesses) * guess_len :].view(len(guesses), guess_len)
            target = torch.cat([preds[:1].expand(len(guesses), 1), g_preds], dim=1)
            best, accepted, bonus = branch_verify(torch.tensor(guesses, device=device), target)
        emitted = [*guesses[best][:accepted], bonus] if accepted else [bonus]
        for j, t in enumerate(emitted):  # nothing after an EOS id is drafted
            if t in self.eos_token_ids:
                emitted = emitted[: j + 1]
                break
        kept = list(range(past, past + len(chunk))) + [
            past + off + layout.guess_index(best, j) for j in range(len(emitted) - 1)
        ]
        keep_path(self.cache, past, kept)
        self.seq += emitted
        if use_window:
            new_row = preds[1 : 1 + row_lengths[-1]].tolist()
            self.pool.insert_ngrams(window.update(input_token, new_row))
        return emitted, len(ids)

    @property
    def cache_device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device


class OuroborosDecoder:
    """Greedy Ouroboros decoding with a draft model that drafts phrase by phrase.

    Target cache invariant between steps: it holds every committed token except the last (``pending``),
    which heads the next verification trunk ``[pending, d_1 .. d_g]``; suffix leaves follow in flat order.
    The draft's state is a :class:`LookaheadDrafter` (cache, Jacobi window) that lives for one sample; the
    phrase pool is shared by drafter and decoder and lives for a sample or a task (``pool_scope``).

    Per-step statistics (:class:`~decoders.types.StepRecord`): ``drafted`` = draft tokens proposed (suffix
    tokens not included), ``accepted`` = draft tokens accepted, ``draft_forwards`` / ``draft_tokens_fed`` =
    the drafter's forwards and tokens this step (the first step includes the draft's prompt prefill),
    ``target_tokens_fed`` = pending + draft + every suffix token, and
    ``source = {"draft": a, "suffix": b, "bonus": 1}`` (``emitted = a + b + 1`` before truncation).

    Args:
        target_model: the model whose greedy output is reproduced.
        draft_model: a smaller model with the same tokenizer (required).
        gamma: draft tokens per step (>= 1); fewer near ``max_new_tokens`` or after a drafted EOS id.
        window_size: ``W >= 1``, the draft's Jacobi window columns (n-grams harvested per draft forward).
        ngram_size: ``N >= 2``; phrases hold ``N - 1`` tokens, so a step emits up to ``gamma + N`` tokens.
        guess_set_size: ``G >= 0``, phrases kept per key token and verified per draft forward (independent of
            ``W``; the reference code requires ``W == G``). ``G = 0`` keeps no phrases: plain Jacobi drafting.
        topk: ``>= 0`` newest phrases keyed by the last draft token appended as candidate suffixes (at most
            ``G`` exist); 0 disables draft lengthening.
        pool_scope: ``"sample"`` clears the pool at every :meth:`generate` (cold start); ``"task"`` keeps it
            until :meth:`reset` (warm start; speed then depends on sample order, outputs do not).
        seed: seed of the Jacobi window initialisation (tokens drawn from the prompt), reseeded per call.
        pool_from_prompt: also insert the prompt's own n-grams into the phrase pool before decoding (as
            LookaheadDecoding's ``POOL_FROM_PROMPT``; not in the paper): drafts and suffixes can then copy
            prompt text, which prompt lookup decoding shows pays off on code tasks. Off by default.
        eos_token_ids: ids that end generation.

    Raises:
        ValueError: if the draft model is missing, on ``gamma < 1``, ``W < 1``, ``N < 2``, ``G < 0``,
            ``topk < 0``, a negative seed or an unknown ``pool_scope``.
    """

    name = "ouroboros"

    def __init__(
        self,
        target_model: PreTrainedModel,
        draft_model: PreTrainedModel | None,
        gamma: int = 6,
        window_size: int = 4,
        ngram_size: int = 4,
        guess_set_size: int = 4,
        topk: int = 3,
        pool_scope: str = "sample",
        seed: int = 0,
        pool_from_prompt: bool = False,
        eos_token_ids: Iterable[int] = (),
    ):
        if draft_model is None:
            raise ValueError("the ouroboros decoder needs a draft model: choose a model pair with a draft")
        self.target_model = target_model
        self.draft_model = draft_model
        self.gamma = check_int("gamma (draft tokens per step)", gamma, 1)
        self.window_size = check_int("window_size (W)", window_size, 1)
        self.ngram_size = check_int("ngram_size (N)", ngram_size, 2)
        self.guess_set_size = check_int("guess_set_size (G)", guess_set_size, 0)
        self.topk = check_int("topk (candidate suffixes)", topk, 0)
        self.pool_scope = check_pool_scope(pool_scope)
        self.seed = check_int("seed", seed, 0)
        if not isinstance(pool_from_prompt, bool):
            raise ValueError(f"pool_from_prompt must be true or false, got {pool_from_prompt!r}")
        self.pool_from_prompt = pool_from_prompt
        self.eos_token_ids = frozenset(eos_token_ids)
        self.pool = NGramPool(self.ngram_size, self.guess_set_size)
        # Padded embedding sizes may differ (e.g. 151936 vs 152064): the draft proposes only ids the target
        # can embed, and target-made phrases enter the pool only if the draft can embed them.
        self._draft_vocab = min(
            target_model.get_input_embeddings().num_embeddings, draft_model.get_output_embeddings().out_features
        )
        self._draft_embed = draft_model.get_input_embeddings().num_embeddings

    def reset(self) -> None:
        """Empty the phrase pool (start of a task under ``pool_scope="task"``)."""
        self.pool.clear()

    @torch.inference_mode()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int) -> DecodeResult:
        """Decode; same contract as :meth:`decoders.vanilla.VanillaDecoder.generate`.

        Args:
            input_ids: ``torch.LongTensor`` of shape ``(1, prompt_len)`` on the target's device.
            max_new_tokens: upper bound on new tokens, >= 1. A step never emits more than what is left: the
                draft and the suffixes are shortened near the end.

        Returns:
            :class:`DecodeResult`; ``extra`` holds the configuration, pool / suffix statistics and two timers
            (``time.perf_counter``, CUDA synchronized): ``draft_time_s`` = draft rollback, the draft's prompt
            prefill and lookahead forwards, and the suffix lookup; ``verify_time_s`` = every target forward
            (prefill included), acceptance, KV compaction and pool recycling. The rest of the wall time is
            host bookkeeping outside the loop.
        """
        check_max_new_tokens(max_new_tokens)
        if input_ids.shape[0] != 1:
            raise ValueError(f"batch size must be 1, got {input_ids.shape[0]}")
        if self.pool_scope == "sample":
            self.pool.clear()
        target, device = self.target_model, input_ids.device
        seq = input_ids[0].tolist()  # committed tokens: prompt + output
        prompt_len = len(seq)
        if self.pool_from_prompt:
            n = self.ngram_size
            self.pool.insert_ngrams(seq[i : i + n] for i in range(prompt_len - n + 1))
        drafter = LookaheadDrafter(self.draft_model, self.pool, self.window_size, self.ngram_size, self.seed,
                                   self._draft_vocab, self.eos_token_ids)
        drafter.start(seq)
        cache = new_cache(target)
        draft_time = verify_time = 0.0

        t0 = _clock(device)
        logits = forward(target, input_ids, cache, logits_to_keep=1)
        seq.append(int(logits[0, -1].argmax()))
        verify_time += _clock(device) - t0
        steps = [StepRecord(target_tokens_fed=prompt_len, emitted=1, source={"bonus": 1})]
        suffix_steps = suffix_hits = suffix_fed = suffix_accepted = 0

        finished = max_new_tokens == 1 or seq[-1] in self.eos_token_ids
        while not finished:
            past_len = len(seq) - 1  # target cache length; seq[-1] is pending
            remaining = max_new_tokens - (len(seq) - prompt_len)
            max_depth = _max_depth(target, past_len)  # trunk / leaf depths beyond the pending token
            budget = max(0, min(self.gamma, remaining - 1, max_depth))

            # (A) phrase-level drafting, (B) candidate suffixes keyed by the last draft token.
            t0 = _clock(device)
            proposal = DraftProposal([], 0, 0)
            if budget:
                drafter.sync(seq)
                proposal = drafter.propose(budget)
            draft, g = proposal.tokens, len(proposal.tokens)
            key = draft[-1] if draft else seq[-1]
            suffix_len = max(0, min(self.ngram_size - 1, remaining - 1 - g, max_depth - g))
            suffixes: list[tuple[int, ...]] = []
            if suffix_len and self.topk and key not in self.eos_token_ids:
                suffixes = list(dict.fromkeys(s[:suffix_len] for s in self.pool.topk(key, self.topk)))
            t1 = _clock(device)
            draft_time += t1 - t0

            # (C) one target forward over the trunk [pending, draft] and the suffix leaves.
            ids = [seq[-1], *draft] + [t for s in suffixes for t in s]
            if suffixes:
                parents = chain_with_branches(g + 1, [suffix_len] * len(suffixes))
                mask, position_ids = tree_attention(parents, past_len, dtype=target.dtype, device=device)
            else:
                mask = position_ids = None  # a plain causal continuation
            logits = forward(target, torch.tensor([ids], device=device), cache, position_ids=position_ids,
                             attention_mask=mask)
            preds_t = logits[0].argmax(-1)  # (len(ids),): the target's token after each fed token
            a, bonus = greedy_verify(torch.tensor(draft, dtype=torch.long, device=device), preds_t[: g + 1])
            best = b = 0
            if a == g and suffixes:
                leaf = preds_t[g + 1 :].view(len(suffixes), suffix_len)
                rows = torch.cat([preds_t[g : g + 1].expand(len(suffixes), 1), leaf], dim=1)
                best, b, bonus = branch_verify(torch.tensor(suffixes, device=device), rows)
            kept = list(range(past_len, past_len + a + 1)) + [
                past_len + g + 1 + best * suffix_len + j for j in range(b)
            ]
            keep_path(cache, past_len, kept)
            emitted = [*draft[:a], *(suffixes[best][:b] if b else ()), bonus]
            preds = preds_t.tolist()
            recycle_verification(self.pool, key, suffixes, draft, preds, a, self._draft_embed)
            verify_time += _clock(device) - t1

            seq += emitted
            finished = len(seq) - prompt_len >= max_new_tokens or not self.eos_token_ids.isdisjoint(emitted)
            suffix_steps += bool(suffixes)
            suffix_hits += b > 0
            suffix_fed += len(suffixes) * suffix_len
            suffix_accepted += b
            steps.append(StepRecord(
                target_tokens_fed=len(ids), emitted=len(emitted), drafted=g, accepted=a,
                draft_forwards=proposal.forwards, draft_tokens_fed=proposal.tokens_fed,
                source={"draft": a, "suffix": b, "bonus": 1},
            ))

        decode = steps[1:]
        n_decode = len(decode)
        draft_fwd = sum(s.draft_forwards for s in decode)
        lookahead_fwd = draft_fwd - (1 if drafter.prefill_tokens else 0)  # the prompt prefill excluded
        extra = {
            "pool_scope": self.pool_scope,
            "pool_from_prompt": self.pool_from_prompt,
            "gamma": self.gamma,
            "window_size": self.window_size,
            "ngram_size": self.ngram_size,
            "guess_set_size": self.guess_set_size,
            "topk": self.topk,
            "seed": self.seed,
            "draft_time_s": draft_time,
            "verify_time_s": verify_time,
            "draft_forwards_per_target_forward": draft_fwd / n_decode if n_decode else 0.0,
            # per draft lookahead forward, i.e. the draft's prompt prefill forward excluded
            "draft_tokens_per_draft_forward": sum(s.drafted for s in decode) / lookahead_fwd if lookahead_fwd else 0.0,
            "draft_tokens_fed_per_forward": (
                (sum(s.draft_tokens_fed for s in decode) - drafter.prefill_tokens) / lookahead_fwd
                if lookahead_fwd else 0.0
            ),
            "target_tokens_fed_per_forward": sum(s.target_tokens_fed for s in decode) / n_decode if n_decode else 0.0,
            "draft_pool_hit_rate": drafter.pool_hits / lookahead_fwd if lookahead_fwd else 0.0,
            "suffix_offer_rate": suffix_steps / n_decode if n_decode else 0.0,
            "suffix_hit_rate": suffix_hits / suffix_steps if suffix_steps else 0.0,
            "suffix_tokens_fed": suffix_fed,
            "suffix_tokens_accepted": suffix_accepted,
            "pool_entries": len(self.pool),
        }
        return DecodeResult(tuple(truncate_at_stop(seq[prompt_len:], self.eos_token_ids, max_new_tokens)),
                            tuple(steps), extra)
