"""Static batches: every batched decoder gives each row exactly what vanilla gives that prompt alone (float32), and
batched sampling keeps each row's distribution the target's.

The batches mix prompts of different lengths (1 to 80 tokens) and rows that stop at different steps (an extra stop id
taken from one row's own greedy output, so some rows end on it early and others run to the budget). The cache layout
(:class:`decoders.common.batch.BatchCache`: pads, dead slots, compaction, rows leaving the batch) is checked against
batch-1 forwards directly.
"""

from __future__ import annotations

import collections

import pytest
import torch

from conftest import PROMPTS
from decoders.common import batch as batch_lib
from decoders.common.batch import BatchCache
from decoders.common.forward import forward, new_cache
from decoders.common.kv_cache import keep_path
from decoders.common.sampling import SamplingConfig
from decoders.common.tree import tree_attention
from decoders.fixed_tree import FixedTreeDecoder
from decoders.lookahead import LookaheadDecoder
from decoders.opt_tree import OptTreeDecoder
from decoders.ouroboros import OuroborosDecoder
from decoders.prompt_lookup import PromptLookupDecoder
from decoders.speculative import SpeculativeDecoder
from decoders.vanilla import VanillaDecoder
from sampling_stats import (ALPHA, distribution_pvalue, exact_sequence_probs, greedy_prompt, seed_base, sharpened,
                            swap_rule, tiny_model, wrong_rule)
from tests.decoder_checks import one_torch_thread  # noqa: F401  (pytestmark)

pytestmark = pytest.mark.usefixtures("one_torch_thread")
MAX_NEW = 30

#: name -> constructor (target, draft, eos ids, sampling) of each decoder that decodes batches.
BATCHED = {
    "vanilla": lambda t, d, eos, s: VanillaDecoder(t, eos, sampling=s),
    "speculative": lambda t, d, eos, s: SpeculativeDecoder(t, d, gamma=4, eos_token_ids=eos, sampling=s),
    "speculative/gamma1": lambda t, d, eos, s: SpeculativeDecoder(t, d, gamma=1, eos_token_ids=eos, sampling=s),
    "prompt_lookup": lambda t, d, eos, s: PromptLookupDecoder(t, max_ngram_size=3, num_draft_tokens=6,
                                                              eos_token_ids=eos, sampling=s),
    "lookahead": lambda t, d, eos, s: LookaheadDecoder(t, window_size=4, ngram_size=3, guess_set_size=4,
                                                       eos_token_ids=eos, sampling=s),
    "lookahead/task": lambda t, d, eos, s: LookaheadDecoder(t, window_size=4, ngram_size=3, guess_set_size=4,
                                                            pool_scope="task", eos_token_ids=eos, sampling=s),
    "ouroboros": lambda t, d, eos, s: OuroborosDecoder(t, d, gamma=5, window_size=4, ngram_size=4, guess_set_size=4,
                                                       topk=3, eos_token_ids=eos, sampling=s),
    "opt_tree": lambda t, d, eos, s: OptTreeDecoder(t, d, num_nodes=12, threshold=0.0, max_depth=5,
                                                    eos_token_ids=eos, sampling=s),
    "opt_tree/hybrid": lambda t, d, eos, s: OptTreeDecoder(t, d, num_nodes=12, threshold=0.0, max_depth=5,
                                                           copy_tokens=6, guess_tokens=3, eos_token_ids=eos,
                                                           sampling=s),
    "fixed_tree": lambda t, d, eos, s: FixedTreeDecoder(t, d, paths=[[0], [1], [0, 0], [0, 1], [0, 0, 0]],
                                                        eos_token_ids=eos, sampling=s),
}
#: Decoders whose rows share state in a batch (a task-scoped pool: a row also sees its batch mates' n-grams), so
#: their proposals, not their tokens, may differ from batch size 1.
SHARED_STATE = {"lookahead/task"}
#: Decoders whose batch proposer is one batch-1 proposer per row (:class:`decoders.common.batch.PerRow`): each row
#: makes the same random draws as at batch size 1.
PER_ROW = ["prompt_lookup", "lookahead", "ouroboros", "opt_tree", "opt_tree/hybrid", "fixed_tree"]


@pytest.fixture(scope="module")
def rows(tokenizer, target, eos_ids):
    """(prompt tensors, stop ids, vanilla's batch-1 outputs): 8 prompts of different lengths; the stop ids are the
    model's EOS ids plus a token vanilla emits early for some prompts and never for others."""
    chosen = [PROMPTS[i] for i in (5, 0, 2, 10, 3, 8, 6, 4)]
    ids = [torch.tensor([tokenizer(p, add_special_tokens=False).input_ids]) for p in chosen]
    plain = [VanillaDecoder(target, eos_ids).generate(x, MAX_NEW).token_ids for x in ids]
    counts = collections.Counter(t for out in plain for t in set(out[2:MAX_NEW - 2]))
    stop = next(t for t, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if c < len(plain))
    eos = frozenset(eos_ids | {stop})
    expected = [VanillaDecoder(target, eos).generate(x, MAX_NEW).token_ids for x in ids]
    lengths = [len(e) for e in expected]
    assert len(set(lengths)) >= 3 and MAX_NEW in lengths and min(lengths) < MAX_NEW  # rows stop at different steps
    assert len({x.shape[1] for x in ids}) == len(ids)  # every prompt length differs
    return ids, eos, expected


@pytest.mark.parametrize("size", [2, 3, 4, 8])
@pytest.mark.parametrize("name", list(BATCHED))
def test_each_row_equals_vanilla_alone(name, size, target, noisy_draft, rows):
    ids, eos, expected = rows
    decoder = BATCHED[name](target, noisy_draft, eos, SamplingConfig())
    done: list[int] = []
    results = decoder.generate_batch(ids[:size], MAX_NEW, finished=done.append)
    assert [r.token_ids for r in results] == expected[:size]
    assert sorted(done) == list(range(size))  # every row reported once, when it finished
    for result in results:
        assert sum(s.emitted for s in result.steps) == result.new_tokens
        assert all(s.accepted <= s.drafted for s in result.steps)
    if name != "vanilla":
        assert sum(s.accepted for r in results for s in r.steps) > 0  # drafts were accepted: the rule ran
    if name not in SHARED_STATE:  # each row drafts and accepts what it does alone: the same accept lengths
        alone = [decoder.generate(x, MAX_NEW) for x in ids[:size]]
        assert [[(s.accepted, s.drafted) for s in r.steps] for r in results] == \
            [[(s.accepted, s.drafted) for s in a.steps] for a in alone]


def test_rows_finish_in_order_of_their_lengths(target, noisy_draft, rows):
    """The row that stops first is reported first, while the others still decode."""
    ids, eos, expected = rows
    done: list[int] = []
    decoder = SpeculativeDecoder(target, noisy_draft, gamma=3, eos_token_ids=eos)
    decoder.generate_batch(ids, MAX_NEW, finished=done.append)
    first = min(range(len(ids)), key=lambda i: len(expected[i]))
    assert done[0] == first and len(expected[done[-1]]) == MAX_NEW


@pytest.mark.parametrize("max_new", [1, 2, 5])
def test_short_budgets(max_new, target, noisy_draft, rows):
    ids, eos, _ = rows
    for name in ("vanilla", "speculative", "prompt_lookup"):
        decoder = BATCHED[name](target, noisy_draft, eos, SamplingConfig())
        alone = [VanillaDecoder(target, eos).generate(x, max_new).token_ids for x in ids[:4]]
        assert [r.token_ids for r in decoder.generate_batch(ids[:4], max_new)] == alone, name


def test_one_row_batch_is_generate(target, noisy_draft, rows):
    ids, eos, expected = rows
    decoder = SpeculativeDecoder(target, noisy_draft, gamma=4, eos_token_ids=eos)
    [result] = decoder.generate_batch(ids[1:2], MAX_NEW)
    alone = decoder.generate(ids[1], MAX_NEW)
    assert result.token_ids == alone.token_ids == expected[1]
    assert [s.accepted for s in result.steps] == [s.accepted for s in alone.steps]


def test_decoders_without_batches_refuse(target, noisy_draft, rows):
    ids, eos, _ = rows

    class NoBatches(OptTreeDecoder):
        supports_batch = False

    decoder = NoBatches(target, noisy_draft, num_nodes=4, eos_token_ids=eos)
    with pytest.raises(ValueError, match="does not decode batches: use runner.batch_size=1"):
        decoder.generate_batch(ids[:2], 4)


def test_bad_batches_are_refused(target, rows):
    ids, eos, _ = rows
    decoder = VanillaDecoder(target, eos)
    with pytest.raises(ValueError, match="at least one prompt"):
        decoder.generate_batch([], 4)
    with pytest.raises(ValueError, match="batch size must be 1"):
        decoder.generate_batch([torch.cat([ids[0], ids[0]])], 4)
    sampled = VanillaDecoder(target, eos, sampling=SamplingConfig(0.7))
    with pytest.raises(ValueError, match="1 generators for 2 prompts"):
        sampled.generate_batch(ids[:2], 4, generators=[torch.Generator()])
    with pytest.raises(ValueError, match="needs generator"):
        sampled.generate_batch(ids[:2], 4)


# --- the cache layout against batch-1 forwards ---------------------------------------------------------------------

def _alone(model, prefix, block, parents=None):
    """Batch-1 logits of ``block`` (a tree when ``parents``) after ``prefix``."""
    cache = new_cache(model)
    forward(model, torch.tensor([prefix]), cache)
    if parents is None:
        return forward(model, torch.tensor([block]), cache)[0]
    mask, pos = tree_attention(parents, len(prefix), dtype=model.dtype)
    return forward(model, torch.tensor([block]), cache, position_ids=pos, attention_mask=mask)[0]


@pytest.mark.parametrize("compact_min", [1, 10_000])
def test_ragged_rows_see_only_their_own_tokens(compact_min, monkeypatch, target):
    """Pads, dropped (rejected) tokens, a tree block, a compaction and a row leaving the batch: each row's logits
    are its batch-1 logits."""
    monkeypatch.setattr(batch_lib, "COMPACT_MIN", compact_min)
    prompts = [[5, 6, 7], list(range(10, 30)), [40]]
    cache = BatchCache(target, 3)
    logits, placed = cache.forward(prompts, keep_last=20)
    for i, p in enumerate(prompts):
        cache.append(i, placed[i])
        torch.testing.assert_close(logits[i, 20 - len(p):], forward(target, torch.tensor([p]), new_cache(target))[0],
                                   rtol=1e-5, atol=1e-5)
    # chains of different lengths; row 1 then keeps only its first 2 fed tokens (a rejection), row 0 everything
    blocks = [[1, 2, 3, 4], [50, 51], []]
    starts = [cache.length(i) for i in range(3)]
    logits, placed = cache.forward(blocks, keep_last=4)
    for i in (0, 1):
        torch.testing.assert_close(logits[i, 4 - len(blocks[i]):], _alone(target, prompts[i], blocks[i]),
                                   rtol=1e-5, atol=1e-5)
    cache.keep(0, starts[0], placed[0])
    cache.keep(1, starts[1], placed[1][:1])
    history = [prompts[0] + blocks[0], prompts[1] + blocks[1][:1], prompts[2]]
    # a tree block in row 1 (root, two children, a grandchild), a chain in rows 0 and 2
    tree = [-1, 0, 0, 1]
    blocks = [[9, 8], [60, 61, 62, 63], [41, 42, 43]]
    logits, placed = cache.forward(blocks, [None, tree, None], keep_last=4)
    torch.testing.assert_close(logits[1], _alone(target, history[1], blocks[1], tree), rtol=1e-5, atol=1e-5)
    for i in (0, 2):
        torch.testing.assert_close(logits[i, 4 - len(blocks[i]):], _alone(target, history[i], blocks[i]),
                                   rtol=1e-5, atol=1e-5)
    cache.keep(1, cache.length(1), [placed[1][0], placed[1][2]])  # the path root -> second child
    cache.append(0, placed[0])
    cache.append(2, placed[2])
    history = [history[0] + blocks[0], history[1] + [60, 62], history[2] + blocks[2]]
    # the long row 1 leaves (then most slots are dead: a compaction when allowed); rows 0 and 2 go on
    cache.select([0, 2])
    history = [history[0], history[2]]
    logits, placed = cache.forward([[70], [71, 72]], keep_last=2)
    torch.testing.assert_close(logits[0, -1], _alone(target, history[0], [70])[-1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits[1], _alone(target, history[1], [71, 72]), rtol=1e-5, atol=1e-5)
    if compact_min == 1:
        assert cache.width == max(len(h) for h in history) + 2  # compacted before the last forward
    else:
        assert cache.width > max(len(h) for h in history) + 2


def test_keep_is_keep_path_per_row(target):
    """Keeping a tree path in a row gives the logits :func:`keep_path` gives at batch size 1."""
    prefix, block, tree = [3, 4, 5], [6, 7, 8, 9], [-1, 0, 0, 2]
    cache = BatchCache(target, 1)
    cache.append(0, cache.forward([prefix])[1][0])
    _, placed = cache.forward([block], [tree], keep_last=4)
    cache.keep(0, 3, [placed[0][0], placed[0][2], placed[0][3]])
    logits, _ = cache.forward([[10]])
    single = new_cache(target)
    forward(target, torch.tensor([prefix]), single)
    mask, pos = tree_attention(tree, 3, dtype=target.dtype)
    forward(target, torch.tensor([block]), single, position_ids=pos, attention_mask=mask)
    keep_path(single, 3, [3, 5, 6])
    torch.testing.assert_close(logits[0, -1], forward(target, torch.tensor([[10]]), single)[0, -1],
                               rtol=1e-5, atol=1e-5)


# --- sampling -------------------------------------------------------------------------------------------------------

WARPERS = dict(temperature=0.6, top_p=0.95, top_k=6)
EOS = frozenset({7})
SAMPLED_NEW = 4


def test_batched_vanilla_sampling_draws_what_each_row_draws_alone(target, rows):
    """A row's random draws come from its own generator only: the same tokens as batch-1 sampling with it."""
    ids, eos, _ = rows
    decoder = VanillaDecoder(target, eos, sampling=SamplingConfig(**WARPERS))
    batched = decoder.generate_batch(ids[:5], MAX_NEW, generators=[torch.Generator().manual_seed(i) for i in range(5)])
    alone = [decoder.generate(x, MAX_NEW, generator=torch.Generator().manual_seed(i)) for i, x in enumerate(ids[:5])]
    assert [r.token_ids for r in batched] == [r.token_ids for r in alone]


@pytest.mark.parametrize("name", PER_ROW)
def test_per_row_sampling_draws_what_each_row_draws_alone(name, target, noisy_draft, rows):
    """A per-row proposer makes each row's draws from its own generator in batch-1 order: each row's sampled tokens
    are those of batch-1 sampling with the same generator, so its distribution is batch-1's (whose distribution
    tests: tests/test_sampling_decoders.py, tests/test_sampling_lookahead.py)."""
    ids, eos, expected = rows
    decoder = BATCHED[name](target, noisy_draft, eos, SamplingConfig(**WARPERS))
    batched = decoder.generate_batch(ids[:5], MAX_NEW, generators=[torch.Generator().manual_seed(i) for i in range(5)])
    alone = [decoder.generate(x, MAX_NEW, generator=torch.Generator().manual_seed(i)) for i, x in enumerate(ids[:5])]
    assert [r.token_ids for r in batched] == [r.token_ids for r in alone]
    assert [r.token_ids for r in batched] != expected[:5]  # it sampled


@pytest.fixture(scope="module")
def tiny():
    """(target, draft, prompt, exact distribution of the first tokens) of the sampling tests' 8-id models."""
    target = tiny_model(seed=0, logit_scale=30.0)
    prompt = greedy_prompt(target)
    return target, sharpened(target, factor=3.0, noise=0.3, seed=1), prompt, exact_sequence_probs(
        target, prompt, SamplingConfig(**WARPERS), SAMPLED_NEW, EOS)


def _batched_pvalue(name: str, tiny, runs: int, size: int = 4) -> float:
    """p-value of ``runs`` rows decoded in batches of ``size`` copies of the prompt (one generator per row; a short
    copy of it in every other row, so rows have different lengths)."""
    target, draft, prompt, exact = tiny
    decoder = BATCHED[name](target, draft, EOS, SamplingConfig(**WARPERS))
    seed = seed_base(f"batch/{name}")
    counts: collections.Counter = collections.Counter()
    for start in range(0, runs, size):
        ids = [torch.tensor([prompt if (start + i) % 2 == 0 else prompt[-4:]]) for i in range(size)]
        gens = [torch.Generator().manual_seed(seed + start + i) for i in range(size)]
        for i, result in enumerate(decoder.generate_batch(ids, SAMPLED_NEW, generators=gens)):
            if (start + i) % 2 == 0:
                counts[result.token_ids] += 1
    return distribution_pvalue(counts, exact)


@pytest.mark.parametrize("name", ["speculative", "prompt_lookup"])
def test_batched_sampling_keeps_the_targets_distribution(name, tiny):
    assert _batched_pvalue(name, tiny, runs=1200) > ALPHA


@pytest.mark.parametrize("name", ["speculative", "prompt_lookup"])
def test_batched_sampling_test_rejects_a_wrong_rule(name, tiny, monkeypatch):
    swap_rule(monkeypatch, wrong_rule("accept_argmax", SamplingConfig(**WARPERS)))
    assert _batched_pvalue(name, tiny, runs=400) < ALPHA
