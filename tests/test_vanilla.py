"""Vanilla greedy decoding equals transformers' ``generate(do_sample=False)``, token for token."""

import pytest
import torch

from decoders.vanilla import VanillaDecoder


def test_vanilla_equals_generate(target, eos_ids, prompt_ids):
    decoder = VanillaDecoder(target, eos_token_ids=eos_ids)
    for ids in prompt_ids:
        ours = decoder.generate(ids, 40)
        ref = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=40, do_sample=False,
                              eos_token_id=sorted(eos_ids), pad_token_id=min(eos_ids))
        assert list(ours.token_ids) == ref[0, ids.shape[1]:].tolist()
        assert ours.accept_length == 1.0
        assert ours.num_steps == ours.new_tokens


def test_vanilla_max_new_tokens_one(target, eos_ids, prompt_ids):
    result = VanillaDecoder(target, eos_token_ids=eos_ids).generate(prompt_ids[0], 1)
    assert result.new_tokens == 1 and result.num_steps == 1


@pytest.mark.parametrize("bad", [0, -3])
def test_vanilla_refuses_bad_length(target, prompt_ids, bad):
    with pytest.raises(ValueError, match="max_new_tokens"):
        VanillaDecoder(target).generate(prompt_ids[0], bad)


def test_vanilla_stops_at_eos(target, eos_ids, prompt_ids):
    full = VanillaDecoder(target, eos_token_ids=eos_ids).generate(prompt_ids[1], 30).token_ids
    stop = full[7]
    first = full.index(stop)
    cut = VanillaDecoder(target, eos_token_ids={stop}).generate(prompt_ids[1], 30).token_ids
    assert cut == full[: first + 1]
