"""What a decoder returns: :class:`StepRecord` (one target forward), :class:`DecodeResult` (one prompt),
and the :class:`Decoder` protocol.

It sits at the bottom of the project: it imports nothing of the project, and decoders, the runner and the
report build on it. Timing, text and file I/O do not live here -- decoders never see those (DESIGN.md 2b).
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
        emitted: tokens this step appended to the output, bonus token included (before EOS / length
            truncation is applied to the whole sequence).
        drafted: draft tokens proposed for verification in this step (0 for vanilla / prefill).
        accepted: draft tokens accepted in this step (``accepted <= drafted``).
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


@runtime_checkable
class Decoder(Protocol):
    """A lossless decoder for one prompt at a time (batch size 1).

    ``generate(input_ids, max_new_tokens)`` takes ``input_ids`` as a ``torch.LongTensor`` of shape
    ``(1, prompt_len)`` on the target model's device and returns a :class:`DecodeResult` whose
    ``token_ids`` equal vanilla greedy decoding's (exactly in float32). Decoders that keep state across
    prompts (an n-gram pool) expose ``reset()`` and declare their ``pool_scope``.

    Sampling: a decoder that can sample declares ``supports_sampling = True``, takes ``sampling`` (a
    ``decoders.common.sampling.SamplingConfig``) at construction and ``generator=`` (a ``torch.Generator``,
    its only source of randomness) in ``generate``; at temperature > 0 its output is distributed exactly as
    vanilla sampling's. Other decoders are refused for sampled runs.
    """

    name: str

    def generate(self, input_ids: Any, max_new_tokens: int) -> DecodeResult: ...
