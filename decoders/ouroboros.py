"""Ouroboros: phrase-level drafting by a lookahead-decoding draft model, lengthened drafts, recycled verification.

Zhao, Huang, Han, Xu, Xiao, Zhang, Fang, Zhang, Liu & Sun 2024, "Ouroboros: Generating Longer Drafts Phrase
by Phrase for Faster Speculative Decoding" (arXiv 2402.13720, EMNLP 2024; reference code thunlp/Ouroboros,
restated in docs/decoders.md, "Ouroboros"). One target forward per step, greedy or sampled, lossless. The
shared decode loop :func:`decoders.common.driver.decode` runs the target (prefill, one verification forward
per step, the verification rule, KV compaction of the accepted path, the stop rule, the per-step statistics);
this module is its proposer (:class:`_PhraseTree`), one per sample:

1. **Propose** (:meth:`_PhraseTree.propose`): the *trunk* is the draft model's greedy continuation, made
   phrase by phrase by lookahead decoding on the draft itself, ``gamma`` tokens
   (:class:`~decoders.common.lookahead_drafter.LookaheadDrafter`: the lookahead step shared with
   :class:`decoders.lookahead.LookaheadDecoder`). The newest ``topk`` pool phrases keyed by the last trunk
   token are candidate *suffixes* (lengthened drafts). Trunk and suffixes form one
   :class:`~decoders.common.driver.DraftTree` (suffixes see the trunk, never each other).
2. **Verify** (the driver): one target forward over the pending token and the tree, then the longest accepted
   path (:func:`~decoders.common.verify.tree_verify`); the target's next token after it is always emitted --
   also after a fully matched suffix, which the reference code drops.
3. **Accept** (:meth:`_PhraseTree.accepted`): recycle the target's verification into the phrase pool
   (:func:`recycle_verification`; docs/decoders.md, "Ouroboros"). The draft cache is rolled back lazily, at the next
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
* ``draft_window``: the draft reads only the prompt's first 4 and last ``draft_window`` tokens
  (:func:`~decoders.common.base.draft_view`; docs/decoders.md, "The draft window"): a shorter draft prefill.

Every emitted token is the target's argmax given the accepted prefix, so the output equals vanilla greedy
decoding (exactly in float32). Stock transformers models of any causal-LM family, no patched code.

**Sampling** (temperature > 0), lossless -- the output is distributed exactly as vanilla sampling's:

* the trunk is a SAMPLE of the draft model's own processed distribution: the drafter's lookahead step verifies
  its n-grams against the draft's distribution by the multi-candidate rule (so a draft forward still emits
  several tokens) and reports, for each trunk token, the distribution it was drawn from
  (:attr:`~decoders.common.lookahead_drafter.DraftProposal.probs`, the draft's processed distribution after the
  preceding tokens);
* the target verifies the tree with :func:`~decoders.common.verify.multi_candidate_tree_verify` (also when it
  is a bare trunk, so :attr:`~decoders.common.driver.DraftTree.rejection_chain` is off): at a trunk
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
from typing import Any, Sequence

import torch

from decoders.common.base import DraftingDecoder, draft_view, windowed
from decoders.common.batch import PerRow
from decoders.common.driver import DraftCounts, DraftTree, Verdict
from decoders.common.forward import max_depth_after
from decoders.common.heads import draft_head
from decoders.common.lookahead_drafter import DraftProposal, LookaheadDrafter
from decoders.common.ngram_pool import NGramPool, SuffixIndex, start_pool
from decoders.common.stopping import truncate_at_stop
from decoders.types import StepRecord
from decoders.settings import OuroborosSettings

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
    """Feed one target verification back into the phrase pool (docs/decoders.md, "Ouroboros").

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

    def draft_tree(self, labels: Sequence[str]) -> DraftTree:
        """The proposal as the driver's tree: the trunk chain (nodes ``0 .. g - 1``, origin ``"draft"``, or
        ``"free"`` for a copied trunk), then each suffix chain under the last trunk node (origin ``"suffix"``;
        under the pending token when the trunk is empty), then each branch chain under the trunk node before the
        token it replaces (origin ``"branch"``). ``StepRecord.accepted`` counts trunk nodes only, ``drafted`` is
        the trunk's length; ``labels`` are the ``source`` keys always reported."""
        g = len(self.trunk)
        tokens, parents = list(self.trunk), list(range(-1, g - 1))
        origins = ["free" if self.free else "draft"] * g
        chains = [(g - 1, s, "suffix") for s in self.suffixes] + [(i - 1, t, "branch") for i, t in self.branches]
        for attach, chain, origin in chains:
            first = len(tokens)
            parents += [attach] + [first + j for j in range(len(chain) - 1)]
            tokens += chain
            origins += [origin] * len(chain)
        stats = {"suffix_steps": bool(self.suffixes), "suffix_fed": sum(map(len, self.suffixes)),
                 "model_drafted": 0 if self.free else g, "free_steps": self.free, "free_drafted": g if self.free else 0,
                 "branch_fed": sum(len(t) for _, t in self.branches)}
        return DraftTree(
            tokens, parents, draft_probs=None if self.draft_probs is None else dict(enumerate(self.draft_probs)),
            rejection_chain=False,
            counts=DraftCounts(origins=origins, labels=labels, counted=frozenset({"draft", "free"}), drafted=g,
                               draft_forwards=self.draft_forwards, draft_tokens_fed=self.draft_tokens_fed,
                               stats=stats))


class OuroborosDecoder(DraftingDecoder, settings=OuroborosSettings, uses_draft=True):
    """Ouroboros decoding with a draft model that drafts phrase by phrase: greedy, or lossless sampling.

    Decoding runs in :func:`decoders.common.driver.decode` with a fresh :class:`_PhraseTree` per sample. The
    draft's state is a :class:`LookaheadDrafter` (cache, Jacobi window) that lives for one sample; the phrase
    pool is shared by drafter and decoder and lives for a sample or a task (``pool_scope``).

    Per-step statistics (:class:`~decoders.types.StepRecord`): ``drafted`` = trunk tokens proposed (suffix and
    branch tokens not included), ``accepted`` = trunk tokens accepted and kept, ``draft_forwards`` /
    ``draft_tokens_fed`` = the drafter's forwards and tokens this step (the first drafting step includes the
    draft's prompt prefill), ``target_tokens_fed`` = pending + trunk + every suffix and branch token, and
    ``source = {"draft": a, "suffix": b, "bonus": 0 or 1}`` (plus ``"free"`` / ``"branch"`` when those options are
    on); ``emitted`` = the tokens kept (cut just after an EOS id), the sum of ``source``.

    Timing (the ``stopwatch`` of :meth:`generate`): ``lap("draft")`` after each proposal (draft rollback, draft
    prefill and forwards, suffix lookup), ``lap("verify")`` after the target's prefill and after each
    verification + acceptance (target forward, KV compaction, pool recycling). ``extra`` holds the configuration
    and pool / suffix / option statistics.

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
        draft_window: ``>= 0``; 0 = off. Otherwise the draft reads only the prompt's first 4 and last
            ``draft_window`` tokens (:func:`~decoders.common.base.draft_view`): a shorter draft prefill on long
            prompts; its Jacobi window is drawn from that view, the phrase pool still from the whole prompt
            (``pool_from_prompt``), and the target verifies every token as without it.
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
    draft_shape = "phrases"
    supports_sampling = True
    supports_batch = True

    def _build(self) -> None:
        self.stop_confidence, self.branch_confidence = float(self.stop_confidence), float(self.branch_confidence)
        self.pool = NGramPool(self.ngram_size, self.guess_set_size)
        # The draft proposes only ids the target can embed (:class:`~decoders.common.base.DraftVocab`),
        # target-made phrases enter the pool only if the draft can embed them, and a context holding an id the
        # draft cannot embed is not drafted from.
        self.draft_head = draft_head(self.draft_model, self.draft_vocab_size, self.vocab.draft, self.eos_token_ids)
        self.confidence = bool(self.stop_confidence or self.branch_confidence)

    def reset(self) -> None:
        """Empty the phrase pool (start of a task under ``pool_scope="task"``)."""
        self.pool.clear()

    def target_width(self, probs: torch.Tensor | None) -> torch.Tensor | None:
        """The draft's distributions ``(g, draft_width)`` on the target's ``(g, target_vocab)`` columns (the
        draft proposes only ids below ``vocab.draft <= vocab.target``, so no mass is cut)."""
        if probs is None or probs.shape[1] == self.vocab.target:
            return probs
        out = probs.new_zeros((probs.shape[0], self.vocab.target))
        m = min(probs.shape[1], self.vocab.target)
        out[:, :m] = probs[:, :m]
        return out

    def proposer(self) -> "_PhraseTree":
        return _PhraseTree(self, self.pool)

    def batch_proposer(self, rows: int) -> PerRow:
        """One proposer per row, its draft model run for that row alone (batch size 1: the draft forwards of a
        step are not batched); under ``pool_scope="sample"`` each row has a phrase pool of its own (every request
        starts cold, as at batch size 1), under ``"task"`` the rows share the task's pool."""
        if self.pool_scope == "task":
            return PerRow(self.proposer, rows)
        return PerRow(lambda: _PhraseTree(self, NGramPool(self.ngram_size, self.guess_set_size)), rows)


class _PhraseTree:
    """The Ouroboros proposer for one sample (:class:`~decoders.common.driver.Proposer`).

    State: the :class:`LookaheadDrafter` on the draft model, whether the context can still be drafted from (it
    holds no id the draft cannot embed), and the last :class:`Proposal` (its trunk and suffixes are recycled
    into the pool once the target has verified them).
    """

    def __init__(self, decoder: OuroborosDecoder, pool: NGramPool):
        d = self.decoder = decoder  # its settings and draft head
        self.pool = pool  # the decoder's (kept across samples under ``pool_scope="task"``), or a batch row's own
        self.drafter = LookaheadDrafter(d.draft_model, pool, d.window_size, d.ngram_size, d.seed,
                                        eos_token_ids=d.eos_token_ids, head=d.draft_head, confidence=d.confidence,
                                        sampling=d.sampling)
        self.draftable = False
        self.offset = 0  # context tokens the draft does not read (its draft_window; draft_view)
        self.copier: SuffixIndex | None = None  # set by start when free drafts are on
        self.proposal = Proposal([])
        self.labels = ("draft", "suffix", *(("free",) if d.free_draft_min_match else ()),
                       *(("branch",) if d.branch_confidence else ()))

    def start(self, prompt: list[int]) -> None:
        """Clear the pool (``pool_scope="sample"``), seed it from the prompt (``pool_from_prompt``), start the
        drafter on the prompt as the draft reads it (``draft_window``)."""
        d = self.decoder
        start_pool(self.pool, prompt, d.pool_scope, d.pool_from_prompt, vocab_limit=d.vocab.embed)
        view, self.offset = draft_view(prompt, d.draft_window)
        self.draftable = d.vocab.can_embed(view)  # what the draft reads
        if self.draftable:
            self.drafter.start(view)
        # free drafts: the context's copy (prompt lookup's match), kept incrementally for this sample
        self.copier = SuffixIndex(max(FREE_DRAFT_MAX_MATCH, d.free_draft_min_match)) if d.free_draft_min_match \
            else None

    def propose(self, context: list[int], remaining: int, generator: torch.Generator | None) -> DraftTree:
        """The trunk (free copy, or the draft model's lookahead drafting), its suffixes and branches.

        Args:
            context: prompt + committed tokens; ``context[-1]`` is the pending token.
            remaining: new tokens still allowed; the tree never emits more.
            generator: required when sampling (the draft samples its trunk).
        """
        d, eos = self.decoder, self.decoder.eos_token_ids
        max_depth = max_depth_after(d.target_model, len(context) - 1)  # node depths below the pending token
        budget = max(0, min(d.gamma, remaining - 1, max_depth))
        trunk: list[int] = []
        free = False
        draft = DraftProposal([], 0, 0)
        if budget and d.free_draft_min_match:
            copied = self.copier.candidates(context, budget, d.free_draft_min_match)
            trunk = truncate_at_stop(copied, eos, budget)
            free = bool(trunk)
        if budget and not free and self.draftable:
            self.drafter.sync(windowed(context, self.offset))  # the context as the draft reads it
            draft = self.drafter.propose(budget, d.stop_confidence, generator)
            trunk = draft.tokens
        g = len(trunk)
        key = trunk[-1] if trunk else context[-1]
        suffix_len = max(0, min(d.ngram_size - 1, remaining - 1 - g, max_depth - g))
        suffixes: list[tuple[int, ...]] = []
        if suffix_len and d.topk and key not in eos:
            suffixes = list(dict.fromkeys(s[:suffix_len] for s in self.pool.topk(key, d.topk)))
        branches: list[tuple[int, tuple[int, ...]]] = []
        if d.branch_confidence and draft.top_probs:
            unsure = sorted((p, i) for i, p in enumerate(draft.top_probs) if p < d.branch_confidence)
            for _, i in unsure[: d.max_branches]:
                alt = draft.runner_up[i]
                length = min(d.ngram_size, remaining - 1 - i, max_depth - i)
                if alt < 0 or length < 1:
                    continue
                phrase = self.pool.topk(alt, 1)
                tokens = truncate_at_stop([alt, *(phrase[0] if phrase else ())], eos, length)
                branches.append((i, tuple(tokens)))
        self.proposal = Proposal(trunk, free, suffixes, branches, draft.forwards, draft.tokens_fed,
                                 None if free else d.target_width(draft.probs))
        return self.proposal.draft_tree(self.labels)

    def accepted(self, context: list[int], tree: DraftTree, verdict: Verdict) -> None:
        """Recycle the verification into the pool; stop drafting after an id the draft cannot embed."""
        d, proposal = self.decoder, self.proposal
        pending = context[-len(verdict.emitted) - 1]
        g = len(proposal.trunk)
        recycle_verification(self.pool, proposal.key if proposal.key is not None else pending, proposal.suffixes,
                             proposal.trunk, verdict.preds, sum(k < g for k in verdict.path), d.vocab.embed)
        if self.draftable and not d.vocab.can_embed(verdict.emitted):
            self.draftable = False
            log.warning("the target emitted id %d, which the draft model cannot embed (embedding size %d): no "
                        "more draft-model drafts for this sample", max(verdict.emitted), d.vocab.embed)

    def extra(self, steps: Sequence[StepRecord], stats: dict[str, float]) -> dict[str, Any]:
        """Configuration and per-sample statistics for the result row."""
        d, n_decode = self.decoder, len(steps)
        suffix_kept = [s.source["suffix"] for s in steps]
        draft_fwd = sum(s.draft_forwards for s in steps)
        prefill = self.drafter.prefill_tokens
        lookahead_fwd = draft_fwd - (1 if prefill else 0)  # the draft's prompt prefill excluded
        extra: dict[str, object] = {
            "pool_scope": d.pool_scope,
            "pool_from_prompt": d.pool_from_prompt,
            "gamma": d.gamma,
            "window_size": d.window_size,
            "ngram_size": d.ngram_size,
            "guess_set_size": d.guess_set_size,
            "topk": d.topk,
            "seed": d.seed,
            "draft_forwards_per_target_forward": draft_fwd / n_decode if n_decode else 0.0,
            # per draft lookahead forward, i.e. the draft's prompt prefill forward excluded
            "draft_tokens_per_draft_forward": stats.get("model_drafted", 0) / lookahead_fwd if lookahead_fwd else 0.0,
            "draft_tokens_fed_per_forward": (
                (sum(s.draft_tokens_fed for s in steps) - prefill) / lookahead_fwd if lookahead_fwd else 0.0
            ),
            "target_tokens_fed_per_forward": sum(s.target_tokens_fed for s in steps) / n_decode if n_decode else 0.0,
            "draft_pool_hit_rate": self.drafter.pool_hits / lookahead_fwd if lookahead_fwd else 0.0,
            "suffix_offer_rate": stats.get("suffix_steps", 0) / n_decode if n_decode else 0.0,
            "suffix_hit_rate": (sum(map(bool, suffix_kept)) / stats["suffix_steps"] if stats.get("suffix_steps")
                                else 0.0),
            "suffix_tokens_fed": stats.get("suffix_fed", 0),
            "suffix_tokens_accepted": sum(suffix_kept),
            "pool_entries": len(self.pool),
            "draft_window_cut": self.offset,
        }
        if d.free_draft_min_match:
            free_acc = sum(s.source.get("free", 0) for s in steps)
            extra.update(free_draft_min_match=d.free_draft_min_match, free_steps=stats.get("free_steps", 0),
                         free_tokens_drafted=stats.get("free_drafted", 0), free_tokens_accepted=free_acc)
        if d.draft_vocab_size:
            extra["draft_vocab_size"] = d.draft_vocab_size
        if d.confidence:
            extra.update(stop_confidence=d.stop_confidence, branch_confidence=d.branch_confidence,
                         max_branches=d.max_branches, branch_tokens_fed=stats.get("branch_fed", 0),
                         branch_tokens_accepted=sum(s.source.get("branch", 0) for s in steps))
        return extra
