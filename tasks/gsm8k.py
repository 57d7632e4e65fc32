"""GSM8K (Cobbe et al. 2021, arXiv 2110.14168): 1319 grade-school math problems, 8-shot chain of thought.

Data: the test split from ``openai/gsm8k`` (config ``main``) or a local ``test.jsonl`` (``task.data_path``,
or ``<data_dir>/gsm8k/test.jsonl``); see :mod:`tasks.data`. The gold answer is the text after ``####``
in ``answer``, commas removed.

Prompt (Wei et al. 2022, arXiv 2201.11903, the lm-eval ``gsm8k-cot`` layout): the 8 exemplars as
``Q: {question}\\nA: {chain_of_thought}`` blocks separated by a blank line, then ``Q: {question}\\nA:``.
The exemplars are read from ``exemplars_path``; when it is null, from ``cot_8shot_exemplars.jsonl`` next
to the local data file, and when the data comes from the hub (or no such file is there), from the
built-in copy :data:`COT_EXEMPLARS` (the same 8 texts; a test checks they match the shared file). With
``chat`` style the whole few-shot text is the one user message, so both styles see the same
demonstrations.

Accuracy: the completion is cut at the next ``Q:`` (and, in completion style, at a blank line); the
prediction (:func:`extract_answer`) is the number after the first "The answer is" (or "answer:"), else the
one in the last ``\\boxed{}``, else after ``####``, else the last number in the text. Numbers are read the
way models write them: LaTeX thousands separators (``$9{,}500``, ``9\\,500``), currency symbols, thousands
commas, percentages and units after the number, negative and decimal numbers, markdown bold. The prediction
is compared numerically with the gold answer. No number = wrong.

Selection: ``offset`` skips the first problems and ``limit`` keeps the next ones; sample ids
(``gsm8k/<index in the test file>``) do not change with the selection.
"""

from __future__ import annotations

import logging
import math
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator, Optional

from declare import at_least, between, setting
from tasks.types import Sample
from tasks.base import Task, TaskSettings, apply_chat, cut_at_stop, select_slice
from tasks.data import DataNotFoundError, DataSource, load_records, read_jsonl, require_fields

log = logging.getLogger(__name__)

SOURCE = DataSource(task="GSM8K", relpath="gsm8k/test.jsonl", hub_id="openai/gsm8k", hub_config="main",
                    hub_split="test")
EXEMPLARS_FILE = "cot_8shot_exemplars.jsonl"
STOP_SEQUENCES = ("Q:", "\n\n")
CHAT_STOP_SEQUENCES = ("Q:",)  # chat replies use blank lines between steps

#: The 8 chain-of-thought exemplars of Wei et al. 2022 (Appendix, Table 20), as (question, chain of thought).
COT_EXEMPLARS: tuple[tuple[str, str], ...] = (
    ("There are 15 trees in the grove. Grove workers will plant trees in the grove today. After they are done, "
     "there will be 21 trees. How many trees did the grove workers plant today?",
     "There are 15 trees originally. Then there were 21 trees after some more were planted. So there must have "
     "been 21 - 15 = 6. The answer is 6."),
    ("If there are 3 cars in the parking lot and 2 more cars arrive, how many cars are in the parking lot?",
     "There are originally 3 cars. 2 more cars arrive. 3 + 2 = 5. The answer is 5."),
    ("Leah had 32 chocolates and her sister had 42. If they ate 35, how many pieces do they have left in total?",
     "Originally, Leah had 32 chocolates. Her sister had 42. So in total they had 32 + 42 = 74. After eating 35, "
     "they had 74 - 35 = 39. The answer is 39."),
    ("Jason had 20 lollipops. He gave Denny some lollipops. Now Jason has 12 lollipops. How many lollipops did "
     "Jason give to Denny?",
     "Jason started with 20 lollipops. Then he had 12 after giving some to Denny. So he gave Denny 20 - 12 = 8. "
     "The answer is 8."),
    ("Shawn has five toys. For Christmas, he got two toys each from his mom and dad. How many toys does he have "
     "now?",
     "Shawn started with 5 toys. If he got 2 toys each from his mom and dad, then that is 4 more toys. 5 + 4 = 9. "
     "The answer is 9."),
    ("There were nine computers in the server room. Five more computers were installed each day, from monday to "
     "thursday. How many computers are now in the server room?",
     "There were originally 9 computers. For each of 4 days, 5 more computers were added. So 5 * 4 = 20 "
     "computers were added. 9 + 20 is 29. The answer is 29."),
    ("Michael had 58 golf balls. On tuesday, he lost 23 golf balls. On wednesday, he lost 2 more. How many golf "
     "balls did he have at the end of wednesday?",
     "Michael started with 58 golf balls. After losing 23 on tuesday, he had 58 - 23 = 35. After losing 2 more, "
     "he had 35 - 2 = 33 golf balls. The answer is 33."),
    ("Olivia has $23. She bought five bagels for $3 each. How much money does she have left?",
     "Olivia had 23 dollars. 5 bagels for 3 dollars each will be 5 x 3 = 15 dollars. So she has 23 - 15 dollars "
     "left. 23 - 15 is 8. The answer is 8."),
)

# Model outputs are normalised before numbers are read: LaTeX thousands separators (``9{,}500``,
# ``9\,500``), escaped ``\$``/``\%``, ``\text{...}`` wrappers, markdown bold, the Unicode minus sign and
# thin/no-break spaces between digit groups.
_REWRITES = (
    (re.compile(r"\{,\}"), ","),
    (re.compile(r"(?<=\d)\\[,!;: ](?=\d)"), ""),
    (re.compile(r"(?<=\d)[\u2009\u202f\u00a0](?=\d{3}\b)"), ""),
    (re.compile(r"\\([$%])"), r"\1"),
    (re.compile(r"\\(?:text|textbf|mathrm|mathbf|mbox)\{([^{}]*)\}"), r"\1"),
    (re.compile(r"\*\*|__"), ""),
    (re.compile("\u2212"), "-"),
)
_CURRENCY = "$€£¥₹"
# A number: a minus (not a hyphen after a word or digit: "5-3" is 5 and 3) and/or a currency symbol, then
# digits -- with thousands commas only in groups of three ("1,234,567"; "3,4,5" is three numbers) -- and
# optional decimals ("42." is 42: a sentence's full stop). Percent signs and units after it are ignored.
_NUMBER_RE = re.compile(
    r"(?P<neg1>(?<![\w\-])-\s?)?(?:[" + _CURRENCY + r"]\s?)?(?P<neg2>-\s?)?"
    r"(?<![\w.])(?P<int>\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?P<frac>\.\d+)?"
)
_ANSWER_RE = re.compile(r"\banswer\s*(?:is|was|:|=)", re.IGNORECASE)
_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_HASHES_RE = re.compile(r"####")


def normalize_text(text: str) -> str:
    """``text`` with the LaTeX / markdown / typographic number forms rewritten (see :data:`_REWRITES`)."""
    for pattern, repl in _REWRITES:
        text = pattern.sub(repl, text)
    return text


def _value(m: re.Match[str]) -> str:
    sign = "-" if (m.group("neg1") or m.group("neg2")) else ""
    return sign + m.group("int").replace(",", "") + (m.group("frac") or "")


def _boxed(text: str) -> list[str]:
    """The contents of every ``\\boxed{...}`` (nested braces balanced)."""
    out = []
    for m in _BOXED_RE.finditer(text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        out.append(text[m.end():i - 1] if depth == 0 else text[m.end():])
    return out


def extract_answer(completion: str) -> str | None:
    """The predicted number, or ``None`` when the text holds none.

    In order: the first number on the line after the first "answer is" / "answer:" (the 8-shot protocol's
    "The answer is N."), else the number in the last ``\\boxed{}``, else the number after the last
    ``####``, else the last number of the text. Numbers are read after :func:`normalize_text`; see
    ``_NUMBER_RE`` for what counts as one.

    Examples:
        >>> extract_answer("5 + 4 = 9. The answer is 9.")
        '9'
        >>> extract_answer("The answer is $9{,}500.")
        '9500'
        >>> extract_answer("So she pays \\\\boxed{\\\\$1,200}.")
        '1200'
        >>> extract_answer("She pays $1,200 then $-3.5 back")
        '-3.5'
        >>> extract_answer("no idea") is None
        True
    """
    text = normalize_text(completion)
    m = _ANSWER_RE.search(text)
    if m:
        line = text[m.end():].split("\n", 1)[0]
        n = _NUMBER_RE.search(line)
        if n:
            return _value(n)
    for content in reversed(_boxed(text)):
        n = _NUMBER_RE.search(content)
        if n:
            return _value(n)
    hashes = list(_HASHES_RE.finditer(text))
    if hashes:
        n = _NUMBER_RE.search(text[hashes[-1].end():].split("\n", 1)[0])
        if n:
            return _value(n)
    numbers = list(_NUMBER_RE.finditer(text))
    return _value(numbers[-1]) if numbers else None


def gold_answer(answer: str) -> str:
    """The text after ``####`` in a GSM8K ``answer`` field, commas removed."""
    if "####" not in answer:
        raise ValueError(f"GSM8K answer has no '####' line: {answer[-80:]!r}")
    return answer.split("####")[-1].strip().replace(",", "")


def numbers_equal(prediction: str | None, gold: str) -> bool:
    """Numeric equality of two number strings (``"18.0" == "18"``); ``None`` or unparsable is unequal."""
    if prediction is None:
        return False
    try:
        return math.isclose(float(prediction), float(gold), rel_tol=0.0, abs_tol=1e-6)
    except ValueError:
        return prediction.strip() == gold.strip()


def build_prompt(question: str, exemplars: tuple[tuple[str, str], ...] | list[tuple[str, str]]) -> str:
    """The 8-shot CoT prompt text, ending with ``"Q: {question}\\nA:"``."""
    blocks = [f"Q: {q}\nA: {cot}" for q, cot in exemplars] + [f"Q: {question}\nA:"]
    return "\n\n".join(blocks)


@dataclass
class GSM8KSettings(TaskSettings):
    """GSM8K's settings (Cobbe et al. 2021, arXiv 2110.14168; 8-shot chain of thought, Wei et al. 2022)."""

    data_dir: Optional[str] = setting(None, None, "shared data folder holding gsm8k/test.jsonl")
    hub_id: Optional[str] = setting(SOURCE.hub_id, None, "Hugging Face dataset id, when no local file is given")
    max_new_tokens: int = setting(256, at_least(1), "default generation budget (runner.max_new_tokens wins)")
    exemplars_path: Optional[str] = setting(None, None, f"a {EXEMPLARS_FILE} (null: the built-in exemplars)")
    num_fewshot: int = setting(8, between(0, len(COT_EXEMPLARS)), "chain-of-thought shots in the prompt")


class GSM8K(Task, settings=GSM8KSettings):
    """The GSM8K task (test split, 8-shot chain of thought).

    Args:
        data_path: a local ``test.jsonl`` or a folder holding it; ``None`` uses ``data_dir`` or the hub.
        data_dir: the shared data folder (``<data_dir>/gsm8k/test.jsonl``); ``None`` = not used.
        limit: keep ``limit`` problems after ``offset`` (``None`` = all 1319).
        offset: skip the first ``offset`` problems (>= 0; ``0`` = start at the first).
        max_new_tokens: default generation budget for this task.
        prompt_style: ``auto`` (chat template for instruct models), ``chat`` or ``completion``.
        exemplars_path: a JSONL of exemplars (``question``, ``chain_of_thought``); ``None`` = next to the local
            data file, else the built-in copy.
        num_fewshot: how many of the exemplars to use (0..8, default 8).
        hub_id: the hub dataset id (config ``main``).

    Raises:
        DataNotFoundError: at construction, when the data can be read neither locally nor from the hub, or
            ``exemplars_path`` does not exist.
        ValueError: a bad setting.
    """

    name = "gsm8k"
    version = "1.1"  # 1.1: answer extraction reads LaTeX separators, boxed answers, currency, units
    stop_sequences = STOP_SEQUENCES
    quality_columns = ("accuracy",)

    def _load(self) -> None:
        rows, self.origin = load_records(replace(SOURCE, hub_id=self.hub_id), self.data_path, self.data_dir)
        require_fields(rows, ("question", "answer"), self.origin)
        self._problems = select_slice(list(enumerate(rows)), self.offset, None)
        exemplars = self._load_exemplars(self.exemplars_path, self.origin)
        self.exemplars = tuple(exemplars[:self.num_fewshot])

    @staticmethod
    def _load_exemplars(exemplars_path: str | None, origin: str) -> tuple[tuple[str, str], ...]:
        if exemplars_path not in (None, ""):
            p = Path(os.path.expanduser(str(exemplars_path)))
            if not p.is_file():
                raise DataNotFoundError(f"GSM8K exemplars not found: task.exemplars_path={exemplars_path!r} does not "
                                        f"exist. Point it at a {EXEMPLARS_FILE} (e.g. ../shared/data/gsm8k/"
                                        f"{EXEMPLARS_FILE}) or set it to null for the built-in exemplars.")
        else:
            local = Path(origin)
            p = local.parent / EXEMPLARS_FILE
            if not (local.is_file() and p.is_file()):
                log.info("GSM8K: using the built-in 8 CoT exemplars (no %s next to %s)", EXEMPLARS_FILE, origin)
                return COT_EXEMPLARS
        rows = sorted(read_jsonl(p), key=lambda r: r.get("index", 0))
        log.info("GSM8K: exemplars from %s", p)
        return tuple((r["question"], r["chain_of_thought"]) for r in rows)

    def samples(self, limit: int | None = None) -> Iterator[Sample]:
        limit = limit if limit is not None else self.limit
        for i, p in self._problems[:limit]:
            yield Sample(sample_id=f"gsm8k/{i}", prompt=build_prompt(p["question"], self.exemplars),
                         reference=gold_answer(p["answer"]), metadata={"question": p["question"]})

    def render(self, sample: Sample, tokenizer: Any, chat: bool) -> str:
        """Prompt text for ``sample``; ``chat``: through the tokenizer's chat template (:meth:`uses_chat`)."""
        if chat:
            return apply_chat(tokenizer, [{"role": "user", "content": sample.prompt}])
        return sample.prompt

    def postprocess(self, sample: Sample, completion: str, chat: bool) -> str:
        """The answer text: the completion cut at the next question (and a blank line for base models)."""
        return cut_at_stop(completion, CHAT_STOP_SEQUENCES if chat else self.stop_sequences).strip()

    def score(self, sample: Sample, completion: str, chat: bool) -> dict[str, float]:
        """``{"accuracy": 1.0}`` when the extracted number equals the gold answer, else ``{"accuracy": 0.0}``."""
        prediction = extract_answer(self.postprocess(sample, completion, chat))
        return {"accuracy": float(numbers_equal(prediction, sample.reference))}
