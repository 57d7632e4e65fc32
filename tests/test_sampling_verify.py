"""The sampling verification rules keep the target distribution (decoders/common/verify.py).

Synthetic conditional tables stand in for the models: ``T1`` (first token), ``T2[x1]`` (second token), ``T3[x1,
x2]`` (third token) for the target and ``D1``, ``D2[x1]`` for the draft, over 5 ids. Each run draws a draft (or
takes fixed candidates), verifies it with the rule, and -- when fewer than three tokens were emitted -- continues
with plain draws from the target, so the first three emitted tokens must follow ``T1(a) T2[a](b) T3[a, b](c)``
exactly. The drafts and candidate branches hold two tokens, so the third token is the bonus token after a fully
accepted draft. A chi-square test (:mod:`sampling_stats`: whole sequences, each position, each pair of
neighbours, Bonferroni-combined; false-alarm rate 1e-3 per test, fixed seeds) compares them, and the same test
must reject every deliberately wrong rule of :mod:`sampling_stats` (:data:`sampling_stats.TREE_MISTAKES` and a
draft distribution recorded at another temperature), swapped in through the adapters the decoder tests use.

Measured p-values with these seeds (``RUNS`` = 2000 runs each): the right rules 0.07 .. 1 (also through the
adapters that give the tree rule the linear and branch signatures). Wrong rules, linear draft / candidate
branches / Ouroboros-shaped tree: ``accept_argmax`` 0 / 3e-136 / 0; ``resample_target`` 2e-95 / 6e-123 / 9e-80;
``shared_uniform`` 2e-21 / 0 / 8e-239; ``unnormalised_residual`` (siblings only) 9e-262 / 2e-110;
``stale_bonus`` 3e-216 / 0 / 7e-223 (every table has full support, so this is the bonus token's distribution,
not its support); ``draft_temperature`` 9e-40 (linear) / 2e-42 (tree).
"""

from __future__ import annotations

import collections
import sys

import pytest
import torch

import decoders.common.verify
from decoders.common.sampling import SamplingConfig
from decoders.common.verify import (multi_candidate_tree_verify, multi_candidate_verify, rejection_verify,
                                    residual_probs)
from sampling_stats import (ALPHA, TREE_MISTAKES, as_multi_candidate_verify, as_rejection_verify,
                            chisquare_pvalue, distribution_pvalue, seed_base, swap_rule, swap_verifier, wrong_rule,
                            wrong_tree_verify)

V = 5
RUNS = 2000


def _table(shape: tuple[int, ...], sharpness: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, V, generator=g) * sharpness).softmax(-1)


T1, T2, T3 = _table((), 1.5, 0), _table((V,), 1.5, 1), _table((V, V), 1.5, 2)
# An over-confident draft that mostly agrees with the target: rejections and residual draws both happen.
D1 = (T1.log() * 2.5).softmax(-1)
D2 = (T2.log() * 2.5 + torch.randn(V, V, generator=torch.Generator().manual_seed(3)) * 0.3).softmax(-1)
EXACT = {(a, b, c): float(T1[a] * T2[a, b] * T3[a, b, c]) for a in range(V) for b in range(V) for c in range(V)}
#: The draft tables taken as drawn at this temperature, for the "recorded at temperature 1" wrong rule.
DRAFT_SAMPLING = SamplingConfig(temperature=0.6)

#: Mistakes a linear draft can show (``unnormalised_residual`` needs siblings).
LINEAR_MISTAKES = tuple(m for m in TREE_MISTAKES if m != "unnormalised_residual")


def _wrong(mistake: str):
    """A wrong tree rule by name (:func:`sampling_stats.wrong_rule`); ``"draft_temperature"``: the draft
    distributions recorded at temperature 1 while drawn at :data:`DRAFT_SAMPLING`'s."""
    return wrong_rule(mistake, DRAFT_SAMPLING)


def _three_tokens(emitted: list[int], g: torch.Generator) -> tuple[int, int, int]:
    """The first three tokens, continuing with plain target draws when fewer were emitted."""
    emitted = list(emitted)
    if len(emitted) == 1:
        emitted.append(int(torch.multinomial(T2[emitted[0]], 1, generator=g)))
    if len(emitted) == 2:
        emitted.append(int(torch.multinomial(T3[emitted[0], emitted[1]], 1, generator=g)))
    return emitted[0], emitted[1], emitted[2]


def _counts(run_once, name: str) -> collections.Counter:
    g = torch.Generator().manual_seed(seed_base(name))
    return collections.Counter(run_once(g) for _ in range(RUNS))


def _linear_draft_run(verify):
    def run_once(g):
        x1 = int(torch.multinomial(D1, 1, generator=g))
        x2 = int(torch.multinomial(D2[x1], 1, generator=g))
        n, nxt = verify(torch.tensor([x1, x2]), torch.stack([D1, D2[x1]]), torch.stack([T1, T2[x1], T3[x1, x2]]), g)
        return _three_tokens([x1, x2][:n] + [nxt], g)
    return run_once


def _target_row(prefix: list[int]) -> torch.Tensor:
    """The target's distribution after ``prefix`` (past the end of a short branch: never used)."""
    if any(t < 0 for t in prefix):
        return T1
    if not prefix:
        return T1
    return T2[prefix[0]] if len(prefix) == 1 else T3[prefix[0], prefix[1]]


def _tree_run(verify, branches: list[list[int]]):
    """Fixed deterministic candidate branches (``-1`` pads), verified in one call."""
    tokens = torch.tensor(branches)
    probs = torch.stack([torch.stack([_target_row(b[:j]) for j in range(tokens.shape[1] + 1)]) for b in branches])

    def run_once(g):
        b, n, nxt = verify(tokens, probs, g)
        return _three_tokens(branches[b][:n] + [nxt], g)
    return run_once


#: Candidate trees: shared prefixes (argmax -> 1 / argmax -> 2), a duplicate first token (3 twice), a short branch.
BRANCHES = [[int(T1.argmax()), 1], [int(T1.argmax()), 2], [3, 0], [3, 4], [4, -1]]


def test_residual_probs():
    target = torch.tensor([0.0, 0.5, 0.25, 0.25])
    draft = torch.tensor([0.0, 0.0, 0.5, 0.5])
    assert torch.equal(residual_probs(target, draft), torch.tensor([0.0, 1.0, 0.0, 0.0]))
    one_hot = torch.tensor([0.0, 1.0, 0.0, 0.0])
    torch.testing.assert_close(residual_probs(target, one_hot), torch.tensor([0.0, 0.0, 0.5, 0.5]))
    assert torch.equal(residual_probs(target, target), target)  # no mass left: the target itself


@pytest.mark.parametrize("verify", [rejection_verify, as_rejection_verify(multi_candidate_tree_verify)],
                         ids=["rejection_verify", "tree-rule-as-rejection"])
def test_rejection_verify_keeps_target_distribution(verify):
    assert distribution_pvalue(_counts(_linear_draft_run(verify), "verify/linear"), EXACT) > ALPHA


@pytest.mark.parametrize("mistake", LINEAR_MISTAKES + ("draft_temperature",))
def test_rejection_test_rejects_wrong_verifier(mistake):
    counts = _counts(_linear_draft_run(as_rejection_verify(_wrong(mistake))), "verify/linear")
    assert distribution_pvalue(counts, EXACT) < ALPHA


@pytest.mark.parametrize("branches", [BRANCHES, [BRANCHES[0]], [[3, 4]]], ids=["tree", "argmax-chain", "chain"])
@pytest.mark.parametrize("verify", [multi_candidate_verify, as_multi_candidate_verify(multi_candidate_tree_verify)],
                         ids=["multi_candidate_verify", "tree-rule-as-branches"])
def test_multi_candidate_verify_keeps_target_distribution(branches, verify):
    assert distribution_pvalue(_counts(_tree_run(verify, branches), "verify/branches"), EXACT) > ALPHA


@pytest.mark.parametrize("mistake", TREE_MISTAKES)
def test_multi_candidate_test_rejects_wrong_verifier(mistake):
    counts = _counts(_tree_run(as_multi_candidate_verify(_wrong(mistake)), BRANCHES), "verify/branches")
    assert distribution_pvalue(counts, EXACT) < ALPHA


def test_sampled_trunk_with_deterministic_suffixes():
    """Ouroboros' phase-2 shape: a trunk sampled from the draft (a single child per node, with its
    draft_probs) followed by deterministic suffix candidates, all in one call."""
    def run_once(g):
        x1 = int(torch.multinomial(D1, 1, generator=g))
        x2 = int(torch.multinomial(D2[x1], 1, generator=g))
        suffixes = [s for s in (int(T2[x1].argmax()), 0) if s != x2] or [0]
        tokens = torch.tensor([[x1, x2]] + [[x1, s] for s in suffixes])
        one_hot = torch.eye(V)
        draft = torch.stack([torch.stack([D1, D2[x1]])] + [torch.stack([D1, one_hot[s]]) for s in suffixes])
        target = torch.stack([torch.stack([T1, T2[x1], T3[x1, int(t)]]) for t in tokens[:, 1]])
        b, n, nxt = multi_candidate_verify(tokens, target, g, draft_probs=draft)
        return _three_tokens(tokens[b, :n].tolist() + [nxt], g)
    assert distribution_pvalue(_counts(run_once, "verify/trunk-suffixes"), EXACT) > ALPHA


def _ouroboros_tree_run(verify, trunk_is_sampled: bool = True, stats: collections.Counter | None = None):
    """Ouroboros' tree in one :func:`multi_candidate_tree_verify` call: root (0); the sampled trunk ``x1`` (1,
    from ``D1``) and ``x2`` (3, from ``D2[x1]``, child of 1); a branch at the root (2): the draft's most likely
    token other than ``x1`` (chosen AFTER ``x1`` was drawn), continued by 5; a pool suffix after ``x1`` (4,
    deterministic sibling of ``x2``: the target's argmax there, or 0). ``trunk_is_sampled=False`` passes no
    draft distributions (the trunk verified as if deterministic)."""
    def run_once(g):
        x1 = int(torch.multinomial(D1, 1, generator=g))
        x2 = int(torch.multinomial(D2[x1], 1, generator=g))
        alt = int(D1.clone().index_fill_(0, torch.tensor([x1]), -1.0).argmax())
        suffix = int(T2[x1].argmax()) if int(T2[x1].argmax()) != x2 else 0
        tokens = [-1, x1, alt, x2, suffix, 0]
        parents = [-1, 0, 0, 1, 1, 2]
        target = torch.stack([T1, T2[x1], T2[alt], T3[x1, x2], T3[x1, suffix], T3[alt, 0]])
        draft = {1: D1, 3: D2[x1]} if trunk_is_sampled else None
        path, nxt = verify(tokens, parents, target, g, draft)
        if stats is not None:
            stats.update(len(path) * ["accepted"] + [f"path{tuple(path[:1])}"] + (["whole"] if len(path) == 2 else []))
        return _three_tokens([tokens[k] for k in path][:2] + [nxt], g)
    return run_once


def test_tree_verify_sampled_trunk_branch_and_suffix():
    stats = collections.Counter()
    counts = _counts(_ouroboros_tree_run(multi_candidate_tree_verify, stats=stats), "verify/ouroboros-tree")
    assert distribution_pvalue(counts, EXACT) > ALPHA
    # trunk, branch and residual draws; whole paths followed by a bonus token
    assert stats["path(1,)"] and stats["path(2,)"] and stats["path()"] and stats["whole"], stats


@pytest.mark.parametrize("mistake", TREE_MISTAKES + ("draft_temperature",))
def test_tree_verify_test_rejects_wrong_verifier(mistake):
    counts = _counts(_ouroboros_tree_run(_wrong(mistake)), "verify/ouroboros-tree")
    assert distribution_pvalue(counts, EXACT) < ALPHA


def test_sampled_trunk_verified_as_deterministic_is_lossless_but_accepts_less():
    """Why "forget the draft distribution" is not one of the wrong verifiers: a trunk token drawn independently
    of the target's coins and verified as a deterministic candidate (accept with ``p(x)`` instead of
    ``min(1, p(x) / q(x))``, remove ``x`` on rejection) still yields the target's distribution; it only
    accepts less (``sum q p <= sum min(q, p)``)."""
    sampled, deterministic = collections.Counter(), collections.Counter()
    _counts(_ouroboros_tree_run(multi_candidate_tree_verify, stats=sampled), "verify/ouroboros-tree")
    counts = _counts(_ouroboros_tree_run(multi_candidate_tree_verify, trunk_is_sampled=False, stats=deterministic),
                     "verify/ouroboros-tree")
    assert distribution_pvalue(counts, EXACT) > ALPHA
    assert deterministic["accepted"] < 0.95 * sampled["accepted"], (deterministic, sampled)  # tokens accepted


def test_tree_verify_same_token_siblings_share_their_children():
    """Two n-grams ``[a, 1]`` and ``[a, 2]`` (nodes 1 and 2 both spell ``a``): after ``a`` is accepted, both
    second tokens are candidates; only the first ``a`` is tried at the root. With a target certain of ``a``
    then of ``2``, the path is node 4 (the second n-gram's ``2``) and its ancestors: ``[2, 4]``, the nodes whose
    KV entries the decoder keeps."""
    a = 3
    certain = torch.eye(V)
    tokens, parents = [-1, a, a, 1, 2], [-1, 0, 0, 1, 2]
    target = torch.stack([certain[a], certain[2], certain[2], certain[0], certain[0]])
    path, nxt = multi_candidate_tree_verify(tokens, parents, target, torch.Generator().manual_seed(0))
    assert (path, nxt) == ([2, 4], 0)


def test_sampled_child_must_come_first():
    tokens = torch.tensor([[0], [1]])
    draft = torch.stack([torch.eye(V)[0][None], D1[None]])  # deterministic 0, then a sampled 1
    target = torch.stack([torch.stack([torch.full((V,), 1 / V)] * 2)] * 2)
    target[0, 0] = torch.tensor([0.0, 0.25, 0.25, 0.25, 0.25])  # 0 is always rejected: 1 gets tried
    with pytest.raises(ValueError, match="first child"):
        multi_candidate_verify(tokens, target, torch.Generator().manual_seed(0), draft_probs=draft)


def test_docstring_example_two_candidates():
    """``[[4, 2], [1, 3]]`` with first-position target [.1, .1, .1, .1, .6]: token 1 keeps probability 0.1."""
    first = torch.tensor([0.1, 0.1, 0.1, 0.1, 0.6])
    target = torch.stack([torch.stack([first, T2[4], T3[4, 2]]), torch.stack([first, T2[1], T3[1, 3]])])
    g = torch.Generator().manual_seed(7)
    counts = collections.Counter()
    for _ in range(RUNS):
        b, n, nxt = multi_candidate_verify(torch.tensor([[4, 2], [1, 3]]), target, g)
        counts[[[4, 2], [1, 3]][b][0] if n else nxt] += 1
    assert chisquare_pvalue(counts, dict(enumerate(first.tolist()))) > ALPHA


def test_shapes_refused():
    g = torch.Generator()
    with pytest.raises(ValueError):
        rejection_verify(torch.tensor([1, 2]), torch.zeros(1, V), torch.zeros(3, V), g)
    with pytest.raises(ValueError):
        multi_candidate_verify(torch.tensor([[1, 2]]), torch.zeros(1, 2, V), g)
    with pytest.raises(ValueError):
        multi_candidate_verify(torch.zeros(0, 2, dtype=torch.long), torch.zeros(0, 3, V), g)
    with pytest.raises(ValueError, match="earlier node"):
        multi_candidate_tree_verify([-1, 1, 2], [-1, 2, 0], torch.full((3, V), 1 / V), g)
    with pytest.raises(ValueError):
        multi_candidate_tree_verify([-1, 1], [-1, 0], torch.full((3, V), 1 / V), g)


def test_swap_verifier_reaches_every_importer_and_is_undone(monkeypatch):
    """The wrong rules reach a decoder whichever module it imported the rule into, and only for the test."""
    import decoders.common.lookahead_step  # noqa: F401  (imports multi_candidate_tree_verify)

    importers = sorted(name for name, module in sys.modules.items() if name.startswith("decoders.")
                       and getattr(module, "multi_candidate_tree_verify", None) is multi_candidate_tree_verify)
    assert "decoders.common.lookahead_step" in importers and "decoders.common.verify" in importers
    wrong = wrong_tree_verify("shared_uniform")
    with monkeypatch.context() as patch:
        assert swap_verifier(patch, "multi_candidate_tree_verify", wrong) == importers
        assert all(sys.modules[name].multi_candidate_tree_verify is wrong for name in importers)
        patched = swap_rule(patch, wrong)
        assert set(importers) <= set(patched)
        assert decoders.common.verify.rejection_verify is not rejection_verify
    assert all(sys.modules[name].multi_candidate_tree_verify is multi_candidate_tree_verify for name in importers)
    assert decoders.common.verify.rejection_verify is rejection_verify
    with pytest.raises(AttributeError):
        swap_verifier(monkeypatch, "no_such_rule", wrong)


def test_tree_verify_reads_only_the_rows_on_its_path():
    """Given a row function instead of a tensor, the rule asks only for the rows it reads (the accepted path and
    the node it draws after) and draws exactly what the tensor form draws with the same generator."""
    torch.manual_seed(3)
    probs = torch.softmax(torch.randn(7, V) * 3, -1)
    tokens, parents = [-1, 1, 2, 3, 1, 2, 0], [-1, 0, 0, 1, 1, 4, 5]
    for seed in range(200):
        asked: list[int] = []

        def row(i):
            asked.append(i)
            return probs[i]

        eager = multi_candidate_tree_verify(tokens, parents, probs, torch.Generator().manual_seed(seed))
        lazy = multi_candidate_tree_verify(tokens, parents, row, torch.Generator().manual_seed(seed))
        assert lazy == eager
        path = eager[0]
        assert asked == [0, *path]  # the root, then each accepted node once; never a row off the path
