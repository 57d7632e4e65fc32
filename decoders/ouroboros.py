"""Ouroboros: phrase-level drafting by a lookahead-decoding draft model, lengthened drafts, recycled verification.

Zhao, Huang, Han, Xu, Xiao, Zhang, Fang, Zhang, Liu & Sun 2024, "Ouroboros: Generating Longer Drafts Phrase
by Phrase for Faster Speculative Decoding" (arXiv 2402.13720, EMNLP 2024; reference code thunlp/Ouroboros,
restated in ALGORITHMS.md section 1). One target forward per step, greedy or sampled, lossless. Each step is
three pieces, as in the other decoders:

1. **Propose** (:meth:`OuroborosDecoder.propose`): the *trunk* is the draft model's greedy continuation, made
   phrase by phrase by lookahead decoding on the draft itself, ``gamma`` tokens
   (:class:`~decoders.common.lookahead_step.LookaheadDrafter`: the lookahead step shared with
   :class:`decoders.lookahead.LookaheadDecoder`). The newest ``topk`` pool phrases keyed by the last trunk
   token are candidate *suffixes* (lengthened drafts).
2. **Verify** (:meth:`OuroborosDecoder.verify`): one target forward over the pending token, the trunk and the
   suffixes as a token tree (suffixes see the trunk, never each other), then the longest accepted path
   (:func:`~decoders.common.verify.tree_verify`); the target's next token after it is always emitted -- also
   after a fully matched suffix, which the reference code drops.
3. **Accept** (:meth:`OuroborosDecoder.accept`): keep the accepted path's KV entries
   (:func:`~decoders.common.kv_cache.keep_path`) and recycle the target's verification into the phrase pool
   (:func:`recycle_verification`, ALGORITHMS.md 1.5). The draft cache is rolled back lazily, at the next
   proposal, to what the draft and the output still share.

``pool_scope="task"`` keeps the phrase pool across samples until :meth:`reset` (warm start); ``"sample"`` is
cold start. Options for cheaper drafting (each off by default, each changes speed only):

* ``free_draft_min_match``: when the context (prompt + output) already repeats its last
  ``free_draft_min_match`` or more tokens, the trunk is the text that followed (prompt lookup decoding's
  copy, :func:`~decoders.common.ngram_pool.find_prompt_lookup_candidates`) and the draft model does not run.
* ``draft_vocab_size``: the draft's argmax over its most frequent ids only
  (:class:`~decoders.common.heads.ReducedVocabHead`, ranking :func:`~decoders.common.heads.merge_rank_ids`).
* ``stop_confidence``: drafting stops after a draft forward that emitted a token whose draft probability is
  below the threshold. ``branch_confidence``: where a trunk token's draft probability is below it, the draft's
  runner-up token, continued by the newest pool phrase keyed by it, joins the tree as an alternative branch
  (at most ``max_branches`` per step).

Every emitted token is the target's argmax given the accepted prefix, so the output equals vanilla greedy
decoding (exactly in float32). Stock transformers models of any causal-LM family, no patched code.

**Sampling** (temperature > 0), lossless -- the output is distributed exactly as vanilla sampling's:

* the trunk is a SAMPLE of the draft model's own processed distribution: the drafter's lookahead step verifies
  its n-grams against the draft's distribution by the multi-candidate rule (so a draft forward still emits
  several tokens) and reports, for each trunk token, the distribution it was drawn from
  (:attr:`~decoders.common.lookahead_step.DraftProposal.probs`, the draft's processed distribution after the
  preceding tokens);
* the target verifies the tree with :func:`~decoders.common.verify.multi_candidate_tree_verify`: at a trunk
  node the sampled trunk token is tried first, by modified rejection sampling (Leviathan et al. 2023,
  arXiv 2211.17192, Alg. 1; Chen et al. 2023, arXiv 2302.01318): accepted with
  ``min(1, target_probs[x] / draft_probs[x])``, otherwise the residual becomes
  ``normalize(max(0, target_probs - draft_probs))``; the deterministic candidates at that node (a branch's
  alternative token) are then tried against the residual, and after the trunk the pool suffixes are
  deterministic candidates (one-hot) -- SpecInfer's multi-step speculative sampling (Miao et al. 2024,
  arXiv 2305.09781); the token after the accepted path is drawn from the remaining residual, or from the
  target's distribution after a whole accepted path;
* the options stay lossless: a free draft (copied from the context) is a deterministic trunk; the reduced
  draft vocabulary only changes the draft distribution (the trunk is drawn from, and verified with, the
  distribution over those ids); ``stop_confidence`` stops on the drawn tokens' draft probabilities (a stopping
  rule on tokens already drawn); ``branch_confidence`` adds, where the drawn token's draft probability is low,
  the draft's most likely OTHER token as a deterministic sibling tried after the trunk token.

Window updates and the pool's recycling use the models' argmax in both modes (guesses only).
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import torch
from transformers import PreTrainedModel

from decoders.common.checks import check_bool, check_fraction, check_input_ids, check_int, check_pool_scope
from decoders.common.forward import forward, new_cache
from decoders.common.heads import FullHead, ReducedVocabHead, merge_rank_ids
from decoders.common.kv_cache import check_rollback, keep_path
from decoders.common.lookahead_step import DraftProposal, LookaheadDrafter, max_depth_after
from decoders.common.ngram_pool import NGramPool, find_prompt_lookup_candidates
from decoders.common.sampling import GREEDY, SamplingConfig, check_generator
from decoders.common.stopping import check_max_new_tokens, truncate_at_stop
from decoders.common.tree import tree_attention
from decoders.common.verify import multi_candidate_tree_verify, tree_verify
from decoders.types import NULL_STOPWATCH, DecodeResult, StepRecord, Stopwatch

log = logging.getLogger(__name__)

#: Longest context n-gram the free-draft matcher tries (longest match first, as prompt lookup decoding).
FREE_DRAFT_MAX_MATCH = 8


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
class Proposal:
    """The candidates of one step, verified by one target forward (a token tree under the pending token).

    Attributes:
        trunk: ``d_1 .. d_g``: the draft model's greedy continuation (a sample of its distribution when
            sampling), or a copy from the context (``free``).
        free: the trunk was copied from the context; the draft model did not run.
        suffixes: candidate suffixes continuing the trunk (all of one length), newest pool phrases first.
        branches: ``(i, tokens)``: an alternative to ``trunk[i:]`` starting with the draft's runner-up at ``i``.
        draft_forwards: draft forwards spent on this proposal.
        draft_tokens_fed: tokens fed to the draft over them.
        draft_probs: sampling with a model-drafted trunk only: ``torch.FloatTensor`` of shape
            ``(len(trunk), target_vocab)``, the distribution each trunk token was drawn from (``None``: the trunk
            is deterministic -- greedy, or a free copy).
    """

    trunk: list[int]
    free: bool = False
    suffixes: list[tuple[int, ...]] = field(default_factory=list)
    branches: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)
    draft_forwards: int = 0
    draft_tokens_fed: int = 0
    draft_probs: torch.Tensor | None = None

    @property
    def key(self) -> int | None:
        """The suffixes' pool key: the last trunk token (``None`` for an empty trunk: the pending token)."""
        return self.trunk[-1] if self.trunk else None

    def tree(self, pending: int) -> tuple[list[int], list[int]]:
        """Flat tokens and parent array: pending (root), trunk chain, suffix chains, branch chains."""
        g = len(self.trunk)
        ids, parents = [pending, *self.trunk], list(range(-1, g))
        for attach, tokens in [(g, s) for s in self.suffixes] + list(self.branches):
            first = len(ids)
            parents += [attach] + [first + j for j in range(len(tokens) - 1)]
            ids += tokens
        return ids, parents


@dataclass(frozen=True)
class Verdict:
    """The target's verdict on a :class:`Proposal`.

    Attributes:
        emitted: accepted tokens plus the target's next token, cut just after an EOS id and at the budget.
        path: the accepted nodes' flat indices in the tree (root excluded), before the EOS cut.
        preds: the target's argmax after every fed node (flat order).
        counts: accepted tokens kept by origin (``draft`` or ``free``, ``suffix``, ``branch``) and ``bonus``.
        tokens_fed: tokens fed to the target.
    """

    emitted: list[int]
    path: list[int]
    preds: list[int]
    counts: dict[str, int]
    tokens_fed: int


@dataclass
class _Sample:
    """Per-sample state: committed tokens (prompt + output), target cache, drafter, counters."""

    seq: list[int]
    prompt_len: int
    cache: object
    drafter: LookaheadDrafter
    draftable: bool
    stats: dict[str, int] = field(default_factory=dict)

    def add(self, **counts: int) -> None:
        for k, v in counts.items():
            self.stats[k] = self.stats.get(k, 0) + v


class OuroborosDecoder:
    """Ouroboros decoding with a draft model that drafts phrase by phrase: greedy, or lossless sampling.

    Target cache invariant between steps: it holds every committed token except the last (``pending``), the
    root of the next verification tree. The draft's state is a :class:`LookaheadDrafter` (cache, Jacobi
    window) that lives for one sample; the phrase pool is shared by drafter and decoder and lives for a sample
    or a task (``pool_scope``).

    Per-step statistics (:class:`~decoders.types.StepRecord`): ``drafted`` = trunk tokens proposed (suffix and
    branch tokens not included), ``accepted`` = trunk tokens accepted and kept, ``draft_forwards`` /
    ``draft_tokens_fed`` = the drafter's forwards and tokens this step (the first drafting step includes the
    draft's prompt prefill), ``target_tokens_fed`` = pending + trunk + every suffix and branch token, and
    ``source = {"draft": a, "suffix": b, "bonus": 0 or 1}`` (plus ``"free"`` / ``"branch"`` when those options are
    on); ``emitted`` = the tokens kept (cut just after an EOS id), the sum of ``source``.

    Args:
        target_model: the model whose greedy output (or sampling distribution) is reproduced.
        draft_model: a smaller model with the same tokenizer (required).
        gamma: trunk tokens per step (>= 1); fewer near ``max_new_tokens``, after a drafted EOS id or a
            confidence stop.
        window_size: ``W >= 1``, the draft's Jacobi window columns (n-grams harvested per draft forward).
        ngram_size: ``N >= 2``; phrases hold ``N - 1`` tokens, so a step emits up to ``gamma + N`` tokens.
        guess_set_size: ``G >= 0``, phrases kept per key token and verified per draft forward (independent of
            ``W``; the reference code requires ``W == G``). ``G = 0`` keeps no phrases: plain Jacobi drafting.
        topk: ``>= 0`` newest phrases keyed by the last trunk token appended as candidate suffixes (at most
            ``G`` exist); 0 disables draft lengthening.
        pool_scope: ``"sample"`` clears the pool at every :meth:`generate` (cold start); ``"task"`` keeps it
            until :meth:`reset` (warm start; speed then depends on sample order, outputs do not).
        seed: seed of the Jacobi window initialisation (tokens drawn from the prompt), reseeded per call.
        pool_from_prompt: also insert the prompt's own n-grams into the phrase pool before decoding (as
            LookaheadDecoding's ``POOL_FROM_PROMPT``; not in the paper). Off by default.
        free_draft_min_match: ``>= 0``; 0 = off. Otherwise, when the context's last ``n >= free_draft_min_match``
            tokens occurred earlier (longest ``n`` up to :data:`FREE_DRAFT_MAX_MATCH` first, most recent
            occurrence), the trunk is the ``gamma`` tokens that followed, and the draft model does not run.
        draft_vocab_size: ``>= 0``; 0 = off. Otherwise the draft proposes only the ``draft_vocab_size`` lowest
            ids (BPE merge rank, :func:`~decoders.common.heads.merge_rank_ids`) plus the EOS ids, through a
            reduced LM head.
        stop_confidence: in ``[0, 1]``; 0 = off. Drafting stops after a draft forward that emitted a token whose
            draft probability is below it.
        branch_confidence: in ``[0, 1]``; 0 = off. Trunk tokens whose draft probability is below it get an
            alternative branch: the draft's runner-up token plus the newest pool phrase keyed by it.
        max_branches: ``>= 1``, most alternative branches per step (least confident positions first).
        eos_token_ids: ids that end generation.
        sampling: greedy (the default) or the sampling settings of the run, applied to both models (see the
            module docstring for the rules; every option above is lossless under sampling too). When sampling,
            "draft probability" in the two confidence options is the drawn token's probability under the
            draft's processed distribution, and the branch token is the draft's most likely other token.

    Raises:
        ValueError: if the draft model is missing, on an out-of-range setting, or if either model's KV cache
            cannot be rolled back (:func:`~decoders.common.kv_cache.check_rollback`).
    """

    name = "ouroboros"
    supports_sampling = True

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
        free_draft_min_match: int = 0,
        draft_vocab_size: int = 0,
        stop_confidence: float = 0.0,
        branch_confidence: float = 0.0,
        max_branches: int = 1,
        eos_token_ids: Iterable[int] = (),
        sampling: SamplingConfig = GREEDY,
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
        self.pool_from_prompt = check_bool("pool_from_prompt", pool_from_prompt)
        self.free_draft_min_match = check_int("free_draft_min_match (0 = off)", free_draft_min_match, 0)
        self.draft_vocab_size = check_int("draft_vocab_size (0 = off)", draft_vocab_size, 0)
        self.stop_confidence = check_fraction("stop_confidence", stop_confidence)
        self.branch_confidence = check_fraction("branch_confidence", branch_confidence)
        self.max_branches = check_int("max_branches", max_branches, 1)
        check_rollback(target_model, "target model", self.name)
        check_rollback(draft_model, "draft model", self.name)
        self.eos_token_ids = frozenset(eos_token_ids)
        self.sampling = sampling
        self.pool = NGramPool(self.ngram_size, self.guess_set_size)
        # Padded embedding sizes may differ (e.g. 151936 vs 152064): the draft proposes only ids the target can
        # embed, target-made phrases enter the pool only if the draft can embed them, and a context holding an
        # id the draft cannot embed is not drafted from.
        self._target_vocab = target_model.get_output_embeddings().out_features  # columns of the target's logits
        self._draft_vocab = min(
            target_model.get_input_embeddings().num_embeddings, self._target_vocab,
            draft_model.get_output_embeddings().out_features,
        )
        self._draft_embed = draft_model.get_input_embeddings().num_embeddings
        self._draft_head = (
            ReducedVocabHead(draft_model, merge_rank_ids(self.draft_vocab_size, self._draft_vocab, self.eos_token_ids))
            if self.draft_vocab_size else FullHead(draft_model, self._draft_vocab)
        )
        self._confidence = bool(self.stop_confidence or self.branch_confidence)

    def reset(self) -> None:
        """Empty the phrase pool (start of a task under ``pool_scope="task"``)."""
        self.pool.clear()

    # ---------------------------------------------------------------------------------------------------------
    def propose(self, run: _Sample, remaining: int, generator: torch.Generator | None = None) -> Proposal:
        """(1) The trunk (free copy, or the draft model's lookahead drafting), its suffixes and branches.

        Args:
            run: the sample's state; ``run.seq[-1]`` is the pending token.
            remaining: new tokens still allowed; the tree never emits more.
            generator: required when sampling (the draft samples its trunk).
        """
        seq, eos = run.seq, self.eos_token_ids
        max_depth = max_depth_after(self.target_model, len(seq) - 1)  # node depths below the pending token
        budget = max(0, min(self.gamma, remaining - 1, max_depth))
        trunk: list[int] = []
        free = False
        draft = DraftProposal([], 0, 0)
        if budget and self.free_draft_min_match:
            trunk = truncate_at_stop(find_prompt_lookup_candidates(
                seq, max(FREE_DRAFT_MAX_MATCH, self.free_draft_min_match), budget, self.free_draft_min_match), eos, budget)
            free = bool(trunk)
        if budget and not free and run.draftable:
            run.drafter.sync(seq)
            draft = run.drafter.propose(budget, self.stop_confidence, generator)
            trunk = draft.tokens
        g = len(trunk)
        key = trunk[-1] if trunk else seq[-1]
        suffix_len = max(0, min(self.ngram_size - 1, remaining - 1 - g, max_depth - g))
        suffixes: list[tuple[int, ...]] = []
        if suffix_len and self.topk and key not in eos:
            suffixes = list(dict.fromkeys(s[:suffix_len] for s in self.pool.topk(key, self.topk)))
        branches: list[tuple[int, tuple[int, ...]]] = []
        if self.branch_confidence and draft.top_probs:
            unsure = sorted((p, i) for i, p in enumerate(draft.top_probs) if p < self.branch_confidence)
            for _, i in unsure[: self.max_branches]:
                alt = draft.runner_up[i]
                length = min(self.ngram_size, remaining - 1 - i, max_depth - i)
                if alt < 0 or length < 1:
                    continue
                phrase = self.pool.topk(alt, 1)
                tokens = truncate_at_stop([alt, *(phrase[0] if phrase else ())], eos, length)
                branches.append((i, tuple(tokens)))
        return Proposal(trunk, free, suffixes, branches, draft.forwards, draft.tokens_fed,
                        None if free else self._target_width(draft.probs))

    def _target_width(self, probs: torch.Tensor | None) -> torch.Tensor | None:
        """The draft's distributions ``(g, draft_width)`` on the target's ``(g, target_vocab)`` columns (the
        draft proposes only ids below ``_draft_vocab <= target_vocab``, so no mass is cut)."""
        if probs is None or probs.shape[1] == self._target_vocab:
            return probs
        out = probs.new_zeros((probs.shape[0], self._target_vocab))
        m = min(probs.shape[1], self._target_vocab)
        out[:, :m] = probs[:, :m]
        return out

    def verify(self, run: _Sample, proposal: Proposal, remaining: int, generator: torch.Generator | None = None
               ) -> Verdict:
        """(2) One target forward over the tree rooted at the pending token; the accepted path.

        Greedy: the longest path whose tokens are the target's argmax (:func:`~decoders.common.verify.tree_verify`).
        Sampling (``generator`` required): :func:`~decoders.common.verify.multi_candidate_tree_verify` with the
        trunk tokens' draft distributions (rejection sampling at trunk nodes; suffixes, branches and a free trunk
        are deterministic candidates).
        """
        target, device = self.target_model, self.target_model.get_input_embeddings().weight.device
        past_len = len(run.seq) - 1
        ids, parents = proposal.tree(run.seq[-1])
        if proposal.suffixes or proposal.branches:
            mask, position_ids = tree_attention(parents, past_len, dtype=target.dtype, device=device)
        else:
            mask = position_ids = None  # a plain causal continuation
        logits = forward(target, torch.tensor([ids], device=device), run.cache, position_ids=position_ids,
                         attention_mask=mask)
        preds = logits[0].argmax(-1).tolist()  # the target's token after each fed node
        if self.sampling.greedy:
            path, bonus = tree_verify(ids, parents, preds)
        else:  # trunk node k + 1 holds trunk[k], drawn from draft_probs[k] (the trunk is the first child there)
            sampled = (None if proposal.draft_probs is None
                       else {k + 1: proposal.draft_probs[k] for k in range(len(proposal.trunk))})
            path, bonus = multi_candidate_tree_verify(ids, parents, self.sampling.probs(logits[0]), generator,
                                                      sampled)
        emitted = truncate_at_stop([*(ids[k] for k in path), bonus], self.eos_token_ids, remaining)
        g, n_suffix = len(proposal.trunk), len(proposal.suffixes) * (len(proposal.suffixes[0]) if proposal.suffixes else 0)
        kept_nodes = path[: len(emitted)]
        counts = {
            "free" if proposal.free else "draft": sum(k <= g for k in kept_nodes),
            "suffix": sum(g < k <= g + n_suffix for k in kept_nodes),
            "branch": sum(k > g + n_suffix for k in kept_nodes),
            "bonus": len(emitted) - len(kept_nodes),
        }
        return Verdict(emitted, path, preds, counts, len(ids))

    def accept(self, run: _Sample, proposal: Proposal, verdict: Verdict) -> None:
        """(3) Keep the accepted path's KV entries, recycle the verification into the pool, commit the tokens."""
        past_len = len(run.seq) - 1
        keep_path(run.cache, past_len, [past_len + k for k in [0, *verdict.path][: len(verdict.emitted)]])
        g = len(proposal.trunk)
        trunk_accepted = sum(k <= g for k in verdict.path)
        key = proposal.key if proposal.key is not None else run.seq[-1]
        recycle_verification(self.pool, key, proposal.suffixes, proposal.trunk, verdict.preds, trunk_accepted,
                             self._draft_embed)
        run.seq += verdict.emitted
        if run.draftable and max(verdict.emitted) >= self._draft_embed:
            run.draftable = False
            log.warning("the target emitted id %d, which the draft model cannot embed (embedding size %d): no "
                        "more draft-model drafts for this sample", max(verdict.emitted), self._draft_embed)

    # ---------------------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, generator: torch.Generator | None = None,
                 stopwatch: Stopwatch | None = None) -> DecodeResult:
        """Decode; same contract as :meth:`decoders.vanilla.VanillaDecoder.generate`.

        Args:
            input_ids: ``torch.LongTensor`` of shape ``(1, prompt_len)`` on the target's device.
            max_new_tokens: upper bound on new tokens, >= 1. A step never emits more than what is left: the
                trunk, suffixes and branches are shortened near the end.
            generator: the only source of randomness (draft and target draws); required when sampling.
            stopwatch: the runner's timer: ``first_token()`` after the target's prefill; ``lap("draft")`` after
                each proposal (draft rollback, draft prefill and forwards, suffix lookup) and ``lap("verify")``
                after the target's prefill and after each verification + acceptance (target forward, KV
                compaction, pool recycling).

        Returns:
            :class:`DecodeResult`; ``extra`` holds the configuration and pool / suffix / option statistics.
        """
        check_input_ids(input_ids)
        check_max_new_tokens(max_new_tokens)
        check_generator(self.sampling, generator)
        watch = stopwatch or NULL_STOPWATCH
        if self.pool_scope == "sample":
            self.pool.clear()
        prompt = input_ids[0].tolist()
        prompt_len = len(prompt)
        draftable = max(prompt) < self._draft_embed
        if self.pool_from_prompt:
            n = self.ngram_size
            self.pool.insert_ngrams(g for g in (prompt[i : i + n] for i in range(prompt_len - n + 1))
                                    if max(g) < self._draft_embed)
        drafter = LookaheadDrafter(self.draft_model, self.pool, self.window_size, self.ngram_size, self.seed,
                                   eos_token_ids=self.eos_token_ids, head=self._draft_head,
                                   confidence=self._confidence, sampling=self.sampling)
        if draftable:
            drafter.start(prompt)
        run = _Sample(list(prompt), prompt_len, new_cache(self.target_model), drafter, draftable)
        logits = forward(self.target_model, input_ids, run.cache, logits_to_keep=1)
        run.seq.append(self.sampling.next_token(logits[0, -1], generator))
        watch.lap("verify")
        watch.first_token()
        steps = [StepRecord(target_tokens_fed=prompt_len, emitted=1, source={"bonus": 1})]

        finished = max_new_tokens == 1 or run.seq[-1] in self.eos_token_ids
        while not finished:
            remaining = max_new_tokens - (len(run.seq) - prompt_len)
            proposal = self.propose(run, remaining, generator)
            watch.lap("draft")
            verdict = self.verify(run, proposal, remaining, generator)
            self.accept(run, proposal, verdict)
            watch.lap("verify")
            finished = len(run.seq) - prompt_len >= max_new_tokens or not self.eos_token_ids.isdisjoint(verdict.emitted)
            counts = verdict.counts
            a = counts["free" if proposal.free else "draft"]
            run.add(suffix_steps=bool(proposal.suffixes), suffix_hits=counts["suffix"] > 0,
                    suffix_fed=sum(map(len, proposal.suffixes)), suffix_accepted=counts["suffix"],
                    model_drafted=0 if proposal.free else len(proposal.trunk), free_steps=proposal.free,
                    free_drafted=len(proposal.trunk) if proposal.free else 0, branch_fed=sum(len(t) for _, t in proposal.branches),
                    branch_accepted=counts["branch"])
            source = {"draft": 0 if proposal.free else a, "suffix": counts["suffix"], "bonus": counts["bonus"]}
            if self.free_draft_min_match:
                source["free"] = a if proposal.free else 0
            if self.branch_confidence:
                source["branch"] = counts["branch"]
            steps.append(StepRecord(
                target_tokens_fed=verdict.tokens_fed, emitted=len(verdict.emitted), drafted=len(proposal.trunk),
                accepted=a, draft_forwards=proposal.draft_forwards, draft_tokens_fed=proposal.draft_tokens_fed,
                source=source,
            ))
        return DecodeResult(tuple(truncate_at_stop(run.seq[prompt_len:], self.eos_token_ids, max_new_tokens)),
                            tuple(steps), self._extra(run, steps[1:]))

    def _extra(self, run: _Sample, decode: list[StepRecord]) -> dict[str, object]:
        """Configuration and per-sample statistics for the result row."""
        st, n_decode = run.stats, len(decode)
        draft_fwd = sum(s.draft_forwards for s in decode)
        prefill = run.drafter.prefill_tokens
        lookahead_fwd = draft_fwd - (1 if prefill else 0)  # the draft's prompt prefill excluded
        extra: dict[str, object] = {
            "pool_scope": self.pool_scope,
            "pool_from_prompt": self.pool_from_prompt,
            "gamma": self.gamma,
            "window_size": self.window_size,
            "ngram_size": self.ngram_size,
            "guess_set_size": self.guess_set_size,
            "topk": self.topk,
            "seed": self.seed,
            "draft_forwards_per_target_forward": draft_fwd / n_decode if n_decode else 0.0,
            # per draft lookahead forward, i.e. the draft's prompt prefill forward excluded
            "draft_tokens_per_draft_forward": st.get("model_drafted", 0) / lookahead_fwd if lookahead_fwd else 0.0,
            "draft_tokens_fed_per_forward": (
                (sum(s.draft_tokens_fed for s in decode) - prefill) / lookahead_fwd if lookahead_fwd else 0.0
            ),
            "target_tokens_fed_per_forward": sum(s.target_tokens_fed for s in decode) / n_decode if n_decode else 0.0,
            "draft_pool_hit_rate": run.drafter.pool_hits / lookahead_fwd if lookahead_fwd else 0.0,
            "suffix_offer_rate": st.get("suffix_steps", 0) / n_decode if n_decode else 0.0,
            "suffix_hit_rate": st.get("suffix_hits", 0) / st["suffix_steps"] if st.get("suffix_steps") else 0.0,
            "suffix_tokens_fed": st.get("suffix_fed", 0),
            "suffix_tokens_accepted": st.get("suffix_accepted", 0),
            "pool_entries": len(self.pool),
        }
        if self.free_draft_min_match:
            free_acc = sum(s.source.get("free", 0) for s in decode)
            extra.update(free_draft_min_match=self.free_draft_min_match, free_steps=st.get("free_steps", 0),
                         free_tokens_drafted=st.get("free_drafted", 0), free_tokens_accepted=free_acc)
        if self.draft_vocab_size:
            extra["draft_vocab_size"] = self.draft_vocab_size
        if self._confidence:
            extra.update(stop_confidence=self.stop_confidence, branch_confidence=self.branch_confidence,
                         max_branches=self.max_branches, branch_tokens_fed=st.get("branch_fed", 0),
                         branch_tokens_accepted=st.get("branch_accepted", 0))
        return extra
