"""One benchmark item, :class:`Sample`. It imports nothing of the project; the task base class
(:class:`tasks.base.Task`), the tasks and the runner build on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence


@dataclass(frozen=True)
class Sample:
    """One benchmark item.

    Attributes:
        sample_id: stable id within the task (e.g. ``HumanEval/0``).
        prompt: the prompt text (plain-text tasks) -- rendered by :meth:`tasks.base.Task.render`.
        reference: whatever scoring needs (tests, gold answer, reference summary).
        metadata: free-form extras (entry point, category, ...).
        messages: chat turns for chat-style tasks, when the task supplies them.
    """

    sample_id: str
    prompt: str
    reference: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)
    messages: Sequence[dict[str, str]] | None = None
