"""CNN/DailyMail 3.0.0 (Hermann et al. 2015; See et al. 2017): zero-shot news summarization, ROUGE-1/2/L/Lsum.

Data: the test split from ``abisee/cnn_dailymail`` (config ``3.0.0``, 11,490 articles) or a local JSONL with
``article`` and ``highlights`` (``task.data_path``, or ``<data_dir>/cnn_dailymail/test_first1000.jsonl``:
the first 1000 test articles in hub order); see :mod:`tasks.data`. Sample ids are ``cnn_dm/<test index>``
in both cases, so runs on the local subset and on the hub split line up.

Prompt (zero-shot, the H2O / HELM wording the local file was taken from):
* ``completion`` style: ``"###\\nArticle: {article}\\n\\nSummarize the above article in 3 sentences.\\n"``;
  the completion is cut at the next ``###``.
* ``chat`` style: one user message ``"Article: {article}\\n\\nSummarize the above article in 3 sentences."``.
Both templates are settings (``completion_prompt``, ``chat_prompt``; ``{article}`` is replaced). Bump
``version`` when changing the defaults.

Quality: F-measures (``rouge-score``, Porter stemming, offline) of the summary against ``highlights``,
named as ``rouge-score`` names them:

* ``rouge1``, ``rouge2``: unigram / bigram overlap.
* ``rougeL``: *sentence-level* ROUGE-L, the longest common subsequence of the two texts taken as one token
  sequence each (sentence breaks ignored).
* ``rougeLsum``: *summary-level* ROUGE-L (Lin 2004, section 3.2: the union LCS of every reference sentence
  against all summary sentences), the figure summarization papers report as "ROUGE-L". Sentences are
  separated by newlines, as ``rouge-score`` expects; both texts are first split into sentences by
  :func:`split_sentences` -- the highlights are already one per line, and a generated summary is split at
  newlines and at sentence-ending punctuation. This splitter is deterministic and needs no downloaded
  data (``nltk``'s punkt model, which papers often use, needs a download this harness does not make), so
  ``rougeLsum`` can differ slightly from a punkt-split figure.

For speculative decoding the metric of interest is speed; the outputs of lossless decoders equal vanilla's.

Selection: ``offset`` skips the first articles and ``limit`` keeps the next ones; sample ids
(``cnn_dm/<test index>``) do not change with the selection.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Iterator, Optional

from declare import at_least, contains, setting
from tasks.types import Sample
from tasks.base import Task, TaskSettings, apply_chat, cut_at_stop, select_slice
from tasks.data import DataSource, load_records, require_fields

SOURCE = DataSource(task="CNN/DailyMail", relpath="cnn_dailymail/test_first1000.jsonl",
                    hub_id="abisee/cnn_dailymail", hub_config="3.0.0", hub_split="test")
STOP_SEQUENCES = ("###",)
INSTRUCTION = "Summarize the above article in 3 sentences."
COMPLETION_PROMPT = "###\nArticle: {article}\n\n" + INSTRUCTION + "\n"
CHAT_PROMPT = "Article: {article}\n\n" + INSTRUCTION
ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")


@dataclass
class CNNDailyMailSettings(TaskSettings):
    """CNN/DailyMail's settings (See et al. 2017, version 3.0.0), as in the Ouroboros and Spec-Bench setups."""

    data_dir: Optional[str] = setting(None, None, "shared data folder holding cnn_dailymail/test_first1000.jsonl")
    hub_id: Optional[str] = setting(SOURCE.hub_id, None, "Hugging Face dataset id, when no local file is given")
    max_new_tokens: int = setting(128, at_least(1), "default generation budget (runner.max_new_tokens wins)")
    completion_prompt: str = setting(COMPLETION_PROMPT, contains("{article}"), "prompt of base models")
    chat_prompt: str = setting(CHAT_PROMPT, contains("{article}"), "user turn of instruct models")


#: Words after which a full stop does not end a sentence (titles, initials of common abbreviations).
ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st mt gen gov sen rep lt col capt sgt cpl rev hon pres vs etc inc ltd co corp "
    "no nos fig jan feb mar apr jun jul aug sep sept oct nov dec a.m p.m u.s u.k u.n e.g i.e".split())
_SENTENCE_END = re.compile(r"(?<=[.!?])([\"')\]]*)\s+(?=[\"'(\[]?[A-Z0-9])")


def split_sentences(text: str) -> list[str]:
    """Split ``text`` into sentences: at every newline, and after ``.``/``!``/``?`` (plus closing quotes or
    brackets) followed by whitespace and a capital letter or digit -- except after a single-letter initial
    or a word in :data:`ABBREVIATIONS`. Deterministic, no downloaded model; blank pieces are dropped.

    Example:
        >>> split_sentences('Mr. Smith left at 5 p.m. Friday. He said "go." Then: silence!\\nNew line')
        ['Mr. Smith left at 5 p.m. Friday.', 'He said "go."', 'Then: silence!', 'New line']
    """
    sentences: list[str] = []
    for line in text.split("\n"):
        start = 0
        for m in _SENTENCE_END.finditer(line):
            words = line[start:m.start()].split()
            last = words[-1].rstrip(".!?\"')]").lower() if words else ""
            if line[m.start() - 1] == "." and (last in ABBREVIATIONS or (len(last) == 1 and last.isalpha())):
                continue
            sentences.append(line[start:m.end(1)].strip())
            start = m.end()
        sentences.append(line[start:].strip())
    return [s for s in sentences if s]


def rouge(prediction: str, reference: str, scorer: Any = None) -> dict[str, float]:
    """ROUGE-1/2/L/Lsum F-measures of ``prediction`` against ``reference`` (``rouge-score``, stemmed).

    ``rougeL`` is sentence-level (one LCS over the whole texts); ``rougeLsum`` is summary-level, over the
    sentences of :func:`split_sentences` joined by newlines (``rouge-score``'s convention).

    Args:
        prediction: the generated summary.
        reference: the reference summary (highlights, one sentence per line).
        scorer: a ``rouge_scorer.RougeScorer`` over :data:`ROUGE_TYPES` to reuse; ``None`` builds one.

    Returns:
        ``{"rouge1": f, "rouge2": f, "rougeL": f, "rougeLsum": f}``, each in [0, 1].
    """
    if scorer is None:
        from rouge_score import rouge_scorer

        scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
    scores = scorer.score("\n".join(split_sentences(reference)), "\n".join(split_sentences(prediction)))
    return {k: float(scores[k].fmeasure) for k in ROUGE_TYPES}


class CNNDailyMail(Task, settings=CNNDailyMailSettings):
    """The CNN/DailyMail summarization task (test split, zero-shot).

    Args:
        data_path: a local JSONL (``article``, ``highlights``) or a folder holding ``test_first1000.jsonl``;
            ``None`` uses ``data_dir`` or the hub.
        data_dir: the shared data folder (``<data_dir>/cnn_dailymail/test_first1000.jsonl``).
        limit: keep ``limit`` articles after ``offset`` (``None`` = all available: 1000 local, 11,490 on the hub).
        offset: skip the first ``offset`` articles (>= 0).
        max_new_tokens: default generation budget for this task.
        prompt_style: ``auto`` (chat template for instruct models), ``chat`` or ``completion``.
        completion_prompt: the base-model prompt, with ``{article}``.
        chat_prompt: the user message for chat models, with ``{article}``.
        hub_id: the hub dataset id (config ``3.0.0``).

    Raises:
        DataNotFoundError: at construction, when the data can be read neither locally nor from the hub.
        ValueError: a bad setting.
    """

    name = "cnn_dm"
    version = "1.1"  # 1.1: adds rougeLsum (summary-level ROUGE-L)
    stop_sequences = STOP_SEQUENCES
    quality_columns = ROUGE_TYPES

    def _load(self) -> None:
        rows, self.origin = load_records(replace(SOURCE, hub_id=self.hub_id), self.data_path, self.data_dir)
        require_fields(rows, ("article", "highlights"), self.origin)
        self._articles = select_slice(list(enumerate(rows)), self.offset, None, "articles")
        self._scorer: Any = None

    def samples(self, limit: int | None = None) -> Iterator[Sample]:
        limit = limit if limit is not None else self.limit
        for i, row in self._articles[:limit]:
            index = int(row.get("test_index", i))
            metadata = {"test_index": index, **({"id": row["id"]} if row.get("id") else {})}
            yield Sample(sample_id=f"cnn_dm/{index}", prompt=row["article"], reference=row["highlights"],
                         metadata=metadata)

    def render(self, sample: Sample, tokenizer: Any, chat: bool) -> str:
        """Prompt text for ``sample``; ``chat``: through the tokenizer's chat template (:meth:`uses_chat`)."""
        if chat:
            content = self.chat_prompt.replace("{article}", sample.prompt)
            return apply_chat(tokenizer, [{"role": "user", "content": content}])
        return self.completion_prompt.replace("{article}", sample.prompt)

    def postprocess(self, sample: Sample, completion: str, chat: bool) -> str:
        """The summary: the completion cut at the next ``###``, stripped."""
        return cut_at_stop(completion, self.stop_sequences).strip()

    def score(self, sample: Sample, completion: str, chat: bool) -> dict[str, float]:
        """ROUGE-1/2/L/Lsum F-measures of the summary against the highlights (see :func:`rouge`)."""
        if self._scorer is None:
            from rouge_score import rouge_scorer

            self._scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
        return rouge(self.postprocess(sample, completion, chat), sample.reference, self._scorer)
