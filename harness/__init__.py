"""The top floor: app, runner, metrics, report. Importing it registers the typed config schemas
(:mod:`harness.config`) in Hydra's ConfigStore, which every ``conf/*/*.yaml`` lists as its first default."""

from harness import config as _config  # noqa: F401  (registers base_model, base_runner, base_task_*, base_decoder_*)
