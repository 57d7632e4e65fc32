"""transformers' own ``generate``, the external references a user would otherwise pick: assisted generation
(``generate(..., assistant_model=draft)``, :class:`HFAssistedDecoder`) and plain greedy / sampled generation
(:class:`HFGreedyDecoder`, the ``hf_greedy`` reference that shows our vanilla is not handicapped).

They run transformers' code path, not :func:`decoders.common.forward.forward`, so they are reference points,
not algorithm comparisons on equal footing. Forward hooks count target and draft forwards and the tokens fed
to each, so accept length (new tokens per target forward) is reported like every other decoder's. The
per-step accepted count is derived from how far the target's cache position moved between verification
forwards.

Settings reach transformers explicitly, never by inheritance: during a call the target's (and draft's)
``generation_config`` is swapped for a neutral one that holds only their special token ids (restored
afterwards), so a checkpoint's own ``generation_config.json`` (e.g. a hub model's ``repetition_penalty`` or
``top_k=20``) cannot silently change the processing; the sampling fields come from
:meth:`decoders.common.sampling.SamplingConfig.generation_config_kwargs` (the same warpers as our decoders).
transformers samples from the global RNG; when sampling, each call runs inside ``torch.random.fork_rng``
seeded by a draw from the decoder's generator, so the global state is neither read nor changed.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterable, Iterator

import torch
from transformers import GenerationConfig, PreTrainedModel

from decoders.common.checks import check_input_ids
from decoders.common.sampling import GREEDY, SamplingConfig, check_generator
from decoders.common.stopping import check_max_new_tokens, truncate_at_stop
from decoders.types import DecodeResult, FirstTokenStreamer, StepRecord, Stopwatch
from decoders.settings import HFAssistedSettings
from declare import check_args



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


def neutral_generation_config(model: PreTrainedModel, **fields: Any) -> GenerationConfig:
    """A ``GenerationConfig`` with only ``model``'s special token ids (bos / eos / pad) plus ``fields``: what
    transformers fills in from it for unset fields is then its own neutral global defaults."""
    own = model.generation_config
    return GenerationConfig(bos_token_id=own.bos_token_id, eos_token_id=own.eos_token_id,
                            pad_token_id=own.pad_token_id, **fields)


def confidence_threshold(value: Any) -> float | None:
    """Normalise ``assistant_confidence_threshold``: ``None`` = transformers' default (0.4 in 5.x);
    ``0`` / ``"off"`` / ``False`` = early stop of drafting switched off (transformers adds its
    ``ConfidenceCriteria`` only for a threshold > 0); else a number in ``(0, 1]``.

    Raises:
        ValueError: on anything else.
    """
    if value is None:
        return None
    if value is False or (isinstance(value, str) and value.strip().lower() == "off"):
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError("assistant_confidence_threshold must be null (transformers' default), 0 or 'off' "
                         f"(switched off), or a number in (0, 1], got {value!r}")
    return float(value)


class _TransformersGenerate:
    """What both references share: the neutral configs, the RNG fork and the forward hooks."""

    supports_sampling = True

    def __init__(self, target_model: PreTrainedModel, eos_token_ids: Iterable[int], sampling: SamplingConfig):
        self.target_model = target_model
        self.eos_token_ids = frozenset(eos_token_ids)
        self.sampling = sampling

    def _generation_config(self, max_new_tokens: int) -> GenerationConfig:
        """The target's generation config of one call (tests may extend it)."""
        return GenerationConfig(
            max_new_tokens=max_new_tokens,
            eos_token_id=sorted(self.eos_token_ids) or None,
            pad_token_id=min(self.eos_token_ids) if self.eos_token_ids else None,
            **self.sampling.generation_config_kwargs(),
        )

    @contextlib.contextmanager
    def _call_state(self, device: torch.device, generator: torch.Generator | None,
                    configs: dict[PreTrainedModel, GenerationConfig]) -> Iterator[None]:
        """Install ``configs`` as the models' generation configs and, when sampling, a seeded forked RNG."""
        saved = {model: model.generation_config for model in configs}
        try:
            for model, config in configs.items():
                model.generation_config = config
            if self.sampling.greedy:
                yield
                return
            seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
            devices = [device.index if device.index is not None else torch.cuda.current_device()] \
                if device.type == "cuda" else []
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(seed)
                yield
        finally:
            for model, config in saved.items():
                model.generation_config = config

    def _run(self, input_ids: torch.Tensor, max_new_tokens: int, generator: torch.Generator | None,
             draft_model: PreTrainedModel | None, draft_config: GenerationConfig | None,
             generate_kwargs: dict[str, Any], stopwatch: Stopwatch | None
             ) -> tuple[list[int], _ForwardCounter, _ForwardCounter]:
        """One ``target_model.generate`` call under hooks that count forwards; the stopwatch's ``first_token()``
        is called through transformers' ``streamer`` when the first new tokens are known."""
        check_input_ids(input_ids)
        check_max_new_tokens(max_new_tokens)
        check_generator(self.sampling, generator)
        configs = {self.target_model: neutral_generation_config(self.target_model)}
        if draft_model is not None:
            configs[draft_model] = draft_config
        target_hook, draft_hook = _ForwardCounter(), _ForwardCounter()
        handles = [self.target_model.register_forward_pre_hook(target_hook, with_kwargs=True)]
        if draft_model is not None:
            handles.append(draft_model.register_forward_pre_hook(draft_hook, with_kwargs=True))
        try:
            with self._call_state(input_ids.device, generator, configs):
                output = self.target_model.generate(
                    input_ids,
                    attention_mask=torch.ones_like(input_ids),
                    generation_config=self._generation_config(max_new_tokens),
                    streamer=FirstTokenStreamer(stopwatch) if stopwatch is not None else None,
                    **generate_kwargs,
                )
        finally:
            for h in handles:
                h.remove()
        new = truncate_at_stop(output[0, input_ids.shape[1]:].tolist(), self.eos_token_ids, max_new_tokens)
        return new, target_hook, draft_hook


class HFAssistedDecoder(_TransformersGenerate):
    """Assisted generation by transformers, greedy or sampled, with statistics recovered through hooks.

    Greedy: the draft's argmax tokens are kept while they match the target's argmax. Sampling
    (``do_sample=True``): transformers' ``_speculative_sampling``, Algorithm 1 of Leviathan et al. 2023
    (arXiv 2211.17192) -- the same rule as :func:`decoders.common.verify.rejection_verify`, implemented by
    transformers -- with the draft sampling from its own processed distribution.

    Args:
        target_model: the model whose output (distribution) is reproduced.
        draft_model: the assistant model (same tokenizer).
        gamma: ``num_assistant_tokens`` (draft tokens per step, >= 1); ``None`` keeps transformers' default
            (20 in 5.x).
        num_assistant_tokens_schedule: ``"constant"``, ``"heuristic"`` or ``"heuristic_transient"``;
            ``None`` keeps transformers' default (``"constant"`` in 5.x).
        assistant_confidence_threshold: early stop of drafting when the draft's confidence in its token falls
            below it (self-adjusting during a call); ``None`` keeps transformers' default (0.4 in 5.x), ``0`` or
            ``"off"`` switches it off (see :func:`confidence_threshold`).
        eos_token_ids: ids that end generation.
        tokenizer: the shared tokenizer; used only when the two configs' ``vocab_size`` differ (padded
            embeddings), where transformers requires universal assisted decoding.
        sampling: greedy (the default) or the sampling settings of the run.

    The assistant's generation config is rebuilt before every call, so the heuristic schedule's state
    never leaks from one sample to the next (which would make speed depend on sample order).

    Raises:
        ValueError: if ``draft_model`` is missing or a knob is out of range.
    """

    name = "hf_assisted"
    draft_shape = "dynamic chain"

    def __init__(
        self,
        target_model: PreTrainedModel,
        draft_model: PreTrainedModel | None,
        gamma: int | None = HFAssistedSettings.gamma,
        num_assistant_tokens_schedule: str | None = HFAssistedSettings.num_assistant_tokens_schedule,
        assistant_confidence_threshold: float | str | None = HFAssistedSettings.assistant_confidence_threshold,
        eos_token_ids: Iterable[int] = (),
        tokenizer: Any = None,
        sampling: SamplingConfig = GREEDY,
    ):
        if draft_model is None:
            raise ValueError("hf_assisted needs a draft model: choose a model pair with a draft")
        check_args(HFAssistedSettings, dict(gamma=gamma, num_assistant_tokens_schedule=num_assistant_tokens_schedule))
        super().__init__(target_model, eos_token_ids, sampling)
        self.draft_model = draft_model
        # transformers decides "same tokenizer" by config.vocab_size; padded sizes may differ although the
        # tokenizer is shared (checked by harness.job.models), and then it insists on both tokenizers
        # (universal assisted decoding, which re-tokenizes text between the models).
        self._generate_kwargs: dict[str, Any] = {"assistant_model": draft_model}
        if target_model.config.get_text_config().vocab_size != draft_model.config.get_text_config().vocab_size:
            if not sampling.greedy:
                raise ValueError(
                    "hf_assisted cannot sample with this pair: target and draft vocab_size differ (padded embeddings), "
                    "and transformers 5.24 then samples through universal speculative decoding, which fails for a "
                    "shared tokenizer (AttributeError in AssistantToTargetTranslator; same root cause as "
                    "huggingface/transformers#45307) and prunes the draft's LM head in place. Use runner.temperature=0 "
                    "or a pair with equal vocab_size, or drop hf_assisted from a sampled run")
            if tokenizer is None:
                raise ValueError("target and draft vocab sizes differ: hf_assisted needs `tokenizer`")
            self._generate_kwargs.update(tokenizer=tokenizer, assistant_tokenizer=tokenizer)
        # transformers reads these knobs from the assistant's generation_config (AssistedCandidateGenerator);
        # unset ones get its global defaults.
        self.assistant_knobs = {
            key: value for key, value in (
                ("num_assistant_tokens", gamma),
                ("num_assistant_tokens_schedule", num_assistant_tokens_schedule),
                ("assistant_confidence_threshold", confidence_threshold(assistant_confidence_threshold)),
            ) if value is not None
        }

    @torch.inference_mode()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, generator: torch.Generator | None = None,
                 stopwatch: Stopwatch | None = None) -> DecodeResult:
        """Decode with ``target_model.generate(assistant_model=draft_model, do_sample=...)``; same contract as
        :meth:`decoders.vanilla.VanillaDecoder.generate`. The stopwatch's ``first_token()`` comes after the
        draft's prefill and first draft, since transformers drafts before its first target forward."""
        draft_config = neutral_generation_config(self.draft_model, **self.assistant_knobs)
        new, target_hook, draft_hook = self._run(input_ids, max_new_tokens, generator, self.draft_model,
                                                 draft_config, self._generate_kwargs, stopwatch)
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


class HFGreedyDecoder(_TransformersGenerate):
    """transformers' plain ``generate`` (no assistant): the ``hf_greedy`` reference for our vanilla decoder.

    Greedy at temperature 0 (``do_sample=False``); at temperature > 0, transformers' multinomial sampling with
    the same warpers. Same stop ids as every decoder; one step per target forward (counted by a hook).

    Args:
        target_model: the transformers causal LM.
        eos_token_ids: ids that end generation.
        sampling: greedy (the default) or the sampling settings of the run.
    """

    name = "hf_greedy"
    draft_shape = "none"

    def __init__(self, target_model: PreTrainedModel, eos_token_ids: Iterable[int] = (),
                 sampling: SamplingConfig = GREEDY):
        super().__init__(target_model, eos_token_ids, sampling)

    @torch.inference_mode()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, generator: torch.Generator | None = None,
                 stopwatch: Stopwatch | None = None) -> DecodeResult:
        """Decode with ``target_model.generate()``; same contract as
        :meth:`decoders.vanilla.VanillaDecoder.generate`. Step ``i`` records the tokens fed to the ``i``-th
        target forward and one emitted token (the last forward may be cut by the stop rule)."""
        new, target_hook, _ = self._run(input_ids, max_new_tokens, generator, None, None, {}, stopwatch)
        steps = tuple(StepRecord(target_tokens_fed=fed, emitted=1, source={"bonus": 1})
                      for _, fed in target_hook.calls)
        return DecodeResult(tuple(new), steps)
