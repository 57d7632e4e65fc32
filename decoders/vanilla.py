"""Vanilla greedy decoding with a KV cache: the reference every other decoder must reproduce."""

from __future__ import annotations

from typing import Iterable

import torch
from transformers import PreTrainedModel

from decoders.common.checks import check_input_ids
from decoders.common.forward import forward, new_cache
from decoders.common.stopping import check_max_new_tokens, truncate_at_stop
from decoders.types import NULL_STOPWATCH, DecodeResult, StepRecord, Stopwatch


class VanillaDecoder:
    """Greedy decoding, one target forward per new token (the prompt's prefill is step 0).

    Args:
        target_model: the transformers causal LM to decode with.
        eos_token_ids: ids that end generation (see :func:`decoders.common.stopping.collect_eos_token_ids`).
    """

    name = "vanilla"

    def __init__(self, target_model: PreTrainedModel, eos_token_ids: Iterable[int] = (), **_: object):
        self.target_model = target_model
        self.eos_token_ids = frozenset(eos_token_ids)

    @torch.inference_mode()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, stopwatch: Stopwatch | None = None) -> DecodeResult:
        """Decode greedily.

        Args:
            input_ids: ``torch.LongTensor`` of shape ``(1, prompt_len)`` on the target's device.
            max_new_tokens: upper bound on new tokens, >= 1.
            stopwatch: the runner's timer; ``first_token()`` is called once the prefill gave the first token.

        Returns:
            :class:`DecodeResult` with ``accept_length`` exactly 1.0.

        Raises:
            ValueError: if ``max_new_tokens < 1``, the batch size is not 1 or the prompt is empty.
        """
        check_input_ids(input_ids)
        check_max_new_tokens(max_new_tokens)
        cache = new_cache(self.target_model)
        logits = forward(self.target_model, input_ids, cache, logits_to_keep=1)
        token = logits[:, -1:].argmax(-1)
        out = [int(token)]
        (stopwatch or NULL_STOPWATCH).first_token()
        steps = [StepRecord(target_tokens_fed=input_ids.shape[1], emitted=1, source={"bonus": 1})]
        while len(out) < max_new_tokens and out[-1] not in self.eos_token_ids:
            logits = forward(self.target_model, token, cache, logits_to_keep=1)
            token = logits[:, -1:].argmax(-1)
            out.append(int(token))
            steps.append(StepRecord(target_tokens_fed=1, emitted=1, source={"bonus": 1}))
        return DecodeResult(tuple(truncate_at_stop(out, self.eos_token_ids, max_new_tokens)), tuple(steps))
