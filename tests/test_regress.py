"""harness.regress: the gate passes an identical run and fails a lower accept length, a new divergence, a
speedup drop beyond the noise-aware tolerance, and a missing cell; incomparable runs are refused."""

from __future__ import annotations

import json

import pytest

from fixture_rows import fixture_rows, write_run
from harness import regress


@pytest.fixture()
def baseline(tmp_path):
    run = write_run(tmp_path / "base", fixture_rows("base"))
    return regress.write_baseline([run], tmp_path / "baseline.json")


def gate(baseline, run, *extra):
    return regress.main(["--baseline", str(baseline), "--current", str(run), *extra])


def test_baseline_is_small_json(baseline):
    data = json.loads(baseline.read_text())
    assert data["meta"]["version"] == regress.BASELINE_VERSION
    cell = data["cells"]["humaneval | target-7b / draft-1b | speculative"]
    assert cell["speedup"] == pytest.approx(2.0) and cell["accept_length"] == pytest.approx(28 / 9)
    assert cell["samples"] == 4 and cell["divergent_samples"] == [] and cell["max_new_tokens"] == "64"
    assert baseline.stat().st_size < 8000


def test_identical_run_passes(baseline, tmp_path, capsys):
    run = write_run(tmp_path / "same", fixture_rows("other-run-id"))
    assert gate(baseline, run) == 0
    assert "no regression" in capsys.readouterr().out


def test_lower_accept_length_fails(baseline, tmp_path, capsys):
    run = write_run(tmp_path / "worse", fixture_rows("x", pattern=(4, 1, 1)))
    assert gate(baseline, run, "--speedup-tolerance", "10") == 1
    out = capsys.readouterr().out
    assert "accept_length" in out and "REGRESSION" in out
    line = next(l for l in out.splitlines() if "REGRESSION" in l)
    assert "accept_length" in line and "3.111" in line


def test_higher_accept_length_is_reported_not_failed(baseline, tmp_path, capsys):
    run = write_run(tmp_path / "better", fixture_rows("x", pattern=(4, 4, 4)))
    assert gate(baseline, run) == 0
    assert "improved" in capsys.readouterr().out


def test_new_divergence_fails_in_float32(baseline, tmp_path, capsys):
    run = write_run(tmp_path / "div", fixture_rows("x", divergent=[2]))
    assert gate(baseline, run) == 1
    out = capsys.readouterr().out
    assert "new: humaneval/2" in out and "mbpp/2" in out


def test_divergence_tolerance_outside_float32(tmp_path):
    def bf16(rows):
        for r in rows:
            r["dtype"] = "bfloat16"
        return rows

    base = regress.write_baseline([write_run(tmp_path / "b", bf16(fixture_rows("b", n=10)))], tmp_path / "b.json")
    one = write_run(tmp_path / "one", bf16(fixture_rows("c", n=10, divergent=[3])))
    assert gate(base, one) == 1                                        # 10 % drop > 2 % default
    assert gate(base, one, "--equality-tolerance", "0.15") == 0


def test_speedup_drop_fails_beyond_tolerance(baseline, tmp_path, capsys):
    slower = write_run(tmp_path / "slow", fixture_rows("x", spec_factor=1.5))
    assert gate(baseline, slower) == 1
    out = capsys.readouterr().out
    bad = [l for l in out.splitlines() if l.endswith("REGRESSION")]
    assert bad and all(" speedup " in l and "speculative" in l for l in bad)
    assert gate(baseline, slower, "--speedup-rel-tolerance", "0.3") == 0   # 1.5 >= 2.0 - 0.6
    slightly = write_run(tmp_path / "noise", fixture_rows("y", spec_factor=1.97))
    assert gate(baseline, slightly) == 0                                    # within the 0.05 absolute tolerance


def test_speedup_tolerance_accounts_for_measured_spread(tmp_path):
    noisy = [1.0, 3.0, 1.5, 2.5]  # mean 2.0, bootstrap std ~0.4
    base = regress.write_baseline([write_run(tmp_path / "b", fixture_rows("b", spec_factor=noisy))],
                                  tmp_path / "b.json")
    cell = json.loads(base.read_text())["cells"]["humaneval | target-7b / draft-1b | speculative"]
    assert 0.2 < cell["speedup_std"] < 0.6
    run = write_run(tmp_path / "c", fixture_rows("c", spec_factor=[f - 0.3 for f in noisy]))
    assert gate(base, run) == 0                  # 0.3 below, inside k * std
    assert gate(base, run, "--speedup-k", "0") == 1


def test_missing_cell_fails_unless_allowed(baseline, tmp_path, capsys):
    rows = [r for r in fixture_rows("x") if r["task"] == "humaneval"]
    run = write_run(tmp_path / "half", rows)
    assert gate(baseline, run) == 1
    assert "missing" in capsys.readouterr().out
    assert gate(baseline, run, "--allow-missing") == 0


def test_new_cell_is_listed(baseline, tmp_path, capsys):
    run = write_run(tmp_path / "more", fixture_rows("x", lookahead_scope="sample"))
    assert gate(baseline, run) == 0
    assert "new" in capsys.readouterr().out


def test_incomparable_runs_are_refused(baseline, tmp_path, capsys):
    fewer = write_run(tmp_path / "fewer", fixture_rows("x", n=3))
    assert gate(baseline, fewer) == 2
    assert "samples" in capsys.readouterr().err
    rows = fixture_rows("y")
    for r in rows:
        r["max_new_tokens"] = 32
    assert gate(baseline, write_run(tmp_path / "shorter", rows)) == 2


def test_failed_rows_fail(baseline, tmp_path):
    rows = fixture_rows("x")
    rows.append(dict(rows[1], status="error", sample_id="humaneval/99"))
    assert gate(baseline, write_run(tmp_path / "err", rows)) == 1


def test_write_baseline_cli(tmp_path, capsys):
    run = write_run(tmp_path / "run", fixture_rows("x"))
    assert regress.main(["--write-baseline", str(run), "--out", str(tmp_path / "b.json")]) == 0
    assert "4 cells" in capsys.readouterr().out
    assert regress.main(["--baseline", str(tmp_path / "b.json"), "--current", str(run)]) == 0
