"""What a decoder returns: :class:`StepRecord` (one target forward), :class:`DecodeResult` (one prompt),
the :class:`Decoder` protocol, and the :class:`Stopwatch` hook through which the runner times a decoder.

It sits at the bottom of the project: it imports nothing of the project, and decoders, the runner and the
report build on it. Timing, text and file I/O do not live here -- decoders never see those (docs/measurement.md,
"How cells are measured").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class StepRecord:
    """Statistics of one target forward pass (prefill included as step 0).

    Attributes:
        target_tokens_fed: tokens fed to the target forward (prompt length for prefill, gamma + 1 for a
            speculative verification step, 1 for a vanilla decode step).
        emitted: tokens this step appended to the output, bonus token included; tokens after an EOS id are
            not counted (a step whose accepted draft holds an EOS id emits up to and including it), so the
            steps' ``emitted`` add up to ``DecodeResult.new_tokens``.
        drafted: draft tokens proposed for verification in this step (0 for vanilla / prefill).
        accepted: draft tokens accepted and kept in this step (``accepted <= drafted``, ``accepted <= emitted``).
        draft_forwards: forward passes of the draft model spent preparing this step.
        draft_tokens_fed: tokens fed to the draft model over those forwards.
        source: where accepted tokens came from, e.g. ``{"draft": 3, "bonus": 1}``; free-form per decoder.
    """

    target_tokens_fed: int
    emitted: int
    drafted: int = 0
    accepted: int = 0
    draft_forwards: int = 0
    draft_tokens_fed: int = 0
    source: dict[str, int] | None = None


@dataclass(frozen=True)
class DecodeResult:
    """What every decoder returns for one prompt.

    Attributes:
        token_ids: the new tokens only (prompt excluded), truncated by the shared stop rule
            (:func:`decoders.common.stopping.truncate_at_stop`): at ``max_new_tokens`` and just after the
            first end-of-sequence id, which is kept.
        steps: one :class:`StepRecord` per target forward, prefill first.
        extra: decoder-specific scalar statistics (e.g. ``draft_time_s``); copied into result rows.
    """

    token_ids: tuple[int, ...]
    steps: tuple[StepRecord, ...]
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_steps(self) -> int:
        """Target forward passes, prefill included."""
        return len(self.steps)

    @property
    def accept_length(self) -> float:
        """Mean new tokens per target forward, bonus token included (vanilla: exactly 1.0)."""
        return self.new_tokens / self.num_steps if self.steps else 0.0

    @property
    def num_drafted(self) -> int:
        return sum(s.drafted for s in self.steps)

    @property
    def num_accepted(self) -> int:
        return sum(s.accepted for s in self.steps)

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted draft tokens / drafted tokens, or ``None`` when nothing was drafted."""
        drafted = self.num_drafted
        return self.num_accepted / drafted if drafted else None

    @property
    def draft_forwards(self) -> int:
        return sum(s.draft_forwards for s in self.steps)

    @property
    def target_tokens_fed(self) -> int:
        return sum(s.target_tokens_fed for s in self.steps)

    def summary(self) -> dict[str, Any]:
        """Flat per-sample statistics for a result row (no timing, no text)."""
        decode_steps = self.steps[1:]
        return {
            "new_tokens": self.new_tokens,
            "num_steps": self.num_steps,
            "accept_length": self.accept_length,
            "num_drafted": self.num_drafted,
            "num_accepted": self.num_accepted,
            "acceptance_rate": self.acceptance_rate,
            "draft_forwards": self.draft_forwards,
            "draft_tokens_fed": sum(s.draft_tokens_fed for s in self.steps),
            "draft_forwards_per_step": (
                sum(s.draft_forwards for s in decode_steps) / len(decode_steps) if decode_steps else 0.0
            ),
            "target_tokens_fed_per_step": (
                sum(s.target_tokens_fed for s in decode_steps) / len(decode_steps) if decode_steps else 0.0
            ),
            # Per-step lists only where something was drafted (vanilla's would be all zeros).
            "accepted_per_step": [s.accepted for s in decode_steps] if self.num_drafted else None,
            "drafted_per_step": [s.drafted for s in decode_steps] if self.num_drafted else None,
            **self.extra,
        }


class Stopwatch(Protocol):
    """The runner's timer, handed to :meth:`Decoder.generate`. Decoders mark events; they never read a clock.

    The runner starts it right before ``generate`` and stops it right after (device synchronized); what a
    decoder reports through it becomes row columns (time to first token, decode-only tokens/s, phase times).
    """

    def first_token(self, tokens: int = 1) -> None:
        """Mark that the first new token is known. Called once per ``generate``, as soon as it is known
        (after the target's prefill for this project's decoders). ``tokens``: new tokens known at that moment
        (1, except for a decoder whose first emission holds several: transformers' assisted generation
        verifies its first draft with its prefill). Later calls are ignored."""

    def lap(self, phase: str) -> None:
        """Charge the time since the previous mark (``lap`` or the start) to ``phase`` (e.g. ``"draft"``,
        ``"verify"``); for decoders that report a time split."""

    def mark(self, phase: str) -> None:
        """End a fine-grained host phase of a step (``"propose"``, ``"inputs"``, ``"forward"``, ``"rule"``,
        ``"cache"``, ``"update"``, ``"bookkeeping"``: :data:`harness.job.overhead.PHASES`). The runner's stopwatch
        ignores marks (no clock read, no device sync: they cost a timed run nothing); the host-overhead
        profiler (:class:`harness.job.overhead.PhaseProfiler`) charges the time since the previous mark to it."""


class _NullStopwatch:
    """A :class:`Stopwatch` that does nothing (``generate`` called without one)."""

    def first_token(self, tokens: int = 1) -> None:
        pass

    def lap(self, phase: str) -> None:
        pass

    def mark(self, phase: str) -> None:
        pass


#: Used when ``generate`` gets no stopwatch, so decoders need no ``if stopwatch`` branches.
NULL_STOPWATCH: Stopwatch = _NullStopwatch()


class FirstTokenStreamer:
    """Adapter from transformers' streamer protocol to :meth:`Stopwatch.first_token`.

    ``GenerationMixin.generate(streamer=...)`` calls ``put(prompt_ids)`` first, then ``put(new_ids)`` each time
    tokens are accepted, then ``end()``; the second ``put`` holds the first new tokens (several at once in
    assisted generation: passed on as ``first_token(tokens=...)``).
    """

    def __init__(self, stopwatch: Stopwatch):
        self.stopwatch = stopwatch
        self.calls = 0

    def put(self, value: Any) -> None:
        self.calls += 1
        if self.calls == 2:
            self.stopwatch.first_token(tokens=max(1, int(getattr(value, "numel", lambda: 1)())))

    def end(self) -> None:
        pass


@runtime_checkable
class Decoder(Protocol):
    """A lossless decoder for one prompt at a time (batch size 1).

    ``generate(input_ids, max_new_tokens, stopwatch=None)`` takes ``input_ids`` as a ``torch.LongTensor`` of
    shape ``(1, prompt_len >= 1)`` on the target model's device and returns a :class:`DecodeResult` whose
    ``token_ids`` equal vanilla greedy decoding's (exactly in float32). It calls ``stopwatch.first_token()``
    once, when the first new token is known (a draft model's prefill that a decoder runs after it is timed by
    the runner and moved to the prefill side: :class:`harness.job.timing.Stopwatch`). Decoders that keep state
    across prompts (an n-gram pool) expose ``reset()`` and declare their ``pool_scope``.

    Sampling: a decoder that can sample declares ``supports_sampling = True``, takes ``sampling`` (a
    ``decoders.common.sampling.SamplingConfig``) at construction and ``generator=`` (a ``torch.Generator``,
    its only source of randomness) in ``generate``; at temperature > 0 its output is distributed exactly as
    vanilla sampling's. Other decoders are refused for sampled runs.

    ``draft_shape`` says what a step verifies, for the report's theory column (Leviathan et al.'s eq. 1 models
    only ``"chain"``: a fixed number of draft tokens in a line): ``"none"``, ``"chain"``, ``"dynamic chain"``
    (a draft length that changes per step), ``"tree"``, ``"phrases"`` (Ouroboros), ``"n-grams"`` (Lookahead's
    guesses) or ``"copy"`` (tokens copied from the context).
    """

    name: str
    draft_shape: str

    def generate(self, input_ids: Any, max_new_tokens: int, stopwatch: Stopwatch | None = None) -> DecodeResult: ...
