"""Running a job: the Hydra app, the runner and the row of one timed cell, timing, run folders and their lock,
resuming, models and their cache."""
