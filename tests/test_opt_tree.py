"""OPT-Tree draft trees (decoders/opt_tree.py): lossless on whole sequences in float32, the paper's growth and
selection rules, the draft's KV kept for the accepted path, the cost-aware rule and the hybrid tree.

Two model pairs: the shared flat tiny models (their best tree is one layer wide) and a *confident* pair (the
same models with their LM heads scaled, so the draft's probabilities are high and trees grow deep).
"""

from __future__ import annotations

import logging

import pytest

from decoders.common.cost import ForwardCost, batch_cost_curve
from decoders.opt_tree import OptTreeDecoder, _TreeGrower
from decoders.speculative import SpeculativeDecoder
from decoders.vanilla import VanillaDecoder
from tests.decoder_checks import assert_tree_draft_keeps_the_accepted_kv

MAX_NEW = 32
#: Prompts used (plain text, code and repetitive ones, so copies hit).
CHOSEN = (0, 1, 2, 3, 8, 11)


CONFIGS = {
    "paper": dict(num_nodes=32, threshold=0.5, max_depth=10),
    "small": dict(num_nodes=4, threshold=0.5, max_depth=3),
    "no_threshold": dict(num_nodes=8, threshold=0.0, max_depth=10),
    "one_node": dict(num_nodes=1, threshold=0.0),
    "hybrid_merge": dict(num_nodes=16, copy_tokens=10, draft_on_copy=True),
    "hybrid_skip": dict(num_nodes=16, copy_tokens=10, draft_on_copy=False),
    "hybrid_one_node": dict(num_nodes=1, copy_tokens=20, draft_on_copy=True),
    "hybrid_small_skip": dict(num_nodes=3, copy_tokens=20, draft_on_copy=False),
    "hybrid_match3_skip": dict(num_nodes=16, copy_tokens=10, draft_on_copy=False, copy_min_match=3),
    "guess": dict(num_nodes=16, threshold=0.0, max_depth=10, guess_tokens=6),
    "guess_small": dict(num_nodes=3, threshold=0.0, max_depth=4, guess_tokens=8),
    "guess_hybrid": dict(num_nodes=16, copy_tokens=10, draft_on_copy=True, guess_tokens=4),
    "reduced_vocab": dict(num_nodes=16, threshold=0.0, max_depth=8, draft_vocab_size=60),
    "reduced_vocab_guess_hybrid": dict(num_nodes=16, copy_tokens=10, guess_tokens=4, draft_vocab_size=60),
    "cost_hybrid": dict(num_nodes=16, copy_tokens=10, cost_aware=True),
}


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("pair", ["flat", "confident"])
def test_equals_vanilla_in_float32(name, pair, target, noisy_draft, confident, prompt_ids, eos_ids):
    t, d = (target, noisy_draft) if pair == "flat" else confident
    vanilla = VanillaDecoder(t, eos_token_ids=eos_ids)
    decoder = OptTreeDecoder(t, d, eos_token_ids=eos_ids, **CONFIGS[name])
    cfg = CONFIGS[name]
    depth = 0.0
    for ids in [prompt_ids[i] for i in CHOSEN]:
        res = decoder.generate(ids, MAX_NEW)
        assert res.token_ids == vanilla.generate(ids, MAX_NEW).token_ids, (name, pair, ids.tolist())
        for s in res.steps[1:]:
            assert s.target_tokens_fed - 1 <= cfg["num_nodes"]  # the node budget holds the copied branch too
            assert s.drafted == s.target_tokens_fed - 1 and s.accepted <= s.drafted
        depth = max(depth, res.extra["tree_depth_per_step"])
        assert res.extra["tree_depth_per_step"] <= cfg.get("max_depth", 10) + cfg.get("copy_tokens", 0)
    if pair == "confident" and cfg["num_nodes"] > 1:
        assert depth > 2, "confident models must grow trees deeper than two layers"


def test_beats_a_linear_draft_in_accept_length(confident, prompt_ids, eos_ids):
    """With the same draft, a 32-node tree accepts more per step than a gamma-4 chain (the point of trees)."""
    t, d = confident
    tree = OptTreeDecoder(t, d, num_nodes=32, eos_token_ids=eos_ids)
    chain = SpeculativeDecoder(t, d, gamma=4, eos_token_ids=eos_ids)
    tau_tree = sum(tree.generate(prompt_ids[i], MAX_NEW).accept_length for i in CHOSEN)
    tau_chain = sum(chain.generate(prompt_ids[i], MAX_NEW).accept_length for i in CHOSEN)
    assert tau_tree > 1.2 * tau_chain


def test_mid_tree_eos_is_kept_and_counted(confident, prompt_ids):
    """An EOS id inside an accepted path ends the output just after it; the counters add up."""
    t, d = confident
    seen = 0
    for ids in prompt_ids[:4]:
        ref = VanillaDecoder(t).generate(ids, MAX_NEW).token_ids
        for k in (3, 7, 12):
            eos = frozenset({ref[k]})
            if ref[k] in ref[:k]:
                continue
            res = OptTreeDecoder(t, d, num_nodes=16, eos_token_ids=eos).generate(ids, MAX_NEW)
            assert res.token_ids == ref[: k + 1]
            assert sum(s.emitted for s in res.steps) == res.new_tokens
            last = res.steps[-1]
            seen += last.emitted > 1 and last.accepted == last.emitted
    assert seen > 0


@pytest.mark.parametrize("copy_tokens,guess_tokens", [(0, 0), (10, 0), (0, 6), (10, 4)])
def test_draft_kv_of_the_accepted_path_is_kept_not_recomputed(copy_tokens, guess_tokens, confident, prompt_ids,
                                                               eos_ids):
    t, d = confident
    decoder = OptTreeDecoder(t, d, num_nodes=16, copy_tokens=copy_tokens, guess_tokens=guess_tokens,
                             eos_token_ids=eos_ids)
    assert_tree_draft_keeps_the_accepted_kv(decoder, prompt_ids[:4], MAX_NEW)


def _cost(target_slope: float) -> ForwardCost:
    """A synthetic cost curve: 1 ms per draft forward, target ``1 ms * (1 + target_slope * (k - 1))``."""
    points = (1, 2, 4, 8, 16, 32, 64)
    return ForwardCost(points, tuple(1e-3 * (1 + target_slope * (k - 1)) for k in points), (1e-3,) * len(points))


def test_cost_aware_trees_follow_the_cost_curve(confident, prompt_ids, eos_ids):
    """Where k tokens cost k times one (float32 on a CPU), the tree is small; where they are nearly free (a GPU),
    it is large. Both lossless."""
    t, d = confident
    sizes = {}
    for slope in (0.0, 1.0):
        decoder = OptTreeDecoder(t, d, num_nodes=32, eos_token_ids=eos_ids)
        decoder.cost_aware, decoder.cost = True, _cost(slope)
        nodes = 0.0
        for ids in prompt_ids[:4]:
            res = decoder.generate(ids, MAX_NEW)
            assert res.token_ids == VanillaDecoder(t, eos_token_ids=eos_ids).generate(ids, MAX_NEW).token_ids
            nodes += res.extra["tree_nodes_per_step"]
            assert "cost_points" in res.extra
        sizes[slope] = nodes
    assert sizes[1.0] < 0.5 * sizes[0.0], sizes


def test_cost_is_measured_at_construction(target, noisy_draft):
    calls = []
    hook = target.register_forward_hook(lambda module, args, out: calls.append(1))
    try:
        decoder = OptTreeDecoder(target, noisy_draft, num_nodes=8, cost_aware=True)
    finally:
        hook.remove()
    cost = decoder.cost
    assert cost is not None and cost.points[0] == 1 and cost.points[-1] >= 9
    assert len(calls) == 1 + 4 * len(cost.points)  # one prefill, then a warm-up and 3 timed calls per point
    assert all(x > 0 for x in cost.target_s + cost.draft_s)
    assert cost.target_time(3) == pytest.approx((cost.target_time(2) + cost.target_time(4)) / 2)
    assert len(cost.describe().split(",")) == len(cost.points)


def test_a_cost_curve_stops_timing_a_point_after_enough_seconds(target):
    """batch_cost_curve(enough_s=...): a point's timing stops once its timed calls took that long (at least one
    timed call after the warm-up); without it every repeat runs."""
    for enough_s, per_point in ((None, 4), (1e9, 4), (0.0, 2)):
        calls = []
        hook = target.register_forward_hook(lambda module, args, out: calls.append(1))
        try:
            curve = batch_cost_curve(target, 1, [1, 4], repeats=3, enough_s=enough_s)
        finally:
            hook.remove()
        assert list(curve) == [1, 4] and all(t > 0 for t in curve.values())
        assert len(calls) == 1 + per_point * 2, (enough_s, len(calls))  # the prefill, then per point


def test_copy_min_match_copies_only_where_a_longer_suffix_recurs(confident, prompt_ids, eos_ids):
    """With copy_min_match=3 a step copies only when the context's last 3 tokens occurred before: a context whose
    last token recurs but whose last 2- and 3-grams do not gets no copy (with 1 it does), and each copy the
    decoder makes is the continuation of a recurring 3-gram."""
    t, d = confident
    lone = [5, 9, 7, 11, 12, 13, 7]  # 7 recurs; [13, 7] and [12, 13, 7] do not
    for m, copies in ((1, True), (3, False)):
        grower = OptTreeDecoder(t, d, num_nodes=8, copy_tokens=4, draft_on_copy=False, copy_min_match=m,
                                eos_token_ids=eos_ids).proposer()
        grower.start(lone)
        tree = grower.propose(lone, 16, None)
        assert ("copy" in tree.counts.origins) is copies
    decoder = OptTreeDecoder(t, d, num_nodes=16, copy_tokens=10, draft_on_copy=False, copy_min_match=3,
                             eos_token_ids=eos_ids)
    rates = [decoder.generate(prompt_ids[i], MAX_NEW).extra for i in (2, 3, 8, 11)]  # repetitive prompts
    assert all(x["copy_min_match"] == 3 for x in rates) and max(x["copy_step_rate"] for x in rates) > 0


def test_guessed_chains_grow_several_levels_per_draft_forward(confident, prompt_ids, eos_ids):
    """guess_tokens feeds a chain copied from the context under the best frontier node: on prompts that repeat,
    guessed nodes join the trees and the target verifies them, the same trees take fewer draft forwards per step
    than layer by layer, and the output is vanilla's."""
    t, d = confident
    forwards, depth, kept = {}, {}, 0.0
    for guess in (0, 6):
        decoder = OptTreeDecoder(t, d, num_nodes=16, threshold=0.0, max_depth=10, guess_tokens=guess,
                                 eos_token_ids=eos_ids)
        f = s = 0
        depths = []
        for i in (2, 3, 8, 11):  # repetitive prompts
            res = decoder.generate(prompt_ids[i], 48)
            f += sum(step.draft_forwards for step in res.steps[1:])
            s += len(res.steps) - 1
            depths.append(res.extra["tree_depth_per_step"])
            if guess:
                kept += res.extra["guess_verified_per_step"]
                assert res.extra["guess_fed_per_step"] >= res.extra["guess_kept_per_step"]
        forwards[guess], depth[guess] = f / s, sum(depths) / len(depths)
    assert kept > 0
    assert forwards[6] < 0.9 * forwards[0], forwards
    assert depth[6] >= 0.9 * depth[0], depth


def test_a_guessed_chain_is_kept_up_to_the_first_token_the_draft_does_not_rank(confident, prompt_ids, eos_ids):
    """Guessing the draft's own best path under the best first-level node grows a tree as deep, of at least the
    same expected accept length, in fewer draft forwards, every guessed node kept; a guess whose first token is not
    among the draft's choices there is fed, none of it kept, and the tree is the plain one, layer by layer."""
    t, d = confident
    ids = prompt_ids[1][0].tolist()

    def grow(guess_tokens, chain=None):
        decoder = OptTreeDecoder(t, d, num_nodes=8, threshold=0.0, max_depth=6, guess_tokens=guess_tokens,
                                 eos_token_ids=eos_ids)
        grower = decoder.proposer()
        grower.start(ids)
        if chain is not None:
            grower._guess = lambda *args: list(chain)
        tree = grower.propose(ids, 32, None)
        return tree, sum(value for _, _, value, _ in grower._last_nodes)

    plain, value = grow(0)
    assert plain.counts.draft_forwards == 6 and plain.counts.stats["tree_depth"] == 6  # layer by layer
    path, node = [], 0  # the best path under the best first-level node (node 0)
    while True:
        children = [j for j, p in enumerate(plain.parents) if p == node]
        if not children:
            break
        node = children[0]  # children come in value order
        path.append(plain.tokens[node])
    assert len(path) >= 3
    right, right_value = grow(4, path[:4])
    assert right.counts.stats["guess_kept"] == min(4, len(path)) and right.counts.draft_forwards < 6
    assert right_value >= value - 1e-6 and right.counts.stats["tree_depth"] == 6
    not_ranked = next(tok for tok in range(d.config.vocab_size)
                      if tok not in [plain.tokens[j] for j, p in enumerate(plain.parents) if p == 0])
    wrong, wrong_value = grow(4, [not_ranked, *path[1:4]])
    assert wrong.counts.stats["guess_fed"] >= 4 and wrong.counts.stats["guess_kept"] == 0
    assert wrong.tokens == plain.tokens and wrong.parents == plain.parents and wrong.counts.draft_forwards == 6


def test_hybrid_skip_runs_no_draft_forward_on_copy_steps(confident, prompt_ids, eos_ids):
    t, d = confident
    decoder = OptTreeDecoder(t, d, num_nodes=16, copy_tokens=10, draft_on_copy=False, eos_token_ids=eos_ids)
    copy_steps = 0
    for i in (2, 3, 8, 11):  # repetitive prompts: the context holds the continuation
        res = decoder.generate(prompt_ids[i], MAX_NEW)
        for s in res.steps[1:]:
            if s.source.get("copy", 0) and s.draft_forwards == 0:
                copy_steps += 1
        assert res.extra["copy_step_rate"] > 0
    assert copy_steps > 0


@pytest.mark.parametrize("num_nodes,draft_on_copy", [(1, True), (1, False), (4, True), (4, False)])
def test_the_node_budget_bounds_every_verified_tree_copy_included(num_nodes, draft_on_copy, confident, prompt_ids,
                                                                  eos_ids):
    # Before: the copied branch came on top of num_nodes (num_nodes=1 verified 14-15 tokens a step)
    t, d = confident
    vanilla = VanillaDecoder(t, eos_token_ids=eos_ids)
    decoder = OptTreeDecoder(t, d, num_nodes=num_nodes, copy_tokens=20, draft_on_copy=draft_on_copy,
                             eos_token_ids=eos_ids)
    copy_steps = 0
    for i in (2, 3, 8, 11):  # repetitive prompts: the context holds the continuation
        res = decoder.generate(prompt_ids[i], MAX_NEW)
        assert res.token_ids == vanilla.generate(prompt_ids[i], MAX_NEW).token_ids
        for s in res.steps[1:]:
            assert s.drafted == s.target_tokens_fed - 1 <= num_nodes, (i, s)
            copy_steps += bool(s.source.get("copy", 0))
        assert res.extra["tree_nodes_per_step"] <= num_nodes
    assert copy_steps > 0


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_nodes=0), "num_nodes"), (dict(threshold=-0.1), "threshold"), (dict(max_depth=0), "max_depth"),
    (dict(copy_tokens=-1), "copy_tokens"), (dict(cost_aware="yes"), "cost_aware"),
    (dict(cost_aware=-1), "cost_aware=-1: must be true or false"), (dict(draft_on_copy=1), "draft_on_copy"),
    (dict(threshold=1.5), r"threshold=1.5: must be a number in \[0.0, 1.0\]"),
    (dict(copy_min_match=4), "copy_min_match=4"), (dict(copy_min_match=0), "copy_min_match=0"),
    (dict(guess_tokens=-1), "guess_tokens=-1"), (dict(draft_vocab_size=-1), "draft_vocab_size=-1"),
])
def test_bad_settings_refused(kwargs, match, target, noisy_draft):
    with pytest.raises(ValueError, match=match):
        OptTreeDecoder(target, noisy_draft, **kwargs)


def test_needs_a_draft_model(target):
    with pytest.raises(ValueError, match="needs a draft model"):
        OptTreeDecoder(target, None)


def test_selection_is_the_top_nodes_by_value_and_a_valid_tree(confident, prompt_ids):
    """The verified tree has num_nodes nodes, parents before children, values falling along every path."""
    t, d = confident
    decoder = OptTreeDecoder(t, d, num_nodes=8, threshold=0.0)
    grower = _TreeGrower(decoder)
    context = prompt_ids[3][0].tolist()
    grower.start(context)
    tree = grower.propose(context, 50, None)
    assert tree.size == 8
    assert all(p < i for i, p in enumerate(tree.parents))
    values = [v for _, _, v, _ in grower._last_nodes]
    parents = [p for _, p, _, _ in grower._last_nodes]
    for i, p in enumerate(parents):  # values fall along every path
        if p >= 0:
            assert values[i] <= values[p] + 1e-9


def test_a_reduced_draft_vocabulary_drafts_only_its_ids(confident, prompt_ids, eos_ids, caplog):
    """draft_vocab_size: every draft node is one of the lowest-merge-rank ids or an EOS id (a copied node may be
    any id), the trees differ from the full head's (which drafts higher ids on these prompts), the rows say so,
    and the output is vanilla's."""
    t, d = confident
    size = 60
    full = OptTreeDecoder(t, d, num_nodes=16, threshold=0.0, max_depth=6, eos_token_ids=eos_ids)
    reduced = OptTreeDecoder(t, d, num_nodes=16, threshold=0.0, max_depth=6, draft_vocab_size=size,
                             eos_token_ids=eos_ids)
    assert reduced.draft_head.columns == size + len({e for e in eos_ids if e >= size})
    high = 0
    for i in (0, 1, 4):
        ids = prompt_ids[i][0].tolist()
        trees = {}
        for name, decoder in (("full", full), ("reduced", reduced)):
            grower = decoder.proposer()
            grower.start(ids)
            trees[name] = grower.propose(ids, 32, None).tokens
        assert trees["reduced"] and all(tok < size or tok in eos_ids for tok in trees["reduced"]), trees
        high += sum(tok >= size for tok in trees["full"])
        res = reduced.generate(prompt_ids[i], MAX_NEW)
        assert res.token_ids == VanillaDecoder(t, eos_token_ids=eos_ids).generate(prompt_ids[i], MAX_NEW).token_ids
        assert res.extra["draft_vocab_size"] == size
    assert high > 0, "the full head must draft ids the reduced one cannot, or this test shows nothing"
    assert "draft_vocab_size" not in full.generate(prompt_ids[0], 4).extra
    with caplog.at_level(logging.WARNING, logger="decoders.common.heads"):  # a "reduced" head of every id: said
        OptTreeDecoder(t, d, draft_vocab_size=10**9)
    assert "is not below the draft's vocabulary" in caplog.text and "cuts nothing" in caplog.text


def test_the_best_path_leads_the_verified_tree(confident, prompt_ids, eos_ids):
    """The verified tree is laid out depth first, siblings by value: from the first node, each node's most valued
    child comes right after it, so an accepted best path keeps its KV entries in place."""
    t, d = confident
    grower = OptTreeDecoder(t, d, num_nodes=16, threshold=0.0, max_depth=6, eos_token_ids=eos_ids).proposer()
    ids = prompt_ids[1][0].tolist()
    grower.start(ids)
    tree = grower.propose(ids, 32, None)
    values = [value for _, _, value, _ in grower._last_nodes]
    assert all(p < i for i, p in enumerate(tree.parents))
    lead = 1
    while lead < len(tree.parents) and tree.parents[lead] == lead - 1:
        lead += 1
    assert lead >= 3
    for j in range(lead):
        siblings = [i for i, p in enumerate(tree.parents) if p == tree.parents[j]]
        assert siblings[0] == j and values[j] == max(values[i] for i in siblings)
    children = [i for i, p in enumerate(tree.parents) if p == lead - 1]
    assert not children  # the leading chain ends at a leaf


def _hybrid_grower(confident, slope: float, **settings) -> _TreeGrower:
    """A cost-aware hybrid tree's proposer on a synthetic cost curve (:func:`_cost`)."""
    t, d = confident
    decoder = OptTreeDecoder(t, d, num_nodes=16, copy_tokens=10, **settings)
    decoder.cost_aware, decoder.cost = True, _cost(slope)
    return _TreeGrower(decoder)


def _copy_step(grower: _TreeGrower, copy: list[int], hits: int, misses: int) -> None:
    grower._copy_hits, grower._copy_misses = hits, misses
    grower._copy, grower._copy_value = copy, grower._expected_copy(len(copy))


def test_cost_aware_hybrid_drafts_on_a_copy_step_only_where_the_draft_is_expected_to_pay(confident):
    # Before: a cost-aware hybrid drafted on every copy step (and ranked its nodes as if the copy were not verified)
    grower = _hybrid_grower(confident, slope=0.05)  # 11 tokens verified in 1.5 target forwards of one token
    _copy_step(grower, [5] * 10, hits=90, misses=1)  # copies nearly always right so far: q = 91/93
    assert grower._copy_value == pytest.approx(sum((91 / 93) ** i for i in range(1, 11)))
    assert grower._draft_on_copy()  # no draft-only step yet: the draft is tried
    grower._draft_rate = 1.5e3  # the draft's own trees: 1.5 tokens per ms
    assert not grower._draft_on_copy()  # the copy alone: (1 + 8.9) tokens / 1.5 ms = 6.6 per ms
    _copy_step(grower, [5] * 10, hits=0, misses=99)  # copies nearly always wrong so far: q = 1/101
    assert grower._draft_on_copy()  # the copy alone: 1.01 tokens / 1.5 ms = 0.67 per ms
    never = _hybrid_grower(confident, slope=0.05, draft_on_copy=False)
    _copy_step(never, [5] * 10, hits=0, misses=99)
    never._draft_rate = 1.5e3
    assert not never._draft_on_copy()  # draft_on_copy=False is obeyed
    plain = _TreeGrower(OptTreeDecoder(*confident, num_nodes=16, copy_tokens=10))
    assert plain._draft_on_copy() and plain._copy_value == 0.0  # not cost-aware: draft_on_copy as set


def test_cost_aware_hybrid_rates_count_the_copy_once(confident):
    grower = _hybrid_grower(confident, slope=0.05)
    _copy_step(grower, [7, 8], hits=0, misses=0)  # q = 1/2: E(copy) = 0.5 + 0.25
    cand = [(7, -1, 0.9, 0), (3, -1, 0.05, 0), (8, 0, 0.8, 1)]  # nodes 0 and 2 are the copy's path
    t = grower.decoder.cost.target_time
    rates = grower._rates(cand, [0, 2, 1], spent=2e-3)
    assert rates[:3] == pytest.approx([1.75 / (2e-3 + t(3))] * 3)  # merged nodes add no value and no token
    assert rates[3] == pytest.approx(1.8 / (2e-3 + t(4)))
    grower._copy, grower._copy_value = [], 0.0  # without a copy: as before
    assert grower._rates(cand, [0, 2], spent=0.0) == pytest.approx([1 / t(1), 1.9 / t(2), 2.7 / t(3)])


def test_cost_aware_hybrid_reports_its_copy_steps_that_drafted(confident, prompt_ids, eos_ids):
    t, d = confident
    decoder = OptTreeDecoder(t, d, num_nodes=16, copy_tokens=10, eos_token_ids=eos_ids)
    decoder.cost_aware, decoder.cost = True, _cost(0.05)
    rates = []
    for i in (2, 3, 8, 11):  # repetitive prompts: copies hit
        res = decoder.generate(prompt_ids[i], MAX_NEW)
        assert res.token_ids == VanillaDecoder(t, eos_token_ids=eos_ids).generate(prompt_ids[i], MAX_NEW).token_ids
        rates.append((res.extra["copy_step_rate"], res.extra["copy_draft_rate"]))
    assert all(0.0 <= r <= 1.0 for pair in rates for r in pair) and max(c for c, _ in rates) > 0, rates
