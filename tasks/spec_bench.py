"""Spec-Bench (Xia et al. 2024, arXiv 2401.07851): the 480-question mixed speed benchmark of speculative
decoding, 6 subtasks x 80, asked through the chat template like MT-Bench; no automatic quality score.

Data: Spec-Bench's ``question.jsonl`` (pinned raw file of hemingkx/Spec-Bench) or a local copy
(``task.data_path``, or ``<data_dir>/spec_bench/question.jsonl``); see :mod:`tasks.data`. Subtasks:
multi-turn conversation (the 80 MT-Bench questions, ids 81..160, 2 turns each, their MT-Bench categories),
``translation``, ``summarization``, ``qa``, ``math_reasoning`` and ``rag`` (1 turn each). The question
text is used verbatim (e.g. "Translate German to English: ...", "Summarize: ..."), as Spec-Bench does.

Each sample's metadata carries ``category`` (the file's own) and ``subtask`` (``mt_bench`` for the
MT-Bench categories, else the category), which is how Spec-Bench reports speed. The multi-turn hook
(:meth:`turns`, :meth:`render_turn`) is :class:`tasks.mt_bench.MTBench`'s.
"""

from __future__ import annotations

from typing import Any

from tasks.data import DataSource
from tasks.mt_bench import MT_BENCH_CATEGORIES, MTBench

SPEC_BENCH_COMMIT = "fd2c1cd7d2201ef71db4c5f4e455008f017967bf"
SOURCE = DataSource(
    task="Spec-Bench", relpath="spec_bench/question.jsonl",
    url=f"https://raw.githubusercontent.com/hemingkx/Spec-Bench/{SPEC_BENCH_COMMIT}/data/spec_bench/question.jsonl",
)
SUBTASKS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")


def subtask_of(category: str) -> str:
    """Spec-Bench's reporting group for a question category (the MT-Bench categories -> ``mt_bench``)."""
    return "mt_bench" if category in MT_BENCH_CATEGORIES else category


class SpecBench(MTBench):
    """The Spec-Bench task: 480 questions (80 of them two-turn), chat template, timing only.

    Takes the arguments of :class:`tasks.mt_bench.MTBench` (``offset`` / ``limit`` select questions in file
    order, i.e. the MT-Bench ones first; ``categories`` takes categories or subtask names), with
    ``max_new_tokens`` 1024 per turn.
    """

    name = "spec_bench"
    version = "1.0"
    source = SOURCE

    def _metadata(self, row: dict[str, Any]) -> dict[str, Any]:
        return {**super()._metadata(row), "subtask": subtask_of(row["category"])}
