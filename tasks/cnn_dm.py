"""CNN/DailyMail 3.0.0 (Hermann et al. 2015; See et al. 2017): zero-shot news summarization, ROUGE-1/2/L.

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

Quality: ROUGE-1, ROUGE-2 and ROUGE-L F-measures (``rouge-score``, Porter stemming, offline) of the
summary against ``highlights``. For speculative decoding the metric of interest is speed; the outputs of
lossless decoders equal vanilla's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterator

from tasks.types import Sample
from tasks.base import apply_chat, check_prompt_style, cut_at_stop, use_chat
from tasks.data import DataSource, load_records

SOURCE = DataSource(task="CNN/DailyMail", relpath="cnn_dailymail/test_first1000.jsonl",
                    hub_id="abisee/cnn_dailymail", hub_config="3.0.0", hub_split="test")
STOP_SEQUENCES = ("###",)
INSTRUCTION = "Summarize the above article in 3 sentences."
COMPLETION_PROMPT = "###\nArticle: {article}\n\n" + INSTRUCTION + "\n"
CHAT_PROMPT = "Article: {article}\n\n" + INSTRUCTION
ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


def rouge(prediction: str, reference: str, scorer: Any = None) -> dict[str, float]:
    """ROUGE-1/2/L F-measures of ``prediction`` against ``reference`` (``rouge-score``, stemmed).

    Args:
        prediction: the generated summary.
        reference: the reference summary (highlights, one sentence per line).
        scorer: a ``rouge_scorer.RougeScorer`` to reuse; ``None`` builds one.

    Returns:
        ``{"rouge1": f, "rouge2": f, "rougeL": f}``, each in [0, 1].
    """
    if scorer is None:
        from rouge_score import rouge_scorer

        scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
    scores = scorer.score(reference, prediction)
    return {k: float(scores[k].fmeasure) for k in ROUGE_TYPES}


class CNNDailyMail:
    """The CNN/DailyMail summarization task (test split, zero-shot).

    Args:
        data_path: a local JSONL (``article``, ``highlights``) or a folder holding ``test_first1000.jsonl``;
            ``None`` uses ``data_dir`` or the hub.
        data_dir: the shared data folder (``<data_dir>/cnn_dailymail/test_first1000.jsonl``).
        limit: keep the first ``limit`` articles (``None`` = all available: 1000 local, 11,490 on the hub).
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
    version = "1.0"
    stop_sequences = STOP_SEQUENCES
    quality_columns = ROUGE_TYPES

    def __init__(
        self,
        data_path: str | None = None,
        data_dir: str | None = None,
        limit: int | None = None,
        max_new_tokens: int = 128,
        prompt_style: str = "auto",
        completion_prompt: str = COMPLETION_PROMPT,
        chat_prompt: str = CHAT_PROMPT,
        hub_id: str = SOURCE.hub_id,
        **_: Any,
    ):
        if limit is not None and limit < 1:
            raise ValueError(f"task.limit must be >= 1 or null, got {limit}")
        for key, template in (("completion_prompt", completion_prompt), ("chat_prompt", chat_prompt)):
            if "{article}" not in template:
                raise ValueError(f"task.{key} must contain '{{article}}', got {template!r}")
        self.limit = limit
        self.max_new_tokens = max_new_tokens
        self.prompt_style = check_prompt_style(prompt_style)
        self.completion_prompt = completion_prompt
        self.chat_prompt = chat_prompt
        rows, self.origin = load_records(replace(SOURCE, hub_id=hub_id), data_path, data_dir)
        self._articles = rows
        self._chat: bool | None = None
        self._scorer: Any = None

    def samples(self, limit: int | None = None) -> Iterator[Sample]:
        limit = limit if limit is not None else self.limit
        for i, row in enumerate(self._articles[:limit]):
            index = int(row.get("test_index", i))
            metadata = {"test_index": index, **({"id": row["id"]} if row.get("id") else {})}
            yield Sample(sample_id=f"cnn_dm/{index}", prompt=row["article"], reference=row["highlights"],
                         metadata=metadata)

    def render(self, sample: Sample, tokenizer: Any, chat: bool | None = None) -> str:
        """Prompt text for ``sample``; ``chat`` is the model config's ``chat_template`` flag."""
        self._chat = use_chat(self.prompt_style, tokenizer, chat)
        if self._chat:
            content = self.chat_prompt.replace("{article}", sample.prompt)
            return apply_chat(tokenizer, [{"role": "user", "content": content}])
        return self.completion_prompt.replace("{article}", sample.prompt)

    def postprocess(self, sample: Sample, completion: str) -> str:
        """The summary: the completion cut at the next ``###``, stripped."""
        return cut_at_stop(completion, self.stop_sequences).strip()

    def score(self, sample: Sample, completion: str) -> dict[str, float]:
        """ROUGE-1/2/L F-measures of the summary against the highlights."""
        if self._scorer is None:
            from rouge_score import rouge_scorer

            self._scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
        return rouge(self.postprocess(sample, completion), sample.reference, self._scorer)
