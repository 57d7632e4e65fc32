"""Fixed draft trees (decoders/fixed_tree.py): lossless on whole sequences in float32, the shape grown as given
(ranks, one draft forward per layer, cut at the budget and at EOS nodes), a chain shape equal to speculative
decoding, the draft's KV kept for the accepted path, and bad shapes refused in one line.

Sampling is tested with the other tree decoders (tests/test_sampling_decoders.py).
"""

from __future__ import annotations

import pytest
import torch

from decoders.fixed_tree import FixedTreeDecoder, TreeShape, _FixedTreeGrower
from decoders.settings import EAGLE1_TREE, tree_shape_problem
from decoders.speculative import SpeculativeDecoder
from decoders.vanilla import VanillaDecoder
from harness.rows.grouping import settings_label
from tests.decoder_checks import (assert_positions_stay_below_max_position_embeddings,
                                  assert_refuses_bad_generate_calls, assert_tree_draft_keeps_the_accepted_kv)

MAX_NEW = 32
CHOSEN = (0, 1, 2, 3, 8, 11)
BINARY_3 = [[0], [1], [0, 0], [0, 1], [1, 0], [1, 1], [0, 0, 0], [0, 0, 1], [0, 1, 0], [0, 1, 1], [1, 0, 0],
            [1, 0, 1], [1, 1, 0], [1, 1, 1]]
SHAPES = {"eagle1": None, "binary3": BINARY_3, "wide": [[0], [1], [2], [3], [4], [5]],
          "deep_chain": [[0] * d for d in range(1, 9)], "lopsided": [[0], [0, 0], [0, 0, 0], [0, 1], [2], [2, 5]]}


def _make(t, d, shape, **kwargs):
    return FixedTreeDecoder(t, d, **({} if SHAPES[shape] is None else {"paths": SHAPES[shape]}), **kwargs)


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("pair", ["flat", "confident"])
def test_equals_vanilla_in_float32(shape, pair, target, noisy_draft, confident, prompt_ids, eos_ids):
    t, d = (target, noisy_draft) if pair == "flat" else confident
    decoder = _make(t, d, shape, eos_token_ids=eos_ids)
    vanilla = VanillaDecoder(t, eos_token_ids=eos_ids)
    nodes = len(SHAPES[shape] or EAGLE1_TREE)
    accepted = 0
    for ids in [prompt_ids[i] for i in CHOSEN]:
        res = decoder.generate(ids, MAX_NEW)
        assert res.token_ids == vanilla.generate(ids, MAX_NEW).token_ids, (shape, pair, ids.tolist())
        for s in res.steps[1:]:
            assert s.drafted == s.target_tokens_fed - 1 <= nodes and s.accepted <= s.drafted
        accepted += sum(s.accepted for s in res.steps)
    assert accepted > 0


def test_grows_the_shape_as_given(confident, prompt_ids):
    """Each node's token is its rank among the draft's tokens after its parent; one draft forward per layer."""
    t, d = confident
    decoder = FixedTreeDecoder(t, d, paths=[[0], [2], [0, 1], [0, 0], [2, 0], [0, 1, 3]])
    grower = _FixedTreeGrower(decoder)
    context = prompt_ids[3][0].tolist()
    grower.start(context)
    tree = grower.propose(context, 50, None)
    assert tree.counts.draft_forwards == 3  # layers 1, 2 and 3
    paths = [decoder.shape.paths[k] for k in grower.node_key]
    # depth first, siblings by rank: the path of first-ranked children leads (its KV stays in place when accepted)
    assert paths == [(0,), (0, 0), (0, 1), (0, 1, 3), (2,), (2, 0)]

    def ranked_after(prefix):
        logits = d(torch.tensor([context + prefix])).logits[0, -1].float()
        return logits.argsort(descending=True).tolist()

    by_path = dict(zip(paths, tree.tokens))
    for path, token in by_path.items():
        prefix = [by_path[path[:i]] for i in range(1, len(path))]
        assert ranked_after(prefix)[path[-1]] == token, path
    assert tree.parents == [-1, 0, 0, 2, -1, 4]


def test_the_token_budget_cuts_the_depth(confident, prompt_ids):
    t, d = confident
    grower = _FixedTreeGrower(FixedTreeDecoder(t, d, paths=SHAPES["deep_chain"]))
    context = prompt_ids[0][0].tolist()
    grower.start(context)
    tree = grower.propose(context, 4, None)  # 3 draft tokens at most along a path
    assert tree.size == 3 and tree.counts.draft_forwards == 3
    assert grower.propose(context[:1], 1, None).size == 0  # only the target's own token fits


def test_an_eos_node_is_not_expanded(confident, prompt_ids):
    t, d = confident
    context = prompt_ids[0][0].tolist()
    plain = _FixedTreeGrower(FixedTreeDecoder(t, d, paths=BINARY_3))
    plain.start(context)
    first = plain.propose(context, 50, None).tokens[0]  # the draft's top token
    grower = _FixedTreeGrower(FixedTreeDecoder(t, d, paths=BINARY_3, eos_token_ids=frozenset({first})))
    grower.start(context)
    tree = grower.propose(context, 50, None)
    kept = [grower.decoder.shape.paths[k] for k in grower.node_key]
    assert tree.tokens[0] == first and not any(p[0] == 0 and len(p) > 1 for p in kept)  # [0]'s subtree dropped
    assert len(kept) == 1 + 1 + 2 + 4


def test_a_chain_is_greedy_speculative_decoding(confident, prompt_ids, eos_ids):
    """The chain [[0], [0, 0], [0, 0, 0]] proposes speculative decoding's gamma=3 draft every step."""
    t, d = confident
    chain = FixedTreeDecoder(t, d, paths=[[0], [0, 0], [0, 0, 0]], eos_token_ids=eos_ids)
    spec = SpeculativeDecoder(t, d, gamma=3, eos_token_ids=eos_ids)
    for i in CHOSEN:
        a, b = chain.generate(prompt_ids[i], MAX_NEW), spec.generate(prompt_ids[i], MAX_NEW)
        assert a.token_ids == b.token_ids
        assert [(s.drafted, s.accepted, s.draft_forwards) for s in a.steps] == \
               [(s.drafted, s.accepted, s.draft_forwards) for s in b.steps]


def test_draft_kv_of_the_accepted_path_is_kept_not_recomputed(confident, prompt_ids, eos_ids):
    t, d = confident
    decoder = FixedTreeDecoder(t, d, paths=BINARY_3, eos_token_ids=eos_ids)
    assert_tree_draft_keeps_the_accepted_kv(decoder, prompt_ids[:4], MAX_NEW)


@pytest.mark.parametrize("paths, match", [
    ([], "at least one path"),
    ([[0], [1, 0]], r"path \[1, 0\] has no parent: add \[1\]"),
    ([[0], [0]], "listed twice"),
    ([[0], []], "non-empty list of ranks"),
    ([[0], [-1]], "non-empty list of ranks"),
    ([[0], [True]], "non-empty list of ranks"),
    ([[d] for d in range(1025)], "at most 1024"),
    ([[0] * d for d in range(1, 66)], "at most 64 levels"),
    ("abc", "must be a list of paths"),
    ({(0,): 1}, "must be a list of paths"),
    ((p for p in [[0]]), "must be a list of paths"),
    ([[0], "ab"], "path 'ab': a path is a non-empty list of ranks"),
])
def test_bad_shapes_refused(paths, match, target, noisy_draft):
    assert tree_shape_problem(paths) is not None
    with pytest.raises(ValueError, match=match):
        FixedTreeDecoder(target, noisy_draft, paths=paths)


def test_a_rank_beyond_the_drafts_vocabulary_is_refused(target, noisy_draft):
    vocab = noisy_draft.get_output_embeddings().weight.shape[0]
    with pytest.raises(ValueError, match="beyond the draft's vocabulary"):
        FixedTreeDecoder(target, noisy_draft, paths=[[vocab + 5]])


def test_a_reduced_draft_vocabulary_ranks_only_its_ids(confident, prompt_ids, eos_ids):
    """draft_vocab_size: ranks are taken among the lowest-merge-rank ids (and EOS ids) only; lossless; a rank
    beyond the reduced vocabulary is refused."""
    t, d = confident
    decoder = FixedTreeDecoder(t, d, paths=BINARY_3, draft_vocab_size=60, eos_token_ids=eos_ids)
    vanilla = VanillaDecoder(t, eos_token_ids=eos_ids)
    for ids in [prompt_ids[i] for i in CHOSEN]:
        grower = _FixedTreeGrower(decoder)
        grower.start(ids[0].tolist())
        tree = grower.propose(ids[0].tolist(), 32, None)
        assert tree.tokens and all(tok < 60 or tok in eos_ids for tok in tree.tokens)
        res = decoder.generate(ids, MAX_NEW)
        assert res.token_ids == vanilla.generate(ids, MAX_NEW).token_ids
        assert res.extra["draft_vocab_size"] == 60
    columns = decoder.draft_head.columns
    with pytest.raises(ValueError, match=f"beyond the draft's vocabulary \\({columns} ids: the 60 lowest-ranked ids "
                                         "and the end-of-sequence ids\\)"):
        FixedTreeDecoder(t, d, paths=[[columns]], draft_vocab_size=60, eos_token_ids=eos_ids)
    FixedTreeDecoder(t, d, paths=[[columns - 1]], draft_vocab_size=60, eos_token_ids=eos_ids)  # the last rank


def test_needs_a_draft_model(target):
    with pytest.raises(ValueError, match="needs a draft model"):
        FixedTreeDecoder(target, None)


def test_shape_order_and_levels():
    shape = TreeShape.of([[1, 0], [0], [1], [0, 2]])
    assert shape.paths == ((0,), (1,), (0, 2), (1, 0)) and shape.parent == (-1, -1, 0, 1)
    assert shape.levels == [2, 2] and shape.depth == 2
    assert TreeShape.of(EAGLE1_TREE).levels == [4, 8, 8, 3, 2]


def test_label_names_the_shape_by_nodes_per_depth():
    label = settings_label({"_target_": "decoders.fixed_tree.FixedTreeDecoder", "paths": BINARY_3})
    assert label == "tree=2+4+8"
    assert settings_label({"_target_": "decoders.fixed_tree.FixedTreeDecoder",
                           "paths": [list(p) for p in EAGLE1_TREE]}) == "tree=4+8+8+3+2"


def test_swept_shapes_are_labelled_by_nodes_per_depth_or_spelled_out_when_those_agree():
    import json

    import pandas as pd

    from harness.rows.grouping import config_labels

    def labels(*shapes):
        params = [json.dumps({"_target_": "decoders.fixed_tree.FixedTreeDecoder", "paths": p}) for p in shapes]
        return list(config_labels(pd.DataFrame({"decoder": ["fixed_tree"] * len(shapes), "decoder_params": params})))

    assert labels([[0], [1]], [[0], [0, 0]]) == ["fixed_tree (tree=2)", "fixed_tree (tree=1+1)"]
    assert labels([[0], [1], [0, 0]], [[0], [1], [1, 0]]) == ["fixed_tree (tree=[[0],[1],[0,0]])",
                                                              "fixed_tree (tree=[[0],[1],[1,0]])"]


def test_generate_refusals_and_the_position_limit(tokenizer, target, noisy_draft, prompt_ids):
    assert_refuses_bad_generate_calls(FixedTreeDecoder(target, noisy_draft), prompt_ids[0])
    assert_positions_stay_below_max_position_embeddings(
        tokenizer, prompt_ids[0], lambda m: FixedTreeDecoder(m, m, paths=SHAPES["deep_chain"]))
