"""MBPP (Austin et al. 2021, arXiv 2108.07732): 500 basic Python problems, the standard 3-shot prompt.

Data: one split (``split``, default ``test``) of ``google-research-datasets/mbpp`` (config ``full``; shots
from its ``prompt`` split) or of a local ``mbpp.jsonl`` (the full 974-row release), given by
``task.data_path`` or ``<data_dir>/mbpp/mbpp.jsonl``; see :mod:`tasks.data`. The splits of the release
(its README): ``test`` = task ids 11..510 (500, the benchmark), ``validation`` = 511..600 (90),
``train`` = 601..974 (374), ``prompt`` = 1..10, of which 2, 3 and 4 are the shots and are never asked
(their solutions are in the prompt), so the ``prompt`` split yields ids 1, 5..10 (7 problems). ``offset``
skips the first problems of the split and ``limit`` keeps the next ones; sample ids stay ``mbpp/<task id>``.

Prompt (Austin et al. 2021; the lm-eval ``mbpp`` layout): one block per shot and one for the query,
separated by a blank line. A block is::

    You are an expert Python programmer, and here is your task: {text} Your code should pass these tests:

    {test_list[0]}
    {test_list[1]}
    {test_list[2]}
    [BEGIN]

A shot continues with its reference ``code`` verbatim (the data's ``\\r\\n`` line ends kept) and
``\\n[DONE]``; the query ends after ``[BEGIN]\\n``. With ``chat`` style the whole few-shot text is the one
user message (the model then sees the same demonstrations either way). The completion is cut at
``[DONE]``; a fenced code block, if the reply has one, is taken as the program.

pass@1 (greedy) runs the program, ``test_setup_code`` (after the program: it uses the solution's
classes) and the three asserts in :func:`tasks.execution.run_program` (the executor every code task uses)
only when ``allow_code_execution`` is true.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterator, Optional

from declare import at_least, one_of, setting
from tasks.types import Sample
from tasks.base import CodeTaskSettings, Task, apply_chat, cut_at_stop, extract_code_block, select_slice
from tasks.data import DataSource, load_records, require_fields
from tasks.execution import CodeScorer

SOURCE = DataSource(task="MBPP", relpath="mbpp/mbpp.jsonl", hub_id="google-research-datasets/mbpp",
                    hub_config="full", hub_split="test")
#: Task ids of each split of the full release (its README); ``prompt`` minus the shots is what that split asks.
SPLIT_IDS = {"test": range(11, 511), "validation": range(511, 601), "train": range(601, 975), "prompt": range(1, 11)}
SHOT_IDS = (2, 3, 4)
STOP_SEQUENCES = ("[DONE]",)


@dataclass
class MBPPSettings(CodeTaskSettings):
    """MBPP's settings (Austin et al. 2021, arXiv 2108.07732)."""

    data_dir: Optional[str] = setting(None, None, "shared data folder holding mbpp/mbpp.jsonl")
    split: str = setting("test", one_of(*SPLIT_IDS), "the release's split (task ids of the README)")
    hub_id: Optional[str] = setting(SOURCE.hub_id, None, "Hugging Face dataset id, when no local file is given")
    max_new_tokens: int = setting(512, at_least(1), "default generation budget (runner.max_new_tokens wins)")


def format_block(problem: dict[str, Any]) -> str:
    """The problem statement, its three asserts and ``[BEGIN]``, ending with a newline."""
    tests = "\n".join(problem["test_list"][:3])
    return (f"You are an expert Python programmer, and here is your task: {problem['text']} "
            f"Your code should pass these tests:\n\n{tests}\n[BEGIN]\n")


def build_prompt(problem: dict[str, Any], shots: list[dict[str, Any]]) -> str:
    """The 3-shot prompt text for ``problem`` (see the module docstring)."""
    demos = [format_block(s) + s["code"] + "\n[DONE]" for s in shots]
    return "\n\n".join(demos + [format_block(problem)])


def build_program(problem: dict[str, Any], code: str) -> str:
    """The candidate ``code``, then ``test_setup_code``, then the asserts, as one script.

    The setup goes after the code: the two problems that have one (ids 367, 927) build test trees from
    the ``Node`` class the solution defines.
    """
    parts = [code, problem.get("test_setup_code") or "", "\n".join(problem["test_list"])]
    return "\n".join(p for p in parts if p) + "\n"


class MBPP(Task, settings=MBPPSettings):
    """The MBPP task (one split, default ``test``; 3-shot).

    Args:
        data_path: a local ``mbpp.jsonl`` or a folder holding it; ``None`` uses ``data_dir`` or the hub.
        data_dir: the shared data folder (``<data_dir>/mbpp/mbpp.jsonl``); ``None`` = not used.
        split: ``test`` (default), ``validation``, ``train`` or ``prompt`` (see the module docstring).
        limit: keep ``limit`` problems after ``offset`` (``None`` = all of the split).
        offset: skip the first ``offset`` problems of the split (>= 0).
        max_new_tokens: default generation budget for this task.
        prompt_style: ``auto`` (chat template for instruct models), ``chat`` or ``completion``.
        allow_code_execution: run the asserts for pass@1 (executes model-written code).
        timeout_s: per-problem execution timeout in seconds (0.1 to 3600).
        max_memory_mb: address-space limit per program in MiB (256 to 65536).
        max_file_mb: what a program may write in MiB, per file and in its temp folder (1 to 1024).
        isolation: ``namespaces`` (OS isolation, else refuse), ``auto`` or ``none`` (:mod:`tasks.sandbox`).
        hub_id: the hub dataset id (config ``full``).

    Raises:
        DataNotFoundError: at construction, when the data can be read neither locally nor from the hub.
        ValueError: a bad setting, or data without the split's problems or the shots.
        DataFormatError: a corrupt data file, or records without the fields MBPP needs.
    """

    name = "mbpp"
    version = "1.0"
    stop_sequences = STOP_SEQUENCES
    quality_columns = ("pass@1",)

    def _load(self) -> None:
        self.scorer = CodeScorer.for_task(self.allow_code_execution, self.timeout_s, self.max_memory_mb,
                                          self.max_file_mb, self.isolation)
        source = replace(SOURCE, hub_id=self.hub_id, hub_split=self.split)
        rows, self.origin = load_records(source, self.data_path, self.data_dir)
        if (source.hub_id is not None and self.data_path in (None, "") and self.data_dir in (None, "")
                and self.split != "prompt"):
            # The hub's other splits lack the shots; they are in its "prompt" split (task ids 1..10).
            rows = rows + load_records(replace(source, hub_split="prompt"), None, None)[0]
        require_fields(rows, ("task_id", "text", "code", "test_list"), self.origin)
        by_id = {int(r["task_id"]): r for r in rows}
        missing_shots = [i for i in SHOT_IDS if i not in by_id]
        if missing_shots:
            raise ValueError(f"MBPP data from {self.origin} lacks the prompt shots (task ids {missing_shots}); "
                             "use the full mbpp.jsonl release (task ids 1..974)")
        self._shots = [by_id[i] for i in SHOT_IDS]
        ids = SPLIT_IDS[self.split]
        problems = [by_id[i] for i in ids if i in by_id and i not in SHOT_IDS]
        if not problems:
            raise ValueError(f"MBPP data from {self.origin} holds none of the {self.split} problems (task ids "
                             f"{ids.start}..{ids.stop - 1}); use the full mbpp.jsonl release (task ids 1..974)")
        self._problems = select_slice(problems, self.offset, None)

    def samples(self, limit: int | None = None) -> Iterator[Sample]:
        limit = limit if limit is not None else self.limit
        for p in self._problems[:limit]:
            yield Sample(sample_id=f"mbpp/{p['task_id']}", prompt=build_prompt(p, self._shots), reference=p,
                         metadata={"task_id": int(p["task_id"])})

    def render(self, sample: Sample, tokenizer: Any, chat: bool) -> str:
        """Prompt text for ``sample``; ``chat``: through the tokenizer's chat template (:meth:`uses_chat`)."""
        if chat:
            return apply_chat(tokenizer, [{"role": "user", "content": sample.prompt}])
        return sample.prompt

    def postprocess(self, sample: Sample, completion: str, chat: bool) -> str:
        """The program: the completion cut at ``[DONE]``, or the first fenced code block in it."""
        text = cut_at_stop(completion, self.stop_sequences)
        code = extract_code_block(text) if "```" in text else None
        if code is None:
            code = text.replace("[BEGIN]", "", 1) if text.lstrip().startswith("[BEGIN]") else text
        return code

    def score(self, sample: Sample, completion: str, chat: bool) -> dict[str, float]:
        """``{"pass@1": 0.0 or 1.0, "code_isolation": ...}`` when code execution is allowed, else ``{}``."""
        if self.scorer is None:
            return {}
        program = build_program(sample.reference, self.postprocess(sample, completion, chat))
        return self.scorer.score(program)
