"""The task contract: :class:`Sample` (one benchmark item) and the :class:`Task` protocol (after lm-eval's
Task). It imports nothing of the project; tasks and the runner build on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Protocol, Sequence


@dataclass(frozen=True)
class Sample:
    """One benchmark item.

    Attributes:
        sample_id: stable id within the task (e.g. ``HumanEval/0``).
        prompt: the prompt text (plain-text tasks) -- rendered by :meth:`Task.render`.
        reference: whatever scoring needs (tests, gold answer, reference summary).
        metadata: free-form extras (entry point, category, ...).
        messages: chat turns for chat-style tasks, when the task supplies them.
    """

    sample_id: str
    prompt: str
    reference: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)
    messages: Sequence[dict[str, str]] | None = None


class Task(Protocol):
    """A benchmark: samples, prompt rendering, stop sequences and scoring (after lm-eval's Task).

    Attributes:
        name, version: the task's name and version (bump ``version`` when prompts or scoring change).
        stop_sequences: text stop sequences applied to completions for scoring.
        max_new_tokens: the task's default generation budget.
        quality_columns: the keys :meth:`score` returns, i.e. the quality columns of result rows that the
            summary aggregates (``("pass@1",)``, ``("accuracy",)``, ``("rouge1", "rouge2", "rougeL",
            "rougeLsum")``; ``()`` for tasks without an automatic score).

    Optional members the runner and app use when present: ``stop_token_ids(tokenizer, chat) ->
    frozenset[int]`` (extra ids that end generation, e.g. the chat template's turn markers; added to the
    EOS ids), and the multi-turn hook ``turns(sample)`` / ``render_turn(...)`` (:mod:`tasks.mt_bench`).
    """

    name: str
    version: str
    stop_sequences: Sequence[str]
    max_new_tokens: int
    quality_columns: Sequence[str]

    def samples(self, limit: int | None = None) -> Iterator[Sample]: ...

    def render(self, sample: Sample, tokenizer: Any) -> str: ...

    def postprocess(self, sample: Sample, completion: str) -> str: ...

    def score(self, sample: Sample, completion: str) -> dict[str, float]: ...
