"""Helpers of the sampling distribution tests (tests/test_sampling*.py); not a test module itself.

What lives here:

* :func:`tiny_model` -- a float32 model with a small vocabulary (8 ids, no tokenizer), so the exact
  distribution of short outputs can be enumerated;
* :func:`exact_sequence_probs` -- that exact distribution: the product of the target's processed conditional
  distributions (:meth:`decoders.common.sampling.SamplingConfig.probs`), by batched enumeration;
* :func:`sample_counts` -- the empirical distribution of a decoder's outputs over many seeds;
* :func:`distribution_pvalue` -- Pearson's chi-square goodness of fit (``scipy.stats.chisquare``) of the whole
  sequences and of each position's marginal, Bonferroni-combined;
* wrong verifiers (:func:`wrong_rejection_verify`, :func:`wrong_multi_candidate_verify`): deliberately broken
  copies of the rules in :mod:`decoders.common.verify`, used only to show that the tests reject them.

False-alarm rate: a test fails when the Bonferroni-combined p-value is below :data:`ALPHA` = 1e-3, so a
correct decoder fails with probability at most 1e-3 per test for a random seed (the chi-square
approximation holds because bins with an expected count below 5 are pooled). The seeds are fixed, so the
outcome is deterministic: a correct decoder passes every time; a changed seed keeps the 1e-3 bound.
"""

from __future__ import annotations

import collections
import copy
from typing import Any, Callable, Iterable, Sequence

import torch
from scipy.stats import chisquare

from decoders.common.sampling import SamplingConfig
from decoders.common.verify import residual_probs
from harness.models import build_tiny_random

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


def sample_counts(generate: Callable[[torch.Generator], Sequence[int]], runs: int, seed: int
                  ) -> collections.Counter:
    """Counts of ``tuple(generate(generator))`` over ``runs`` generators seeded ``seed, seed + 1, ...``."""
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


def distribution_pvalue(counts: dict[tuple[int, ...], int], probs: dict[tuple[int, ...], float]) -> float:
    """Bonferroni-combined p-value of the whole-sequence test and of the marginal test at each position.

    A position's marginal has one extra outcome, ``None``: the sequence ended (EOS) before it.
    """
    length = max(len(s) for s in probs)
    pvalues = [chisquare_pvalue(counts, probs)]
    for pos in range(length):
        m_probs: dict[Any, float] = collections.defaultdict(float)
        m_counts: dict[Any, int] = collections.Counter()
        for s, p in probs.items():
            m_probs[s[pos] if pos < len(s) else None] += p
        for s, c in counts.items():
            m_counts[s[pos] if pos < len(s) else None] += c
        pvalues.append(chisquare_pvalue(m_counts, m_probs))
    return min(1.0, min(pvalues) * len(pvalues))


# ---------------------------------------------------------------------------------------------------------
# Deliberately wrong verifiers (test-only): the distribution tests must reject them.
# ---------------------------------------------------------------------------------------------------------
MISTAKES = ("accept_argmax", "resample_target")


def _draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


def wrong_rejection_verify(mistake: str) -> Callable:
    """A broken :func:`decoders.common.verify.rejection_verify` (same signature).

    ``"accept_argmax"``: a draft token that is the target's most likely token is always accepted (correct only
    when ``draft_probs[x] <= target_probs[x]``). ``"resample_target"``: after a rejection the token is drawn
    from ``target_probs`` instead of the residual ``max(0, target_probs - draft_probs)``.
    """
    assert mistake in MISTAKES

    def verify(draft_tokens, draft_probs, target_probs, generator):
        gamma = draft_tokens.shape[0]
        for i in range(gamma):
            x = int(draft_tokens[i])
            u = float(torch.rand((), generator=generator))
            if mistake == "accept_argmax" and x == int(target_probs[i].argmax()):
                continue
            if u * float(draft_probs[i, x]) < float(target_probs[i, x]):
                continue
            probs = target_probs[i] if mistake == "resample_target" else residual_probs(target_probs[i], draft_probs[i])
            return i, _draw(probs, generator)
        return gamma, _draw(target_probs[gamma], generator)

    return verify


def wrong_multi_candidate_verify(mistake: str) -> Callable:
    """A broken :func:`decoders.common.verify.multi_candidate_verify` for deterministic candidates.

    ``"accept_argmax"``: a candidate that is the target's most likely token at its node is always accepted.
    ``"resample_target"``: a rejected candidate's mass is not removed -- the residual stays ``target_probs``.
    """
    assert mistake in MISTAKES

    def verify(branch_tokens, target_probs, generator, draft_probs=None):
        assert draft_probs is None
        tokens = branch_tokens.tolist()
        alive, depth = list(range(len(tokens))), 0
        while True:
            target = target_probs[alive[0], depth]
            residual = target
            if depth == branch_tokens.shape[1]:
                break
            accepted, tried = None, set()
            for b in alive:
                x = tokens[b][depth]
                if x < 0 or x in tried:
                    continue
                tried.add(x)
                u = float(torch.rand((), generator=generator))
                if (mistake == "accept_argmax" and x == int(target.argmax())) or u < float(residual[x]):
                    accepted = x
                    break
                if mistake != "resample_target":
                    q = torch.zeros_like(residual)
                    q[x] = 1.0
                    residual = residual_probs(residual, q)
            if accepted is None:
                break
            alive = [b for b in alive if tokens[b][depth] == accepted]
            depth += 1
        return alive[0], depth, _draw(residual, generator)

    return verify


TREE_MISTAKES = ("accept_argmax", "resample_target")


def wrong_tree_verify(mistake: str) -> Callable:
    """A broken :func:`decoders.common.verify.multi_candidate_tree_verify` (same signature).

    ``"accept_argmax"``: a child that is the target's most likely token at its node is always accepted.
    ``"resample_target"``: a rejected child's mass is not removed -- the residual stays ``target_probs`` (for a
    sampled child: the token after a rejection is drawn from ``target_probs`` instead of
    ``normalize(max(0, target_probs - draft_probs))``).
    """
    assert mistake in TREE_MISTAKES

    def verify(tokens, parents, target_probs, generator, draft_probs=None):
        children: list[list[int]] = [[] for _ in tokens]
        for k in range(1, len(tokens)):
            children[parents[k]].append(k)
        current = [0]
        while True:
            target = target_probs[current[0]]
            residual = target
            kids = sorted(k for c in current for k in children[c])
            accepted, tried = None, set()
            for k in kids:
                x = int(tokens[k])
                if x < 0 or x in tried:
                    continue
                tried.add(x)
                q = draft_probs.get(k) if draft_probs is not None else None
                p_draft_x = 1.0 if q is None else float(q[x])
                u = float(torch.rand((), generator=generator))
                if (mistake == "accept_argmax" and x == int(target.argmax())) or u * p_draft_x < float(residual[x]):
                    accepted = x
                    break
                if mistake != "resample_target":
                    if q is None:
                        q = torch.zeros_like(residual)
                        q[x] = 1.0
                    residual = residual_probs(residual, q)
            if accepted is None:
                break
            current = [k for k in kids if int(tokens[k]) == accepted]
        path, k = [], current[0]
        while k:
            path.append(k)
            k = parents[k]
        return path[::-1], _draw(residual, generator)

    return verify
