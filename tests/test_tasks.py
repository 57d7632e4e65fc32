"""Tasks other than HumanEval (MBPP, GSM8K, CNN/DM, MT-Bench, Spec-Bench), the shared data loading and
the code-execution helper. CPU only, no network: fixture rows are written into ``tmp_path``; record
counts are checked against the shared offline copies in ``../shared/data`` (skipped when absent); the
hub paths are exercised with HF_HUB_OFFLINE=1 set before ``datasets`` is imported (in a subprocess) or
with the reachability probe replaced.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasks import data as task_data
from tasks.cnn_dm import CNNDailyMail, rouge
from tasks.data import DataNotFoundError
from tasks.execution import run_program
from tasks.gsm8k import COT_EXEMPLARS, GSM8K, extract_answer, gold_answer, numbers_equal
from tasks.mbpp import MBPP
from tasks.mt_bench import MTBench
from tasks.spec_bench import SpecBench

PROJECT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("SPECDEC_DATA_DIR") or PROJECT.parent / "shared" / "data")
needs_shared = pytest.mark.skipif(not (SHARED / "gsm8k" / "test.jsonl").is_file(),
                                  reason=f"shared offline data not found at {SHARED}")


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------------ data
@needs_shared
@pytest.mark.parametrize("cls,count", [(MBPP, 500), (GSM8K, 1319), (CNNDailyMail, 1000), (MTBench, 80),
                                       (SpecBench, 480)])
def test_shared_data_counts(cls, count):
    task = cls(data_dir=str(SHARED))
    samples = list(task.samples())
    assert len(samples) == count
    assert len({s.sample_id for s in samples}) == count
    assert len(list(task.samples(limit=3))) == 3


@needs_shared
def test_shared_data_details():
    mbpp = list(MBPP(data_path=str(SHARED / "mbpp")).samples())
    assert [s.metadata["task_id"] for s in mbpp] == list(range(11, 511))
    mt = MTBench(data_path=str(SHARED / "mt_bench" / "question.jsonl"))
    assert all(mt.turns(s) == 2 for s in mt.samples())
    spec = SpecBench(data_dir=str(SHARED))
    samples = list(spec.samples())
    assert sum(spec.turns(s) == 2 for s in samples) == 80
    subtasks = [s.metadata["subtask"] for s in samples]
    assert {k: subtasks.count(k) for k in set(subtasks)} == {
        "mt_bench": 80, "translation": 80, "summarization": 80, "qa": 80, "math_reasoning": 80, "rag": 80}
    assert len(list(SpecBench(data_dir=str(SHARED), categories=["translation", "writing"]).samples())) == 90


@needs_shared
def test_builtin_gsm8k_exemplars_match_the_shared_file():
    rows = task_data.read_jsonl(SHARED / "gsm8k" / "cot_8shot_exemplars.jsonl")
    assert tuple((r["question"], r["chain_of_thought"]) for r in rows) == COT_EXEMPLARS


@pytest.mark.parametrize("cls", [MBPP, GSM8K, CNNDailyMail, MTBench, SpecBench])
def test_missing_local_path_names_both_fixes(cls, tmp_path):
    t0 = time.perf_counter()
    with pytest.raises(DataNotFoundError) as err:
        cls(data_path=str(tmp_path / "nope.jsonl"))
    msg = str(err.value)
    assert "nope.jsonl" in msg and "does not exist" in msg
    assert "task.data_path" in msg and "data_dir=../shared/data" in msg and "network access" in msg
    with pytest.raises(DataNotFoundError, match="holds no"):
        cls(data_dir=str(tmp_path))  # a data folder without the task's file
    with pytest.raises(DataNotFoundError, match="holds no"):
        cls(data_path=str(tmp_path))  # a folder without the file
    assert time.perf_counter() - t0 < 5


def test_unreachable_hub_fails_fast_naming_both_fixes(monkeypatch):
    """No local setting, hub unreachable: the probe's failure is reported at once (no datasets retries)."""
    monkeypatch.setattr(task_data, "_library_offline", lambda: False)
    monkeypatch.setattr(task_data, "_reachable", lambda url, timeout_s=3.0: "cannot connect (test)")
    for cls, remote in [(GSM8K, "openai/gsm8k"), (MTBench, "raw.githubusercontent.com/lm-sys/FastChat")]:
        with pytest.raises(DataNotFoundError) as err:
            cls()
        msg = str(err.value)
        assert remote in msg and "unreachable" in msg
        assert "task.data_path" in msg and "data_dir=../shared/data" in msg


def test_offline_hub_fails_fast_naming_both_fixes(tmp_path):
    """HF_HUB_OFFLINE=1 from the start, nothing cached: construction fails within seconds, naming both fixes."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
           "SPECDEC_DATA_DIR": ""}
    code = ("from tasks.gsm8k import GSM8K\nfrom tasks.data import DataNotFoundError\n"
            "try:\n    GSM8K()\nexcept DataNotFoundError as e:\n    print('ERR', e)\n")
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=PROJECT, capture_output=True, text=True,
                         timeout=60)
    assert time.perf_counter() - t0 < 30
    assert out.stdout.startswith("ERR"), out.stderr[-2000:]
    assert "offline mode" in out.stdout and "openai/gsm8k" in out.stdout
    assert "task.data_path" in out.stdout and "data_dir=../shared/data" in out.stdout


# ------------------------------------------------------------------------------------------------ MBPP
def mbpp_row(task_id: int, text: str, code: str, tests: list[str], setup: str = "") -> dict:
    return {"task_id": task_id, "text": text, "code": code, "test_list": tests, "test_setup_code": setup,
            "challenge_test_list": []}


@pytest.fixture
def mbpp_file(tmp_path):
    rows = [
        mbpp_row(1, "Unused.", "pass", ["assert True"] * 3),
        mbpp_row(2, "Add two numbers.", "def add(a, b):\r\n  return a + b", ["assert add(1, 2) == 3",
                                                                           "assert add(0, 0) == 0",
                                                                           "assert add(-1, 1) == 0"]),
        mbpp_row(3, "Negate.", "def neg(x):\r\n  return -x", ["assert neg(1) == -1", "assert neg(0) == 0",
                                                                "assert neg(-2) == 2"]),
        mbpp_row(4, "Square.", "def sq(x):\r\n  return x * x", ["assert sq(2) == 4", "assert sq(0) == 0",
                                                                   "assert sq(-3) == 9"]),
        mbpp_row(11, "Double.", "def double(x):\r\n  return 2 * x", ["assert double(2) == 4",
                                                                        "assert double(0) == 0",
                                                                        "assert double(-1) == -2"]),
        mbpp_row(12, "Uses setup.", "class Box:\r\n  v = 7", ["assert box.v == 7"] * 3, setup="box = Box()"),
        mbpp_row(600, "Validation, not test.", "pass", ["assert True"] * 3),
    ]
    return write_jsonl(tmp_path / "mbpp" / "mbpp.jsonl", rows)


def test_mbpp_prompt(mbpp_file, tokenizer):
    task = MBPP(data_path=str(mbpp_file.parent))
    samples = list(task.samples())
    assert [s.sample_id for s in samples] == ["mbpp/11", "mbpp/12"]
    head = "You are an expert Python programmer, and here is your task: "
    mid = " Your code should pass these tests:\n\n"
    expected = (
        f"{head}Add two numbers.{mid}assert add(1, 2) == 3\nassert add(0, 0) == 0\nassert add(-1, 1) == 0\n"
        "[BEGIN]\ndef add(a, b):\r\n  return a + b\n[DONE]\n\n"
        f"{head}Negate.{mid}assert neg(1) == -1\nassert neg(0) == 0\nassert neg(-2) == 2\n"
        "[BEGIN]\ndef neg(x):\r\n  return -x\n[DONE]\n\n"
        f"{head}Square.{mid}assert sq(2) == 4\nassert sq(0) == 0\nassert sq(-3) == 9\n"
        "[BEGIN]\ndef sq(x):\r\n  return x * x\n[DONE]\n\n"
        f"{head}Double.{mid}assert double(2) == 4\nassert double(0) == 0\nassert double(-1) == -2\n[BEGIN]\n"
    )
    assert task.render(samples[0], tokenizer, chat=False) == expected
    chat = task.render(samples[0], tokenizer, chat=True)
    assert chat == f"<|im_start|>user\n{expected}<|im_end|>\n<|im_start|>assistant\n"


def test_mbpp_postprocess_and_score(mbpp_file, tokenizer):
    task = MBPP(data_path=str(mbpp_file), allow_code_execution=True, timeout_s=5)
    s11, s12 = list(task.samples())
    task.render(s11, tokenizer, chat=False)
    good = "def double(x):\n    return x + x\n[DONE]\n\nYou are an expert"
    assert task.postprocess(s11, good) == "def double(x):\n    return x + x\n"
    assert task.score(s11, good) == {"pass@1": 1.0}
    assert task.score(s11, "def double(x):\n    return x\n[DONE]") == {"pass@1": 0.0}
    assert task.score(s12, "class Box:\n  v = 7\n[DONE]") == {"pass@1": 1.0}  # setup runs after the code
    assert task.score(s12, "class Box:\n  v = 6\n[DONE]") == {"pass@1": 0.0}
    task.render(s11, tokenizer, chat=True)
    reply = "Here you go:\n```python\ndef double(x):\n    return 2 * x\n```\n[DONE]"
    assert task.postprocess(s11, reply) == "def double(x):\n    return 2 * x\n"
    assert task.score(s11, reply) == {"pass@1": 1.0}
    assert MBPP(data_path=str(mbpp_file)).score(s11, good) == {}  # execution is opt-in


def test_mbpp_without_shots_is_rejected(tmp_path):
    path = write_jsonl(tmp_path / "m.jsonl", [mbpp_row(11, "x", "pass", ["assert True"] * 3)])
    with pytest.raises(ValueError, match="shots"):
        MBPP(data_path=str(path))


# ------------------------------------------------------------------------------------------- execution
@pytest.mark.parametrize("program,status", [
    ("def f(x):\n    return x + 1\nassert f(1) == 2\n", "passed"),
    ("def f(x):\n    return x\nassert f(1) == 2\n", "failed"),
    ("raise ValueError('boom')\n", "error"),
    ("def f(:\n", "error"),
    ("import sys\nsys.exit(0)\nassert False\n", "error"),  # leaving early is not passing
    ("while True:\n    pass\n", "timeout"),
])
def test_run_program(program, status):
    t0 = time.perf_counter()
    result = run_program(program, timeout_s=2.0)
    assert result.status == status, result.detail
    assert result.passed == (status == "passed")
    assert time.perf_counter() - t0 < 10
    if status == "error" and "boom" in program:
        assert "ValueError: boom" in result.detail


def test_run_program_kills_children_on_timeout():
    program = ("import subprocess, sys\n"
               "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
               "while True:\n    pass\n")
    t0 = time.perf_counter()
    assert run_program(program, timeout_s=2.0).status == "timeout"
    assert time.perf_counter() - t0 < 10


# ----------------------------------------------------------------------------------------------- GSM8K
@pytest.mark.parametrize("completion,expected", [
    ("There are 3 + 2 = 5 cars. The answer is 5.", "5"),
    ("The answer is 1,234.", "1234"),
    ("It costs $1,200 in total. The answer is $1,200.", "1200"),
    ("The temperature drops 5-3 degrees. The answer is -3.", "-3"),
    ("She owes -$5 now.", "-5"),
    ("The answer is 2.50 dollars.", "2.50"),
    ("So 7 - 4 = 3 and 3 * 2 = 6 apples", "6"),  # no phrase: the last number
    ("He ends with 12,000,000 dollars.", "12000000"),
    ("The answer is: **42**", "42"),
    ("The answer is 8. Q: 9 apples", "8"),  # the first 'The answer is' wins over later numbers
    ("I cannot tell.", None),
    ("", None),
])
def test_gsm8k_extract_answer(completion, expected):
    assert extract_answer(completion) == expected


def test_gsm8k_gold_and_equality():
    assert gold_answer("Half of 48 is <<48/2=24>>24.\n#### 1,024") == "1024"
    assert gold_answer("#### -3") == "-3"
    assert numbers_equal("18.00", "18") and numbers_equal("-3", "-3") and not numbers_equal("3", "-3")
    assert not numbers_equal(None, "3")
    with pytest.raises(ValueError, match="####"):
        gold_answer("no final line")


@pytest.fixture
def gsm8k_file(tmp_path):
    rows = [{"question": "Tom has 3 apples and buys 2. How many?", "answer": "3 + 2 = <<3+2=5>>5\n#### 5"},
            {"question": "A bill is $1,000 minus $1. How much?", "answer": "1000-1=999\n#### 999"}]
    write_jsonl(tmp_path / "gsm8k" / "cot_8shot_exemplars.jsonl", [
        {"index": 1, "question": "Q two?", "chain_of_thought": "Two. The answer is 2.", "answer": "2"},
        {"index": 0, "question": "Q one?", "chain_of_thought": "One. The answer is 1.", "answer": "1"},
    ])
    return write_jsonl(tmp_path / "gsm8k" / "test.jsonl", rows)


def test_gsm8k_prompt(gsm8k_file, tokenizer):
    task = GSM8K(data_path=str(gsm8k_file))  # exemplars: the file next to the data, in index order
    sample = next(task.samples())
    assert sample.sample_id == "gsm8k/0" and sample.reference == "5"
    expected = ("Q: Q one?\nA: One. The answer is 1.\n\nQ: Q two?\nA: Two. The answer is 2.\n\n"
                "Q: Tom has 3 apples and buys 2. How many?\nA:")
    assert task.render(sample, tokenizer, chat=False) == expected
    assert task.render(sample, tokenizer, chat=True) == f"<|im_start|>user\n{expected}<|im_end|>\n<|im_start|>assistant\n"


def test_gsm8k_builtin_exemplars_and_score(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "elsewhere.jsonl", [{"question": "What is 2+2?", "answer": "#### 4"}])
    task = GSM8K(data_path=str(path), num_fewshot=8)
    sample = next(task.samples())
    prompt = task.render(sample, tokenizer, chat=False)
    assert prompt.startswith("Q: There are 15 trees in the grove.") and prompt.count("\nA: ") == 8
    assert prompt.endswith("\n\nQ: What is 2+2?\nA:")
    assert task.score(sample, " 2 + 2 = 4. The answer is 4.\n\nQ: What is 3+3?\nA: The answer is 6.") == {"accuracy": 1.0}
    assert task.score(sample, " I think 5.") == {"accuracy": 0.0}
    assert task.score(sample, " No idea.") == {"accuracy": 0.0}
    zero_shot = GSM8K(data_path=str(path), num_fewshot=0)
    assert zero_shot.render(next(zero_shot.samples()), tokenizer, chat=False) == "Q: What is 2+2?\nA:"


# ---------------------------------------------------------------------------------------------- CNN/DM
def test_cnn_dm_prompt_and_rouge(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "cnn.jsonl", [
        {"test_index": 7, "article": "The cat sat on the mat.", "highlights": "Cat sits on mat .\nIt was happy ."}])
    task = CNNDailyMail(data_path=str(path))
    sample = next(task.samples())
    assert sample.sample_id == "cnn_dm/7" and task.max_new_tokens == 128
    assert task.render(sample, tokenizer, chat=False) == (
        "###\nArticle: The cat sat on the mat.\n\nSummarize the above article in 3 sentences.\n")
    assert task.render(sample, tokenizer, chat=True) == (
        "<|im_start|>user\nArticle: The cat sat on the mat.\n\nSummarize the above article in 3 sentences."
        "<|im_end|>\n<|im_start|>assistant\n")
    task.render(sample, tokenizer, chat=False)
    assert task.postprocess(sample, " A cat sat.\n###\nArticle: next") == "A cat sat."
    scores = task.score(sample, "Cat sits on mat .\nIt was happy .")
    assert set(scores) == set(task.quality_columns) == {"rouge1", "rouge2", "rougeL"}
    assert all(v == pytest.approx(1.0) for v in scores.values())


def test_rouge_known_pairs():
    assert rouge("the cat sat", "the cat was sitting") == pytest.approx(
        {"rouge1": 4 / 7, "rouge2": 0.4, "rougeL": 4 / 7})  # stems: sat | wa, sit; 2 of 3 vs 2 of 4 unigrams
    assert rouge("dogs bark loudly", "the cat sat") == {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}
    assert rouge("a b c d", "a b c d") == pytest.approx({"rouge1": 1.0, "rouge2": 1.0, "rougeL": 1.0})


# ------------------------------------------------------------------------------- MT-Bench / Spec-Bench
@pytest.fixture
def mt_file(tmp_path):
    return write_jsonl(tmp_path / "mt_bench" / "question.jsonl", [
        {"question_id": 81, "category": "writing", "turns": ["Write a haiku.", "Now make it sad."]},
        {"question_id": 82, "category": "math", "turns": ["What is 2+2?", "And times 3?"],
         "reference": ["4", "12"]},
    ])


def test_mt_bench_two_turn_conversation(mt_file, tokenizer):
    task = MTBench(data_path=str(mt_file))
    sample = next(task.samples())
    assert sample.sample_id == "mt_bench/81" and task.turns(sample) == 2 and task.max_new_tokens == 1024
    assert task.quality_columns == () and task.score(sample, "anything") == {}
    turn0 = "<|im_start|>user\nWrite a haiku.<|im_end|>\n<|im_start|>assistant\n"
    assert task.render(sample, tokenizer, chat=True) == turn0
    assert task.render_turn(sample, tokenizer, True, 0, []) == turn0
    turn1 = task.render_turn(sample, tokenizer, True, 1, ["  Leaves fall softly.\n"])
    assert turn1 == (
        "<|im_start|>user\nWrite a haiku.<|im_end|>\n"
        "<|im_start|>assistant\nLeaves fall softly.<|im_end|>\n"
        "<|im_start|>user\nNow make it sad.<|im_end|>\n"
        "<|im_start|>assistant\n")
    # The answer goes through the tokenizer's template as an assistant message (turn 0 is a prefix).
    assert turn1.startswith(turn0[: -len("<|im_start|>assistant\n")])
    with pytest.raises(ValueError, match="previous answer"):
        task.render_turn(sample, tokenizer, True, 1, [])
    with pytest.raises(ValueError, match="out of range"):
        task.render_turn(sample, tokenizer, True, 2, ["a", "b"])


def test_mt_bench_plain_transcript_and_options(mt_file, tokenizer):
    task = MTBench(data_path=str(mt_file), system_prompt="Be brief.")
    sample = next(task.samples())
    assert task.render_turn(sample, tokenizer, False, 1, [" Leaves fall.\nUSER: junk the model went on"]) == (
        "Be brief.\n\nUSER: Write a haiku.\nASSISTANT: Leaves fall.\nUSER: Now make it sad.\nASSISTANT:")
    assert task.render(sample, tokenizer, True).startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    only_math = MTBench(data_path=str(mt_file), categories=["math"], max_turns=1)
    (s,) = list(only_math.samples())
    assert s.sample_id == "mt_bench/82" and only_math.turns(s) == 1 and s.reference == ["4", "12"]
    with pytest.raises(ValueError, match="match no question"):
        MTBench(data_path=str(mt_file), categories=["poetry"])


def test_spec_bench_rows(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "q.jsonl", [
        {"question_id": 81, "category": "writing", "turns": ["Write a haiku.", "Now make it sad."]},
        {"question_id": 161, "category": "translation", "turns": ["Translate German to English: Hallo Welt"],
         "reference": ["Hello world"]},
        {"question_id": 481, "category": "rag", "turns": ["Context.\nQuestion?"], "reference": [["answer"]]},
    ])
    task = SpecBench(data_path=str(path))
    samples = list(task.samples())
    assert [s.sample_id for s in samples] == ["spec_bench/81", "spec_bench/161", "spec_bench/481"]
    assert [task.turns(s) for s in samples] == [2, 1, 1]
    assert [s.metadata["subtask"] for s in samples] == ["mt_bench", "translation", "rag"]
    assert task.render(samples[1], tokenizer, True) == (
        "<|im_start|>user\nTranslate German to English: Hallo Welt<|im_end|>\n<|im_start|>assistant\n")
    assert len(list(SpecBench(data_path=str(path), categories=["mt_bench"]).samples())) == 1


def test_chat_style_without_template_says_what_to_change(mt_file, tokenizer):
    import copy

    bare = copy.copy(tokenizer)
    bare.chat_template = None
    task = MTBench(data_path=str(mt_file), prompt_style="chat")
    with pytest.raises(ValueError, match="prompt_style=completion"):
        task.render(next(task.samples()), bare, None)


# ---------------------------------------------------------------------------------------------- config
@needs_shared
@pytest.mark.parametrize("name,cls,max_new_tokens", [
    ("mbpp", MBPP, 512), ("gsm8k", GSM8K, 256), ("cnn_dm", CNNDailyMail, 128), ("mt_bench", MTBench, 1024),
    ("spec_bench", SpecBench, 1024)])
def test_task_configs_compose_and_instantiate(name, cls, max_new_tokens):
    import hydra
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(PROJECT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[f"task={name}", f"++data_dir={SHARED}", "task.limit=2"])
        assert cfg.task.data_dir == str(SHARED)
        task = hydra.utils.instantiate(cfg.task)
        default = compose("config", overrides=[f"task={name}"])
    assert isinstance(task, cls) and task.name == name
    assert len(list(task.samples())) == 2
    assert task.max_new_tokens == max_new_tokens
    assert default.task.max_new_tokens == max_new_tokens and default.task.data_path is None
