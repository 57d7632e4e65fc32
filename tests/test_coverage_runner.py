"""Every cell accounted for: the runner, tune.py and the Spec-Bench exchange
never turn a failed, unpaired or mixed cell into a figure without a word.

* a conversation whose earlier turn has no answer (the decoder's, or vanilla's) is not continued on
  another history and paired with vanilla: its later turns get ``status=skipped`` rows saying why.
* ``benchmarks/tune.py`` refuses runs that differ in dtype, machine class or task unless ``--combine``
  admits it, and records what it was tuned on in a machine-readable header line.
* Spec-Bench import refuses answers without ``wall_time`` or with a time that is not positive (one
  line, exit 2), and export refuses a folder holding another run's answer files.
* a shard's ``summary.md`` says what it covers; an empty data file, an unknown ``runner.sample_ids`` entry
  and an empty shard are one ``error:`` line with exit status 2, before any model loads.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import harness.job.app
from harness.config.compose import ConfigError, tuned_on
from tests.fixture_rows import fixture_rows, write_run
from tests.test_experiments import GRID, _tuning_runs, tune
from tests.test_runner import _run, _rows

ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------------------- MT-Bench turns
def _mt_file(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in [
        {"question_id": 81, "category": "writing", "turns": ["Write a haiku.", "Now make it sad."]},
        {"question_id": 82, "category": "math", "turns": ["What is 2+2?", "And times 3?"]},
    ]))
    return path


def _fail_on(monkeypatch, decoder_cls, sample_id: str, turn: int) -> None:
    """``decoder_cls.generate`` raises on (``sample_id``, ``turn``): the runner builds every cell's row with
    ``_base_row`` right before calling the decoder, which tells the patched generate whose cell it is."""
    import harness.job.runner

    current: dict = {}
    base_row = harness.job.runner.Runner._base_row
    generate = decoder_cls.generate

    def tracking(self, sample, index, name, t, *args, **kwargs):
        current.update(sample_id=sample.sample_id, turn=t)
        return base_row(self, sample, index, name, t, *args, **kwargs)

    def failing(self, *args, **kwargs):
        if (current.get("sample_id"), current.get("turn")) == (sample_id, turn):
            raise RuntimeError(f"boom on {sample_id} turn {turn}")
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(harness.job.runner.Runner, "_base_row", tracking)
    monkeypatch.setattr(decoder_cls, "generate", failing)


def _mt_run(tmp_path: Path, run_dir: Path, *overrides: str):
    data = _mt_file(tmp_path / "mt_bench" / "question.jsonl")
    return _run(run_dir, "task=mt_bench", "model.chat_template=true", f"task.data_path={data}", "runner.warmup=0",
                "runner.max_new_tokens=8", "runner.score=false", "decoder=[vanilla,speculative]", *overrides)


def _by_cell(rows):
    return {(r["sample_id"], r["decoder"], r["turn"]): r for r in rows}


def test_a_decoders_failed_first_turn_skips_its_second_turn_and_resume_retries_both(tmp_path, monkeypatch):
    # before: speculative failed on question 82's first turn, and its second turn was then asked with
    # another history (an empty first answer), yet paired with vanilla: equality_check=exact, matches_vanilla
    from decoders import speculative

    with monkeypatch.context() as m:
        _fail_on(m, speculative.SpeculativeDecoder, "mt_bench/82", 0)
        with pytest.raises(SystemExit) as e:
            _mt_run(tmp_path, tmp_path / "run")
    assert e.value.code == 1                                            # a failed cell
    cells = _by_cell(_rows(tmp_path / "run"))
    assert len(cells) == 8
    assert cells[("mt_bench/82", "speculative", 0)]["status"] == "error"
    skipped = cells[("mt_bench/82", "speculative", 1)]
    assert skipped["status"] == "skipped"
    assert "turn 0 error" in skipped["reason"] and "another history than vanilla's" in skipped["reason"]
    assert skipped.get("matches_vanilla") is None and skipped.get("equality_check") is None
    assert "completion" not in skipped and "tokens_per_s" not in skipped
    # vanilla's conversation and the other question are untouched
    assert cells[("mt_bench/82", "vanilla", 1)]["status"] == "ok"
    for t in (0, 1):
        ok = cells[("mt_bench/81", "speculative", t)]
        assert ok["status"] == "ok" and ok["matches_vanilla"] is True and ok["equality_check"] == "exact"
    # resume: the failed turn and the skipped one are both run again, on vanilla's history, and paired
    _mt_run(tmp_path, tmp_path / "run")
    cells = _by_cell([r for r in _rows(tmp_path / "run") if r["status"] == "ok"])
    for t in (0, 1):
        r = cells[("mt_bench/82", "speculative", t)]
        assert r["matches_vanilla"] is True and r["equality_check"] == "exact"
    assert cells[("mt_bench/82", "speculative", 1)]["prompt_matches_vanilla"] is True


def test_vanillas_failed_first_turn_leaves_no_second_turn_paired_with_another_history(tmp_path, monkeypatch):
    # vanilla's side: vanilla's second turn was built from an empty first answer and the
    # decoders' second turns were compared with it (equality_check=exact)
    from decoders import vanilla

    _fail_on(monkeypatch, vanilla.VanillaDecoder, "mt_bench/82", 0)
    with pytest.raises(SystemExit) as e:
        _mt_run(tmp_path, tmp_path / "run")
    assert e.value.code == 1
    cells = _by_cell(_rows(tmp_path / "run"))
    assert cells[("mt_bench/82", "vanilla", 0)]["status"] == "error"
    first = cells[("mt_bench/82", "speculative", 0)]                   # measured, but nothing to compare with
    assert first["status"] == "ok" and first["matches_vanilla"] is None and first["equality_check"] is None
    v1, s1 = cells[("mt_bench/82", "vanilla", 1)], cells[("mt_bench/82", "speculative", 1)]
    assert v1["status"] == "skipped" and "turn 0 error" in v1["reason"]
    assert s1["status"] == "skipped" and "vanilla's conversation" in s1["reason"]
    assert not any(r["status"] == "ok" and r["sample_id"] == "mt_bench/82" and r["turn"] == 1
                   for r in _rows(tmp_path / "run"))


# ------------------------------------------------------------------------------------------ the runner
def test_a_shards_summary_says_what_it_covers(tmp_path):
    # before: summary.md said `shard=0/2` over a table that reads like the whole task
    _run(tmp_path, "decoder=[vanilla]", "task.limit=3", "runner.shard=0/2", "runner.max_new_tokens=4")
    md = (tmp_path / "summary.md").read_text()
    assert "shard=0/2 (2 of 3 samples)" in md
    assert "shard 0/2 of the run: 2 of the 3 selected samples (sample_index % 2 == 0: HumanEval/0, HumanEval/2)" in md
    assert "`python -m harness.report <shard folders>` merges them" in md


@pytest.fixture
def no_models(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("models were loaded before the task's samples were checked")

    monkeypatch.setattr(harness.job.app, "load_pair", refuse)


def test_an_empty_data_file_is_refused_before_any_model_loads(tmp_path, no_models):
    # before: an empty data file loaded the models and exited 3 naming a results.jsonl never written
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match=r"no samples to run: the task data \(.*empty.jsonl\) holds no records"):
        _run(tmp_path / "run", "decoder=[vanilla]", f"task.data_path={empty}")
    assert not (tmp_path / "run" / "results.jsonl").exists()


def test_a_corrupt_data_file_and_an_empty_shard_are_one_line_before_any_model_loads(tmp_path, no_models):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task_id": "x"\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl, line 1: not valid JSON") as e:
        _run(tmp_path / "a", "decoder=[vanilla]", f"task.data_path={bad}")
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"runner.shard=3/4 selects none of the 2 selected samples"):
        _run(tmp_path / "b", "decoder=[vanilla]", "runner.shard=3/4")


@pytest.mark.parametrize("case", ["sample_ids", "empty"])
def test_run_py_refuses_with_one_error_line_and_exit_2(case, tmp_path):
    # before: an unknown runner.sample_ids entry was a Hydra traceback with exit status 1
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    arg = "runner.sample_ids=[HumanEval/7]" if case == "sample_ids" else f"task.data_path={empty}"
    if case == "empty":  # a folder holding something of the user's is never removed by a refusal
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "notes.txt").write_text("mine")
    proc = subprocess.run([sys.executable, "run.py", "model=tiny-random", "task.limit=2", "decoder=[vanilla]", arg,
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "HYDRA_FULL_ERROR" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1
    assert ("HumanEval/7" in errors[0]) if case == "sample_ids" else ("holds no records" in errors[0])
    assert not (tmp_path / "run" / "results.jsonl").exists()
    if case == "sample_ids":  # the folder Hydra made (.hydra/, run.log) is removed: a refusal leaves nothing
        assert not (tmp_path / "run").exists()
    else:
        assert (tmp_path / "run" / "notes.txt").read_text() == "mine"


# -------------------------------------------------------------------------------------------------- tune.py
def _set(run: Path, **values) -> None:
    """Overwrite columns of every row of a run folder."""
    rows = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    for r in rows:
        r.update(values)
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_tune_refuses_runs_of_different_dtypes_and_tasks_one_line_each(tmp_path, capsys):
    # before: a float32 HumanEval sweep and a bfloat16 MBPP sweep gave one averaged score, exit 0,
    # and a header reading "dtype bfloat16, float32"
    grid = {k: v for k, v in GRID.items() if k != "speculative_g8"}   # no divergence (float32 would refuse it)
    humaneval, mbpp = _tuning_runs(tmp_path / "runs", grid)
    _set(humaneval, dtype="float32")
    out = tmp_path / "decoder"
    assert tune.main([str(humaneval), str(mbpp), "--conf-dir", str(out), "--family", "speculative"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(line.startswith("error: ") for line in err)
    assert "the runs differ in dtype: float32 in" in err[0] and "bfloat16 in" in err[0] and "--combine dtype" in err[0]
    assert "the runs differ in task: humaneval in" in err[1] and "--combine task" in err[1]
    assert not out.exists()
    # admitted on request: said in the header, and in the machine-readable line
    assert tune.main([str(humaneval), str(mbpp), "--conf-dir", str(out), "--family", "speculative",
                      "--combine", "task,dtype"]) == 0
    text = (out / "speculative_tuned.yaml").read_text()
    assert "# Combined on request (--combine task,dtype): task (humaneval, mbpp), dtype (bfloat16, float32)" in text
    record = tuned_on(text)
    assert record == {"dtype": ["bfloat16", "float32"], "device_name": "test cpu", "cpu_isa": "unrecorded",
                      "task": ["humaneval", "mbpp"], "combined": ["task", "dtype"]}
    assert yaml.safe_load(text)["gamma"] == 6                             # still a loadable config


@pytest.mark.parametrize("column,value", [("device_name", "AMD EPYC [25/1] (2 cores, avx2)"), ("cpu_isa", "avx2")])
def test_tune_refuses_runs_from_another_machine_class(column, value, tmp_path, capsys):
    humaneval, mbpp = _tuning_runs(tmp_path / "runs")
    _set(mbpp, **{column: value})
    out = tmp_path / "decoder"
    assert tune.main([str(humaneval), str(mbpp), "--conf-dir", str(out), "--combine", "task"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: the runs differ in machine (device_name")
    assert value in err[0] and "--combine machine" in err[0]
    assert not out.exists()
    assert tune.main([str(humaneval), str(mbpp), "--conf-dir", str(out), "--combine", "task",
                      "--combine", "machine", "--family", "speculative"]) == 0
    assert tuned_on((out / "speculative_tuned.yaml").read_text())["combined"] == ["task", "machine"]


def test_tune_from_one_run_needs_no_combine_and_records_what_it_was_tuned_on(tmp_path, capsys):
    humaneval, _ = _tuning_runs(tmp_path / "runs")
    _set(humaneval, device_name="AMD EPYC [25/17] (2 cores, avx2+avx512f+avx512_bf16)", cpu_isa="avx512_bf16")
    out = tmp_path / "decoder"
    assert tune.main([str(humaneval), "--conf-dir", str(out), "--family", "speculative"]) == 0
    text = (out / "speculative_tuned.yaml").read_text()
    line = next(x for x in text.splitlines() if x.startswith("# tuned-on: "))
    assert json.loads(line.removeprefix("# tuned-on: ")) == tuned_on(text) == {
        "dtype": "bfloat16", "device_name": "AMD EPYC [25/17] (2 cores, avx2+avx512f+avx512_bf16)",
        "cpu_isa": "avx512_bf16", "task": "humaneval", "combined": []}
    assert "Combined on request" not in text
    assert tuned_on("# @package decoder.x\ngamma: 4\n") is None     # a config written before the line


def test_tune_header_says_only_what_was_combined_and_each_run_once(tmp_path, capsys):
    # before: `--combine task` on one HumanEval run wrote "Combined on request (--combine task): task (humaneval)"
    # and "combined": ["task"]; a run named twice was listed twice under "Tuning runs"
    humaneval, _ = _tuning_runs(tmp_path / "runs")
    out = tmp_path / "decoder"
    assert tune.main([str(humaneval), str(humaneval), "--conf-dir", str(out), "--family", "speculative",
                      "--combine", "task"]) == 0
    assert "note: --combine task: the runs do not differ in it" in capsys.readouterr().out
    text = (out / "speculative_tuned.yaml").read_text()
    assert "Combined on request" not in text and tuned_on(text)["combined"] == []
    assert f"# Tuning runs: {humaneval}." in text


def test_tune_table_says_when_a_task_is_too_small_for_an_interval(tmp_path, capsys):
    # before: one problem per task printed "humaneval 1.80 [, ]" and a CI width of "inf"
    runs = _tuning_runs(tmp_path / "runs", humaneval_ids=range(0, 1), mbpp_ids=range(511, 512))
    assert tune.main([str(r) for r in runs] + ["--conf-dir", str(tmp_path / "d"), "--family", "speculative",
                                               "--combine", "task", "--dry-run"]) == 0
    table = capsys.readouterr().out
    assert "(n too small)" in table and "[, ]" not in table and " inf " not in table


def test_tune_rejects_an_unknown_combine_name(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        tune.main([str(tmp_path), "--combine", "model"])
    assert e.value.code == 2 and "choose from task, dtype, machine" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------- Spec-Bench exchange
def _answer(qid, mid, text="a", tokens=10, **choice):
    c = {"index": 0, "turns": [text], "decoding_steps": [5], "new_tokens": [tokens], "wall_time": [1.0],
         "accept_lengths": [2] * 5}
    c.update(choice)
    return json.dumps({"question_id": qid, "category": "qa", "answer_id": "x", "model_id": mid, "tstamp": 0.0,
                       "choices": [c]}) + "\n"


def _answers(d: Path, method_line: str) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "m-vanilla-float16-temp-0.0.jsonl").write_text(_answer(1, "m-vanilla-float16-temp-0.0")
                                                        + _answer(2, "m-vanilla-float16-temp-0.0"))
    (d / "m-sps-float16-temp-0.0.jsonl").write_text(_answer(1, "m-sps-float16-temp-0.0") + method_line)
    return d


@pytest.mark.parametrize("bad,message", [
    ({"wall_time": None}, r"line 2 \(question 2, choice 0, model_id m-sps-float16-temp-0.0\): no `wall_time` list"),
    ({"wall_time": [0.0]}, r"line 2 \(question 2, .*\), turn 0: wall_time 0.0 is not a positive time"),
    ({"wall_time": [-2.0]}, r"turn 0: wall_time -2.0 is not a positive time"),
    ({"wall_time": []}, r"0 `wall_time` values for 1 turns"),
    ({"new_tokens": ["many"]}, r"turn 0: new_tokens 'many' / wall_time 1.0 are not numbers"),
])
def test_spec_bench_import_refuses_bad_times_with_one_line(bad, message, tmp_path, capsys):
    # before: a missing wall_time was a KeyError traceback; a zero time dropped the question silently
    from harness.report import build as report
    from harness.exchange.specbench import import_answers

    choice = {k: v for k, v in bad.items() if v is not None}
    line = _answer(2, "m-sps-float16-temp-0.0", **choice)
    if bad.get("wall_time", 0) is None:
        rec = json.loads(line)
        del rec["choices"][0]["wall_time"]
        line = json.dumps(rec) + "\n"
    d = _answers(tmp_path / "answers", line)
    with pytest.raises(ValueError, match=message) as e:
        import_answers([d])
    assert "\n" not in str(e.value)
    capsys.readouterr()
    assert report.main(["--spec-bench", str(d), "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err
    assert len([x for x in err.splitlines() if x.startswith("error: ")]) == 1 and "Traceback" not in err


def test_spec_bench_error_turns_import_as_failed_cells_whatever_their_time(tmp_path):
    from harness.exchange.specbench import import_answers

    d = _answers(tmp_path / "answers", _answer(2, "m-sps-float16-temp-0.0", text="ERROR", tokens=0, wall_time=[0.0]))
    rows = import_answers([d])
    sps = rows[rows["decoder"] == "m-sps-float16-temp-0.0"].set_index("sample_id")
    assert sps.loc["2", "status"] == "error" and sps.loc["1", "status"] == "ok"


def test_spec_bench_export_refuses_a_folder_holding_another_runs_answers(tmp_path):
    # before: exporting two runs into one folder silently mixed (or overwrote) them
    from harness.report import build as report
    from harness.exchange.specbench import export_answers, import_answers

    a = report.load_rows([write_run(tmp_path / "a", fixture_rows("a", tasks=["mt_bench"], n=2))])
    b = report.load_rows([write_run(tmp_path / "b", fixture_rows("b", tasks=["mt_bench"], n=2))])
    out = tmp_path / "answers"
    first = export_answers(a, out)
    assert export_answers(a, out) == first                                # the same run again: rewritten
    with pytest.raises(ValueError, match=r"already holds Spec-Bench answer files of another run or export") as e:
        export_answers(b, out)
    assert "\n" not in str(e.value)
    assert all(json.loads(f.read_text().splitlines()[0])["harness"]["export_of"] ==
               json.loads(first[0].read_text().splitlines()[0])["harness"]["export_of"] for f in first)
    # a folder mixed by hand (same model ids from two runs) is refused on import, too
    export_answers(b, tmp_path / "answers_b")
    mixed = tmp_path / "mixed"
    for i, src in enumerate((out, tmp_path / "answers_b")):
        for f in src.glob("*.jsonl"):
            (mixed / str(i)).mkdir(parents=True, exist_ok=True)
            (mixed / str(i) / f.name).write_text(f.read_text())
    with pytest.raises(ValueError, match=r"comes from 2 answer files .* of different runs"):
        import_answers([mixed])
    # replace=True: the folder then holds the second run only
    export_answers(b, out, replace=True)
    back = import_answers([out])
    assert set(back["run_id"].str.split("-").str[-1]) == set(b["run_id"].astype(str))
