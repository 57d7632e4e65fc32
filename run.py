"""Entry point: ``python run.py [overrides]`` (Hydra). Composes the config, loads the models once,
builds the task and the decoders, runs them through :class:`harness.runner.Runner`, prints the summary.

Examples:
    python run.py                                          # main job: Qwen2.5-Coder pair, HumanEval[:5]
    python run.py model=tiny-random task.limit=2 decoder=[vanilla,speculative]
    python run.py -m decoder=[vanilla,speculative] decoder.speculative.gamma=2,4,6
    python run.py list [decoder ...]                       # configs with one-line descriptions
    python run.py list decoder=speculative                 # a config's settings: value, default, bound, meaning

A config that cannot run (an unknown name or key, a value out of bounds; :mod:`harness.config`) is refused
before anything runs: one ``error: ...`` line per problem on stderr, exit status 2.
"""

from __future__ import annotations

import logging
import sys
import time

import hydra
from omegaconf import DictConfig

from harness.precheck import ConfigError, list_configs, precheck
from harness.rundir import snapshot, undo

#: When this process started, and the single run's folder as it was before Hydra wrote into it: a job refused
#: for a reason only it can see leaves the folder as it found it (harness.rundir).
STARTED = time.time()
BEFORE = None

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

    from harness.app import main_job  # torch and transformers: only once the command line passed precheck

    try:
        return main_job(cfg)
    except ConfigError as e:  # a value only the job can check (sample ids, the data), or a sweep's job
        job = HydraConfig.get()
        undo(job.runtime.output_dir, BEFORE, STARTED, f"{job.job.name}.log")
        refuse(e)
        return None


if __name__ == "__main__":
    try:
        if sys.argv[1:2] == ["list"]:
            print(list_configs(sys.argv[2:]))
            sys.exit(0)
        run_dir = precheck(sys.argv[1:])
    except ConfigError as e:
        refuse(e)
    if run_dir is not None:
        BEFORE = snapshot(run_dir)
    main()
