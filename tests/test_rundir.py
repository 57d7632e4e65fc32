"""A refused job leaves its run folder as it found it (harness.job.rundir): Hydra's files put back or removed, a
folder the job made removed, nothing of the user's or of a finished run ever touched."""

from __future__ import annotations

import os
import time

from harness.job.rundir import HYDRA_FILES, snapshot, undo


def _hydra_writes(folder, text="new"):
    """What Hydra does before the job runs: the folder, .hydra/*.yaml and the job log."""
    (folder / ".hydra").mkdir(parents=True, exist_ok=True)
    for rel in HYDRA_FILES:
        (folder / rel).write_text(text)
    with open(folder / "run.log", "a") as f:
        f.write("[job] refused\n")


def test_a_folder_the_job_made_is_removed(tmp_path):
    run = tmp_path / "run"
    before = snapshot(run)
    _hydra_writes(run)
    assert undo(run, before, time.time()) and not run.exists()


def test_the_users_files_stay_even_when_named_like_logs(tmp_path):
    # Before: a folder whose entries all looked like Hydra's (.hydra/, *.log) was deleted with the user's notes.log
    run = tmp_path / "mine"
    (run / "experiment.log").mkdir(parents=True)
    (run / "experiment.log" / "data.csv").write_text("1,2")
    (run / "notes.log").write_text("important")
    before = snapshot(run)
    _hydra_writes(run)
    undo(run, before, time.time())
    assert sorted(p.name for p in run.iterdir()) == ["experiment.log", "notes.log"]
    assert (run / "notes.log").read_text() == "important"


def test_a_finished_runs_record_is_put_back_byte_for_byte(tmp_path):
    # Before: a refused re-run into a finished run's folder left .hydra/ describing the refused job
    run = tmp_path / "done"
    _hydra_writes(run, "the finished run")
    (run / "results.jsonl").write_text("{}\n")
    before = snapshot(run)
    _hydra_writes(run, "the refused job")
    undo(run, before, time.time())
    assert all((run / rel).read_text() == "the finished run" for rel in HYDRA_FILES)
    assert (run / "run.log").read_text() == "[job] refused\n"        # as it was before the refused job
    assert (run / "results.jsonl").read_text() == "{}\n"


def test_without_a_snapshot_only_this_process_files_in_an_otherwise_empty_folder_go(tmp_path):
    started = time.time()
    time.sleep(0.05)  # a process writes well after it starts; a file's mtime may trail time.time() by a clock tick
    job = tmp_path / "sweep" / "0"
    _hydra_writes(job)
    assert undo(job, None, started) and not job.exists()
    kept = tmp_path / "sweep" / "1"
    _hydra_writes(kept)
    (kept / "results.jsonl").write_text("{}\n")                      # anything else: nothing is touched
    assert not undo(kept, None, started) and (kept / ".hydra" / "config.yaml").exists()
    old = tmp_path / "sweep" / "2"
    _hydra_writes(old)
    for p in [old / "run.log", *(old / rel for rel in HYDRA_FILES)]:
        os.utime(p, (started - 60, started - 60))                     # written before this process started
    assert not undo(old, None, started) and (old / "run.log").exists()


def test_parent_folders_the_job_made_go_too_and_a_users_empty_hydra_folder_stays(tmp_path):
    # Before: hydra.run.dir=x/y/z left x/ and x/y/ behind; an empty .hydra/ of the user's was removed
    deep = tmp_path / "x" / "y" / "z"
    before = snapshot(deep)
    _hydra_writes(deep)
    undo(deep, before, time.time())
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    mine = tmp_path / "mine"
    (mine / ".hydra").mkdir(parents=True)
    before = snapshot(mine)
    _hydra_writes(mine)
    undo(mine, before, time.time())
    assert (mine / ".hydra").is_dir() and not any((mine / ".hydra").iterdir())


def test_a_finished_runs_log_of_another_job_name_is_kept(tmp_path):
    # Before: a finished run with hydra.job.name=foo lost foo.log when a refused re-run undid its writes
    run = tmp_path / "jn"
    run.mkdir()
    (run / "foo.log").write_text("the finished run's log\n")
    before = snapshot(run)
    _hydra_writes(run)
    with open(run / "foo.log", "a") as f:
        f.write("the refused job\n")
    undo(run, before, time.time(), log_name="foo.log")
    assert (run / "foo.log").read_text() == "the finished run's log\n"


def test_files_the_job_did_not_change_keep_their_times_and_changed_ones_get_theirs_back(tmp_path):
    # Before: every *.log of the folder was rewritten on undo (new mtime), Hydra's files got the undo's mtime
    run = tmp_path / "run"
    _hydra_writes(run, "the finished run")
    (run / "notes.log").write_text("the user's")
    for p in [run / "notes.log", run / "run.log", *(run / rel for rel in HYDRA_FILES)]:
        os.utime(p, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
    before = snapshot(run)
    _hydra_writes(run, "the refused job")
    undo(run, before, time.time())
    for p in [run / "notes.log", run / "run.log", *(run / rel for rel in HYDRA_FILES)]:
        assert p.stat().st_mtime_ns == 1_000_000_000_000_000_000, p


def test_a_sweep_snapshot_puts_back_multirun_yaml_and_the_last_finished_jobs_record(tmp_path):
    # Before: a sweep's jobs had no snapshot: a refused job left multirun.yaml and a shared subdir's .hydra
    # describing itself
    from harness.job import rundir

    sweep = tmp_path / "sweep"
    _hydra_writes(sweep / "0", "the finished sweep")
    (sweep / "multirun.yaml").write_text("the finished sweep")
    old = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in sweep.rglob("*") if p.is_file()}
    rundir.remember(rundir.sweep_snapshot(sweep))
    try:
        (sweep / "multirun.yaml").write_text("the refused sweep")
        _hydra_writes(sweep / "0", "the refused sweep")
        rundir.undo_refused(sweep / "0", time.time())
        assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in sweep.rglob("*") if p.is_file()} == old
        (sweep / "multirun.yaml").write_text("the next sweep")
        _hydra_writes(sweep / "same", "job 0")                # job 0 of a sweep with hydra.sweep.subdir=same
        rundir.remembered().finished_job(sweep / "same")
        _hydra_writes(sweep / "same", "job 1")                # job 1, refused
        rundir.undo_refused(sweep / "same", time.time())
        assert (sweep / "same" / HYDRA_FILES[0]).read_text() == "job 0"
        assert (sweep / "multirun.yaml").read_text() == "the next sweep"  # its job 0 finished: its record
    finally:
        rundir.remember(None)
