"""transformers' own assisted generation (``generate(..., assistant_model=draft)``), the external
reference a user would otherwise pick.

It runs transformers' code path, not :func:`decoders.common.forward.forward`, so it is a reference point,
not an algorithm comparison on equal footing. Forward hooks on both models count target and draft
forwards and the tokens fed to each, so its accept length (new tokens per target forward) is reported
like every other decoder's. The per-step accepted count is derived from how far the target's cache
position moved between verification forwards.
"""

from __future__ import annotations

import copy
from typing import Any, Iterable

import torch
from transformers import GenerationConfig, PreTrainedModel

from decoders.common.checks import check_input_ids
from decoders.common.stopping import check_max_new_tokens, truncate_at_stop
from decoders.types import DecodeResult, FirstTokenStreamer, StepRecord, Stopwatch


class _ForwardCounter:
    """Forward hook recording ``(first cache position, tokens fed)`` for each call of a model."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def __call__(self, module: Any, args: tuple, kwargs: dict) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        n = int(ids.shape[1]) if ids is not None else int(kwargs["inputs_embeds"].shape[1])
        pos = kwargs.get("position_ids")
        start = int(pos[0, 0]) if pos is not None else -1
        self.calls.append((start, n))


class HFAssistedDecoder:
    """Greedy assisted generation by transformers, with statistics recovered through hooks.

    Args:
        target_model: the model whose greedy output is reproduced.
        draft_model: the assistant model (same tokenizer).
        gamma: ``num_assistant_tokens``; ``None`` keeps transformers' default.
        num_assistant_tokens_schedule: ``"constant"``, ``"heuristic"`` or ``"heuristic_transient"``;
            ``None`` keeps transformers' default.
        assistant_confidence_threshold: early-stop threshold of the draft; ``None`` keeps the default.
        eos_token_ids: ids that end generation.
        tokenizer: the shared tokenizer; used only when the two configs' ``vocab_size`` differ (padded
            embeddings), where transformers requires universal assisted decoding.

    The assistant's generation config is restored before every call, so the heuristic schedule's state
    never leaks from one sample to the next (which would make speed depend on sample order).

    Raises:
        ValueError: if ``draft_model`` is missing or ``gamma < 1``.
    """

    name = "hf_assisted"

    def __init__(
        self,
        target_model: PreTrainedModel,
        draft_model: PreTrainedModel | None,
        gamma: int | None = None,
        num_assistant_tokens_schedule: str | None = None,
        assistant_confidence_threshold: float | None = None,
        eos_token_ids: Iterable[int] = (),
        tokenizer: Any = None,
        **_: object,
    ):
        if draft_model is None:
            raise ValueError("hf_assisted needs a draft model: choose a model pair with a draft")
        if gamma is not None and (not isinstance(gamma, int) or gamma < 1):
            raise ValueError(f"gamma (num_assistant_tokens) must be an integer >= 1 or null, got {gamma!r}")
        self.target_model = target_model
        self.draft_model = draft_model
        self.eos_token_ids = frozenset(eos_token_ids)
        # transformers decides "same tokenizer" by config.vocab_size; padded sizes may differ although the
        # tokenizer is shared (checked by harness.models), and then it insists on both tokenizers
        # (universal assisted decoding, which re-tokenizes text between the models).
        self._generate_kwargs: dict[str, Any] = {}
        if target_model.config.get_text_config().vocab_size != draft_model.config.get_text_config().vocab_size:
            if tokenizer is None:
                raise ValueError("target and draft vocab sizes differ: hf_assisted needs `tokenizer`")
            self._generate_kwargs = {"tokenizer": tokenizer, "assistant_tokenizer": tokenizer}
        self._draft_generation_config = copy.deepcopy(draft_model.generation_config)
        for key, value in (
            ("num_assistant_tokens", gamma),
            ("num_assistant_tokens_schedule", num_assistant_tokens_schedule),
            ("assistant_confidence_threshold", assistant_confidence_threshold),
        ):
            if value is not None:
                setattr(self._draft_generation_config, key, value)

    @torch.inference_mode()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, stopwatch: Stopwatch | None = None) -> DecodeResult:
        """Decode with ``target_model.generate(assistant_model=draft_model, do_sample=False)``; the stopwatch's
        ``first_token()`` is called through transformers' ``streamer`` when the first new tokens are accepted
        (after the draft's prefill and first draft, as transformers drafts before its first target forward)."""
        check_input_ids(input_ids)
        check_max_new_tokens(max_new_tokens)
        self.draft_model.generation_config = copy.deepcopy(self._draft_generation_config)
        gen_config = GenerationConfig(
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=sorted(self.eos_token_ids) or None,
            pad_token_id=min(self.eos_token_ids) if self.eos_token_ids else None,
        )
        target_hook, draft_hook = _ForwardCounter(), _ForwardCounter()
        handles = [
            self.target_model.register_forward_pre_hook(target_hook, with_kwargs=True),
            self.draft_model.register_forward_pre_hook(draft_hook, with_kwargs=True),
        ]
        try:
            output = self.target_model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                assistant_model=self.draft_model,
                generation_config=gen_config,
                streamer=FirstTokenStreamer(stopwatch) if stopwatch is not None else None,
                **self._generate_kwargs,
            )
        finally:
            for h in handles:
                h.remove()
        new = truncate_at_stop(output[0, input_ids.shape[1]:].tolist(), self.eos_token_ids, max_new_tokens)
        return DecodeResult(tuple(new), self._steps(target_hook.calls, draft_hook.calls, input_ids.shape[1], len(new)))

    @staticmethod
    def _steps(
        target_calls: list[tuple[int, int]], draft_calls: list[tuple[int, int]], prompt_len: int, new_tokens: int
    ) -> tuple[StepRecord, ...]:
        """Rebuild per-step records from the target's forward calls.

        Call ``i`` starts at cache position ``start_i`` and feeds ``fed_i`` tokens: the committed tokens
        its cache lacks (the whole prompt on the first call, the pending token later) followed by the
        candidates. After it, the sequence holds ``start_{i+1} + 1`` tokens (the next call re-feeds the
        last one), or the final length after the last call.
        """
        end = prompt_len + new_tokens
        steps = []
        committed = prompt_len
        for i, (start, fed) in enumerate(target_calls):
            after = target_calls[i + 1][0] + 1 if i + 1 < len(target_calls) else end
            emitted = max(0, after - committed)
            drafted = max(0, fed - (committed - start))
            accepted = max(0, min(drafted, emitted - 1))
            steps.append(StepRecord(target_tokens_fed=fed, emitted=emitted, drafted=drafted, accepted=accepted,
                                    source={"draft": accepted, "bonus": emitted - accepted}))
            committed = max(committed, after)  # transformers 5.x re-feeds the prompt from 0 after its prefill call
        if steps and draft_calls:
            # Draft forwards cannot be attributed to single steps from hooks; spread them evenly.
            total_fwd, total_fed, k = len(draft_calls), sum(n for _, n in draft_calls), len(steps)
            steps = [
                StepRecord(s.target_tokens_fed, s.emitted, s.drafted, s.accepted,
                           total_fwd // k + (j < total_fwd % k), total_fed // k + (j < total_fed % k), s.source)
                for j, s in enumerate(steps)
            ]
        return tuple(steps)
