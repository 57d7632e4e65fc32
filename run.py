"""Entry point: ``python run.py [overrides]`` (Hydra). Composes the config, loads the models once,
builds the task and the decoders, runs them through :class:`harness.job.runner.Runner`, prints the summary.

Examples:
    python run.py                                          # main job: Qwen2.5-Coder pair, HumanEval[:5]
    python run.py model=tiny-random task.limit=2 decoder=[vanilla,speculative]
    python run.py -m decoder=[vanilla,speculative] decoder.speculative.gamma=2,4,6
    python run.py list [decoder ...]                       # configs with one-line descriptions
    python run.py list decoder=speculative                 # a config's settings: value, default, bound, meaning

A config that cannot run (an unknown name or key, a value out of bounds; :mod:`harness.config.compose`) is refused
before anything runs: one ``error: ...`` line per problem on stderr, exit status 2. So is a run (or sweep) folder
that another process is writing (:mod:`harness.job.runlock`; its lock is taken before Hydra writes into the folder)
or that cannot be made, and a full disk or file-size limit while writing rows (the rows written are kept, the
line gives the command that resumes).
"""

from __future__ import annotations

import logging
import re
import sys
import time

import hydra
from omegaconf import DictConfig

from harness.config.precheck import ConfigError, Folder, list_configs, precheck
from harness.job.rundir import (SweepSnapshot, pin, remember, remembered, snapshot, sweep_snapshot, tidy, undo,
                            undo_refused)
from harness.job.runlock import FolderBusyError, acquire

#: When this process started, and the lock of the run's (or sweep's) folder, taken before Hydra writes into it;
#: the folder's state from before is recorded in harness.job.rundir: a job refused for a reason only it can see
#: leaves the folder as it found it.
STARTED = time.time()
LOCK = None
#: A folder value Hydra's override grammar takes unquoted.
PLAIN_PATH = re.compile(r"[\w./+-]+")

log = logging.getLogger("run")
#: Exit status of a refused configuration (the shell convention for bad usage).
CONFIG_ERROR_EXIT = 2


def refuse(error: ConfigError) -> None:
    """Print each line of ``error`` as ``error: ...`` on stderr and exit with :data:`CONFIG_ERROR_EXIT`."""
    for line in str(error).splitlines():
        print(f"error: {line}", file=sys.stderr)
    sys.exit(CONFIG_ERROR_EXIT)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig

    from harness.job.app import main_job  # torch and transformers: only once the command line passed precheck

    job = HydraConfig.get()
    try:
        result = main_job(cfg)
    except ConfigError as e:  # a value only the job can check (sample ids, the data), or a sweep's job
        undo_refused(job.runtime.output_dir, STARTED, f"{job.job.name}.log", LOCK)
        refuse(e)
        return None
    except OSError as e:  # a full disk, a file-size limit: rows written so far are kept (no undo)
        refuse(ConfigError(" ".join(str(e).split())))
        return None
    finally:  # a refusal ends the sweep; any other end of a job is its record, put back if a later job is refused
        before = remembered()
        if isinstance(before, SweepSnapshot):
            before.finished_job(job.runtime.output_dir)
    return result


def hold(folder: Folder) -> None:
    """Before Hydra writes: pin the folder (a default named by the time would be named anew by Hydra), record
    its state (:mod:`harness.job.rundir`) and take its lock (:mod:`harness.job.runlock`); refuse in one line when
    another process holds it or it cannot be made."""
    global LOCK
    key = "hydra.sweep.dir" if folder.multirun else "hydra.run.dir"
    if PLAIN_PATH.fullmatch(str(folder.path)):
        sys.argv[1:] = pin(sys.argv[1:], key, str(folder.path))
    before = sweep_snapshot(folder.path) if folder.multirun else snapshot(folder.path)
    remember(before)
    try:
        LOCK = acquire(folder.path, key)
    except FolderBusyError as e:
        refuse(ConfigError(str(e)))
    except OSError as e:
        try:
            undo(folder.path, before.root if folder.multirun else before, STARTED, None)
        except OSError:  # a read-only folder: nothing was written into it, nothing to put back
            pass
        refuse(ConfigError(f"{key}={folder.path}: the folder cannot be made or written: {e.strerror or e}"
                           f"{f' ({e.filename})' if e.filename else ''}; choose a writable folder"))


if __name__ == "__main__":
    try:
        if sys.argv[1:2] == ["list"]:
            print(list_configs(sys.argv[2:]))
            sys.exit(0)
        folder = precheck(sys.argv[1:])
    except ConfigError as e:
        refuse(e)
    if folder is not None:
        hold(folder)
        if folder.configs:
            from harness.config.estimate import line
            from harness.rows.machine import cpu_isa, cpu_signature, native_half_precision

            print(line(folder.configs, folder.njobs, cpu_isa(), native_half_precision("bfloat16"), cpu_signature()),
                  flush=True)
    try:
        main()
    finally:
        if LOCK is not None:
            LOCK.release()
            tidy(remembered())  # the folder made for the lock, when no job wrote into it
