"""Ouroboros is lossless (token-identical to vanilla in float32); its drafter is the draft's greedy text."""

from __future__ import annotations

import random

import pytest
import torch

from decoders.common.jacobi import JacobiWindow
from decoders.common.ngram_pool import NGramPool
from decoders.common.tree import chain_with_branches, prepend_chain, tree_attention
from decoders.common.lookahead_drafter import LookaheadDrafter
from decoders.ouroboros import OuroborosDecoder, recycle_verification
from tests.decoder_checks import (assert_positions_stay_below_max_position_embeddings,
                                  assert_refuses_bad_generate_calls, memoised_vanilla)

MAX_NEW = 32
REPETITIVE = (2, 3, 8, 11)  # indices of highly repetitive conftest prompts
# (gamma, W, N, G, topk): gamma 1..12, N 2..7, W != G, G = 0 and 1, topk 0 and topk > G, W = 1, and the
# paper's HumanEval setting (gamma 12, W = G = 20, N = 7, topk 3; on fewer prompts, its forwards are large).
GRID = [
    (1, 1, 2, 1, 1), (3, 3, 3, 1, 1), (4, 4, 4, 4, 3), (5, 2, 5, 6, 2), (6, 5, 4, 3, 0), (4, 3, 4, 0, 3),
    (2, 3, 6, 3, 5), (8, 4, 3, 5, 3), (12, 20, 7, 20, 3),
]
PROMPTS_FOR = {(12, 20, 7, 20, 3): (*REPETITIVE, 0, 4)}


@pytest.fixture(scope="module")
def vanilla(target, prompt_ids):
    """Memoised vanilla reference: ``vanilla(i or input_ids, max_new_tokens, eos_ids, model) -> token ids``."""
    return memoised_vanilla(target, prompt_ids, MAX_NEW)


def _check_steps(res, gamma: int, ngram_size: int, prompt_len: int) -> None:
    assert res.steps[0].target_tokens_fed == prompt_len and res.steps[0].source == {"bonus": 1}
    for k, s in enumerate(res.steps[1:]):
        a, b, free, branch = s.source["draft"], s.source["suffix"], s.source.get("free", 0), s.source.get("branch", 0)
        assert s.source["bonus"] in (0, 1) and s.emitted == a + b + free + branch + s.source["bonus"]
        assert s.accepted == a + free <= s.drafted <= gamma and 0 <= b <= ngram_size - 1
        assert b == 0 or s.accepted == s.drafted  # a suffix continues only a fully accepted draft
        assert branch == 0 or s.accepted < s.drafted  # a branch replaces a rejected draft token
        assert s.target_tokens_fed >= 1 + s.drafted + b + branch
        if "free" not in s.source:  # the draft model drafted every trunk
            assert (s.draft_forwards == 0) == (s.drafted == 0)
            assert s.draft_forwards <= s.drafted + (k == 0)  # the first step also prefills the draft
    assert sum(s.emitted for s in res.steps) == res.new_tokens


@pytest.mark.parametrize("gamma, W, N, G, topk", GRID, ids=[f"g{g}-W{w}-N{n}-G{G}-k{k}" for g, w, n, G, k in GRID])
def test_equals_vanilla_grid(target, noisy_draft, prompt_ids, vanilla, gamma, W, N, G, topk):
    dec = OuroborosDecoder(target, noisy_draft, gamma=gamma, window_size=W, ngram_size=N, guess_set_size=G, topk=topk)
    suffix_tokens = 0
    chosen = PROMPTS_FOR.get((gamma, W, N, G, topk), range(len(prompt_ids)))
    assert len(prompt_ids) >= 10
    for i in chosen:
        ids = prompt_ids[i]
        res = dec.generate(ids, MAX_NEW)
        assert res.token_ids == vanilla(i), f"prompt {i}"
        _check_steps(res, gamma, N, ids.shape[1])
        suffix_tokens += sum(s.source["suffix"] for s in res.steps[1:])
    if G and topk:  # the lengthened-draft path is exercised
        assert suffix_tokens > 0
    else:
        assert suffix_tokens == 0


@pytest.mark.parametrize("draft_kind", ["same", "noisy", "other"])
def test_equals_vanilla_any_draft(request, target, prompt_ids, vanilla, eos_ids, draft_kind):
    draft = {"same": target, "noisy": request.getfixturevalue("noisy_draft"),
             "other": request.getfixturevalue("other_draft")}[draft_kind]
    gamma = 2 if draft_kind == "other" else 5  # the unrelated draft is almost always rejected
    dec = OuroborosDecoder(target, draft, gamma=gamma, window_size=4, ngram_size=4, guess_set_size=4, topk=3,
                           eos_token_ids=eos_ids)
    for i, ids in enumerate(prompt_ids):
        res = dec.generate(ids, MAX_NEW)
        assert res.token_ids == vanilla(i, MAX_NEW, eos_ids), f"prompt {i}"
        _check_steps(res, gamma, 4, ids.shape[1])
        if draft_kind == "same":  # the draft is the target: every draft token is accepted
            assert all(s.accepted == s.drafted for s in res.steps[1:])


def test_suffixes_accepted_on_repetitive_prompts(target, noisy_draft, prompt_ids, vanilla):
    dec = OuroborosDecoder(target, noisy_draft, gamma=4, window_size=4, ngram_size=4, guess_set_size=4, topk=3)
    results = {i: dec.generate(prompt_ids[i], MAX_NEW) for i in REPETITIVE}
    assert all(r.token_ids == vanilla(i) for i, r in results.items())
    assert sum(s.source["suffix"] for r in results.values() for s in r.steps[1:]) > 0
    # A step can emit more than gamma + 1 tokens only thanks to a suffix.
    assert max(s.emitted for r in results.values() for s in r.steps[1:]) > 4 + 1
    extra = results[REPETITIVE[0]].extra
    for key in ("pool_scope", "gamma", "window_size", "ngram_size", "guess_set_size", "topk",
                "draft_forwards_per_target_forward", "draft_tokens_fed_per_forward",
                "target_tokens_fed_per_forward", "suffix_hit_rate", "pool_entries"):
        assert key in extra
    assert 0 <= extra["suffix_hit_rate"] <= 1
    assert "draft_time_s" not in extra  # decoders never time themselves: the runner's stopwatch does


class _Marks:
    """A recording :class:`decoders.types.Stopwatch`."""

    def __init__(self):
        self.marks: list[str] = []

    def first_token(self, tokens=1):
        self.marks.append("first")

    def lap(self, phase):
        self.marks.append(phase)

    def mark(self, phase):
        pass


def test_draft_verify_split_goes_through_the_stopwatch(target, noisy_draft, prompt_ids, vanilla):
    dec = OuroborosDecoder(target, noisy_draft, gamma=4, window_size=4, ngram_size=4, guess_set_size=4, topk=3)
    watch = _Marks()
    res = dec.generate(prompt_ids[2], MAX_NEW, stopwatch=watch)
    assert res.token_ids == vanilla(2)
    # prefill (charged to verify), first token, then one draft + verify lap per decoding step
    assert watch.marks == ["verify", "first"] + ["draft", "verify"] * (res.num_steps - 1)


@pytest.mark.parametrize("W, N, G", [(4, 4, 4), (3, 2, 2), (5, 5, 0)])
def test_drafter_is_draft_greedy(noisy_draft, prompt_ids, vanilla, W, N, G):
    """The draft's lookahead decoding reproduces the draft model's own greedy text, several tokens/forward."""
    forwards = tokens = 0
    for i in (0, 2, 4, 8, 11):
        prompt = prompt_ids[i][0].tolist()
        drafter = LookaheadDrafter(noisy_draft, NGramPool(N, G), W, N)
        drafter.start(prompt)
        proposal = drafter.propose(MAX_NEW)
        assert tuple(proposal.tokens) == vanilla(i, MAX_NEW, model=noisy_draft)
        forwards, tokens = forwards + proposal.forwards - 1, tokens + len(proposal.tokens)  # - the prefill
    if G:
        assert forwards < tokens  # multi-token draft forwards happened
    else:
        assert forwards == tokens


def test_drafter_rollback_and_junk_pool(noisy_draft, prompt_ids, vanilla):
    """After a rollback to a prefix plus a foreign token, drafting continues the new text exactly."""
    prompt = prompt_ids[3][0].tolist()
    pool = NGramPool(4, 3)
    rng = random.Random(0)
    for key in range(noisy_draft.config.vocab_size):  # junk phrases for every key: output unchanged
        pool.insert(key, [rng.randrange(noisy_draft.config.vocab_size) for _ in range(3)])
    drafter = LookaheadDrafter(noisy_draft, pool, 4, 4)
    drafter.start(prompt)
    first = drafter.propose(7).tokens
    assert tuple(first) == vanilla(3, 7, model=noisy_draft)
    committed = prompt + first[:3] + [(first[3] + 1) % 256]  # the "target" rejected the 4th token
    drafter.sync(committed)
    assert drafter.cache.get_seq_length() <= len(committed) - 1
    more = drafter.propose(9).tokens
    assert tuple(more) == vanilla(torch.tensor([committed]), 9, model=noisy_draft)


def _eos_from_suffix(res) -> int | None:
    """A token first emitted strictly inside an accepted suffix (never seen earlier in the output)."""
    pos = 0
    for s in res.steps:
        step_tokens = res.token_ids[pos : pos + s.emitted]
        a, b = (s.source.get("draft", 0), s.source.get("suffix", 0))
        for j in range(a, min(a + b, len(step_tokens))):
            t = step_tokens[j]
            if t not in res.token_ids[: pos + j]:
                return t
        pos += s.emitted
    return None


def test_eos_inside_accepted_suffix(target, prompt_ids, vanilla):
    kwargs = dict(gamma=3, window_size=4, ngram_size=5, guess_set_size=4, topk=3)
    found = 0
    for i, ids in enumerate(prompt_ids):
        eos = _eos_from_suffix(OuroborosDecoder(target, target, **kwargs).generate(ids, MAX_NEW))
        if eos is None:
            continue
        res = OuroborosDecoder(target, target, eos_token_ids={eos}, **kwargs).generate(ids, MAX_NEW)
        ref = vanilla(i, MAX_NEW, frozenset({eos}))
        assert res.token_ids == ref and ref[-1] == eos and eos not in ref[:-1]
        last = res.steps[-1]
        start = sum(s.emitted for s in res.steps[:-1])
        j = len(ref) - 1 - start  # index of the EOS within the last step's emitted tokens
        if last.source["draft"] <= j < last.source["draft"] + last.source["suffix"]:
            found += 1  # really accepted from a suffix: cut just after it, no bonus token, counters add up
            assert last.source["bonus"] == 0 and j == last.emitted - 1
            assert sum(s.emitted for s in res.steps) == len(ref)
    assert found >= 1


def test_eos_as_first_token(target, noisy_draft, prompt_ids, vanilla):
    first = vanilla(3)[0]
    res = OuroborosDecoder(target, noisy_draft, eos_token_ids={first}).generate(prompt_ids[3], MAX_NEW)
    assert res.token_ids == (first,) and res.num_steps == 1


@pytest.mark.parametrize("gamma", [4, 5])
def test_max_new_tokens_exact(target, noisy_draft, prompt_ids, vanilla, gamma):
    """max_new_tokens 1, gamma - 1, gamma, gamma + 1, gamma + 2: stop exactly, never emit more."""
    dec = OuroborosDecoder(target, noisy_draft, gamma=gamma, window_size=3, ngram_size=4, guess_set_size=3, topk=3)
    for max_new in (1, gamma - 1, gamma, gamma + 1, gamma + 2):
        for i in (*REPETITIVE, 0):
            res = dec.generate(prompt_ids[i], max_new)
            assert res.token_ids == vanilla(i, max_new) and len(res.token_ids) == max_new
            assert sum(s.emitted for s in res.steps) == max_new


def test_warm_pool_any_order_same_outputs(target, noisy_draft, prompt_ids, vanilla):
    kwargs = dict(gamma=4, window_size=4, ngram_size=4, guess_set_size=3, topk=3)
    warm = OuroborosDecoder(target, noisy_draft, pool_scope="task", **kwargs)
    order = list(range(len(prompt_ids)))
    shuffled = order[:]
    random.Random(1).shuffle(shuffled)
    for i in shuffled:
        res = warm.generate(prompt_ids[i], MAX_NEW)
        assert res.token_ids == vanilla(i) and res.extra["pool_scope"] == "task"
    assert len(warm.pool) > 0
    rng = random.Random(0)  # then junk phrases for every key, in the reverse order: outputs do not change
    for key in range(target.config.vocab_size):
        warm.pool.insert(key, [rng.randrange(target.config.vocab_size) for _ in range(3)])
    for i in order[::-1]:
        assert warm.generate(prompt_ids[i], MAX_NEW).token_ids == vanilla(i)
    warm.reset()
    assert len(warm.pool) == 0


def test_cold_pool_forgets_and_warm_pool_remembers(target, noisy_draft, prompt_ids):
    kwargs = dict(gamma=4, window_size=4, ngram_size=4, guess_set_size=3, topk=3)
    cold = OuroborosDecoder(target, noisy_draft, pool_scope="sample", **kwargs)
    warm = OuroborosDecoder(target, noisy_draft, pool_scope="task", **kwargs)
    first = cold.generate(prompt_ids[2], MAX_NEW)
    cold.generate(prompt_ids[5], MAX_NEW)
    again_cold = cold.generate(prompt_ids[2], MAX_NEW)
    assert again_cold.steps == first.steps and again_cold.extra["pool_scope"] == "sample"
    assert warm.generate(prompt_ids[2], MAX_NEW).steps == first.steps  # an empty warm pool = cold start
    entries = len(warm.pool)
    assert entries > 0
    warm.generate(prompt_ids[2], MAX_NEW)
    assert len(warm.pool) >= entries


def test_positions_stay_below_max_position_embeddings(tokenizer, prompt_ids):
    """Near the end of the context window drafts, suffixes and the draft's window are cut, not overflowed."""
    assert_positions_stay_below_max_position_embeddings(  # prompt 2: 30 tokens
        tokenizer, prompt_ids[2], lambda model: OuroborosDecoder(model, model, gamma=6, window_size=6, ngram_size=5,
                                                                 guess_set_size=4, topk=3))


def test_recycle_verification():
    pool = NGramPool(4, 3)
    draft, preds = [9, 5, 6, 8, 3], [9, 2, 6, 8, 3, 1]  # docstring example: accepted = 1
    recycle_verification(pool, 3, [], draft, preds, 1)
    assert pool.get(5) == [(6, 8, 3)] and pool.get(6) == [(8, 3, 1)] and 8 not in pool and 3 not in pool
    pool = NGramPool(4, 3)
    recycle_verification(pool, 3, [], draft, [9, 2, 6, 8, 4, 1], 1)  # 3 != 4 breaks the chain early
    assert pool.get(5) == [(6, 8, 4)] and len(pool) == 1
    # In-place refinement: suffixes (1, 2, 3) and (4, 5, 6) under key 3 after a fully accepted 1-token draft.
    pool = NGramPool(4, 3)
    pool.insert_ngrams([(3, 7, 7, 7), (3, 4, 5, 6), (3, 1, 2, 3)])
    preds = [3, 1, 2, 0, 9, 4, 5, 8]  # trunk [p, 3] -> [3, 1]; suffix blocks -> [2, 0, 9], [4, 5, 8]
    recycle_verification(pool, 3, [(1, 2, 3), (4, 5, 6)], [3], preds, 1)
    assert pool.get(3) == [(7, 7, 7), (1, 4, 5), (1, 2, 0)]  # same ranks, target's predictions
    recycle_verification(pool, 3, [(1, 2)], [3], [3, 1, 2, 0], 1)  # cut suffixes are not refined
    assert pool.get(3) == [(7, 7, 7), (1, 4, 5), (1, 2, 0)]


def test_tree_helpers_and_window():
    assert prepend_chain([-1, 0, 0], 2) == (-1, 0, 1, 2, 2)
    assert prepend_chain([-1, 0], 0) == (-1, 0)
    assert chain_with_branches(3, [2, 2]) == (-1, 0, 1, 2, 3, 2, 5)
    _, pos = tree_attention(chain_with_branches(3, [2, 2]), 10)
    assert pos.tolist() == [[10, 11, 12, 13, 14, 13, 14]]
    with pytest.raises(ValueError):
        chain_with_branches(0, [1])
    window = JacobiWindow(2, 3, [5])
    assert window.rows == [[-1, 5, 5]] and not window.filled
    assert window.update(0, [8, 9, 7]) == [] and window.rows == [[5, 5], [9, 7]] and window.filled
    assert window.update(4, [1, 2]) == [(4, 9, 1), (5, 7, 2)] and window.rows == [[-1, 7], [1, 2]]
    assert window.tokens() == [7, 1, 2] and window.depth == 2


@pytest.mark.parametrize(
    "kwargs",
    [dict(gamma=0), dict(gamma=2.5), dict(window_size=0), dict(ngram_size=1), dict(guess_set_size=-1),
     dict(topk=-1), dict(pool_scope="prompt"), dict(seed=-1), dict(ngram_size=True)],
)
def test_config_errors(target, noisy_draft, kwargs):
    with pytest.raises(ValueError):
        OuroborosDecoder(target, noisy_draft, **kwargs)


def test_needs_draft(target):
    with pytest.raises(ValueError, match="draft model"):
        OuroborosDecoder(target, None)


def test_batch_and_length_errors(target, noisy_draft, prompt_ids):
    assert_refuses_bad_generate_calls(OuroborosDecoder(target, noisy_draft), prompt_ids[0])


@pytest.mark.parametrize("pool_scope", ["sample", "task"])
def test_pool_from_prompt_equals_vanilla(target, noisy_draft, prompt_ids, vanilla, pool_scope):
    """Seeding the phrase pool with the prompt's n-grams changes speed only, never the output."""
    plain = OuroborosDecoder(target, noisy_draft, gamma=4, window_size=3, ngram_size=4, guess_set_size=4, topk=3)
    seeded = OuroborosDecoder(target, noisy_draft, gamma=4, window_size=3, ngram_size=4, guess_set_size=4, topk=3,
                              pool_from_prompt=True, pool_scope=pool_scope)
    for i in range(len(prompt_ids)):
        res = seeded.generate(prompt_ids[i], MAX_NEW)
        assert res.token_ids == vanilla(i), f"prompt {i}"
        assert res.extra["pool_from_prompt"] is True
        assert plain.generate(prompt_ids[i], MAX_NEW).token_ids == res.token_ids
    # The prompt's n-grams are in the pool before the first step (max_new_tokens=1 decodes nothing more).
    probe = OuroborosDecoder(target, noisy_draft, ngram_size=4, guess_set_size=4, pool_scope="task",
                             pool_from_prompt=True)
    prompt = prompt_ids[2][0].tolist()
    probe.generate(prompt_ids[2], 1)
    assert tuple(prompt[-3:]) in probe.pool.get(prompt[-4])


def test_pool_from_prompt_must_be_bool(target, noisy_draft):
    with pytest.raises(ValueError, match="pool_from_prompt"):
        OuroborosDecoder(target, noisy_draft, pool_from_prompt="yes")


# ---------------------------------------------------------------------------------------------------
# Cheaper drafting options: each lossless, each visibly acting on its counters.
# ---------------------------------------------------------------------------------------------------

BASE = dict(gamma=5, window_size=4, ngram_size=4, guess_set_size=4, topk=3)


def _run_all(dec, prompt_ids, vanilla, max_new=MAX_NEW):
    results = []
    for i, ids in enumerate(prompt_ids):
        res = dec.generate(ids, max_new)
        assert res.token_ids == vanilla(i, max_new), f"prompt {i}"
        _check_steps(res, dec.gamma, dec.ngram_size, ids.shape[1])
        results.append(res)
    return results


@pytest.mark.parametrize("min_match", [1, 2, 3])
def test_free_drafts_equal_vanilla_and_skip_the_draft(target, noisy_draft, prompt_ids, vanilla, min_match):
    plain = _run_all(OuroborosDecoder(target, noisy_draft, **BASE), prompt_ids, vanilla)
    free = _run_all(OuroborosDecoder(target, noisy_draft, free_draft_min_match=min_match, **BASE), prompt_ids,
                    vanilla)
    free_steps = [s for r in free for s in r.steps[1:] if s.source["free"] or (s.drafted and not s.draft_forwards)]
    assert free_steps and all(s.draft_forwards == 0 for s in free_steps)  # the draft model did not run
    assert sum(s.source["free"] for r in free for s in r.steps[1:]) > 0  # copies were accepted
    assert sum(r.draft_forwards for r in free) < sum(r.draft_forwards for r in plain)
    assert all(r.extra["free_steps"] <= r.num_steps - 1 for r in free)


@pytest.mark.parametrize("size", [16, 100, 250])
def test_reduced_draft_vocab_equals_vanilla(target, noisy_draft, prompt_ids, vanilla, size):
    dec = OuroborosDecoder(target, noisy_draft, draft_vocab_size=size, **BASE)
    results = _run_all(dec, prompt_ids, vanilla)
    assert all(r.extra["draft_vocab_size"] == size for r in results)


def test_reduced_vocab_drafter_is_restricted_greedy(noisy_draft, prompt_ids):
    """With a reduced head the drafter's text is the draft's greedy text over the allowed ids only."""
    from decoders.common.forward import forward, new_cache
    from decoders.common.heads import ReducedVocabHead, merge_rank_ids

    ids = merge_rank_ids(120, 260, always=[255])
    allowed = torch.full((noisy_draft.config.vocab_size,), float("-inf"))
    allowed[ids] = 0.0
    for i in (0, 2, 8):
        prompt = prompt_ids[i][0].tolist()
        cache, seq, ref = new_cache(noisy_draft), list(prompt), []
        feed = prompt
        for _ in range(20):  # restricted greedy, one token at a time
            logits = forward(noisy_draft, torch.tensor([feed]), cache, logits_to_keep=1)[0, -1]
            ref.append(int((logits + allowed).argmax()))
            feed = ref[-1:]
        drafter = LookaheadDrafter(noisy_draft, NGramPool(4, 4), 4, 4, head=ReducedVocabHead(noisy_draft, ids))
        drafter.start(seq)
        assert drafter.propose(20).tokens == ref
        assert set(ref) <= set(ids)


def test_merge_rank_ids():
    from decoders.common.heads import merge_rank_ids

    assert merge_rank_ids(4, 10, always=[9]) == [0, 1, 2, 3, 9]
    assert merge_rank_ids(20, 10, always=[12]) == list(range(10))


@pytest.mark.parametrize("threshold", [0.3, 0.6, 0.9])
def test_stop_confidence_equals_vanilla_and_drafts_less(target, noisy_draft, prompt_ids, vanilla, threshold):
    plain = _run_all(OuroborosDecoder(target, noisy_draft, **BASE), prompt_ids, vanilla)
    early = _run_all(OuroborosDecoder(target, noisy_draft, stop_confidence=threshold, **BASE), prompt_ids, vanilla)
    drafted = lambda rs: sum(s.drafted for r in rs for s in r.steps)
    assert drafted(early) < drafted(plain)  # some trunks stopped before gamma


@pytest.mark.parametrize("max_branches", [1, 3])
def test_branches_equal_vanilla_and_are_accepted(target, other_draft, noisy_draft, prompt_ids, vanilla, max_branches):
    accepted = fed = 0
    for draft in (noisy_draft, other_draft):
        dec = OuroborosDecoder(target, draft, branch_confidence=0.99, max_branches=max_branches, **BASE)
        for r in _run_all(dec, prompt_ids, vanilla):
            accepted += r.extra["branch_tokens_accepted"]
            fed += r.extra["branch_tokens_fed"]
            assert all(s.source["branch"] == 0 or s.source["draft"] < s.drafted for s in r.steps[1:])
    assert fed > 0 and accepted > 0  # alternatives were verified, and some were right


def test_all_options_together_and_warm(target, noisy_draft, prompt_ids, vanilla):
    dec = OuroborosDecoder(target, noisy_draft, free_draft_min_match=2, draft_vocab_size=150, stop_confidence=0.5,
                           branch_confidence=0.8, max_branches=2, pool_scope="task", pool_from_prompt=True, **BASE)
    for _ in range(2):
        _run_all(dec, prompt_ids, vanilla)
    for max_new in (1, 4, 5, 6, 7):
        for i in REPETITIVE:
            res = dec.generate(prompt_ids[i], max_new)
            assert res.token_ids == vanilla(i, max_new) and sum(s.emitted for s in res.steps) == max_new


@pytest.mark.parametrize(
    "kwargs",
    [dict(free_draft_min_match=-1), dict(draft_vocab_size=-1), dict(stop_confidence=1.5), dict(branch_confidence=-0.1),
     dict(stop_confidence=True), dict(max_branches=0), dict(free_draft_min_match=1.0)],
)
def test_option_errors(target, noisy_draft, kwargs):
    with pytest.raises(ValueError):
        OuroborosDecoder(target, noisy_draft, **kwargs)
