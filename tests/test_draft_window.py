"""The draft window (``draft_window``: the draft reads only the prompt's first ``SINK_TOKENS`` and last N tokens,
:func:`decoders.common.base.draft_view`): every decoder that takes it still gives vanilla's whole sequences in
float32, its draft cache holds exactly the windowed context, and the draft's prefill shrinks by the offset."""

from __future__ import annotations

import pytest
import torch

from conftest import PROMPTS
from decoders.common.base import SINK_TOKENS, draft_view, windowed
from decoders.fixed_tree import FixedTreeDecoder
from decoders.opt_tree import OptTreeDecoder
from decoders.ouroboros import OuroborosDecoder
from decoders.speculative import SpeculativeDecoder
from decoders.vanilla import VanillaDecoder
from tests.decoder_checks import assert_cache_is_a_fresh_prefill, assert_tree_draft_keeps_the_accepted_kv

MAX_NEW = 24
WINDOW = 8
#: Prompts longer than WINDOW + SINK_TOKENS bytes (so the window cuts them), repetitive and plain.
LONG = [p for p in PROMPTS if len(p) > WINDOW + SINK_TOKENS + 4]

DECODERS = {
    "speculative": lambda t, d, eos, w: SpeculativeDecoder(t, d, gamma=4, draft_window=w, eos_token_ids=eos),
    "opt_tree": lambda t, d, eos, w: OptTreeDecoder(t, d, num_nodes=8, draft_window=w, eos_token_ids=eos),
    "opt_tree_hybrid_guess": lambda t, d, eos, w: OptTreeDecoder(t, d, num_nodes=16, copy_tokens=10, guess_tokens=4,
                                                                 draft_window=w, eos_token_ids=eos),
    "fixed_tree": lambda t, d, eos, w: FixedTreeDecoder(t, d, draft_window=w, eos_token_ids=eos),
    # a step with a copy runs no draft forward: the draft cache falls behind the context and catches up later
    "opt_tree_copy_only": lambda t, d, eos, w: OptTreeDecoder(t, d, num_nodes=16, copy_tokens=10, draft_on_copy=False,
                                                              draft_window=w, eos_token_ids=eos),
    # the draft's lookahead drafting: its Jacobi window and phrase pool beside the windowed cache
    "ouroboros": lambda t, d, eos, w: OuroborosDecoder(t, d, gamma=4, pool_from_prompt=True, draft_window=w,
                                                       eos_token_ids=eos),
}


def test_draft_view_keeps_the_sinks_and_the_last_tokens():
    prompt = list(range(100, 130))
    assert draft_view(prompt, 0) == (prompt, 0)
    assert draft_view(prompt, 26) == (prompt, 0)  # 26 + 4 tokens: nothing to cut
    view, offset = draft_view(prompt, 8)
    assert view == [100, 101, 102, 103, *range(122, 130)] and offset == 30 - 8 - 4
    assert view[SINK_TOKENS:] == prompt[SINK_TOKENS + offset:]  # entry j >= 4 holds context token j + offset
    assert windowed(prompt + [7, 8], offset) == view + [7, 8] and windowed(prompt, 0) is prompt


@pytest.fixture(scope="module")
def long_ids(tokenizer):
    return [torch.tensor([tokenizer(p, add_special_tokens=False).input_ids]) for p in LONG]


@pytest.mark.parametrize("name", DECODERS)
def test_a_windowed_draft_still_gives_vanillas_tokens_and_prefills_less(name, target, noisy_draft, eos_ids, long_ids):
    vanilla = VanillaDecoder(target, eos_token_ids=eos_ids)
    whole, windowed = (DECODERS[name](target, noisy_draft, eos_ids, w) for w in (0, WINDOW))
    fed: list[int] = []  # tokens in each draft forward
    hook = noisy_draft.register_forward_pre_hook(lambda m, args, kw: fed.append(kw["input_ids"].shape[1]),
                                                 with_kwargs=True)
    drafted = 0
    try:
        for ids in long_ids:
            expected = vanilla.generate(ids, MAX_NEW).token_ids
            fed.clear()
            first = whole.generate(ids, MAX_NEW)
            assert first.token_ids == expected, (name, ids.tolist())
            whole_extra = first.extra
            prefill_whole = fed[0]
            fed.clear()
            result = windowed.generate(ids, MAX_NEW)
            assert result.token_ids == expected, (name, ids.tolist())
            offset = draft_view(ids[0].tolist(), WINDOW)[1]
            # the draft's prefill (its first forward: the prompt, and the pending token where the decoder feeds it
            # there) through the window: shorter by the offset
            assert offset > 0 and prefill_whole in (ids.shape[1], ids.shape[1] + 1), name
            assert fed[0] == prefill_whole - offset, name
            # the rows say what the window cut (0 without one)
            assert result.extra["draft_window_cut"] == offset and whole_extra["draft_window_cut"] == 0, name
            drafted += result.num_drafted
    finally:
        hook.remove()
    assert drafted > 0


def test_a_windowed_batch_gives_each_rows_tokens(target, noisy_draft, eos_ids, long_ids):
    decoder = SpeculativeDecoder(target, noisy_draft, gamma=4, draft_window=WINDOW, eos_token_ids=eos_ids)
    vanilla = VanillaDecoder(target, eos_token_ids=eos_ids)
    results = decoder.generate_batch(long_ids[:5], MAX_NEW)
    assert [r.token_ids for r in results] == [vanilla.generate(ids, MAX_NEW).token_ids for ids in long_ids[:5]]
    assert [r.extra["draft_window_cut"] for r in results] == [draft_view(ids[0].tolist(), WINDOW)[1]
                                                             for ids in long_ids[:5]]
    assert sum(r.num_drafted for r in results) > 0


@pytest.mark.parametrize("name", ["opt_tree_hybrid_guess", "fixed_tree", "opt_tree_copy_only"])
def test_a_windowed_tree_draft_cache_is_the_windowed_context(name, target, noisy_draft, eos_ids, long_ids):
    assert_tree_draft_keeps_the_accepted_kv(DECODERS[name](target, noisy_draft, eos_ids, WINDOW), long_ids[:4],
                                            MAX_NEW)


def test_a_windowed_draft_chain_holds_the_windowed_context(target, noisy_draft, eos_ids, long_ids):
    """Between steps the chain's draft cache + ``feed`` are the windowed context less the pending token, and the
    cache's entries are those of a fresh prefill of that prefix."""
    from decoders.common.driver import decode

    decoder = SpeculativeDecoder(target, noisy_draft, gamma=4, draft_window=WINDOW, eos_token_ids=eos_ids)
    checked = 0
    for ids in long_ids[:4]:
        proposer = decoder.proposer()
        step = proposer.accepted

        def accepted(context, tree, verdict, step=step, chain=proposer):
            nonlocal checked
            step(context, tree, verdict)
            view = context[:SINK_TOKENS] + context[chain.offset + SINK_TOKENS:-1]
            held = chain.cache.get_seq_length()
            assert chain.offset > 0 and view[held:] == chain.feed
            assert_cache_is_a_fresh_prefill(noisy_draft, chain.cache, view[:held])
            checked += 1

        proposer.accepted = accepted
        decode(target, proposer, ids, MAX_NEW, eos_token_ids=eos_ids, sampling=decoder.sampling)
    assert checked > 10


def test_a_windowed_batch_chain_holds_each_rows_windowed_context(target, noisy_draft, eos_ids, long_ids):
    """Per row of a static batch, between steps: the draft cache's length + ``feed`` are the row's windowed context
    less the pending token (rows of different offsets, finishing at different steps, so a row's index in the
    batch and its number differ after the first finishes)."""
    from decoders.common.batch import decode_batch

    decoder = SpeculativeDecoder(target, noisy_draft, gamma=4, draft_window=WINDOW, eos_token_ids=eos_ids)
    proposer = decoder.batch_proposer(5)
    step = proposer.accepted
    checked: set[tuple[int, int]] = set()  # (row, batch index) pairs seen

    def accepted(rows, contexts, trees, verdicts):
        step(rows, contexts, trees, verdicts)
        for i, (r, context, tree) in enumerate(zip(rows, contexts, trees)):
            if tree.size:
                offset = proposer.offset[r]
                view = context[:SINK_TOKENS] + context[offset + SINK_TOKENS:-1]
                assert offset > 0 and view[proposer.draft.length(i):] == proposer.feed[r], (r, i)
                checked.add((r, i))

    proposer.accepted = accepted
    decode_batch(target, proposer, long_ids[:5], MAX_NEW, eos_token_ids=eos_ids, sampling=decoder.sampling)
    assert len({offset for offset in proposer.offset}) > 1 and any(r != i for r, i in checked)


def test_a_windowed_ouroboros_drafter_holds_the_windowed_context(target, noisy_draft, eos_ids, long_ids):
    """Each time Ouroboros' drafter adopts the context before drafting, its ``seq`` is the windowed context and its
    cache's entries are those of a fresh prefill of that prefix."""
    from decoders.common.driver import decode

    decoder = DECODERS["ouroboros"](target, noisy_draft, eos_ids, WINDOW)
    checked = 0
    for ids in long_ids[:4]:
        proposer = decoder.proposer()
        drafter, sync = proposer.drafter, proposer.drafter.sync
        context: list[int] = []

        def synced(committed, sync=sync, drafter=drafter, proposer=proposer):
            nonlocal checked
            sync(committed)
            assert proposer.offset > 0 and committed == context[:SINK_TOKENS] + context[proposer.offset + SINK_TOKENS:]
            assert drafter.stepper.seq == committed
            held = drafter.cache.get_seq_length()
            if held:
                assert_cache_is_a_fresh_prefill(noisy_draft, drafter.cache, committed[:held])
                checked += 1

        def propose(ctx, remaining, generator, inner=proposer.propose):
            context[:] = ctx
            return inner(ctx, remaining, generator)

        drafter.sync, proposer.propose = synced, propose
        decode(target, proposer, ids, MAX_NEW, eos_token_ids=eos_ids, sampling=decoder.sampling)
    assert checked > 10
