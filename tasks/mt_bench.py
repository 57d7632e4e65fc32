"""MT-Bench (Zheng et al. 2023, arXiv 2306.05685): 80 two-turn questions in 8 categories, asked through the
target model's chat template; a speed benchmark here, with no automatic quality score.

Data: FastChat's ``question.jsonl`` (pinned raw file of lm-sys/FastChat) or a local copy (``task.data_path``,
or ``<data_dir>/mt_bench/question.jsonl``); see :mod:`tasks.data`. Fields: ``question_id`` (81..160),
``category``, ``turns`` (the user messages), optional ``reference``.

Multi-turn protocol (the runner's hook; single-turn tasks do not define it):

* :meth:`MTBench.turns` gives the number of user turns of a sample (2 for MT-Bench).
* :meth:`MTBench.render_turn` gives the full prompt for turn ``k`` given the answers to turns ``0..k-1``:
  the conversation ``user, assistant, user, ...`` with those answers as assistant messages, ending with
  the assistant opener. The runner decodes turn 0, then renders turn 1 with *that decoder's own* turn-0
  answer (as FastChat's ``gen_model_answer`` and Spec-Bench do), and records one row per
  (sample, turn, decoder). :meth:`MTBench.render` is turn 0, so a runner without the hook still runs the
  first turns.

Prompt styles: ``chat`` renders with the tokenizer's chat template (an optional ``system_prompt`` first);
``completion`` (base models, no template) renders a Vicuna-style plain transcript::

    {system_prompt}

    USER: {turn 1}
    ASSISTANT: {answer 1}
    USER: {turn 2}
    ASSISTANT:

Stops: in chat style generation also ends at the chat template's turn markers (:meth:`stop_token_ids`,
derived from the template by :func:`tasks.base.chat_turn_markers`: ``<|im_end|>`` and ``<|im_start|>`` for
ChatML), so a model that goes on with ``<|im_start|>user ...`` after its answer stops there and the fake user
turn never reaches the turn-2 prompt (the marker is a special token, dropped when the answer is decoded).
Answers put back into the conversation are stripped (and, in completion style, cut at the next
``USER:``), as FastChat strips its outputs.

Selection: ``offset`` skips the first questions (after ``categories``) and ``limit`` keeps the next ones;
sample ids (``mt_bench/<question_id>``) do not change with the selection. Quality (the LLM-as-judge score) is out of scope: ``score``
returns ``{}`` and ``quality_columns`` is empty.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterator, List, Optional, Sequence

from declare import at_least, setting
from tasks.types import Sample
from tasks.base import Task, TaskSettings, cut_at_stop, select_slice
from tasks.data import DataSource, load_records, require_fields

FASTCHAT_COMMIT = "0e6d3e4beaab66f4d3f93db72541a4abab8af28d"
SOURCE = DataSource(
    task="MT-Bench", relpath="mt_bench/question.jsonl",
    url=f"https://raw.githubusercontent.com/lm-sys/FastChat/{FASTCHAT_COMMIT}/fastchat/llm_judge/data/mt_bench/"
        "question.jsonl",
)


@dataclass
class MTBenchSettings(TaskSettings):
    """MT-Bench's settings (Zheng et al. 2023, arXiv 2306.05685): questions of FastChat's file, no automatic score."""

    data_dir: Optional[str] = setting(None, None, "shared data folder holding <task>/question.jsonl")
    source_url: Optional[str] = setting(None, None, "download URL of question.jsonl (null: the task's pinned one)")
    max_new_tokens: int = setting(1024, at_least(1), "default budget per turn (runner.max_new_tokens wins)")
    system_prompt: Optional[str] = setting(None, None, "system prompt of chat renders (null: the template's own)")
    categories: Optional[List[str]] = setting(None, None, "only these question categories (Spec-Bench: or "
                                                             "subtasks; null: all)")
    max_turns: Optional[int] = setting(None, at_least(1), "turns per question (null: all)")


#: The Vicuna v1.1 system prompt, used by the plain-text (completion) transcript.
PLAIN_SYSTEM_PROMPT = (
    "A chat between a curious user and an artificial intelligence assistant. The assistant gives helpful, "
    "detailed, and polite answers to the user's questions."
)
USER, ASSISTANT = "USER:", "ASSISTANT:"
STOP_SEQUENCES = ("\n" + USER,)
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")


class MTBench(Task, settings=MTBenchSettings):
    """The MT-Bench task: 80 questions, 2 turns each, chat template, timing only.

    Args:
        data_path: a local ``question.jsonl`` or a folder holding it; ``None`` uses ``data_dir`` or the
            pinned FastChat file.
        data_dir: the shared data folder (``<data_dir>/mt_bench/question.jsonl``); ``None`` = not used.
        limit: keep ``limit`` questions after ``offset`` (``None`` = all 80); each yields ``turns`` rows per
            decoder.
        offset: skip the first ``offset`` questions (>= 0), counted after ``categories`` is applied.
        max_new_tokens: default generation budget per turn.
        prompt_style: ``auto`` (chat template for instruct models), ``chat`` or ``completion``.
        system_prompt: a system message put first in chat style (``None`` = none, the template's default
            applies); in completion style the transcript's header (``None`` = the Vicuna v1.1 one).
        categories: keep only questions of these categories (``None`` = all); for Spec-Bench a subtask name
            (e.g. ``mt_bench``, ``translation``) works too.
        max_turns: ask at most this many turns per question (``None`` = all; 1 = first turns only).
        source_url: the public question file used when no local copy is configured.

    Raises:
        DataNotFoundError: at construction, when the data can be read neither locally nor from the URL.
        ValueError: a bad setting, or categories that match no question.
    """

    name = "mt_bench"
    version = "1.0"
    stop_sequences: tuple[str, ...] = ()
    quality_columns: tuple[str, ...] = ()
    source = SOURCE

    def _load(self) -> None:
        source = replace(self.source, url=self.source_url) if self.source_url else self.source
        rows, self.origin = load_records(source, self.data_path, self.data_dir)
        require_fields(rows, ("question_id", "category", "turns"), self.origin)
        categories = self.categories
        if categories is not None:
            if isinstance(categories, str):
                categories = [categories]
            wanted = set(categories)
            groups = [self._groups(r) for r in rows]
            known = sorted(set().union(*groups)) if groups else []
            unknown = sorted(wanted - set(known))
            if unknown:
                raise ValueError(f"task.categories {unknown} match no question; categories in {self.origin}: {known}")
            rows = [r for r, g in zip(rows, groups) if g & wanted]
        self._questions = select_slice(rows, self.offset, None, "questions")

    # ------------------------------------------------------------------------------------------------
    def _metadata(self, row: dict[str, Any]) -> dict[str, Any]:
        return {"question_id": int(row["question_id"]), "category": row["category"]}

    def _groups(self, row: dict[str, Any]) -> set[str]:
        """The names ``categories`` can select a question by (its category, and a subtask where defined)."""
        meta = self._metadata(row)
        return {str(meta[k]) for k in ("category", "subtask") if k in meta}

    def samples(self, limit: int | None = None) -> Iterator[Sample]:
        limit = limit if limit is not None else self.limit
        for row in self._questions[:limit]:
            turns = list(row["turns"])[: self.max_turns]
            yield Sample(
                sample_id=f"{self.name}/{row['question_id']}",
                prompt=turns[0],
                reference=row.get("reference"),
                metadata={**self._metadata(row), "num_turns": len(turns)},
                messages=tuple({"role": "user", "content": t} for t in turns),
            )

    def turns(self, sample: Sample) -> int:
        """Number of user turns of ``sample`` (2 for MT-Bench; 1 for most Spec-Bench items)."""
        return len(sample.messages) if sample.messages else 1

    def clean_answer(self, answer: str, chat: bool) -> str:
        """An answer as it is put back into the conversation: stripped (cut at ``USER:`` in completion style)."""
        if not chat:
            answer = cut_at_stop(answer, STOP_SEQUENCES)
        return answer.strip()

    def conversation(self, sample: Sample, turn_index: int, previous_answers: Sequence[str],
                     chat: bool = True) -> list[dict[str, str]]:
        """The messages for turn ``turn_index``: user turns 0..k with the previous answers between them.

        Args:
            sample: a sample from :meth:`samples`.
            turn_index: which user turn to ask (0-based).
            previous_answers: the model's answers to turns ``0..turn_index-1``, in order (exactly that many).
            chat: the prompts go through the chat template (answers are cleaned accordingly).

        Raises:
            ValueError: ``turn_index`` out of range, or the wrong number of previous answers.
        """
        users = list(sample.messages) if sample.messages else [{"role": "user", "content": sample.prompt}]
        if not 0 <= turn_index < len(users):
            raise ValueError(f"{sample.sample_id} has {len(users)} turn(s); turn_index {turn_index} is out of range")
        if len(previous_answers) != turn_index:
            raise ValueError(f"turn {turn_index} of {sample.sample_id} needs the {turn_index} previous answer(s), "
                             f"got {len(previous_answers)}")
        messages: list[dict[str, str]] = []
        for k in range(turn_index):
            messages.append(dict(users[k]))
            messages.append({"role": "assistant", "content": self.clean_answer(previous_answers[k], chat)})
        messages.append(dict(users[turn_index]))
        return messages

    def render_turn(self, sample: Sample, tokenizer: Any, chat: bool, turn_index: int,
                    previous_answers: Sequence[str]) -> str:
        """The full prompt text for turn ``turn_index``, previous answers in the conversation.

        Args:
            sample: a sample from :meth:`samples`.
            tokenizer: the target model's tokenizer (its chat template in chat style).
            chat: through the tokenizer's chat template (:meth:`uses_chat`), else a plain transcript.
            turn_index: which user turn to ask (0-based); ``0 <= turn_index < turns(sample)``.
            previous_answers: this decoder's decoded answers to turns ``0..turn_index-1`` (raw decoded text;
                cleaned here).

        Returns:
            The prompt, ending where the assistant's answer to ``turn_index`` begins.

        Raises:
            ValueError: bad ``turn_index`` / ``previous_answers``, or chat style with a tokenizer that has no
                chat template.
        """
        messages = self.conversation(sample, turn_index, previous_answers, chat)
        if chat:
            if getattr(tokenizer, "chat_template", None) is None:
                raise ValueError(f"task {self.name}: prompt_style={self.prompt_style!r} needs a chat template but the "
                                 "tokenizer has none; use task.prompt_style=completion (plain transcript) or an "
                                 "instruct model")
            if self.system_prompt:
                messages = [{"role": "system", "content": self.system_prompt}] + messages
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return plain_transcript(messages, self.system_prompt or PLAIN_SYSTEM_PROMPT)

    def render(self, sample: Sample, tokenizer: Any, chat: bool) -> str:
        """Turn 0's prompt (what a single-turn runner asks)."""
        return self.render_turn(sample, tokenizer, chat, 0, [])

    def postprocess(self, sample: Sample, completion: str, chat: bool) -> str:
        """The answer as kept in the conversation (see :meth:`clean_answer`)."""
        return self.clean_answer(completion, chat)


def plain_transcript(messages: Sequence[dict[str, str]], system_prompt: str) -> str:
    """A Vicuna-style plain-text conversation ending with ``"ASSISTANT:"`` (see the module docstring)."""
    lines = []
    for m in messages:
        if m["role"] == "system":
            system_prompt = m["content"]
            continue
        tag = USER if m["role"] == "user" else ASSISTANT
        lines.append(f"{tag} {m['content']}")
    return f"{system_prompt}\n\n" + "\n".join(lines) + f"\n{ASSISTANT}"
