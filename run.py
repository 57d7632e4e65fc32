"""Entry point: ``python run.py [overrides]`` (Hydra). Composes the config, loads the models once,
builds the task and the decoders, runs them through :class:`harness.runner.Runner`, prints the summary.

Examples:
    python run.py                                          # main job: Qwen2.5-Coder pair, HumanEval[:5]
    python run.py model=tiny-random task.limit=2 decoder=[vanilla,speculative]
    python run.py -m decoder=[vanilla,speculative] decoder.speculative.gamma=2,4,6
    python run.py list [decoder ...]                       # configs with one-line descriptions
"""

from __future__ import annotations

import logging
import sys

import hydra
from omegaconf import DictConfig

from harness.app import check_choices, list_configs, main_job

log = logging.getLogger("run")


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    return main_job(cfg)


if __name__ == "__main__":
    if sys.argv[1:2] == ["list"]:
        print(list_configs(sys.argv[2:]))
        sys.exit(0)
    check_choices(sys.argv[1:])
    main()
