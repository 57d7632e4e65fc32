"""Vanilla decoding with a KV cache: the reference every other decoder must reproduce.

Greedy (temperature 0): the argmax at every step; other decoders must produce exactly these tokens in
float32. Sampling (temperature > 0): each token is drawn from the target's processed distribution
(:meth:`decoders.common.sampling.SamplingConfig.probs`: transformers' temperature / top-k / top-p warpers),
the distribution every lossless sampling decoder must reproduce -- ancestral sampling, as transformers'
``generate(do_sample=True)`` does.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

import torch
from transformers import PreTrainedModel

from decoders.common.batch import BatchCache, check_batch, retire
from decoders.common.checks import check_input_ids
from decoders.common.forward import forward, new_cache
from decoders.common.sampling import GREEDY, SamplingConfig, argmax_ids, check_generator
from decoders.common.stopping import check_max_new_tokens, truncate_at_stop
from decoders.types import NULL_STOPWATCH, DecodeResult, StepRecord, Stopwatch


class VanillaDecoder:
    """One target forward per new token (the prompt's prefill is step 0).

    Args:
        target_model: the transformers causal LM to decode with.
        eos_token_ids: ids that end generation (see :func:`decoders.common.stopping.collect_eos_token_ids`).
        sampling: greedy (the default) or the sampling settings of the run.
    """

    name = "vanilla"
    draft_shape = "none"
    supports_sampling = True
    supports_batch = True

    def __init__(self, target_model: PreTrainedModel, eos_token_ids: Iterable[int] = (),
                 sampling: SamplingConfig = GREEDY):
        self.target_model = target_model
        self.eos_token_ids = frozenset(eos_token_ids)
        self.sampling = sampling

    def _next(self, logits: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """The next token, ``torch.LongTensor`` of shape ``(1, 1)`` on the logits' device, from the last
        position's logits ``(1, n, vocab_size)``."""
        if self.sampling.greedy:
            return argmax_ids(logits[:, -1:])
        return torch.multinomial(self.sampling.probs(logits[0, -1]), 1, generator=generator).view(1, 1)

    @torch.inference_mode()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, generator: torch.Generator | None = None,
                 stopwatch: Stopwatch | None = None) -> DecodeResult:
        """Decode greedily, or by sampling when the decoder's ``sampling`` has ``temperature > 0``.

        Args:
            input_ids: ``torch.LongTensor`` of shape ``(1, prompt_len)`` on the target's device.
            max_new_tokens: upper bound on new tokens, >= 1.
            generator: the ``torch.Generator`` (on the target's device) every random draw comes from; required
                when sampling, unused when greedy.
            stopwatch: the runner's timer; ``first_token()`` is called once the prefill gave the first token,
                ``mark(phase)`` after each host phase of a step (for the host-overhead profiler).

        Returns:
            :class:`DecodeResult` with ``accept_length`` exactly 1.0.

        Raises:
            ValueError: if ``max_new_tokens < 1``, the batch size is not 1, the prompt is empty, or sampling
                without a generator.
        """
        check_input_ids(input_ids)
        check_max_new_tokens(max_new_tokens)
        check_generator(self.sampling, generator)
        cache = new_cache(self.target_model)
        logits = forward(self.target_model, input_ids, cache, logits_to_keep=1)
        token = self._next(logits, generator)
        out = [int(token)]
        watch = stopwatch or NULL_STOPWATCH
        watch.first_token()
        steps = [StepRecord(target_tokens_fed=input_ids.shape[1], emitted=1, source={"bonus": 1})]
        while len(out) < max_new_tokens and out[-1] not in self.eos_token_ids:
            logits = forward(self.target_model, token, cache, logits_to_keep=1)
            watch.mark("forward")
            token = self._next(logits, generator)
            out.append(int(token))
            watch.mark("rule")
            steps.append(StepRecord(target_tokens_fed=1, emitted=1, source={"bonus": 1}))
            watch.mark("bookkeeping")
        return DecodeResult(tuple(truncate_at_stop(out, self.eos_token_ids, max_new_tokens)), tuple(steps))

    @torch.inference_mode()
    def generate_batch(self, input_ids: Sequence[torch.Tensor], max_new_tokens: int,
                       generators: Sequence[torch.Generator | None] | None = None, stopwatch: Stopwatch | None = None,
                       finished: Callable[[int], None] | None = None) -> list[DecodeResult]:
        """Decode a static batch, one target forward per step for every row still decoding (the batched reference:
        each row's tokens are :meth:`generate`'s for its prompt, and with the same generator its random draws too).

        Args:
            input_ids: ``B`` tensors, each ``torch.LongTensor`` of shape ``(1, prompt_len_b)`` on the target's device
                (lengths may differ: :class:`decoders.common.batch.BatchCache` pads and masks).
            max_new_tokens: upper bound on new tokens per row, >= 1.
            generators: sampling: one ``torch.Generator`` per row, the only source of that row's randomness.
            stopwatch: the batch's timer; ``first_token()`` after the batched prefill.
            finished: called with a row's index as soon as its last token is known (per-request latency).

        Returns:
            One :class:`DecodeResult` per prompt, in order.

        Raises:
            ValueError: as :func:`decoders.common.batch.check_batch`, or ``max_new_tokens < 1``.
        """
        gens = check_batch(input_ids, generators, self.sampling)
        check_max_new_tokens(max_new_tokens)
        watch = stopwatch or NULL_STOPWATCH
        prompts = [ids[0].tolist() for ids in input_ids]
        cache = BatchCache(self.target_model, len(prompts))
        blocks: list[list[int]] = prompts
        out: list[list[int]] = [[] for _ in prompts]
        steps = [[StepRecord(target_tokens_fed=len(p), emitted=1, source={"bonus": 1})] for p in prompts]
        active = list(range(len(prompts)))
        while active:
            logits, placed = cache.forward(blocks)
            watch.mark("forward")
            for i, r in enumerate(active):
                cache.append(i, placed[i])
                out[r].append(self.sampling.next_token(logits[i, -1], gens[r]))
                if len(out[r]) > 1:
                    steps[r].append(StepRecord(target_tokens_fed=1, emitted=1, source={"bonus": 1}))
            if blocks is prompts:
                watch.first_token()
            watch.mark("rule")
            active = retire(active, [len(out[r]) >= max_new_tokens or out[r][-1] in self.eos_token_ids
                                     for r in active], (cache,), finished)
            blocks = [[out[r][-1]] for r in active]
            watch.mark("bookkeeping")
        return [DecodeResult(tuple(truncate_at_stop(o, self.eos_token_ids, max_new_tokens)), tuple(s))
                for o, s in zip(out, steps)]
