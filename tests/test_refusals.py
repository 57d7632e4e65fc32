"""Common mistakes on the command line: each is refused in one ``error:`` line with exit status 2, before torch
or transformers is imported (so in about a second, not the 6-8 s those imports take), and without making a
run folder. The proof that nothing heavy is imported: the command runs with stand-in ``torch`` and
``transformers`` packages first on the path that raise on import; a refusal that needed them would die with a
traceback (exit 1) instead. ``benchmarks/refusal_times.py`` prints how long each refusal takes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: (what the user meant, the command line's arguments, a fragment the one line must hold).
MISTAKES = [
    ("data file that is not there", ["model=tiny-random", "task=gsm8k", "task.data_path=/no/such/gsm8k.jsonl"],
     "task.data_path=/no/such/gsm8k.jsonl: no such file"),
    ("a data folder that is not there", ["model=tiny-random", "data_dir=/no/such/dir"],
     "data_dir=/no/such/dir: no such folder"),
    ("a task's own data folder that is not there", ["model=tiny-random", "task=mbpp", "task.data_dir=/no/such/dir"],
     "task.data_dir=/no/such/dir: no such folder"),
    ("CUDA on a machine without it", ["model=tiny-random", "device=cuda"], "device=cuda: "),
    ("SLURM launcher without sbatch", ["-m", "hydra/launcher=slurm_gpu", "model=tiny-random"], "sbatch"),
    ("two tasks without -m", ["model=tiny-random", "task=humaneval,gsm8k"], "add -m"),
    ("two tasks as a list", ["model=tiny-random", "task=[humaneval,gsm8k]"], "task"),
    ("a misspelt decoder", ["model=tiny-random", "decoder=[vanilla,speculativ]"], "unknown decoder 'speculativ'"),
    ("a budget out of bounds", ["model=tiny-random", "runner.max_new_tokens=0"], "runner.max_new_tokens=0"),
    ("a nucleus bound on a greedy run", ["model=tiny-random", "runner.top_p=1.5"],
     "runner.top_p=1.5: must be a number in (0.0, 1.0]"),
    ("a setting of a decoder not selected", ["model=tiny-random", "decoder.speculatve.gamma=3"],
     "no decoder 'speculatve' in this run; did you mean decoder.speculative.gamma?"),
    ("a tuned config named without its folder", ["model=tiny-random", "decoder=[vanilla,speculative_tuned]"],
     "did you mean tuned/speculative_tuned?"),
    ("a tuned config's setting by its path", ["model=tiny-random", "decoder=[vanilla,tuned/speculative_tuned]",
                                               "decoder.tuned/speculative_tuned.gamma=3"],
     "decoder.speculative_tuned.gamma=3"),
    ("a run folder that is a file", ["model=tiny-random", f"hydra.run.dir={ROOT / 'README.md'}"],
     "is a file, not a folder"),
    ("one decoder node selected twice", ["model=tiny-random", "decoder=[vanilla,tuned/speculative_tuned,"
                                                             "tuned/speculative_tuned]"], "selected twice"),
    ("a launcher without -m", ["model=tiny-random", "hydra/launcher=submitit_local"], "add -m"),
    ("a boolean given a number", ["model=tiny-random", "runner.score=2147483648"],
     "error: runner.score=2147483648: must be true or false"),
    ("a boolean swept with a number", ["-m", "model=tiny-random", "decoder=[vanilla,opt_tree_cost]",
                                       "decoder.opt_tree_cost.cost_aware=true,-1"],
     "error: decoder.opt_tree_cost.cost_aware=-1: must be true or false"),
    ("a temperature that underflows to greedy", ["model=tiny-random", "runner.temperature=1e-400"],
     "error: runner.temperature=1e-400: underflows to 0"),
    ("a temperature out of bounds", ["model=tiny-random", "runner.temperature=1e23"],
     "must be 0 or a number in [0.001, 100.0]"),
]


def run_without_torch(tmp_path: Path, args: list[str]) -> subprocess.CompletedProcess:
    """``python run.py ARGS`` from ``tmp_path`` with torch and transformers made unimportable."""
    fake = tmp_path / "fake"
    for name in ("torch", "transformers"):
        (fake / name).mkdir(parents=True, exist_ok=True)
        (fake / name / "__init__.py").write_text(f"raise ImportError('{name} imported before the refusal')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake), str(ROOT)])}
    return subprocess.run([sys.executable, str(ROOT / "run.py"), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("what,args,fragment", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_mistake_is_one_line_before_torch(tmp_path, what, args, fragment):
    if "hydra/launcher=slurm_gpu" in args and any((Path(p) / "sbatch").exists()
                                                  for p in os.environ.get("PATH", "").split(os.pathsep)):
        pytest.skip("this machine can submit SLURM jobs")
    proc = run_without_torch(tmp_path, args)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, (what, proc.returncode, proc.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], (what, lines)
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "multirun").exists(), what  # no run folder


def test_the_stand_in_torch_would_be_noticed(tmp_path):
    # the check above can fail: a command that gets past the checks imports torch and dies (exit 1)
    proc = run_without_torch(tmp_path, ["model=tiny-random", "task.limit=1", "runner.max_new_tokens=2",
                                        "hydra.run.dir=" + str(tmp_path / "run")])
    assert proc.returncode == 1 and "torch imported before the refusal" in proc.stderr


def _resumable_folder(folder: Path, args: list[str], rows: str = '{"status": "ok"}\n', shard: dict | None = None
                      ) -> None:
    """A run folder as a finished run of ``args`` leaves it, as far as the precheck reads it: ``rows``, and a
    meta.json whose identity is that command's config part plus keys only a job adds."""
    from omegaconf import OmegaConf

    from harness.config.compose import compose, validate
    from harness.config.identity import config_identity

    base = compose(args, return_hydra_config=True, check=False)
    job = validate(OmegaConf.masked_copy(base, [k for k in base if k != "hydra"]),
                   choices=dict(base.hydra.runtime.choices))
    identity = {**config_identity(OmegaConf.to_container(job, resolve=True)), "code.git_commit": "abc",
                "machine.device": "cpu", "data.fingerprint": "f00"}
    folder.mkdir(parents=True)
    (folder / "results.jsonl").write_text(rows)
    (folder / "meta.json").write_text(json.dumps({"identity": identity, "shard": shard}))


def test_resuming_a_folder_of_other_settings_is_one_line_before_torch(tmp_path):
    # Before: refused only by the job, after both models had loaded (25 s on the real pair), in four lines.
    args = ["model=tiny-random", "task.limit=1", "decoder=[vanilla,speculative]"]
    folder = tmp_path / "run"
    _resumable_folder(folder, args)
    before = {p: p.read_bytes() for p in folder.iterdir()}
    proc = run_without_torch(tmp_path, [*args, "decoder.speculative.gamma=6", f"hydra.run.dir={folder}"])
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, lines)
    assert "holds rows measured with other settings (decoder.speculative.gamma: 4 -> 6;" in lines[0]
    assert "runner.resume=false" in lines[0] and "hydra.run.dir=<new folder>" in lines[0]
    assert {p: p.read_bytes() for p in folder.iterdir()} == before  # nothing written or moved


def test_the_same_command_resumes_past_the_precheck(tmp_path):
    from harness.config.precheck import precheck

    args = ["model=tiny-random", "task.limit=1", "decoder=[vanilla,speculative]"]
    _resumable_folder(tmp_path / "run", args)
    assert precheck([*args, f"hydra.run.dir={tmp_path / 'run'}"]).path == tmp_path / "run"  # not refused
    assert precheck([*args, "decoder.speculative.gamma=6", "runner.resume=false", f"hydra.run.dir={tmp_path / 'run'}"])


def test_the_resume_precheck_names_a_shard_or_a_decoder_set_and_skips_a_folder_without_a_row(tmp_path):
    from harness.config.errors import ConfigError
    from harness.config.precheck import precheck

    args = ["model=tiny-random", "task.limit=2", "decoder=[vanilla,speculative]"]
    # Before: another shard was refused only by the job, after the models loaded (runner.shard is not in the identity)
    _resumable_folder(tmp_path / "sh", args, shard={"index": 0, "count": 2})
    with pytest.raises(ConfigError, match=r"\(runner.shard: 0/2 -> 1/2;"):
        precheck([*args, "runner.shard=1/2", f"hydra.run.dir={tmp_path / 'sh'}"])
    assert precheck([*args, "runner.shard=0/2", f"hydra.run.dir={tmp_path / 'sh'}"])  # the same shard resumes
    # Before: another decoder set was named by its first key, "decoder.prompt_lookup._partial_: <absent> -> True"
    _resumable_folder(tmp_path / "dec", args)
    with pytest.raises(ConfigError, match=r"\(decoders: vanilla, speculative -> vanilla, prompt_lookup and \d+ more;"):
        precheck([*args[:2], "decoder=[vanilla,prompt_lookup]", f"hydra.run.dir={tmp_path / 'dec'}"])
    # Before: a results file without a complete row (blank, or a first row torn by a kill) was refused, although the
    # job cuts a torn row off and starts the folder afresh
    for name, rows in (("blank", "\n"), ("torn", '{"status": "ok", "sample_id"')):
        _resumable_folder(tmp_path / name, args, rows=rows)
        assert precheck([*args, "decoder.speculative.gamma=6", f"hydra.run.dir={tmp_path / name}"])


def test_two_spellings_of_one_data_folder_are_one_setting(tmp_path, monkeypatch):
    from harness.config.errors import ConfigError
    from harness.config.precheck import precheck

    # Before: data_dir=<folder>/ or ../<folder> after data_dir=<folder> was "other settings" (the resume was refused)
    data, other = tmp_path / "data", tmp_path / "other"
    data.mkdir()
    other.mkdir()
    args = ["model=tiny-random", "task.limit=1", "decoder=[vanilla]"]
    _resumable_folder(tmp_path / "run", [*args, f"data_dir={data}"])
    monkeypatch.chdir(tmp_path / "run")
    for spelling in (f"{data}/", "../data", f"{tmp_path}/run/../data"):
        assert precheck([*args, f"data_dir={spelling}", f"hydra.run.dir={tmp_path / 'run'}"])
    with pytest.raises(ConfigError, match=rf"\(data_dir: {re.escape(str(data.resolve()))} -> "
                                          rf"{re.escape(str(other.resolve()))};"):
        precheck([*args, "data_dir=../other/", f"hydra.run.dir={tmp_path / 'run'}"])


def test_resuming_a_sweep_whose_job_folder_holds_other_settings_is_one_line_before_torch(tmp_path):
    from harness.config.precheck import precheck

    # Before: job 0 resumed and ran (models loaded), then job 1 refused its folder in 4 lines naming hydra.run.dir
    sweep = ["-m", "model=tiny-random", "task.limit=1", "decoder=[vanilla,speculative]",
             f"hydra.sweep.dir={tmp_path / 's'}"]
    _resumable_folder(tmp_path / "s" / "0", ["model=tiny-random", "task.limit=1", "decoder=[vanilla,speculative]",
                                            "decoder.speculative.gamma=4"])
    _resumable_folder(tmp_path / "s" / "1", ["model=tiny-random", "task.limit=1", "decoder=[vanilla,speculative]",
                                            "decoder.speculative.gamma=6"])
    assert precheck([*sweep, "decoder.speculative.gamma=4,6"])  # the same sweep resumes past the precheck
    proc = run_without_torch(tmp_path, [*sweep, "decoder.speculative.gamma=4,8"])
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, lines)
    assert f"{tmp_path / 's' / '1'} holds rows measured with other settings (decoder.speculative.gamma: 6 -> 8;" \
        in lines[0] and "(hydra.sweep.dir=<new folder>)" in lines[0]
