"""HumanEval task: data, prompts, stop sequences, opt-in pass@1."""

from pathlib import Path

import pytest

from harness.models import build_byte_tokenizer
from tasks.humaneval import DataNotFoundError, HumanEval


def test_164_problems_from_package():
    task = HumanEval()
    samples = list(task.samples())
    assert len(samples) == 164 and samples[0].sample_id == "HumanEval/0"
    assert len(list(task.samples(limit=5))) == 5


SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "humaneval" / "HumanEval.jsonl.gz"


@pytest.mark.skipif(not SHARED.exists(), reason="../shared/data is not beside this checkout")
def test_shared_data_file_works():
    task = HumanEval(data_path=str(SHARED))
    assert len(list(task.samples())) == 164


def test_missing_data_is_explained(tmp_path):
    with pytest.raises(DataNotFoundError, match="task.data_path"):
        HumanEval(data_path=tmp_path / "nope.jsonl")


def test_completion_prompt_and_stop_sequences():
    task = HumanEval(prompt_style="completion")
    sample = next(task.samples())
    assert task.render(sample, build_byte_tokenizer(), chat=False) == sample.prompt
    assert task.postprocess(sample, "    return 1\n\ndef other():\n    pass") == "    return 1\n"


def test_chat_prompt_extracts_code_block():
    task = HumanEval(prompt_style="chat")
    sample = next(task.samples())
    text = task.render(sample, build_byte_tokenizer(), chat=True)
    assert text.startswith("<|im_start|>user\nPlease complete the following Python code")
    assert text.endswith("<|im_start|>assistant\n")
    assert task.postprocess(sample, "Sure:\n```python\ndef f():\n    return 2\n```\nDone") == "def f():\n    return 2\n"


def test_pass_at_1_is_opt_in():
    task = HumanEval(prompt_style="completion")
    sample = next(task.samples())
    assert task.score(sample, sample.reference["canonical_solution"]) == {}


def test_pass_at_1_executes_tests():
    task = HumanEval(prompt_style="completion", allow_code_execution=True, timeout_s=5)
    sample = next(task.samples())
    assert task.score(sample, sample.reference["canonical_solution"]) == {"pass@1": 1.0}
    assert task.score(sample, "    return None\n") == {"pass@1": 0.0}
