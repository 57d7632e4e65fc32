"""The one decode loop every drafting decoder shares, and the :class:`Proposer` protocol it drives.

A drafting decoder is a *proposer* (where candidate tokens come from: a draft model, the context, an n-gram
pool, a Jacobi window) plus this driver (everything else): input checks, the target's prefill and first
token, one target forward per step over the proposed :class:`DraftTree`, the verification rule, KV
compaction of the accepted path, the stop rule (``max_new_tokens``, just after an EOS id), the per-step
:class:`~decoders.types.StepRecord` and the stopwatch laps. The split follows transformers'
``CandidateGenerator`` (``get_candidates`` / ``update_candidate_strategy``) and vLLM's proposer / scorer:
proposers never run the target's verification forward and never decide what is accepted.

Verification is the rules of :mod:`decoders.common.verify`, chosen by the tree's shape:

* greedy: :func:`~decoders.common.verify.tree_verify` (on a chain: the longest prefix matching the target's
  argmax, then the target's own next token);
* sampling, a chain whose every node was sampled by a draft model: modified rejection sampling
  (:func:`~decoders.common.verify.rejection_verify`, Leviathan et al. 2023, Algorithm 1), unless the proposer
  turns :attr:`DraftTree.rejection_chain` off;
* sampling, anything else (deterministic candidates, trees, a sampled trunk with deterministic branches):
  multi-candidate speculative sampling (:func:`~decoders.common.verify.multi_candidate_tree_verify`, SpecInfer).

Target cache invariant between steps: the target's KV cache holds every committed token except the last one
(the *pending* token), which is the root of the next step's tree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import torch
from transformers import PreTrainedModel

from decoders.common import verify
from decoders.common.checks import check_input_ids
from decoders.common.forward import forward, new_cache
from decoders.common.kv_cache import keep_path
from decoders.common.sampling import SamplingConfig, argmax_ids, check_generator
from decoders.common.stopping import check_max_new_tokens, truncate_at_stop
from decoders.common.tree import tree_attention
from decoders.types import NULL_STOPWATCH, DecodeResult, StepRecord, Stopwatch


@dataclass(frozen=True)
class DraftCounts:
    """How the driver counts one step's proposal in its :class:`~decoders.types.StepRecord` (what to count; the
    proposal itself is the :class:`DraftTree` that carries it).

    Attributes:
        origins: ``n`` labels (``"draft"``, ``"suffix"``, ...) under which accepted nodes are counted in
            :attr:`StepRecord.source`; ``None``: every node is ``default_origin``.
        default_origin: the label when ``origins`` is ``None``.
        labels: labels always present in ``source`` (0 when nothing of that origin was kept).
        counted: origins whose kept nodes make :attr:`StepRecord.accepted`; ``None``: all of them.
        drafted: :attr:`StepRecord.drafted` of the step; ``None``: the number of candidate nodes.
        draft_forwards: draft-model forwards spent on this proposal.
        draft_tokens_fed: tokens fed to the draft model over them.
        stats: proposer-specific counters of this step, summed over a sample by the driver and handed to
            :meth:`Proposer.extra`.
    """

    origins: Sequence[str] | None = None
    default_origin: str = "draft"
    labels: Sequence[str] = ()
    counted: frozenset[str] | None = None
    drafted: int | None = None
    draft_forwards: int = 0
    draft_tokens_fed: int = 0
    stats: dict[str, float] = field(default_factory=dict)

    def origin(self, node: int) -> str:
        return self.origins[node] if self.origins is not None else self.default_origin


@dataclass(frozen=True)
class DraftTree:
    """What a proposer offers for one step (what to verify, and how): ``n`` nodes fed after the pending token in
    one target forward, with their :class:`DraftCounts`.

    Node ``i`` holds ``tokens[i]`` and hangs under ``parents[i]`` (``-1``: directly under the pending token, the
    root; otherwise an earlier node). A linear draft is the chain ``parents = [-1, 0, 1, ...]``.

    Attributes:
        tokens: ``n >= 0`` token ids.
        parents: ``n`` parent indices.
        draft_probs: sampling only: ``{node: torch.FloatTensor (target_vocab,)}``, the distribution a node's
            token was drawn from (a sampled draft); nodes absent are deterministic candidates. A sampled node
            must be the first child of its parent (it is tried first).
        verified: ``n`` flags; ``False`` marks a node fed for the proposer's own use (Lookahead's Jacobi
            window) that is never accepted. ``None``: every node is a candidate.
        logits_for: with ``verified``: the unverified nodes whose target logits the proposer reads (the LM head
            runs only for them, the root and the verified nodes and their parents; the other rows of
            :attr:`Verdict.logits` are zeros). ``None``: every row is computed.
        rejection_chain: sampling only: a chain whose every node is sampled is verified by
            :func:`~decoders.common.verify.rejection_verify`; ``False`` verifies it by
            :func:`~decoders.common.verify.multi_candidate_tree_verify` like any other tree (the same output
            distribution, other random draws: for a proposer whose trees are a bare chain only sometimes).
        counts: how the step is counted (:class:`DraftCounts`).
    """

    tokens: Sequence[int] = ()
    parents: Sequence[int] = ()
    draft_probs: dict[int, torch.Tensor] | None = None
    verified: Sequence[bool] | None = None
    logits_for: Sequence[int] | None = None
    rejection_chain: bool = True
    counts: DraftCounts = field(default_factory=DraftCounts)

    @staticmethod
    def chain(tokens: Sequence[int], **kwargs: Any) -> "DraftTree":
        """A linear draft: each token under the previous one."""
        return DraftTree(tokens=list(tokens), parents=list(range(-1, len(tokens) - 1)), **kwargs)

    @property
    def size(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def logit_rows(self) -> list[int] | None:
        """Rows of the verification forward (0 = the root, ``1 + i`` = node ``i``) whose logits are needed, or
        ``None`` for all of them (see :attr:`logits_for`)."""
        if self.verified is None or self.logits_for is None:
            return None
        rows = {0, *(1 + i for i in self.logits_for)}
        for i, ok in enumerate(self.verified):
            if ok:
                rows.update((1 + i, 1 + self.parents[i]))  # a root parent (-1) maps to row 0
        return None if len(rows) == 1 + self.size else sorted(rows)


@dataclass(frozen=True)
class Verdict:
    """The target's verdict on one :class:`DraftTree`.

    Attributes:
        path: accepted nodes (indices into the tree's ``tokens``), root to leaf, before the stop cut.
        emitted: the tokens committed this step: the accepted tokens then the target's next token, cut just
            after an EOS id and at the token budget (``1 <= len(emitted)``).
        kept: accepted nodes among ``emitted`` (``len(emitted) - kept`` is 0 or 1, the bonus token).
        logits: the target's logits after the root and after every node, ``torch.Tensor`` of shape
            ``(1 + n, vocab_size)`` in the model's dtype (row 0: after the pending token).
        preds: the target's argmax after the root and every node (``1 + n`` ids); computed on first use.
    """

    path: list[int]
    emitted: list[int]
    kept: int
    logits: torch.Tensor
    _preds: list[int] | None = field(default=None, repr=False)

    @property
    def preds(self) -> list[int]:
        if self._preds is None:
            object.__setattr__(self, "_preds", argmax_ids(self.logits).tolist())
        return self._preds  # type: ignore[return-value]


class Proposer(Protocol):
    """Where candidates come from, for one sample (a fresh proposer per :func:`decode` call).

    ``context`` is always the prompt plus every committed token; ``context[-1]`` is the pending token, the root
    of the tree under which candidates hang. A proposer must not propose more than ``remaining - 1`` nodes along
    any path (one token is always the target's own) nor past the model's position limit.
    """

    def start(self, prompt: list[int]) -> None:
        """Called once before the target's prefill (a draft model may prefill here or at its first step)."""

    def propose(self, context: list[int], remaining: int, generator: torch.Generator | None) -> DraftTree:
        """The candidates of the next step; ``remaining >= 1`` new tokens are still allowed (with 1, only the
        target's own token fits: propose nothing)."""

    def accepted(self, context: list[int], tree: DraftTree, verdict: Verdict) -> None:
        """Told what the target accepted; ``context`` already ends with ``verdict.emitted`` (update pools, the
        draft's KV cache, a Jacobi window)."""

    def extra(self, steps: Sequence[StepRecord], stats: dict[str, float]) -> dict[str, Any]:
        """Decoder-specific scalars for the result row (configuration, pool statistics), given the decode
        steps (prefill excluded) and the summed :attr:`DraftCounts.stats`."""


def verify_tree(tree: DraftTree, logits: torch.Tensor, pending: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> tuple[list[int], int, list[int] | None]:
    """Apply the verification rule to a tree whose target logits are known.

    Args:
        tree: the proposal.
        logits: ``torch.Tensor`` of shape ``(1 + n, vocab_size)``, the target's logits after the pending token
            and after each node.
        pending: the pending token (the root).
        sampling: greedy or the run's sampling settings.
        generator: required when sampling.

    Returns:
        ``(path, next_token, preds)``: accepted node indices (into ``tree.tokens``), the token emitted after them,
        and the target's argmax after the root and every node when the rule computed it (greedy; else ``None``).
    """
    n = tree.size
    verified = tree.verified
    cand = list(tree.tokens) if verified is None else [t if ok else -1 for t, ok in zip(tree.tokens, verified)]
    if not sampling.greedy and tree.rejection_chain and tree.draft_probs and len(tree.draft_probs) == n \
            and tree.is_chain:
        # A chain sampled by a draft model: modified rejection sampling.
        draft_probs = torch.stack([tree.draft_probs[i] for i in range(n)])
        accepted, token = verify.rejection_verify(torch.tensor(cand, device=logits.device), draft_probs,
                                                  sampling.probs(logits), generator)
        return list(range(accepted)), token, None
    ids = [pending, *cand]
    parents = [-1, *(p + 1 for p in tree.parents)]
    preds = None
    if sampling.greedy:
        preds = argmax_ids(logits).tolist()
        path, token = verify.tree_verify(ids, parents, preds)
    else:
        sampled = None if not tree.draft_probs else {k + 1: q for k, q in tree.draft_probs.items()}
        # The processed distribution of a row only where the rule reads one (the accepted path), not of all 1 + n
        path, token = verify.multi_candidate_tree_verify(ids, parents, lambda i: sampling.probs(logits[i]),
                                                         generator, sampled)
    return [k - 1 for k in path], token, preds


@torch.inference_mode()
def decode(
    target_model: PreTrainedModel,
    proposer: Proposer,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    *,
    eos_token_ids: frozenset[int],
    sampling: SamplingConfig,
    generator: torch.Generator | None = None,
    stopwatch: Stopwatch | None = None,
) -> DecodeResult:
    """Decode one prompt with ``proposer``'s candidates, verified by ``target_model``; lossless.

    Args:
        target_model: the model whose greedy output (or sampling distribution) is reproduced.
        proposer: a fresh :class:`Proposer` for this prompt.
        input_ids: ``torch.LongTensor`` of shape ``(1, prompt_len >= 1)`` on the target's device.
        max_new_tokens: upper bound on new tokens, >= 1.
        eos_token_ids: ids that end generation (kept, nothing after them).
        sampling: greedy or the run's sampling settings.
        generator: the only source of randomness; required when sampling.
        stopwatch: the runner's timer: ``first_token()`` after the target's prefill; ``lap("verify")`` after the
            prefill and after each verification (target forward, rule, KV compaction, proposer update, step
            record); ``lap("draft")`` after each proposal; ``mark(phase)`` after each host phase of a step
            (:data:`harness.job.overhead.PHASES`; for the host-overhead profiler).

    Returns:
        :class:`~decoders.types.DecodeResult` with one :class:`~decoders.types.StepRecord` per target forward
        and ``extra`` from :meth:`Proposer.extra`.

    Raises:
        ValueError: if the batch size is not 1, the prompt is empty, ``max_new_tokens < 1``, sampling without a
            generator, or a proposal with a bad parent array.
    """
    check_input_ids(input_ids)
    check_max_new_tokens(max_new_tokens)
    check_generator(sampling, generator)
    watch = stopwatch or NULL_STOPWATCH
    device, dtype = input_ids.device, target_model.dtype  # dtype read once: transformers walks the parameters
    prompt = input_ids[0].tolist()
    prompt_len = len(prompt)
    proposer.start(prompt)
    cache = new_cache(target_model)
    logits = forward(target_model, input_ids, cache, logits_to_keep=1)
    context = [*prompt, sampling.next_token(logits[0, -1], generator)]
    watch.lap("verify")
    watch.first_token()
    steps = [StepRecord(target_tokens_fed=prompt_len, emitted=1, source={"bonus": 1})]
    stats: dict[str, float] = {}

    finished = max_new_tokens == 1 or context[-1] in eos_token_ids
    while not finished:
        remaining = max_new_tokens - (len(context) - prompt_len)
        tree = proposer.propose(context, remaining, generator)
        watch.mark("propose")
        watch.lap("draft")
        past_len = len(context) - 1
        ids = torch.tensor([[context[-1], *tree.tokens]], device=device)
        if tree.is_chain:
            mask = position_ids = None  # a plain causal continuation
        else:
            mask, position_ids = tree_attention([-1, *(p + 1 for p in tree.parents)], past_len,
                                                dtype=dtype, device=device)
        rows = tree.logit_rows()
        watch.mark("inputs")
        if rows is None:
            logits = forward(target_model, ids, cache, position_ids=position_ids, attention_mask=mask)[0]
        else:  # the LM head only where logits are read
            kept = forward(target_model, ids, cache, position_ids=position_ids, attention_mask=mask,
                           logits_to_keep=torch.tensor(rows, device=device))[0]
            logits = kept.new_zeros((1 + tree.size, kept.shape[-1]))
            logits[rows] = kept
        watch.mark("forward")
        path, token, preds = verify_tree(tree, logits, context[-1], sampling, generator)
        emitted = truncate_at_stop([*(tree.tokens[k] for k in path), token], eos_token_ids, remaining)
        kept = min(len(path), len(emitted))
        watch.mark("rule")
        keep_path(cache, past_len, [past_len, *(past_len + 1 + k for k in path[:kept])][: len(emitted)])
        watch.mark("cache")
        context.extend(emitted)
        verdict = Verdict(path, emitted, kept, logits, preds)  # preds: the rule's argmax, not computed twice
        proposer.accepted(context, tree, verdict)
        watch.mark("update")
        finished = len(context) - prompt_len >= max_new_tokens or not eos_token_ids.isdisjoint(emitted)
        steps.append(step_record(tree, verdict))
        for key, value in tree.counts.stats.items():
            stats[key] = stats.get(key, 0) + value
        watch.mark("bookkeeping")
        watch.lap("verify")

    output = truncate_at_stop(context[prompt_len:], eos_token_ids, max_new_tokens)
    return DecodeResult(tuple(output), tuple(steps), proposer.extra(steps[1:], stats))


def step_record(tree: DraftTree, verdict: Verdict) -> StepRecord:
    """The :class:`StepRecord` of one verification step: kept nodes counted by origin, then the bonus token."""
    counts = tree.counts
    source = dict.fromkeys(counts.labels, 0)
    for k in verdict.path[: verdict.kept]:
        label = counts.origin(k)
        source[label] = source.get(label, 0) + 1
    accepted = sum(v for k, v in source.items() if counts.counted is None or k in counts.counted)
    source["bonus"] = len(verdict.emitted) - verdict.kept
    drafted = counts.drafted if counts.drafted is not None else (
        tree.size if tree.verified is None else sum(map(bool, tree.verified)))
    return StepRecord(target_tokens_fed=1 + tree.size, emitted=len(verdict.emitted), drafted=drafted,
                      accepted=accepted, draft_forwards=counts.draft_forwards,
                      draft_tokens_fed=counts.draft_tokens_fed, source=source)
