"""Helpers shared by tasks: chat/plain rendering, how a prompt becomes token ids, the chat template's turn
markers as stop ids, selecting a reproducible slice of problems (``offset``/``limit``), stop-sequence
truncation and code-block extraction.

What does not live here: data loading (:mod:`tasks.data`), code execution (:mod:`tasks.execution`), scoring.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Iterator, Optional, Sequence, TypeVar

from declare import at_least, between, check_class_line, one_of, setting, signature, take
from tasks.sandbox import MODES as ISOLATION_MODES
from tasks.types import Sample

log = logging.getLogger(__name__)

PROMPT_STYLES = ("auto", "chat", "completion")
T = TypeVar("T")


class DataNotFoundError(FileNotFoundError):
    """A task's data could not be found; the message names the ways to fix it."""


@dataclass
class TaskSettings:
    """The settings every task takes (declared once: :mod:`declare`). Each task adds its own in a subclass,
    next to its code, named in its class line (``class MyTask(Task, settings=MyTaskSettings)``), which makes its
    constructor (:meth:`Task.__init__`); :mod:`harness.config.schemas` builds the Hydra schema on them."""

    data_path: Optional[str] = setting(None, None, "the task's data file (null: data_dir / the default source)")
    limit: Optional[int] = setting(None, at_least(1), "problems run (null: all)")
    offset: int = setting(0, at_least(0), "problems skipped before limit applies (held-out splits)")
    prompt_style: str = setting("auto", one_of(*PROMPT_STYLES), "auto: chat template for instruct models")


@dataclass
class CodeTaskSettings(TaskSettings):
    """The settings the code tasks share: opt-in execution (:mod:`tasks.execution`), its limits and its
    isolation (:mod:`tasks.sandbox`)."""

    allow_code_execution: bool = setting(False, None, "run the generated code to score pass@1 (opt-in)")
    timeout_s: float = setting(10.0, between(0.1, 3600), "wall-clock seconds per program")
    max_memory_mb: int = setting(4096, between(256, 65536), "MiB of address space per program (RLIMIT_AS)")
    max_file_mb: int = setting(64, between(1, 1024), "MiB a program may write: per file and its temp folder")
    isolation: str = setting("namespaces", one_of(*ISOLATION_MODES),
                             "namespaces: OS isolation or refuse; auto: else the Python guard, warned; none")


def select_slice(items: Sequence[T], offset: int, limit: int | None, what: str = "problems") -> list[T]:
    """``items[offset : offset + limit]`` (``limit=None``: to the end), the reproducible dev / held-out split.

    Example: HumanEval's dev split is ``offset=0, limit=20`` (problems 0-19) and the held-out race
    ``offset=20, limit=40`` (problems 20-59); sample ids stay the task's own (``HumanEval/20`` ...).

    Raises:
        ValueError: ``offset`` at or beyond the number of items (nothing would run).
    """
    if offset and offset >= len(items):
        raise ValueError(f"task.offset={offset} skips all {len(items)} {what}; use an offset below {len(items)}")
    end = None if limit is None else offset + limit
    return list(items[offset:end])


def use_chat(style: str, tokenizer: Any, model_has_chat: bool | None = None) -> bool:
    """Whether to render through the chat template: ``chat`` forces it, ``completion`` never, ``auto``
    follows the model config's ``chat_template`` flag (instruct models) or the tokenizer having one."""
    if style == "chat":
        return True
    if style == "completion":
        return False
    if model_has_chat is not None:
        return bool(model_has_chat)
    return getattr(tokenizer, "chat_template", None) is not None


def apply_chat(tokenizer: Any, messages: Sequence[dict[str, str]]) -> str:
    """Render ``messages`` with the tokenizer's chat template, ending with the assistant's turn opener."""
    return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)


# ----------------------------------------------------------------------------------------- encoding
def encode_prompt(tokenizer: Any, text: str, chat: bool) -> list[int]:
    """The token ids of a rendered prompt, following the tokenizer's own convention.

    * Completion-style text: encoded with the tokenizer's default special tokens, so a tokenizer that adds
      BOS (Llama, Gemma, Mistral) gets its BOS, and one that adds none (Qwen) gets none. Special tokens the
      tokenizer would append at the end (an EOS, e.g. ``add_eos_token=True``) are dropped: a prompt must not
      end the sequence.
    * Chat-template text: encoded without adding special tokens, as transformers'
      ``apply_chat_template(tokenize=True)`` does: the template writes every special token it needs, so a
      template that writes BOS itself gets exactly one BOS.
    * Either way a leading doubled BOS (text that already starts with the BOS string, encoded by a
      tokenizer that adds one) is reduced to one.

    Args:
        tokenizer: a transformers tokenizer.
        text: the prompt text from ``Task.render`` / ``render_turn``.
        chat: whether ``text`` was rendered through the chat template.

    Returns:
        The ids as a list of ints (the runner makes the ``(1, prompt_len)`` int64 tensor).
    """
    plain = list(tokenizer(text, add_special_tokens=False).input_ids)
    ids = plain
    if not chat:
        full = list(tokenizer(text, add_special_tokens=True).input_ids)
        if full != plain:
            n = len(plain)
            start = next((k for k in range(len(full) - n + 1) if full[k:k + n] == plain), None)
            if start is None:  # the tokenizer merged differently with its special tokens: keep its output
                ids = full
                eos = getattr(tokenizer, "eos_token_id", None)
                if eos is not None and len(ids) > len(plain) and ids[-1] == eos and (not plain or plain[-1] != eos):
                    ids = ids[:-1]
            else:
                ids = full[:start] + plain
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is not None and len(ids) >= 2 and ids[0] == bos and ids[1] == bos:
        ids = ids[1:]
    return ids


# ------------------------------------------------------------------------------------- turn markers
_SENTINELS = ("SPECDECUSERTURNONE", "SPECDECASSISTANTTURNONE", "SPECDECUSERTURNTWO")


def _special_token_strings(tokenizer: Any) -> set[str]:
    strings = {str(t) for t in getattr(tokenizer, "all_special_tokens", []) or []}
    for token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(token, "special", False):
            strings.add(str(getattr(token, "content", token)))
    return {s for s in strings if s}


def chat_turn_markers(tokenizer: Any) -> tuple[str, ...]:
    """The special tokens the chat template writes between turns: end-of-turn and start-of-turn markers.

    Derived from the template itself, not from a list of known names: the conversation
    ``user, assistant, user`` is rendered with sentinel contents, and every special token of the tokenizer
    found in the text *between* the turns (and in the assistant opener after the last one) is a marker.
    ChatML gives ``<|im_end|>`` and ``<|im_start|>``; Llama 3 ``<|eot_id|>``, ``<|start_header_id|>`` and
    ``<|end_header_id|>``; Gemma ``<end_of_turn>`` and ``<start_of_turn>``. The text before the first turn
    (a BOS, a default system prompt) is not searched.

    Returns:
        The marker strings, sorted; empty when the tokenizer has no chat template or it cannot render the
        probe conversation (logged).
    """
    if getattr(tokenizer, "chat_template", None) is None:
        return ()
    u1, a1, u2 = _SENTINELS
    messages = [{"role": "user", "content": u1}, {"role": "assistant", "content": a1},
                {"role": "user", "content": u2}]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        gaps = [text[text.index(u1) + len(u1):text.index(a1)], text[text.index(a1) + len(a1):text.index(u2)],
                text[text.index(u2) + len(u2):]]
    except Exception as e:  # templates may refuse a conversation shape; fall back to one turn
        try:
            text = tokenizer.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True)
            gaps = [text[text.index(u1) + len(u1):]]
        except Exception as e2:
            log.warning("the chat template cannot render a probe conversation (%s; %s): no turn markers are "
                        "added as stop ids", e, e2)
            return ()
    specials = _special_token_strings(tokenizer)
    return tuple(sorted(s for s in specials if any(s in gap for gap in gaps)))


def chat_stop_token_ids(tokenizer: Any) -> frozenset[int]:
    """The ids of :func:`chat_turn_markers`: generation ends there, so an answer never runs into a fake
    next turn (the marker itself is skipped when the answer is decoded)."""
    ids = set()
    for marker in chat_turn_markers(tokenizer):
        i = tokenizer.convert_tokens_to_ids(marker)
        if isinstance(i, int) and i >= 0 and i != getattr(tokenizer, "unk_token_id", None):
            ids.add(i)
    return frozenset(ids)


class Task:
    """Base class of every task: samples, prompt rendering, post-processing and scoring (after lm-eval's Task).

    Whether prompts go through the chat template is decided once per run (:meth:`uses_chat`: the task's
    ``prompt_style``, the model config's ``chat_template`` flag, the tokenizer) and passed explicitly to
    :meth:`render`, :meth:`postprocess`, :meth:`score` and :meth:`stop_token_ids`; a task keeps no state
    between those calls.

    Attributes:
        name, version: the task's name and version (bump ``version`` when prompts or scoring change).
        stop_sequences: text stop sequences applied to completion-style answers before scoring.
        max_new_tokens: the task's default generation budget (set by the constructor).
        quality_columns: the keys :meth:`score` returns: the quality columns of result rows
            (``("pass@1",)``, ``("accuracy",)``, ROUGE; ``()`` for a task without an automatic score).
        prompt_style: ``auto`` (the chat template for instruct models), ``chat`` or ``completion``.
        origin: where the samples came from (a file path or a hub id), for ``meta.json``.
    """

    name: str = "task"
    version: str = "1.0"
    stop_sequences: Sequence[str] = ()
    max_new_tokens: int = 256
    quality_columns: Sequence[str] = ()
    prompt_style: str = "auto"
    origin: str | None = None

    #: The declared settings (a dataclass of :func:`declare.setting` fields beside the task), from the class line.
    settings: ClassVar[type | None] = None

    def __init_subclass__(cls, settings: type | None = None, **kwargs: Any) -> None:
        """``class MyTask(Task, settings=MyTaskSettings)``: its declared settings (inherited when not given); its
        signature is made from them."""
        check_class_line(cls, "Task", settings, kwargs, "settings=", "_load")
        super().__init_subclass__()
        if settings is not None:
            cls.settings = settings
        if cls.settings is not None:
            cls.__signature__ = signature(cls.settings)

    def __init__(self, *positional: Any, **settings: Any) -> None:
        """Check and keep the declared settings (each as an attribute of the same name; a missing one takes its
        declared default), then :meth:`_load`.

        Raises:
            TypeError: a setting the task does not declare, or one given positionally.
            ValueError: a setting of the wrong type or out of its bound (messages name it ``task.<name>``), or
                what :meth:`_load` raises.
            DataNotFoundError: what :meth:`_load` raises when the data cannot be read.
        """
        if positional:
            names = ", ".join(f.name for f in fields(self.settings)) if self.settings else "it has none"
            raise TypeError(f"{type(self).__name__} takes its settings by keyword ({names})")
        if self.settings is not None:
            for key, value in take(self.settings, settings, type(self).__name__, prefix="task.").items():
                setattr(self, key, value)
        elif settings:
            raise TypeError(f"{type(self).__name__} declares no settings; got {', '.join(settings)}")
        self._load()

    def _load(self) -> None:
        """Read the data and derive what the task needs from its settings (its samples, scorer, shots)."""

    def samples(self, limit: int | None = None) -> Iterator[Sample]:
        """The selected samples, in the task's fixed order."""
        raise NotImplementedError

    def uses_chat(self, tokenizer: Any, model_chat: bool | None = None) -> bool:
        """Whether prompts go through the chat template: :func:`use_chat` of the task's ``prompt_style``, the
        model config's ``chat_template`` flag (``model_chat``) and the tokenizer."""
        return use_chat(self.prompt_style, tokenizer, model_chat)

    def render(self, sample: Sample, tokenizer: Any, chat: bool) -> str:
        """The prompt text of ``sample`` (chat template text when ``chat``)."""
        raise NotImplementedError

    def turns(self, sample: Sample) -> int:
        """Turns of a conversation (multi-turn tasks override it and :meth:`render_turn`)."""
        return 1

    def render_turn(self, sample: Sample, tokenizer: Any, chat: bool, turn_index: int,
                    previous_answers: Sequence[str]) -> str:
        """The prompt of turn ``turn_index``, carrying the decoder's own earlier answers."""
        if turn_index != 0:
            raise ValueError(f"task {self.name} has one turn per sample, got turn {turn_index}")
        return self.render(sample, tokenizer, chat)

    def postprocess(self, sample: Sample, completion: str, chat: bool) -> str:
        """What scoring reads of a completion: cut at the stop sequences."""
        return cut_at_stop(completion, self.stop_sequences)

    def score(self, sample: Sample, completion: str, chat: bool) -> dict[str, float]:
        """The quality columns of one completion (``{}`` when the task has no automatic score)."""
        return {}

    def stop_token_ids(self, tokenizer: Any, chat: bool) -> frozenset[int]:
        """Extra ids that end generation: the chat template's turn markers (:func:`chat_stop_token_ids`) when
        prompts go through it, else none; the app adds them to the EOS ids."""
        return chat_stop_token_ids(tokenizer) if chat else frozenset()


# ------------------------------------------------------------------------------------------- text
def cut_at_stop(text: str, stop_sequences: Sequence[str]) -> str:
    """``text`` up to (not including) the earliest of ``stop_sequences``."""
    cut = len(text)
    for s in stop_sequences:
        i = text.find(s)
        if i != -1:
            cut = min(cut, i)
    return text[:cut]


_CODE_BLOCK = re.compile(r"```(?:[a-zA-Z0-9_+-]*)\n(.*?)(?:```|$)", re.S)


def extract_code_block(text: str) -> str | None:
    """The first fenced code block of ``text`` (an unterminated one counts), or ``None``."""
    m = _CODE_BLOCK.search(text)
    return m.group(1) if m else None
