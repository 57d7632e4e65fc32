"""The state the runner carries through the turns of one sample and repeat: which decoders run in which order,
each decoder's conversation so far, vanilla's reference outputs and the quality scores already computed.

Rules (docs/measurement.md, "How cells are measured", *Conversations*): turn k > 0 of a multi-turn sample
carries the decoder's own earlier answers. When an earlier turn of a decoder has no answer (``error``,
``prompt_too_long``, ``empty_prompt``, or itself skipped), its later turns are not run: they would be asked with
another history than vanilla's and paired with vanilla's answer. They get ``status=skipped`` and a ``reason``
naming the turn and why. When vanilla's earlier turn has no answer, every decoder's later turns are skipped the
same way (there is no reference conversation to pair them with).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tasks.types import Sample

#: vanilla's output of one turn: its new token ids and the ``attempt_id`` of the process that produced them.
Reference = tuple[tuple[int, ...], str | None]


@dataclass
class Conversation:
    """One sample in one repeat, as :meth:`harness.job.runner.Runner._run_turn` runs it turn after turn.

    Attributes:
        sample: the task's sample.
        index: its position in the run's selection (``sample_index``; the rotation and the shard rule use it).
        repeat: the repeat (0..``runner.repeats``-1).
        order: the decoder names in the order they run on this sample and repeat
            (:func:`harness.job.run_settings.decoder_order`).
        done: ``(decoder, turn)`` cells of this repeat already done in the folder (resume): not run again.
        refs: turn -> vanilla's :data:`Reference`; shared by every repeat of the sample (vanilla greedy is
            deterministic, so any repeat is the reference) and filled from the folder on resume.
        scores: turn -> completion -> quality scores; shared by every repeat of the sample so that each distinct
            completion is scored once.
        answers: decoder -> its completion text of each turn so far (``""`` for a turn without an answer): the
            history its next turn is asked with.
        lost: decoder -> the first turn of its conversation without an answer and why (``"turn 0 error (...)"``).
    """

    sample: Sample
    index: int
    repeat: int
    order: list[str]
    done: set[tuple[str, int]]
    refs: dict[int, Reference]
    scores: dict[int, dict[str, dict[str, Any]]]
    answers: dict[str, list[str]] = field(default_factory=dict)
    lost: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in self.order:
            self.answers.setdefault(name, [])

    def answer(self, name: str, completion: str) -> None:
        """Record ``name``'s answer of the current turn (the history of its next turn)."""
        self.answers[name].append(completion)

    def no_answer(self, name: str, why: str) -> None:
        """Record that ``name`` has no answer on the current turn; ``why`` (``"turn 1 prompt_too_long"``) is kept
        as the reason its later turns are skipped, unless an earlier turn already broke its conversation."""
        self.answers[name].append("")
        self.lost.setdefault(name, why)

    def broken_history(self, name: str, turn: int) -> str | None:
        """Why turn ``turn`` of ``name`` must not run (an earlier turn of its conversation, or of vanilla's, has
        no answer), or ``None``."""
        if turn == 0:
            return None
        if name in self.lost:
            return (f"an earlier turn of this conversation has no answer ({self.lost[name]}): turn {turn} would be "
                    "asked with another history than vanilla's, so it is not run")
        if "vanilla" in self.lost:
            return (f"vanilla's conversation has no answer at an earlier turn ({self.lost['vanilla']}): there is no "
                    f"reference for turn {turn} to pair this decoder with, so it is not run")
        return None
