"""Helpers of the sampling distribution tests (tests/test_sampling*.py); not a test module itself.

What lives here:

* :func:`tiny_model` -- a float32 model with a small vocabulary (8 ids, no tokenizer), so the exact
  distribution of short outputs can be enumerated;
* :func:`exact_sequence_probs` -- that exact distribution: the product of the target's processed conditional
  distributions (:meth:`decoders.common.sampling.SamplingConfig.probs`), by batched enumeration;
* :func:`sample_counts` -- the empirical distribution of a decoder's outputs over many seeds, from the seeds of
  :func:`seed_base` (each decoder configuration its own);
* :func:`distribution_pvalue` -- Pearson's chi-square goodness of fit (``scipy.stats.chisquare``) of the whole
  sequences, of each position's marginal and of each pair of consecutive positions, Bonferroni-combined;
* wrong rules: deliberately broken copies of the sampling rules in :mod:`decoders.common.verify`, used only to
  show that the tests reject them -- :func:`wrong_tree_verify` (:data:`TREE_MISTAKES`: over-acceptance, no
  residual, one uniform per verification, a residual not renormalised between siblings, an off-by-one bonus
  token) and the right rule handed wrongly recorded draft distributions (:data:`DRAFT_MISTAKES`:
  :func:`draft_probs_recorded_at`, :func:`draft_probs_unwarped` with :class:`LogitsRecordingSampling`), all
  named in :func:`wrong_rule`;
* :func:`swap_verifier` / :func:`swap_rule` -- put a wrong rule wherever the decoders can call it (the verify
  module, and every decoder module or shared driver that imported the function), through pytest's
  ``monkeypatch``; :func:`as_rejection_verify` and :func:`as_multi_candidate_verify` give one tree rule the other
  two entry points' signatures.

False-alarm rate: a test fails when the Bonferroni-combined p-value is below :data:`ALPHA` = 1e-3, so a
correct decoder fails with probability at most 1e-3 per test for a random seed (the chi-square
approximation holds because bins with an expected count below 5 are pooled). The seeds are fixed, so the
outcome is deterministic: a correct decoder passes every time; a changed seed keeps the 1e-3 bound.
"""

from __future__ import annotations

import collections
import copy
import hashlib
import sys
from typing import Any, Callable, Iterable, Sequence

import torch
from scipy.stats import chisquare

from decoders.common.sampling import SamplingConfig
from decoders.common.verify import multi_candidate_tree_verify, residual_probs
from harness.job.models import build_tiny_random

#: Family-wise false-alarm rate of one distribution test (a correct decoder fails this rarely).
ALPHA = 1e-3
#: Smallest expected count of a chi-square bin; rarer outcomes are pooled.
MIN_EXPECTED = 5.0
VOCAB = 8


def tiny_model(seed: int, logit_scale: float, model_type: str = "qwen2"):
    """A 1-layer float32 model with an 8-id vocabulary and a peaked (``logit_scale``) LM head."""
    config = dict(model_type=model_type, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64, vocab_size=VOCAB,
                  logit_scale=logit_scale)
    return build_tiny_random(config, seed=seed, vocab_size=VOCAB)


def greedy_prompt(model: torch.nn.Module, first: int = 1, length: int = 10) -> list[int]:
    """``length`` token ids: ``first``, then ``model``'s own greedy continuation (prompt lookup and the n-gram pool
    then find n-grams the model likes)."""
    ids = [first]
    with torch.inference_mode():
        for _ in range(length - 1):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids


def sharpened(model, factor: float, noise: float, seed: int):
    """A copy of ``model`` whose LM head is multiplied by ``factor`` and perturbed (a draft that is often
    over-confident in the target's likely tokens, so rejections and residual draws actually happen)."""
    draft = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        w = draft.get_output_embeddings().weight
        w.mul_(factor).add_(torch.randn(w.shape, generator=g) * noise * w.std())
    return draft


@torch.inference_mode()
def exact_sequence_probs(model, prompt: Sequence[int], sampling: SamplingConfig, max_new_tokens: int,
                         eos_token_ids: Iterable[int] = ()) -> dict[tuple[int, ...], float]:
    """The exact distribution of the first ``max_new_tokens`` sampled tokens (cut after an EOS id).

    Enumerates every continuation with non-zero probability, one batched forward per depth, as the product of
    the processed conditional distributions: what vanilla sampling draws from.
    """
    eos = set(eos_token_ids)
    finished: dict[tuple[int, ...], float] = {}
    frontier: dict[tuple[int, ...], float] = {(): 1.0}
    for depth in range(max_new_tokens):
        seqs = list(frontier)
        ids = torch.tensor([list(prompt) + list(s) for s in seqs])
        probs = sampling.probs(model(input_ids=ids).logits[:, -1]).double()
        nxt: dict[tuple[int, ...], float] = {}
        for s, row in zip(seqs, probs):
            for token in row.nonzero().flatten().tolist():
                p = frontier[s] * float(row[token])
                seq = s + (token,)
                if token in eos or depth == max_new_tokens - 1:
                    finished[seq] = finished.get(seq, 0.0) + p
                else:
                    nxt[seq] = p
        frontier = nxt
    return finished


#: Seeds of one named configuration's runs are ``seed_base(name) + i`` with ``i < SEED_STRIDE``.
SEED_STRIDE = 100_000


def seed_base(name: str) -> int:
    """The first seed of the runs of the decoder configuration ``name``: a multiple of :data:`SEED_STRIDE` picked
    by a stable hash of the name among 2**32 slots, so two configurations draw from disjoint seed ranges (a
    collision among a hundred names has a chance of about 1e-6)."""
    return SEED_STRIDE * (1 + int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big"))


def sample_counts(generate: Callable[[torch.Generator], Sequence[int]], runs: int, seed: int
                  ) -> collections.Counter:
    """Counts of ``tuple(generate(generator))`` over ``runs`` generators seeded ``seed, seed + 1, ...``."""
    assert runs <= SEED_STRIDE, runs
    return collections.Counter(tuple(generate(torch.Generator().manual_seed(seed + i))) for i in range(runs))


def chisquare_pvalue(counts: dict[Any, int], probs: dict[Any, float]) -> float:
    """p-value of Pearson's chi-square test of ``counts`` against ``probs``; bins whose expected count is
    below :data:`MIN_EXPECTED` are pooled into one. An outcome of probability 0 gives p = 0."""
    n = sum(counts.values())
    if any(k not in probs or probs[k] <= 0 for k in counts):
        return 0.0
    big = [k for k, p in probs.items() if p * n >= MIN_EXPECTED]
    rest = [k for k in probs if k not in set(big)]
    obs = [counts.get(k, 0) for k in big]
    exp = [probs[k] * n for k in big]
    rest_exp = sum(probs[k] for k in rest) * n
    if rest and rest_exp >= MIN_EXPECTED:
        obs.append(sum(counts.get(k, 0) for k in rest))
        exp.append(rest_exp)
    elif rest and exp:  # too little mass to stand alone: fold it into the smallest bin
        i = min(range(len(exp)), key=exp.__getitem__)
        obs[i] += sum(counts.get(k, 0) for k in rest)
        exp[i] += rest_exp
    if len(obs) < 2:
        return 1.0
    total = sum(exp)
    exp = [e * sum(obs) / total for e in exp]  # rounding of the enumerated probabilities
    return float(chisquare(obs, exp).pvalue)


def _marginal_pvalue(counts: dict[tuple[int, ...], int], probs: dict[tuple[int, ...], float],
                     key: Callable[[tuple[int, ...]], Any]) -> float:
    m_probs: dict[Any, float] = collections.defaultdict(float)
    m_counts: dict[Any, int] = collections.Counter()
    for s, p in probs.items():
        m_probs[key(s)] += p
    for s, c in counts.items():
        m_counts[key(s)] += c
    return chisquare_pvalue(m_counts, m_probs)


def distribution_pvalue(counts: dict[tuple[int, ...], int], probs: dict[tuple[int, ...], float]) -> float:
    """Bonferroni-combined p-value of the whole-sequence test, of the marginal test at each position and of the
    joint test of each pair of consecutive positions.

    A position's marginal has one extra outcome, ``None``: the sequence ended (EOS) before it. The pairs catch
    a wrong dependence between neighbouring tokens (e.g. an acceptance test that reuses the previous depth's
    uniform) with far fewer bins than the whole sequences.
    """
    length = max(len(s) for s in probs)

    def at(s: tuple[int, ...], pos: int) -> int | None:
        return s[pos] if pos < len(s) else None

    pvalues = [chisquare_pvalue(counts, probs)]
    pvalues += [_marginal_pvalue(counts, probs, lambda s, i=i: at(s, i)) for i in range(length)]
    pvalues += [_marginal_pvalue(counts, probs, lambda s, i=i: (at(s, i), at(s, i + 1))) for i in range(length - 1)]
    return min(1.0, min(pvalues) * len(pvalues))


# ---------------------------------------------------------------------------------------------------------
# Deliberately wrong verifiers (test-only): the distribution tests must reject them.
# ---------------------------------------------------------------------------------------------------------
#: The mistakes :func:`wrong_tree_verify` can make (its docstring says what each one does).
TREE_MISTAKES = ("accept_argmax", "resample_target", "shared_uniform", "unnormalised_residual", "stale_bonus")


def _draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


def _one_hot(like: torch.Tensor, x: int) -> torch.Tensor:
    q = torch.zeros_like(like)
    q[x] = 1.0
    return q


def wrong_tree_verify(mistake: str) -> Callable:
    """A broken :func:`decoders.common.verify.multi_candidate_tree_verify` (same signature).

    * ``"accept_argmax"``: a child that is the target's most likely token at its node is always accepted.
    * ``"resample_target"``: a rejected child's mass is never removed -- later children are tested against, and
      the next token is drawn from, ``target_probs`` itself.
    * ``"shared_uniform"``: ONE uniform drawn per call and reused for every child tried, at every node (the
      acceptance tests of siblings and of successive depths are then dependent).
    * ``"unnormalised_residual"``: after a rejection the next child is tested against the residual
      ``max(0, residual - draft_probs)`` without renormalising it (it under-accepts later siblings); the next
      token is still drawn from the renormalised residual.
    * ``"stale_bonus"``: after a fully accepted path (the last accepted node has no child to try) the next
      token is drawn from the distribution the last accepted child was tested against -- the target's
      distribution at the last draft position (off by one) -- instead of the target's distribution after it.
    """
    assert mistake in TREE_MISTAKES, mistake

    def verify(tokens, parents, target_probs, generator, draft_probs=None):
        children: list[list[int]] = [[] for _ in tokens]
        for k in range(1, len(tokens)):
            children[parents[k]].append(k)
        shared = float(torch.rand((), generator=generator)) if mistake == "shared_uniform" else None
        row = target_probs if callable(target_probs) else target_probs.__getitem__  # a tensor or a row function
        current, last_tested = [0], None
        while True:
            target = row(current[0])
            residual = tested = target  # draw from `residual`; test the next child against `tested`
            kids = sorted(k for c in current for k in children[c])
            accepted, tried = None, set()
            for k in kids:
                x = int(tokens[k])
                if x < 0 or x in tried:
                    continue
                tried.add(x)
                q = draft_probs.get(k) if draft_probs is not None else None
                p_draft_x = 1.0 if q is None else float(q[x])
                u = shared if shared is not None else float(torch.rand((), generator=generator))
                if (mistake == "accept_argmax" and x == int(target.argmax())) or u * p_draft_x < float(tested[x]):
                    accepted = x
                    break
                if mistake == "resample_target":
                    continue
                q = _one_hot(residual, x) if q is None else q
                if mistake == "unnormalised_residual":
                    tested = (tested - q).clamp(min=0)
                    residual = residual_probs(residual, q)
                else:
                    residual = tested = residual_probs(residual, q)
            if accepted is None:
                break
            last_tested = tested
            current = [k for k in kids if int(tokens[k]) == accepted]
        if mistake == "stale_bonus" and not tried and last_tested is not None:
            residual = last_tested
        path, k = [], current[0]
        while k:
            path.append(k)
            k = parents[k]
        return path[::-1], _draw(residual, generator)

    return verify


def draft_probs_recorded_at(temperature: float, sampled_at: float) -> Callable:
    """The right rule (:func:`decoders.common.verify.multi_candidate_tree_verify`) given the wrong draft
    distributions: each sampled token's ``draft_probs`` as if recorded at ``temperature`` while the token was
    drawn at ``sampled_at`` -- ``normalize(draft_probs ** (sampled_at / temperature))`` over the same top-k /
    top-p support, a drafter that records ``softmax(logits / temperature)`` but samples from the warped logits.
    One-hot rows (deterministic candidates) are unchanged."""
    power = sampled_at / temperature

    def recorded(q: torch.Tensor) -> torch.Tensor:
        r = q.double().pow(power)
        return (r / r.sum()).to(q.dtype)

    def verify(tokens, parents, target_probs, generator, draft_probs=None):
        wrong = None if draft_probs is None else {k: recorded(q) for k, q in draft_probs.items()}
        return multi_candidate_tree_verify(tokens, parents, target_probs, generator, wrong)

    return verify


#: Mistakes in the draft distributions handed to the (right) rule; they need a sampled draft.
DRAFT_MISTAKES = ("draft_temperature", "draft_unwarped")


def wrong_rule(mistake: str, sampling: SamplingConfig) -> Callable:
    """The wrong tree rule called ``mistake``: one of :data:`TREE_MISTAKES` (:func:`wrong_tree_verify`),
    ``"draft_temperature"`` (draft distributions recorded at temperature 1 while drawn at
    ``sampling.temperature``: :func:`draft_probs_recorded_at`) or ``"draft_unwarped"`` (recorded without any
    warper: :func:`draft_probs_unwarped`; ``sampling`` must then be the decoder's
    :class:`LogitsRecordingSampling`)."""
    if mistake == "draft_temperature":
        return draft_probs_recorded_at(1.0, sampling.temperature)
    if mistake == "draft_unwarped":
        assert isinstance(sampling, LogitsRecordingSampling), "the decoder must sample with LogitsRecordingSampling"
        return draft_probs_unwarped(sampling)
    return wrong_tree_verify(mistake)


def as_rejection_verify(rule: Callable) -> Callable:
    """``rule`` (a tree rule, signature of :func:`~decoders.common.verify.multi_candidate_tree_verify`) with the
    signature of :func:`~decoders.common.verify.rejection_verify`: the linear draft as a chain."""

    def verify(draft_tokens, draft_probs, target_probs, generator):
        gamma = draft_tokens.shape[0]
        tokens = [-1, *draft_tokens.tolist()]
        path, next_token = rule(tokens, list(range(-1, gamma)), target_probs, generator,
                                {k + 1: draft_probs[k] for k in range(gamma)})
        return len(path), next_token

    return verify


def as_multi_candidate_verify(rule: Callable) -> Callable:
    """``rule`` with the signature of :func:`~decoders.common.verify.multi_candidate_verify` (branches as a
    prefix tree, numbered as that function numbers them)."""

    def verify(branch_tokens, target_probs, generator, draft_probs=None):
        num_branches, branch_len = branch_tokens.shape
        vocab = target_probs.shape[-1]
        tokens = [-1] + branch_tokens.reshape(-1).tolist()
        parents = [-1] + [0 if j == 0 else b * branch_len + j for b in range(num_branches) for j in range(branch_len)]
        node_probs = (target_probs[0] if num_branches == 1
                      else torch.cat([target_probs[0, :1], target_probs[:, 1:].reshape(-1, vocab)]))
        node_draft = (None if draft_probs is None else {1 + b * branch_len + j: draft_probs[b, j]
                                                        for b in range(num_branches) for j in range(branch_len)})
        path, next_token = rule(tokens, parents, node_probs, generator, node_draft)
        return ((path[-1] - 1) // branch_len if path else 0), len(path), next_token

    return verify


def swap_verifier(monkeypatch, name: str, wrong: Callable) -> list[str]:
    """Replace the verification function ``name`` by ``wrong`` wherever the decoders can reach it (undone by
    ``monkeypatch`` at the end of the test).

    Patched: :mod:`decoders.common.verify` itself and every already-imported module under ``decoders.`` that
    has an attribute ``name`` (a ``from decoders.common.verify import name`` copy: a decoder, the lookahead
    step, a shared decoding driver). Returns the patched modules' names.
    """
    import decoders.common.verify as verify_module

    if not callable(getattr(verify_module, name, None)):
        raise AttributeError(f"decoders.common.verify has no verification function {name!r}")
    patched = []
    for module_name, module in sorted(sys.modules.items()):
        if module is not None and module_name.startswith("decoders.") and hasattr(module, name):
            monkeypatch.setattr(module, name, wrong)
            patched.append(module_name)
    return patched


def swap_rule(monkeypatch, rule: Callable) -> list[str]:
    """Swap the tree rule ``rule`` in for every sampling verification entry point of
    :mod:`decoders.common.verify` (``multi_candidate_tree_verify``, and ``multi_candidate_verify`` and
    ``rejection_verify`` through the adapters), so a decoder runs it whichever of them it calls. Returns the
    patched modules' names."""
    adapted = {"multi_candidate_tree_verify": rule, "multi_candidate_verify": as_multi_candidate_verify(rule),
               "rejection_verify": as_rejection_verify(rule)}
    return sorted({m for name, fn in adapted.items() for m in swap_verifier(monkeypatch, name, fn)})


class LogitsRecordingSampling(SamplingConfig):
    """A :class:`~decoders.common.sampling.SamplingConfig` that remembers the raw logits behind every processed
    distribution it returns (keyed by the distribution's bytes), so :func:`draft_probs_unwarped` can recompute
    a drafter's distribution the way a drafter that forgets the warpers would record it."""

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "raw_logits", {})

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        probs = super().probs(logits)
        vocab = logits.shape[-1]
        for row, raw in zip(probs.reshape(-1, vocab), logits.reshape(-1, vocab)):
            self.raw_logits[row.cpu().numpy().tobytes()] = raw.float().cpu()
        return probs


def draft_probs_unwarped(sampling: LogitsRecordingSampling) -> Callable:
    """The right rule given the wrong draft distributions: each sampled token's ``draft_probs`` replaced by
    ``softmax(logits)`` of the logits it came from (temperature 1, no top-k / top-p) while the token was drawn
    from the warped distribution -- a drafter that records the raw softmax. ``sampling`` must be the decoder's
    (it found the logits). One-hot rows (deterministic candidates) are unchanged."""

    def recorded(q: torch.Tensor) -> torch.Tensor:
        raw = sampling.raw_logits.get(q.float().cpu().numpy().tobytes())
        if raw is not None:
            return raw.softmax(-1).to(q.device, q.dtype)
        if int((q > 0).sum()) == 1:
            return q  # a deterministic candidate
        raise KeyError("a draft distribution this LogitsRecordingSampling did not produce (padded or "
                       "reduced-vocabulary rows are not supported)")

    def verify(tokens, parents, target_probs, generator, draft_probs=None):
        wrong = None if draft_probs is None else {k: recorded(q) for k, q in draft_probs.items()}
        return multi_candidate_tree_verify(tokens, parents, target_probs, generator, wrong)

    return verify
