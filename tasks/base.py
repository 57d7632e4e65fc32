"""Helpers shared by tasks: chat/plain rendering, stop-sequence truncation, code-block extraction."""

from __future__ import annotations

import re
from typing import Any, Sequence

PROMPT_STYLES = ("auto", "chat", "completion")


class DataNotFoundError(FileNotFoundError):
    """A task's data could not be found; the message names the ways to fix it."""


def check_prompt_style(style: str) -> str:
    if style not in PROMPT_STYLES:
        raise ValueError(f"prompt_style must be one of {PROMPT_STYLES}, got {style!r}")
    return style


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
