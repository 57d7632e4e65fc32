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

import hydra
from omegaconf import DictConfig

from harness.precheck import ConfigError, list_configs, precheck

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
    from harness.app import discard_refused_run_dir, main_job  # torch and transformers: only past precheck

    try:
        return main_job(cfg)
    except ConfigError as e:  # a value only the job can check (sample ids, the data), or a sweep's job
        discard_refused_run_dir()  # the folder Hydra made, if it holds nothing but its own files and logs
        refuse(e)
        return None


if __name__ == "__main__":
    try:
        if sys.argv[1:2] == ["list"]:
            print(list_configs(sys.argv[2:]))
            sys.exit(0)
        precheck(sys.argv[1:])
    except ConfigError as e:
        refuse(e)
    main()
