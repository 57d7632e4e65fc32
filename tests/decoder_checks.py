"""Checks several decoder test modules run the same way: the ``generate`` argument refusals, decoding near the end
of a short context window, and the shared set-up of the sampling tests (one torch thread, runs per decoder)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import pytest
import torch

from decoders.vanilla import VanillaDecoder
from harness.job.models import build_tiny_random


def assert_refuses_bad_generate_calls(decoder: Any, prompt: torch.Tensor) -> None:
    """``decoder.generate`` raises ``ValueError`` for ``max_new_tokens=0`` and for a batch of 2 (``prompt``:
    ``(1, prompt_len)`` token ids)."""
    with pytest.raises(ValueError):
        decoder.generate(prompt, 0)
    with pytest.raises(ValueError):
        decoder.generate(torch.cat([prompt, prompt]), 4)


def assert_positions_stay_below_max_position_embeddings(tokenizer: Any, prompt: torch.Tensor,
                                                        make_decoder: Callable[[Any], Any]) -> None:
    """A 1-layer model with ``max_position_embeddings=64`` decodes ``prompt`` (``(1, prompt_len)`` ids) to the
    end of its window: the decoder ``make_decoder(model)`` gives vanilla's tokens and feeds no position beyond
    63 (its window and drafts are cut, not overflowed)."""
    max_pos = 64
    config = dict(model_type="qwen2", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=max_pos)
    model = build_tiny_random(config, seed=3, vocab_size=len(tokenizer))
    seen: list[int] = []
    hook = model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(int(kwargs["position_ids"].max())), with_kwargs=True
    )
    try:
        max_new = max_pos - prompt.shape[1]  # vanilla's last fed token sits at max_pos - 2
        ref = VanillaDecoder(model).generate(prompt, max_new).token_ids
        seen.clear()
        res = make_decoder(model).generate(prompt, max_new)
    finally:
        hook.remove()
    assert res.token_ids == ref
    assert max(seen) <= max_pos - 1


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for the module (``pytestmark = pytest.mark.usefixtures("one_torch_thread")``): forwards
    of a 16-wide model are fastest on one thread (no OpenMP hand-offs on a busy 2-core CI box)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def runs_for(name: str, default: int, wrong_cases: Sequence[tuple[str, str, int]]) -> int:
    """Runs of the correct decoder configuration ``name``: as many as any wrong rule of it gets in
    ``wrong_cases`` (``(configuration, wrong rule, runs)``), at least ``default``, so the test that rejects the
    wrong rule is the one the decoder passes."""
    return max([default] + [runs for case, _, runs in wrong_cases if case == name])


def memoised_vanilla(target: Any, prompt_ids: Sequence[torch.Tensor], max_new_default: int) -> Callable[..., tuple]:
    """The vanilla reference of a test module's ``vanilla`` fixture: ``run(i or input_ids, max_new_tokens=
    max_new_default, eos_ids=frozenset(), model=target) -> token ids``, each distinct call decoded once."""
    memo: dict = {}

    def run(i: int | torch.Tensor, max_new: int = max_new_default, eos: frozenset = frozenset(),
            model: Any = None) -> tuple[int, ...]:
        model = target if model is None else model
        ids = prompt_ids[i] if isinstance(i, int) else i
        key = (tuple(ids[0].tolist()), max_new, eos, id(model))
        if key not in memo:
            memo[key] = VanillaDecoder(model, eos_token_ids=eos).generate(ids, max_new).token_ids
        return memo[key]

    return run


def assert_refuses_arguments_it_does_not_take(make: Callable[..., Any], misspelt: str) -> None:
    """No ``**kwargs``: ``make(draft_model=None)`` (a decoder without a draft model) and ``make(<misspelt>=3)``
    raise ``TypeError`` naming the argument (``make``: the decoder class with its models bound)."""
    with pytest.raises(TypeError, match="draft_model"):
        make(draft_model=None)
    with pytest.raises(TypeError, match=misspelt):
        make(**{misspelt: 3})


def assert_cache_is_a_fresh_prefill(model: Any, cache: Any, ids: Sequence[int]) -> None:
    """``cache`` (``model``'s KV cache) holds exactly ``len(ids)`` entries, equal (keys and values) to those of a
    fresh prefill of ``ids``."""
    from decoders.common.forward import forward, new_cache

    fresh = new_cache(model)
    forward(model, torch.tensor([list(ids)]), fresh)
    assert cache.get_seq_length() == len(ids)
    for mine, ref in zip(cache.layers, fresh.layers):
        torch.testing.assert_close(mine.keys, ref.keys, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(mine.values, ref.values, atol=1e-4, rtol=1e-4)


def assert_draft_cache_is_a_fresh_prefill(drafter: Any, context: Sequence[int]) -> None:
    """A tree proposer's :class:`~decoders.common.tree_draft.TreeDrafter` after a step: its cache holds exactly
    ``context[:drafter.cached]`` (``context``: the prompt and every committed id; under a draft window, as
    :func:`~decoders.common.base.draft_view` shows it: the first ``SINK_TOKENS``, then from ``offset + SINK_TOKENS``
    on), equal to a fresh prefill of those ids (kept entries moved, not recomputed, must still be right)."""
    from decoders.common.base import SINK_TOKENS

    held = list(context[: drafter.cached])
    if drafter.offset:
        held = held[:SINK_TOKENS] + held[drafter.offset + SINK_TOKENS:]
    assert len(held) == drafter.cached - drafter.offset
    assert_cache_is_a_fresh_prefill(drafter.decoder.draft_model, drafter.cache, held)


def assert_tree_draft_keeps_the_accepted_kv(decoder: Any, prompts: Sequence[torch.Tensor], max_new: int) -> None:
    """A layer-by-layer tree decoder (its proposer has a ``draft``
    :class:`~decoders.common.tree_draft.TreeDrafter`) decodes ``prompts`` (each ``(1, prompt_len)`` ids) to vanilla's
    tokens; after every step the draft's cache equals a fresh prefill of what it claims to hold
    (:func:`assert_draft_cache_is_a_fresh_prefill`), and the accepted path's entries are kept, not recomputed: later
    steps' first draft forwards feed only what the draft has not seen."""
    from decoders.common.driver import decode

    checked = fed = 0
    for ids in prompts:
        proposer = decoder.proposer()
        step = proposer.accepted

        def accepted(context, tree, verdict, step=step, drafter=proposer.draft):
            nonlocal checked
            step(context, tree, verdict)
            assert_draft_cache_is_a_fresh_prefill(drafter, context)
            checked += 1

        proposer.accepted = accepted
        res = decode(decoder.target_model, proposer, ids, max_new, eos_token_ids=decoder.eos_token_ids,
                     sampling=decoder.sampling)
        fed += sum(s.draft_tokens_fed for s in res.steps[2:])
        vanilla = VanillaDecoder(decoder.target_model, eos_token_ids=decoder.eos_token_ids)
        assert res.token_ids == vanilla.generate(ids, max_new).token_ids
    assert checked > 10 and fed > 0
