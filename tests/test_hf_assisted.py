"""transformers' assisted generation wrapper: equal to vanilla, with counted target forwards."""

import pytest

from decoders.hf_assisted import HFAssistedDecoder
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
