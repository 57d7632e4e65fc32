"""The shared decode loop (decoders/common/driver.py) with made-up proposers: whatever tree a proposer offers,
the output is vanilla's; accepted nodes, labels and counters follow the tree; nodes marked not verified are
never accepted; the proposer is told exactly what was committed."""

from __future__ import annotations

import random

import pytest

from decoders.common.driver import DraftCounts, DraftTree, decode
from decoders.common.sampling import GREEDY
from decoders.vanilla import VanillaDecoder

MAX_NEW = 30


class _Scripted:
    """Proposes trees built by ``make(context, remaining, truth)`` where ``truth`` is vanilla's continuation."""

    def __init__(self, make, truth: list[int], prompt_len: int):
        self.make, self.truth, self.prompt_len = make, truth, prompt_len
        self.seen: list[list[int]] = []

    def start(self, prompt):
        assert len(prompt) == self.prompt_len

    def propose(self, context, remaining, generator):
        assert remaining >= 1 and context[self.prompt_len:] == self.truth[: len(context) - self.prompt_len]
        return self.make(context, remaining, self.truth[len(context) - self.prompt_len:])

    def accepted(self, context, tree, verdict):
        assert context[-len(verdict.emitted):] == verdict.emitted
        self.seen.append(list(verdict.emitted))

    def extra(self, steps, stats):
        return {"steps_seen": len(steps), **stats}


def _run(target, ids, make, eos=frozenset()):
    truth = list(VanillaDecoder(target, eos_token_ids=eos).generate(ids, MAX_NEW).token_ids)
    proposer = _Scripted(make, truth, ids.shape[1])
    res = decode(target, proposer, ids, MAX_NEW, eos_token_ids=eos, sampling=GREEDY)
    assert list(res.token_ids) == truth
    assert sum(s.emitted for s in res.steps) == res.new_tokens
    assert [t for e in proposer.seen for t in e] == truth[1:]
    assert res.extra["steps_seen"] == len(res.steps) - 1
    return res


def test_oracle_chain_is_accepted_whole(target, prompt_ids):
    res = _run(target, prompt_ids[0], lambda c, r, truth: DraftTree.chain(truth[: min(5, r - 1)],
                                                                   counts=DraftCounts(labels=("draft",))))
    for s in res.steps[1:-1]:
        assert s.accepted == s.drafted == 5 and s.emitted == 6 and s.source == {"draft": 5, "bonus": 1}


def test_random_trees_with_decoys_keep_vanilla_output(target, prompt_ids):
    rng = random.Random(0)

    def make(context, remaining, truth):
        tokens, parents, origins = [], [], []
        right = -1  # the last node of the right path (-1: the pending token)
        for depth in range(min(4, remaining - 1)):  # the right path, each node among random decoy siblings
            for _ in range(rng.randint(0, 3)):
                tokens.append(rng.randrange(250))
                parents.append(right)
                origins.append("decoy")
            tokens.append(truth[depth])
            parents.append(right)
            origins.append("right")
            right = len(tokens) - 1
        return DraftTree(tokens=tokens, parents=parents, counts=DraftCounts(origins=origins, labels=("right", "decoy")))

    for ids in prompt_ids[:4]:
        res = _run(target, ids, make)
        for s in res.steps[1:]:
            assert s.source["decoy"] == 0 or s.source["right"] == 0  # decoys equal to the truth are rare
            assert s.accepted == s.source["right"] + s.source["decoy"]


def test_unverified_nodes_are_fed_but_never_accepted(target, prompt_ids):
    """A Jacobi-window-like node holding the right token but marked verified=False is not accepted."""
    def make(context, remaining, truth):
        n = min(3, remaining - 1)
        return DraftTree(tokens=truth[:n], parents=list(range(-1, n - 1)), verified=[False] * n,
                         counts=DraftCounts(drafted=0))

    res = _run(target, prompt_ids[1], make)
    assert all(s.accepted == 0 and s.emitted == 1 for s in res.steps[1:])
    assert all(s.target_tokens_fed == 4 for s in res.steps[1:MAX_NEW - 3])   # fed all the same (3 + pending)


def test_eos_inside_an_accepted_path_ends_the_output(target, prompt_ids):
    ids = prompt_ids[0]
    truth = list(VanillaDecoder(target).generate(ids, MAX_NEW).token_ids)
    k = next(k for k in range(3, MAX_NEW) if truth[k] not in truth[:k])
    eos = frozenset({truth[k]})
    res = _run(target, ids, lambda c, r, t: DraftTree.chain(t[: min(6, r - 1)]), eos=eos)
    assert list(res.token_ids) == truth[: k + 1]


def test_bad_parent_array_is_refused(target, prompt_ids):
    bad = _Scripted(None, [], prompt_ids[0].shape[1])
    bad.propose = lambda context, remaining, generator: DraftTree(tokens=[1, 2], parents=[1, -1])
    with pytest.raises(ValueError, match="parent"):
        decode(target, bad, prompt_ids[0], MAX_NEW, eos_token_ids=frozenset(), sampling=GREEDY)


def test_sampling_needs_a_generator(target, prompt_ids):
    from decoders.common.sampling import SamplingConfig

    with pytest.raises(ValueError):
        decode(target, _Scripted(lambda *a: DraftTree(), [], 1), prompt_ids[0], 4, eos_token_ids=frozenset(),
               sampling=SamplingConfig(temperature=0.7))
