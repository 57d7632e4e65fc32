"""transformers' assisted generation wrapper: equal to vanilla, with counted target forwards."""

import pytest

from decoders.hf_assisted import HFAssistedDecoder, HFGreedyDecoder
from decoders.vanilla import VanillaDecoder


@pytest.mark.parametrize("schedule", ["constant", "heuristic"])
def test_hf_assisted_equals_vanilla(schedule, target, noisy_draft, eos_ids, prompt_ids, tokenizer):
    decoder = HFAssistedDecoder(target, noisy_draft, gamma=4, num_assistant_tokens_schedule=schedule,
                                assistant_confidence_threshold=0.0, eos_token_ids=eos_ids, tokenizer=tokenizer)
    vanilla = VanillaDecoder(target, eos_token_ids=eos_ids)
    for ids in prompt_ids[:6]:
        result = decoder.generate(ids, 30)
        assert result.token_ids == vanilla.generate(ids, 30).token_ids
        # Every emitted token is accounted for by the target forwards counted through the hook.
        assert sum(s.emitted for s in result.steps) == result.new_tokens
        assert result.num_steps < result.new_tokens or result.new_tokens <= 2
        if schedule == "constant":
            assert all(s.drafted <= 4 for s in result.steps)


def test_hf_assisted_state_does_not_leak(target, noisy_draft, eos_ids, prompt_ids):
    """The heuristic schedule's num_assistant_tokens is restored before each call."""
    decoder = HFAssistedDecoder(target, noisy_draft, gamma=3, num_assistant_tokens_schedule="heuristic",
                                eos_token_ids=eos_ids)
    first = decoder.generate(prompt_ids[2], 30)
    decoder.generate(prompt_ids[8], 30)
    again = decoder.generate(prompt_ids[2], 30)
    assert [s.target_tokens_fed for s in first.steps] == [s.target_tokens_fed for s in again.steps]


# --- tuning knobs reach transformers -------------------------------------------------------

def _drafted(result):
    """Drafted tokens per target forward (transformers drafts before its first forward too)."""
    return [s.drafted for s in result.steps]


@pytest.mark.parametrize("off", [0, 0.0, "off", False])
def test_confidence_threshold_can_be_switched_off(off, target, other_draft, eos_ids, prompt_ids):
    """An unrelated draft is never confident: transformers' default threshold (0.4) stops drafting after one
    token; switched off, every step drafts the full num_assistant_tokens."""
    default = HFAssistedDecoder(target, other_draft, gamma=4, num_assistant_tokens_schedule="constant")
    disabled = HFAssistedDecoder(target, other_draft, gamma=4, num_assistant_tokens_schedule="constant",
                                 assistant_confidence_threshold=off)
    assert disabled.assistant_knobs["assistant_confidence_threshold"] == 0.0
    ids = prompt_ids[1]
    assert set(_drafted(default.generate(ids, 30))[:-1]) == {1}
    assert set(_drafted(disabled.generate(ids, 30))[:-4]) == {4}  # the last steps are cut by max_new_tokens


def test_num_assistant_tokens_and_schedule_reach_transformers(target, eos_ids, prompt_ids):
    """With a copy of the target as draft every draft is accepted: "constant" keeps gamma, "heuristic" adds 2
    per step. (A copy: the forward hooks must tell the two models apart.)"""
    import copy

    same = copy.deepcopy(target)
    ids = prompt_ids[0]
    constant = HFAssistedDecoder(target, same, gamma=2, num_assistant_tokens_schedule="constant",
                                 assistant_confidence_threshold=0)
    assert set(_drafted(constant.generate(ids, 40))[:-1]) == {2}
    heuristic = HFAssistedDecoder(target, same, gamma=2, num_assistant_tokens_schedule="heuristic",
                                  assistant_confidence_threshold=0)
    assert _drafted(heuristic.generate(ids, 40))[:4] == [2, 4, 6, 8]


def test_generation_config_used_during_the_call(target, noisy_draft, prompt_ids):
    """The assistant's generation config seen by transformers holds exactly the configured knobs; both
    models' own configs are back in place afterwards."""
    seen = []
    handle = noisy_draft.register_forward_pre_hook(lambda module, args: seen.append(module.generation_config))
    before = (target.generation_config, noisy_draft.generation_config)
    try:
        HFAssistedDecoder(target, noisy_draft, gamma=3, num_assistant_tokens_schedule="heuristic_transient",
                          assistant_confidence_threshold="off").generate(prompt_ids[0], 8)
    finally:
        handle.remove()
    used = seen[0]
    assert (used.num_assistant_tokens, used.num_assistant_tokens_schedule, used.assistant_confidence_threshold) == (
        3, "heuristic_transient", 0.0)
    assert (target.generation_config, noisy_draft.generation_config) == before
    seen.clear()
    handle = noisy_draft.register_forward_pre_hook(lambda module, args: seen.append(module.generation_config))
    try:  # null keeps transformers' own defaults (nothing set on the assistant's config)
        HFAssistedDecoder(target, noisy_draft).generate(prompt_ids[0], 4)
    finally:
        handle.remove()
    assert (seen[0].num_assistant_tokens, seen[0].assistant_confidence_threshold) == (None, None)


def test_checkpoint_generation_config_does_not_leak(target, noisy_draft, eos_ids, prompt_ids, tokenizer):
    """A hub checkpoint's generation_config.json (repetition_penalty, top_k ...) changes neither reference."""
    import copy

    hub_target = copy.deepcopy(target)
    hub_target.generation_config.repetition_penalty = 5.0
    hub_target.generation_config.no_repeat_ngram_size = 2
    vanilla = VanillaDecoder(target, eos_token_ids=eos_ids)
    for decoder in (HFGreedyDecoder(hub_target, eos_ids),
                    HFAssistedDecoder(hub_target, noisy_draft, gamma=3, eos_token_ids=eos_ids, tokenizer=tokenizer)):
        for ids in prompt_ids[:4]:
            assert decoder.generate(ids, 24).token_ids == vanilla.generate(ids, 24).token_ids
    assert hub_target.generation_config.repetition_penalty == 5.0  # restored


@pytest.mark.parametrize("kwargs", [{"num_assistant_tokens_schedule": "linear"},
                                    {"assistant_confidence_threshold": 1.5},
                                    {"assistant_confidence_threshold": "on"},
                                    {"gamma": 0}])
def test_bad_knobs_refused(kwargs, target, noisy_draft):
    with pytest.raises(ValueError):
        HFAssistedDecoder(target, noisy_draft, **kwargs)


def test_sampling_with_padded_vocabularies_refused(target, tokenizer):
    """transformers 5.24 routes sampled assisted generation of a pair with different vocab_size through
    universal speculative decoding, which fails for a shared tokenizer (and prunes the draft's LM head in
    place): refused at construction rather than crashing mid-run or altering the draft."""
    from decoders.common.sampling import SamplingConfig
    from harness.job.models import build_tiny_random
    from conftest import TINY

    padded = build_tiny_random(dict(TINY, vocab_size=len(tokenizer) + 4), seed=1, vocab_size=len(tokenizer))
    HFAssistedDecoder(target, padded, tokenizer=tokenizer)  # greedy: fine
    with pytest.raises(ValueError, match="vocab_size.*temperature"):
        HFAssistedDecoder(target, padded, tokenizer=tokenizer, sampling=SamplingConfig(0.7))


def test_hf_greedy_equals_vanilla(target, eos_ids, prompt_ids):
    """transformers' own greedy generate and our vanilla: the same tokens, one target forward per token."""
    hf, vanilla = HFGreedyDecoder(target, eos_ids), VanillaDecoder(target, eos_token_ids=eos_ids)
    for ids in prompt_ids:
        result = hf.generate(ids, 30)
        assert result.token_ids == vanilla.generate(ids, 30).token_ids
        assert result.num_steps == result.new_tokens and result.accept_length == 1.0
