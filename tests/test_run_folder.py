"""A run folder's record and its writer, through ``run.py`` in a subprocess with the tiny random models: a refused
or superseded job leaves every file an earlier job wrote as it was (bytes and modification time), one process
writes a folder at a time (harness.job.runlock), and an I/O failure or an interrupt is one line that says how to
resume."""

from __future__ import annotations

import os
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TINY = ["model=tiny-random", "task.limit=1", "runner.max_new_tokens=4", "runner.warmup=0", "runner.score=false",
        "decoder=[vanilla]"]


def run(args: list[str], cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "run.py"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, **kwargs)


def state(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``root``: bytes and modification time (ns)."""
    return {p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("error:")]


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = error_lines(proc)
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


def rows(folder: Path) -> list[str]:
    return (folder / "results.jsonl").read_text().splitlines()


# ------------------------------------------------------------------------- the finished run's record
def test_a_refused_sweep_leaves_a_finished_sweeps_record_as_it_was(tmp_path):
    # Before: the refused sweep rewrote 0/.hydra/{config,hydra,overrides}.yaml and multirun.yaml
    sweep = tmp_path / "sweep"
    first = run(["-m", *TINY, "runner.seed=0", f"hydra.sweep.dir={sweep}"], tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    (sweep / "0" / "notes.log").write_text("the user's\n")
    os.utime(sweep / "0" / "notes.log", (1_000_000_000, 1_000_000_000))
    before = state(sweep)
    assert {"multirun.yaml", "0/.hydra/config.yaml", "0/.hydra/hydra.yaml", "0/.hydra/overrides.yaml"} <= set(before)
    refused = run(["-m", *TINY, "runner.seed=0", "runner.sample_ids=[nope]", f"hydra.sweep.dir={sweep}"], tmp_path)
    assert "runner.sample_ids" in one_error_line(refused)
    assert state(sweep) == before


def test_a_sweep_job_refused_in_a_shared_subdir_keeps_the_finished_jobs_record(tmp_path):
    # Before: job 1 (refused for its offset) left same/.hydra describing itself beside job 0's rows
    sweep = tmp_path / "sweep"
    proc = run(["-m", *TINY, "task.offset=0,1000", "hydra.sweep.subdir=same", f"hydra.sweep.dir={sweep}"], tmp_path)
    assert "task.offset=1000" in one_error_line(proc)
    overrides = (sweep / "same" / ".hydra" / "overrides.yaml").read_text()
    assert "task.offset=0" in overrides and "task.offset=1000" not in overrides
    assert "offset: 0" in (sweep / "same" / ".hydra" / "config.yaml").read_text()
    assert len(rows(sweep / "same")) == 1


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("finished") / "run"
    proc = run([*TINY, f"hydra.run.dir={folder}"], folder.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return folder


def a_copy(finished: Path, tmp_path: Path) -> Path:
    """A private copy of the finished run (times kept)."""
    return Path(shutil.copytree(finished, tmp_path / "run", copy_function=shutil.copy2))


def test_a_refused_run_keeps_the_users_logs_and_the_records_times(finished, tmp_path):
    # Before: every *.log of the folder was rewritten (new mtime), Hydra's files got new mtimes
    folder = a_copy(finished, tmp_path)
    (folder / "notes.log").write_text("the user's\n")
    os.utime(folder / "notes.log", (1_000_000_000, 1_000_000_000))
    before = state(folder)
    proc = run([*TINY, "runner.sample_ids=[nope]", f"hydra.run.dir={folder}"], tmp_path)
    assert "runner.sample_ids" in one_error_line(proc)
    assert state(folder) == before


def test_resume_false_moves_the_old_record_with_the_old_rows(finished, tmp_path):
    # Before: the old run's .hydra/ was overwritten; only its rows, meta and summary moved to superseded/
    folder = a_copy(finished, tmp_path)
    old = {k: v for k, v in state(folder).items() if k.startswith(".hydra/") or k == "run.log"}
    proc = run([*TINY, "runner.seed=1", "runner.resume=false", f"hydra.run.dir={folder}"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (moved,) = (folder / "superseded").iterdir()
    assert {k: v for k, v in state(moved).items() if k in old} == old
    assert (moved / "results.superseded.jsonl").exists()
    assert "runner.seed=1" in (folder / ".hydra" / "overrides.yaml").read_text()
    assert not (folder / "run.log").read_bytes().startswith(old["run.log"][0]) or not old["run.log"][0]


# ------------------------------------------------------------------------------- one writer per folder
def test_a_second_writer_on_one_folder_is_refused_naming_the_first(tmp_path):
    # Before: both ran, every cell twice under two run ids, each timed while the other loaded the CPU
    folder = tmp_path / "run"
    args = [*TINY[:1], "task.limit=20", "runner.max_new_tokens=24", *TINY[3:], f"hydra.run.dir={folder}"]
    first = subprocess.Popen([sys.executable, str(ROOT / "run.py"), *args], cwd=tmp_path,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not (folder / ".hydra").is_dir() and time.time() < deadline:
            time.sleep(0.2)
        still_running = first.poll() is None
        second = run(args, tmp_path)
    finally:
        first.kill()
        first.wait()
    assert still_running, "the first run ended before the second started; the test proves nothing"
    line = one_error_line(second)
    assert f"pid {first.pid}" in line and "being written by another process" in line
    from harness.job.runlock import acquire

    with acquire(folder) as lock:  # the kernel released the killed holder's lock
        assert lock.held


def test_a_dead_holder_leaves_no_lock_and_other_folders_are_free(tmp_path):
    from harness.job.runlock import LOCK_NAME, FolderBusyError, acquire

    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from harness.job.runlock import acquire; "
                               "acquire(sys.argv[1]); print('held', flush=True); time.sleep(300)",
                               str(tmp_path / "a")], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderBusyError, match=f"pid {holder.pid} on "):
            acquire(tmp_path / "a")
        with acquire(tmp_path / "b"):  # another folder (a shard's own): not blocked
            assert (tmp_path / "b" / LOCK_NAME).exists()
        assert not (tmp_path / "b" / LOCK_NAME).exists()  # its holder removed it on release
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with acquire(tmp_path / "a") as lock:  # killed: the kernel let go
        assert lock.held and str(os.getpid()) in (tmp_path / "a" / LOCK_NAME).read_text()


def test_a_folder_inside_or_around_one_being_written_is_refused(tmp_path):
    # Before: a run into a sweep's job folder (or a sweep around a running run) took its own lock; the sweep's
    # job then overwrote the run's .hydra record and its undo removed the run's files
    from harness.job.runlock import FolderBusyError, acquire

    holders = [subprocess.Popen([sys.executable, "-c", "import sys, time; from harness.job.runlock import acquire; "
                                 "acquire(sys.argv[1]); print('held', flush=True); time.sleep(300)", str(folder)],
                                cwd=ROOT, stdout=subprocess.PIPE, text=True)
               for folder in (tmp_path / "sweep", tmp_path / "other" / "job")]
    try:
        assert [h.stdout.readline().strip() for h in holders] == ["held", "held"]
        with pytest.raises(FolderBusyError, match=f"inside {tmp_path / 'sweep'}, which is being written by .*pid "
                                                  f"{holders[0].pid} on "):
            acquire(tmp_path / "sweep" / "1")
        with pytest.raises(FolderBusyError, match=f"job inside it is being written by .*pid {holders[1].pid} on "):
            acquire(tmp_path / "other", key="hydra.sweep.dir")
        with acquire(tmp_path / "beside"):  # a folder beside both: free
            pass
    finally:
        for h in holders:
            h.send_signal(signal.SIGKILL)
            h.wait()
    with acquire(tmp_path / "sweep" / "1") as lock:  # the sweep's holder died: the job folder is free
        assert lock.held


def test_a_lock_file_planted_as_a_symlink_is_never_followed(tmp_path):
    # Before: as root the holder line truncated and overwrote the link's target
    from harness.job.runlock import LOCK_NAME, acquire

    victim = tmp_path / "victim.txt"
    victim.write_text("IMPORTANT")
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / LOCK_NAME).symlink_to(victim)
    with pytest.raises(OSError):
        acquire(folder)
    assert victim.read_text() == "IMPORTANT"
    (folder / LOCK_NAME).unlink()
    (folder / LOCK_NAME).symlink_to(tmp_path / "dangling")
    with pytest.raises(OSError):
        acquire(folder)
    assert not (tmp_path / "dangling").exists()


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare to mount")
def test_a_read_only_run_folder_is_one_line(tmp_path):
    # Before: undo's os.utime raised EROFS: a 17-line traceback, exit 1
    folder = tmp_path / "ro"
    folder.mkdir()
    (folder / "keep.txt").write_text("kept")
    script = (f"mount --bind {folder} {folder} && mount -o remount,bind,ro {folder} && exec "
              + shlex.join([sys.executable, str(ROOT / "run.py"), *TINY, f"hydra.run.dir={folder}"]))
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"], capture_output=True)
    if probe.returncode:
        pytest.skip("no mount namespace here")
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert "the folder cannot be made or written" in one_error_line(proc)
    assert sorted(p.name for p in folder.iterdir()) == ["keep.txt"]


# -------------------------------------------------------------------------------- one line for I/O
@pytest.mark.parametrize("folder", ["/proc/specdec-x", "/sys/specdec-x"])
@pytest.mark.parametrize("multirun", [False, True])
def test_a_folder_that_cannot_be_made_is_one_line(tmp_path, folder, multirun):
    # Before: FileNotFoundError / PermissionError traceback from Hydra, exit 1
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    proc = run([*(["-m"] if multirun else []), *TINY, f"{key}={folder}"], tmp_path)
    assert one_error_line(proc).startswith(f"error: {key}={folder}: the folder cannot be made")


def test_a_file_size_limit_is_one_line_and_the_rows_written_resume(tmp_path):
    # Before: a Hydra traceback ending in `OSError: [Errno 27] File too large`, a torn row left in the file
    folder = tmp_path / "run"
    args = [*TINY[:1], "task.limit=6", *TINY[2:], f"hydra.run.dir={folder}"]
    limited = run(args, tmp_path, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (8000, 8000)))
    line = one_error_line(limited)
    kept = rows(folder)
    assert 0 < len(kept) < 6 and (folder / "results.jsonl").read_bytes().endswith(b"\n")
    assert "File too large" in line and f"the {len(kept)} rows written before are kept" in line
    resume = line.split("resume: ", 1)[1]
    assert f"hydra.run.dir={folder}" in resume
    done = subprocess.run(shlex.split(resume), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert rows(folder)[:len(kept)] == kept and len(rows(folder)) == 6


def test_the_interrupt_message_gives_the_command_that_resumes(tmp_path):
    # Before: "rerun the same command to resume"; with the default timestamped folder that starts a new folder
    # 48 tokens a sample: the run is still in its cell loop when the signal comes, on a fast machine too (the
    # signal follows the first row; 9 samples of 48 tokens are left). The resume runs the rest: 10, not 20.
    samples = 10
    args = [*TINY[:1], f"task.limit={samples}", "runner.max_new_tokens=48", *TINY[3:]]
    proc = subprocess.Popen([sys.executable, str(ROOT / "run.py"), *args], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    written = []
    while not written and time.time() < deadline and proc.poll() is None:
        written = [p for p in (tmp_path / "results" / "runs").glob("*/results.jsonl") if p.stat().st_size]
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    (folder,) = (tmp_path / "results" / "runs").iterdir()
    command = re.search(r"interrupted \(Ctrl-C\).*resume: (.*)$", err, re.M).group(1)
    assert f"hydra.run.dir={folder}" in command
    before = rows(folder)
    assert 0 < len(before) < samples
    done = subprocess.run(shlex.split(command), cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert list((tmp_path / "results" / "runs").iterdir()) == [folder]  # the same folder, resumed
    assert rows(folder)[:len(before)] == before and len(rows(folder)) == samples  # no cell measured twice


def test_a_sweeps_resume_command_names_the_sweep_folder(monkeypatch, tmp_path):
    # Before: "rerun the same command to resume"; a sweep's default folder is named by the time it started too
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import open_dict

    from harness.job.app import CONF_DIR, resume_command

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["model=tiny-random"], return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.mode = RunMode.MULTIRUN
        cfg.hydra.sweep.dir = str(tmp_path / "sweep")
    monkeypatch.setattr(sys, "argv", ["run.py", "model=tiny-random", "decoder.speculative.gamma=1,2", "-m"])
    HydraConfig.instance().set_config(cfg)
    try:
        command = shlex.split(resume_command(tmp_path / "sweep" / "0"))
    finally:
        HydraConfig.instance().cfg = None
    assert command[1:] == ["run.py", "model=tiny-random", "decoder.speculative.gamma=1,2",
                           f"hydra.sweep.dir={tmp_path / 'sweep'}", "-m"]


def test_a_row_that_does_not_fit_on_the_disk_is_not_left_half_written(tmp_path, monkeypatch):
    # Before: the buffered write left the part that fitted as a torn last line
    import errno

    from harness.rows.results import ResultWriter

    writer = ResultWriter(tmp_path)
    writer.write({"a": 1})
    real_write = os.write

    def full_disk(fd, data):  # room for 5 bytes, then ENOSPC
        if len(data) > 5:
            return real_write(fd, bytes(data[:5]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(OSError, match="No space left") as e:
        writer.write({"b": "x" * 100})
    monkeypatch.undo()
    assert e.value.filename == str(writer.path)
    assert writer.path.read_text() == '{"a": 1}\n'
