"""harness.regress: a gate that can fail. It passes an identical re-run and fails a 10 % slowdown of any single
decoder on the reference race rows, doctored counters, a new divergence and a missing cell; its speed margin
comes from run-to-run noise (replicates), never from how samples differ; incomparable runs are refused.

Load: on synthetic tiny-gate rows with the timing noise measured on the project's 2-core runner and the
run-queue wait each call met beside 0-3 CPU-bound processes, an unchanged run never fails (exit 0 with a core
to itself, 3 "contended" beside 2-3), a 2x slowdown of one decoder fails beside one, and one decoder 1.1x slower
fails 4 times in 5 on a quiet machine; rows without the contention columns fall back to the load average. Only
test_contention_is_measured_per_call times anything (a 50 ms loop): the rows are seeded and synthetic."""

from __future__ import annotations

import copy
import itertools
import json
import math
import random
import re
import time
from pathlib import Path

import pytest

from fixture_rows import fixture_rows, real_run, write_run
from harness.rows import columns
from harness.regress import cells as gate_cells
from harness.regress import checks as gate_checks
from harness.regress import classes as gate_classes
from harness.regress import noise as gate_noise
from harness.regress import gate as regress

ROOT = Path(__file__).resolve().parent.parent
RACE = ROOT / "results" / "reference" / "race20_cpu"
TINY_BASELINES = ROOT / "benchmarks" / "baselines" / "tiny_random"   # one file per machine class
TINY_FILES = sorted(TINY_BASELINES.glob("*.json"))
SPEC = "humaneval | target-7b / draft-1b | speculative"


@pytest.fixture()
def baseline(tmp_path):
    run = write_run(tmp_path / "base", fixture_rows("base"))
    return regress.write_baseline([run], tmp_path / "baseline.json")


def gate(baseline, run, *extra):
    return regress.main(["--baseline", str(baseline), "--current", str(run), *extra])


def regressions(out: str) -> list[str]:
    return [line for line in out.splitlines() if "REGRESSION" in line]


def test_baseline_is_small_json(baseline):
    data = json.loads(baseline.read_text())
    assert data["meta"]["version"] == gate_cells.BASELINE_VERSION == 3
    cell = data["cells"][SPEC]
    assert cell["speedup"] == pytest.approx(2.0) and cell["accept_length"] == pytest.approx(28 / 9)
    assert cell["samples"] == 4 and cell["divergent_samples"] == [] and cell["max_new_tokens"] == "64"
    assert cell["counters"] == {"new_tokens": 4 * 28, "num_steps": 4 * 9, "draft_forwards": 4 * 32,
                                "num_drafted": 4 * 32, "num_accepted": 4 * 19}
    assert cell["replicates"] == 1 and cell["speedup_noise"] is None
    assert baseline.stat().st_size < 12000


def test_identical_run_passes(baseline, tmp_path, capsys):
    run = write_run(tmp_path / "same", fixture_rows("other-run-id"))
    assert gate(baseline, run) == 0
    out = capsys.readouterr().out
    assert "no regression" in out and "ASSUMED" in out   # one replicate each: the noise is an assumption, said


# ------------------------------------------------------------------------------------------ reference race rows
def _race_rows() -> list[dict]:
    if not RACE.joinpath("results.jsonl").is_file():
        pytest.skip("reference race rows not present")
    return [json.loads(line) for line in RACE.joinpath("results.jsonl").open()]


@pytest.fixture(scope="module")
def race_baseline(tmp_path_factory):
    d = tmp_path_factory.mktemp("race")
    return regress.write_baseline([write_run(d / "base", _race_rows())], d / "race.json")


def test_race_identical_rerun_passes(race_baseline, tmp_path):
    rows = [dict(r, run_id="rerun", attempt_id="x") for r in _race_rows()]
    assert gate(race_baseline, write_run(tmp_path / "rerun", rows)) == 0


@pytest.mark.parametrize("decoder", ["speculative", "lookahead", "prompt_lookup", "hf_assisted", "ouroboros",
                                     "ouroboros_warm", "ouroboros_prompt", "ouroboros_prompt_warm"])
def test_race_ten_percent_slowdown_of_any_single_decoder_fails(decoder, race_baseline, tmp_path, capsys):
    # Reproducer: on the 20-problem race the old margin was 3 % of baseline for speculative but 16 % for
    # prompt_lookup (sample-to-sample spread), so a 14 % slowdown of prompt_lookup passed. (A slower vanilla
    # raises every paired speedup: tokens/s is reported, not gated, see test_tokens_per_s_is_reported_not_gated.)
    rows = _race_rows()
    for r in rows:
        if r["decoder"] == decoder:
            r["wall_time_s"] /= 0.9
            r["tokens_per_s"] *= 0.9
    assert gate(race_baseline, write_run(tmp_path / "slow", rows)) == 1
    bad = regressions(capsys.readouterr().out)
    assert bad and all(f"| {decoder} " in line for line in bad)


def test_race_doctored_accept_length_fails(race_baseline, tmp_path, capsys):
    # bfloat16 rows: counters are gated with the (1 %) accept-length tolerance, not exactly
    rows = _race_rows()
    for r in rows:
        if r["decoder"] == "ouroboros" and r["sample_id"] in ("HumanEval/3", "HumanEval/4"):
            r["num_steps"] += 5
    assert gate(race_baseline, write_run(tmp_path / "doctored", rows)) == 1
    assert any("ouroboros " in line and "accept_length" in line for line in regressions(capsys.readouterr().out))


# ------------------------------------------------------------------------------------------ float32 counters
@pytest.mark.parametrize("column, delta", [("num_steps", 1), ("draft_forwards", 1), ("new_tokens", -1),
                                           ("num_accepted", 1)])
def test_doctored_counter_fails_exactly_in_float32(column, delta, baseline, tmp_path, capsys):
    rows = fixture_rows("x")
    doctored = next(r for r in rows if r["decoder"] == "speculative" and r["sample_id"] == "humaneval/2")
    doctored[column] += delta
    doctored["tokens_per_s"] = doctored["new_tokens"] / doctored["wall_time_s"]  # a consistent row
    assert gate(baseline, write_run(tmp_path / "doctored", rows)) == 1
    bad = regressions(capsys.readouterr().out)
    assert any(SPEC in line and f" {column} " in line for line in bad)


def test_moved_counters_with_equal_totals_fail(baseline, tmp_path, capsys):
    rows = fixture_rows("x")
    a, b = [r for r in rows if r["decoder"] == "speculative" and r["task"] == "humaneval"][:2]
    a["num_steps"] += 1
    b["num_steps"] -= 1
    assert gate(baseline, write_run(tmp_path / "moved", rows)) == 1
    assert any("per-sample counters" in line for line in regressions(capsys.readouterr().out))


def test_repeats_that_disagree_in_float32_fail(tmp_path, capsys):
    base = regress.write_baseline([write_run(tmp_path / "b", fixture_rows("b", repeats=2))], tmp_path / "b.json")
    rows = fixture_rows("c", repeats=2)
    next(r for r in rows if r["decoder"] == "speculative" and r["repeat"] == 1)["num_steps"] += 1
    rows_other = [r for r in rows]
    assert gate(base, write_run(tmp_path / "c", rows_other)) == 1
    assert any("repeats agree" in line for line in regressions(capsys.readouterr().out))


def test_lower_accept_length_fails(baseline, tmp_path, capsys):
    run = write_run(tmp_path / "worse", fixture_rows("x", pattern=(4, 1, 1)))
    assert gate(baseline, run) == 1
    assert any("num_accepted" in line for line in regressions(capsys.readouterr().out))


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


# ------------------------------------------------------------------------------------------ speed vs noise
def test_sample_spread_does_not_widen_the_margin(tmp_path, capsys):
    # Reproducer: the old margin was k x the bootstrap std over samples; samples that differ a lot (here
    # speedups 1..3) let a real 10 % slowdown through. The margin now ignores sample-to-sample spread.
    noisy = [1.0, 3.0, 1.5, 2.5]
    base = regress.write_baseline([write_run(tmp_path / "b", fixture_rows("b", spec_factor=noisy))],
                                  tmp_path / "b.json")
    slower = write_run(tmp_path / "c", fixture_rows("c", spec_factor=[0.9 * f for f in noisy]))
    assert gate(base, slower) == 1
    assert any(SPEC in line and " speedup " in line for line in regressions(capsys.readouterr().out))


def test_margin_comes_from_replicates(tmp_path, capsys):
    # three baseline runs (replicates) with 2 % timing jitter: the margin is measured, a 12 % slowdown fails,
    # a re-run with fresh jitter passes
    runs = [write_run(tmp_path / f"b{i}", fixture_rows(f"b{i}", n=8, jitter=0.02, seed=i)) for i in range(3)]
    base = regress.write_baseline(runs, tmp_path / "b.json")
    cell = json.loads(base.read_text())["cells"][SPEC]
    assert cell["replicates"] == 3 and 0 < cell["speedup_noise"] < 0.05
    fresh = write_run(tmp_path / "fresh", fixture_rows("fresh", n=8, jitter=0.02, seed=7))
    assert gate(base, fresh, "--k", "3") == 0   # k = 2 (the default) alarms on ~2 % of checks by design
    assert "measured over repeats" in capsys.readouterr().out
    slow = write_run(tmp_path / "slow", fixture_rows("slow", n=8, spec_factor=2.0 * 0.88, jitter=0.02, seed=8))
    assert gate(base, slow, "--k", "3") == 1
    # repeats inside one run count as replicates too (runner.repeats)
    rep = regress.write_baseline([write_run(tmp_path / "r", fixture_rows("r", n=8, repeats=3, jitter=0.02))],
                                 tmp_path / "r.json")
    assert json.loads(rep.read_text())["cells"][SPEC]["replicates"] == 3


def test_speed_margin_formula():
    tol = gate_checks.Tolerances()
    one = {"noise": None, "counts": [1, 1], "replicates": 1}
    m, how = gate_noise.speed_margin(one, one, tol)                        # assumed 3 % per side, k=2
    assert m == pytest.approx(1 - math.exp(-2 * 0.03 * 2 ** 0.5)) and "ASSUMED" in how
    three = {"noise": None, "counts": [3, 3], "replicates": 3}
    m, _ = gate_noise.speed_margin(three, one, tol)
    assert m == pytest.approx(1 - math.exp(-2 * 0.03 * (1 / 3 + 1) ** 0.5))
    # measured: baseline se = sigma x sqrt(sum c_s / n_s) / S (per-sample medians), run se = sigma x sqrt(c / N)
    # (one median over all its N values); c = pi/2 for medians of >= 3 values
    b = {"noise": 0.10, "counts": [5, 5, 5], "replicates": 5}
    c = {"noise": 0.20, "counts": [5, 5, 5], "replicates": 5}
    se_b, se_c = 0.10 * (3 * math.pi / 2 / 5) ** 0.5 / 3, 0.20 * (math.pi / 2 / 15) ** 0.5
    m, how = gate_noise.speed_margin(b, c, tol)
    assert m == pytest.approx(1 - math.exp(-2 * (se_b ** 2 + se_c ** 2) ** 0.5)) and "measured" in how
    m, how = gate_noise.speed_margin(b, one, tol)                          # the run borrows the baseline's sigma
    assert m == pytest.approx(1 - math.exp(-2 * (se_b ** 2 + 0.10 ** 2 / 2) ** 0.5))
    assert "other's sigma" in how
    tiny = {"noise": 0.001, "counts": [5, 5], "replicates": 5}
    m, how = gate_noise.speed_margin(tiny, tiny, tol)                      # floor
    assert m == pytest.approx(0.02) and "floor" in how
    assert gate_noise.speed_margin(tiny, tiny, tol, floor=0.25)[0] == pytest.approx(0.25)
    # a margin beyond max_margin is not capped into a pass: the check cannot be judged
    wild = {"noise": 2.0, "counts": [5, 5], "replicates": 5}
    m, how = gate_noise.speed_margin(b, wild, tol)
    assert m is None and "noise too large" in how


def test_tokens_per_s_noted_with_the_machine(baseline, tmp_path, capsys):
    # vanilla 10 % slower: speedups rise; tokens/s is a note (absolute speed is not gated), naming another machine
    slow = write_run(tmp_path / "slow", fixture_rows("x", vanilla_factor=0.9, spec_factor=2.0 / 0.9))
    assert gate(baseline, slow) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if " tokens_per_s " in line]
    assert notes and all(" note " in line for line in notes)
    other = write_run(tmp_path / "other", fixture_rows("y", vanilla_factor=0.5, identity={"device_name": "gpu"}))
    assert gate(baseline, other) == 3             # one machine class recorded: speed is not judged on another
    out = capsys.readouterr().out
    assert "not gated: other machine" in out and "no baseline for this machine class" in out


# ------------------------------------------------------------------------------------------ the tiny CI gate
def _limits(out: str) -> list[float]:
    return [float(m) for m in re.findall(r">= (-?[0-9.]+) \(margin", out)]


@pytest.mark.parametrize("path", TINY_FILES, ids=lambda p: p.stem)
def test_ci_gate_limits_are_positive_and_catch_a_slowdown(path, capsys):
    # Reproducer: the tiny-model CI gate had limits like `>= -0.513`: it could not fail on speed.
    data = json.loads(path.read_text())
    assert data["meta"]["version"] == gate_cells.BASELINE_VERSION
    tol = ci_tolerances()
    same = gate_checks.compare(data, data, tol)
    text = gate_checks.format_checks(same)
    assert not [c for c in same if c.failed or c.unjudged]
    limits = _limits(text)
    assert limits and min(limits) > 0
    speed = [c for c in same if c.metric == "speedup"]
    assert speed and all(float(c.limit.split()[1]) >= 0.5 * float(c.baseline) for c in speed)
    # a doctored slowdown beyond the largest margin (half the speedup) of any one decoder fails; the old gate
    # (margin max(0.5, 0.6 x baseline, 3 bootstrap stds over samples)) passed this one for every decoder
    for name, cell in data["cells"].items():
        if cell["decoder"] == "vanilla":
            continue
        slow = copy.deepcopy(data)
        slow["cells"][name]["speedup"] *= 0.45
        values = slow["cells"][name]["speedup_values"]
        slow["cells"][name]["speedup_values"] = {k: [x + math.log(0.45) for x in v] for k, v in values.items()}
        old_limit = cell["speedup"] - max(0.5, 0.6 * cell["speedup"])  # the old gate's (its std term only widened it)
        assert slow["cells"][name]["speedup"] >= old_limit              # ... so the old gate passed this slowdown
        assert [c.cell for c in gate_checks.compare(data, slow, tol) if c.failed] == [name]


def _ci_gate_args() -> dict[str, float]:
    """The tolerances benchmarks/ci_regress.sh passes to the gate (its ``GATE=(...)`` line)."""
    script = (ROOT / "benchmarks" / "ci_regress.sh").read_text()
    line = script[script.index("\nGATE=("):]
    line = line[:line.index(")")]
    pairs = re.findall(r"(--[a-z-]+) ([0-9.]+)", line)
    return {k: float(v) for k, v in pairs}


def ci_tolerances() -> gate_checks.Tolerances:
    args = _ci_gate_args()
    return gate_checks.Tolerances(k=args["--k"], min_margin=args["--min-margin"], max_margin=args["--max-margin"],
                                  max_load_per_core=args["--max-load-per-core"],
                                  max_contention=args["--max-contention"])


@pytest.mark.parametrize("path", TINY_FILES, ids=lambda p: p.stem)
def test_committed_baseline_is_current(path):
    # Reproducer: the committed baseline named the machine "AMD EPYC (2 cores)", a device_name format the
    # runner no longer writes, so tokens/s was "not gated: other machine" on every CI run.
    data = json.loads(path.read_text())
    meta = data["meta"]
    assert path.name == gate_classes.file_name(data)       # where ci_regress.sh --update writes its class
    assert re.search(r"\[\d+/\d+\] \(\d+ cores, ", meta["device_name"]), meta["device_name"]
    assert meta["torch_num_threads"] == 1                   # benchmarks/ci_regress.sh runs one torch thread
    assert meta["load"]["rows_over"] == 0 and meta["load"]["peak"] < meta["load"]["cores"] + 0.5  # quiet
    for cell in data["cells"].values():
        assert cell["device_name"] == meta["device_name"]
        assert cell["replicates"] >= 3 * 5                  # 3 runs x their repeats
        assert not gate_checks.contended(cell)              # a quiet baseline (where contention was measured)
        if cell["decoder"] != "vanilla":
            assert cell["speedup_noise"] is not None
    checks = gate_checks.compare(data, data, ci_tolerances())
    assert not [c for c in checks if c.failed or c.unjudged]
    assert _ci_gate_args()["--max-margin"] < 0.5


def _as_machine(data: dict, device: str) -> dict:
    """A copy of a baseline-shaped summary as if measured on ``device``."""
    out = copy.deepcopy(data)
    out["meta"]["device_name"] = device
    for cell in out["cells"].values():
        cell["device_name"] = device
    return out


def _slowed(data: dict, name: str, factor: float) -> dict:
    """A copy with the cell ``name`` ``factor`` times slower (its speedup and every paired ln ratio)."""
    out = copy.deepcopy(data)
    out["cells"][name]["speedup"] /= factor
    out["cells"][name]["speedup_values"] = {k: [x - math.log(factor) for x in v]
                                            for k, v in out["cells"][name]["speedup_values"].items()}
    return out


def test_each_machine_class_has_its_own_baseline_and_the_classes_differ():
    # Reproducer: CI on a 2-core AMX Xeon failed unchanged code (Ouroboros 1.043 against a limit of 1.046)
    # because the one committed baseline was a Zen 3 EPYC's: the same code's paired speedups sit 2-5 % lower on
    # the Xeon (recorded quietly on both, counters identical). Each class is now judged against its own file.
    baselines = gate_classes.load([TINY_BASELINES])
    assert len(baselines) >= 2 and len({b.machine for b in baselines}) == len(baselines)
    spread = gate_classes.spreads(baselines)
    name = "humaneval | tiny-random-qwen2 / tiny-random-qwen2-twin | ouroboros"
    assert spread[name] > 0.03                               # more than half the 5 % floor: classes differ
    digests = {b.machine: {n: c["counters_digest"] for n, c in b.data["cells"].items()} for b in baselines}
    assert len({json.dumps(d, sort_keys=True) for d in digests.values()}) == 1   # ... in speed, not in counters
    for b in baselines:                                      # a run of a recorded class: judged by its file alone
        checks, used, line = gate_classes.judge(baselines, copy.deepcopy(b.data), ci_tolerances())
        assert used == [b] and line.startswith("machine class recorded")
        assert not [c for c in checks if c.failed or c.unjudged]
        assert not [c for c in checks if "widened" in c.limit]


def test_an_unrecorded_class_is_judged_with_margins_widened_by_the_spread():
    baselines = gate_classes.load([TINY_BASELINES])
    spread = gate_classes.spreads(baselines)
    tol = ci_tolerances()
    name = "humaneval | tiny-random-qwen2 / tiny-random-qwen2-twin | ouroboros"
    for b in baselines:                       # a machine like either recorded one passes, margins widened
        run = _as_machine(b.data, "Test CPU [0/0] (2 cores, avx2)")
        checks, used, line = gate_classes.judge(baselines, run, tol)
        assert "NOT recorded" in line and used
        assert not [c for c in checks if c.failed or c.unjudged], gate_checks.format_checks(checks)
        speed = {c.cell: c for c in checks if c.metric == "speedup"}
        assert all("widened by" in c.limit for c in speed.values())
        own = next(c for c in gate_checks.compare(b.data, b.data, tol) if c.cell == name and c.metric == "speedup")
        own_margin = float(re.search(r"margin ([0-9.]+)%", own.limit)[1])
        wide_margin = float(re.search(r"margin ([0-9.]+)%", speed[name].limit)[1])
        assert wide_margin == pytest.approx(100 * (1 - (1 - own_margin / 100) * math.exp(-spread[name])), abs=0.06)
    # ... and still fails a real slowdown: Ouroboros 1.2x slower on the unrecorded machine, alone
    slow = _slowed(_as_machine(baselines[0].data, "Test CPU [0/0] (2 cores, avx2)"), name, 1.2)
    checks, _, _ = gate_classes.judge(baselines, slow, tol)
    assert [(c.cell, c.metric) for c in checks if c.failed] == [(name, "speedup")]
    status, _ = gate_checks.verdict(checks)
    assert status == 1


def test_an_unrecorded_machine_slower_for_every_decoder_passes_and_the_raw_spread_would_miss_one_slower():
    # An unrecorded machine where every decoder's speedup sits 10 % lower (a common shift, as between the recorded
    # classes) passes; the shift is what common_shift measures. Reproducer of why the shift is removed: judged by
    # the raw spread between three recorded classes (the rule first built), Ouroboros 1.2x slower alone passes.
    baselines = gate_classes.load([TINY_BASELINES])
    assert len(baselines) >= 3
    tol = ci_tolerances()
    name = "humaneval | tiny-random-qwen2 / tiny-random-qwen2-twin | ouroboros"
    base = baselines[0].data
    uniform = _as_machine(base, "Test CPU [0/0] (2 cores, avx2)")
    for cell in [n for n, c in base["cells"].items() if c.get("speedup")]:
        uniform = _slowed(uniform, cell, 1 / 0.9)
    assert gate_classes.common_shift(uniform, base) == pytest.approx(math.log(0.9))
    checks, _, _ = gate_classes.judge(baselines, uniform, tol)
    assert not [c for c in checks if c.failed or c.unjudged], gate_checks.format_checks(checks)
    slow = _slowed(_as_machine(base, "Test CPU [0/0] (2 cores, avx2)"), name, 1.2)
    raw = gate_classes.spreads(baselines, shifted=False)
    accepted = []
    for b in baselines:
        cross = gate_checks.CrossClass(raw, gate_classes.describe(b.machine))
        if not [c for c in gate_checks.compare(b.data, slow, tol, cross) if c.cell == name and c.failed]:
            accepted.append(b)
    assert accepted                                    # some class's widened raw limit lets it through
    failed = [(c.cell, c.metric) for c in gate_classes.judge(baselines, slow, tol)[0] if c.failed]
    assert failed == [(name, "speedup")]


def test_an_unrecorded_machine_catches_one_decoder_15_percent_slower_and_passes_machines_between_the_classes():
    # A new-user pass found the per-cell "most favourable class" rule letting one decoder 1.15-1.25x slower pass
    # on an unrecorded machine. Now: on a machine like any recorded class, any one decoder 1.15x slower fails;
    # unchanged code on machines between (and up to twice as far as) the recorded classes passes.
    baselines = gate_classes.load([TINY_BASELINES])
    tol = ci_tolerances()
    speed = [n for n, c in baselines[0].data["cells"].items() if c.get("speedup")]
    for b in baselines:
        for name in speed:
            slow = _slowed(_as_machine(b.data, "Test CPU [0/0] (2 cores, avx2)"), name, 1.15)
            failed = [(c.cell, c.metric) for c in gate_classes.judge(baselines, slow, tol)[0] if c.failed]
            assert failed == [(name, "speedup")], (b.path.name, name)
    for one, other in itertools.permutations(baselines, 2):
        for t in (0.5, 1.0, 1.5, 2.0):  # log speedups at one + t x (other - one), from one's timings
            run = _as_machine(one.data, "Test CPU [0/0] (2 cores, avx2)")
            for name in speed:
                run = _slowed(run, name, (one.data["cells"][name]["speedup"] /
                                          other.data["cells"][name]["speedup"]) ** t)
            checks = gate_classes.judge(baselines, run, tol)[0]
            assert not [c for c in checks if c.failed], (one.path.name, other.path.name, t,
                                                         gate_checks.format_checks(checks))


def test_one_recorded_class_does_not_judge_speed_on_another(tmp_path, capsys):
    # With one machine class recorded there is no measured spread: speed on another machine is NOT JUDGED
    # (exit 3, never a pass); counters and equality are still gated exactly.
    first, second = TINY_FILES[:2]
    only = tmp_path / "one"
    only.mkdir()
    (only / first.name).write_text(first.read_text())
    baselines = gate_classes.load([only])
    run = json.loads(second.read_text())
    checks, used, line = gate_classes.judge(baselines, run, ci_tolerances())
    assert "NOT recorded" in line and "speed not judged" in line
    assert {c.verdict for c in checks if c.metric == "speedup"} == {"UNGATED"}
    assert not [c for c in checks if c.failed]
    assert gate_checks.verdict(checks)[0] == gate_checks.EXIT_UNJUDGED
    doctored = copy.deepcopy(run)
    doctored["cells"][next(n for n in run["cells"] if n.endswith("speculative"))]["counters"]["num_steps"] += 1
    assert gate_checks.verdict(gate_classes.judge(baselines, doctored, ci_tolerances())[0])[0] == 1


def test_baseline_folders_are_refused_in_one_line(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    run = write_run(tmp_path / "run", fixture_rows("x"))
    assert regress.main(["--baseline", str(empty), "--current", str(run)]) == 2
    assert "no baseline JSON under" in capsys.readouterr().err
    twins = tmp_path / "twins"
    twins.mkdir()
    for stem in ("a", "b"):
        (twins / f"{stem}.json").write_text(TINY_FILES[0].read_text())
    assert regress.main(["--baseline", str(twins), "--current", str(run)]) == 2
    err = capsys.readouterr().err
    assert "keep one per machine class" in err and len(err.strip().splitlines()) == 1
    assert regress.main(["--baseline", str(tmp_path / "nowhere"), "--current", str(run)]) == 2
    assert "no such baseline file or folder" in capsys.readouterr().err


def test_write_baseline_into_a_folder_names_the_machine_class(tmp_path):
    run = write_run(tmp_path / "run", fixture_rows("x"))
    folder = tmp_path / "classes"
    folder.mkdir()
    path = regress.write_baseline([run], folder)
    data = json.loads(path.read_text())
    assert path.parent == folder and path.name == gate_classes.file_name(data)
    assert gate_classes.load([folder])[0].machine == gate_classes.class_of(data)


# ------------------------------------------------------------------------------------------ bookkeeping
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
    mixed = [*fixture_rows("a"), *fixture_rows("b", identity={"git_commit": "zzz"})]
    assert gate(baseline, write_run(tmp_path / "mixed", mixed)) == 2
    assert "several run identities" in capsys.readouterr().err


def test_failed_rows_fail(baseline, tmp_path):
    rows = fixture_rows("x")
    rows.append(dict(rows[1], status="error", sample_id="humaneval/99"))
    assert gate(baseline, write_run(tmp_path / "err", rows)) == 1


def test_old_baseline_version_is_refused(baseline, tmp_path, capsys):
    old = json.loads(baseline.read_text())
    old["meta"]["version"] = 1
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert gate(tmp_path / "old.json", write_run(tmp_path / "run", fixture_rows("x"))) == 2
    assert "write a new baseline" in capsys.readouterr().err


def test_write_baseline_cli(tmp_path, capsys):
    run = write_run(tmp_path / "run", fixture_rows("x"))
    assert regress.main(["--write-baseline", str(run), "--out", str(tmp_path / "b.json")]) == 0
    assert "4 cells" in capsys.readouterr().out
    assert regress.main(["--baseline", str(tmp_path / "b.json"), "--current", str(run)]) == 0


def test_help_names_the_exit_statuses_and_a_docs_page_that_exists(capsys):
    # The gate's --help carries its usage, checks and exit statuses; the statistics live in a docs page of the
    # repository, which every citation in the gate's modules and the CI script must find (heading included).
    with pytest.raises(SystemExit) as exit_:
        regress.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "--write-baseline RUN [RUN ...] --out baseline.json" in out and "3 no regression found" in out
    cited = []
    for f in [*sorted((ROOT / "harness" / "regress").glob("*.py")), ROOT / "benchmarks" / "ci_regress.sh"]:
        text = f.read_text()
        assert "DESIGN.md" not in text and "ALGORITHMS.md" not in text, f
        for page, heading in re.findall(r'(docs/[a-z_]+\.md), "([^"]+)"', text):
            headings = re.findall(r"^#+ (.+)$", (ROOT / page).read_text(), re.M)
            assert " ".join(heading.split()) in headings, (f, page, heading)   # a citation may wrap a line
            cited.append(f.name)
    assert {"gate.py", "noise.py", "checks.py", "ci_regress.sh"} <= set(cited)
    assert "docs/measurement.md" in out


# ------------------------------------------------------------------------------------------ the runner's own rows
def _doctor(run: Path, out: Path, decoder: str, column: str, delta: int) -> Path:
    """A copy of ``run``'s rows with ``column`` of ``decoder``'s first ok row moved by ``delta``."""
    lines = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    first = next(r for r in lines if r["decoder"] == decoder and r["status"] == "ok")
    first[column] += delta
    out.mkdir(parents=True)
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return out


def _quiet(run: Path) -> Path:
    """``run`` with its rows' load and run-delay columns set to a quiet 0.0, in place: these tests check how the
    runner's rows are read, and must not depend on how busy the test machine is (load is tested on synthetic
    rows)."""
    lines = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    for r in lines:
        r.update({c: 0.0 for c in ("load_1m_before", "load_1m_after", "run_delay_s") if c in r})
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return run


def test_gate_on_the_runners_rows(tmp_path, capsys):
    # The gate reads the merged runner's rows as written (load_1m_*, cpu_affinity, ttft_s, run_identity,
    # equality_check, paired_across_processes): its own run passes; a doctored counter fails exactly.
    run = real_run(tmp_path / "greedy")
    measured = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    ok = [r for r in measured if r["status"] == "ok"]
    assert ok and all(r["cpu_time_s"] >= 0 for r in ok)     # the runner records the contention of every call
    assert all(r["run_delay_s"] >= 0 for r in ok) or not Path("/proc/self/task").is_dir()
    run = _quiet(run)
    base = regress.write_baseline([run], tmp_path / "greedy.json")
    cells = json.loads(base.read_text())["cells"]
    spec = next(c for c in cells.values() if c["decoder"] == "speculative")
    assert spec["equality_check"] == "exact" and spec["equal_to_vanilla"] == 1.0 and spec["samples"] == 2
    assert gate(base, run) == 0
    capsys.readouterr()
    assert gate(base, _doctor(run, tmp_path / "doctored", "speculative", "num_steps", 1)) == 1
    assert any("num_steps" in line for line in regressions(capsys.readouterr().out))


def test_gate_on_sampled_rows_says_na_and_still_gates_counters(tmp_path, capsys):
    # Before: a sampled run makes no matches_vanilla claim, so equality is "n/a" (a note, never a
    # pass or a regression); its counters are deterministic per seed and gated exactly; a greedy baseline is
    # not comparable with it.
    run = _quiet(real_run(tmp_path / "sampled", "runner.temperature=0.7", "runner.seed=3"))
    base = regress.write_baseline([run], tmp_path / "sampled.json")
    spec = next(c for c in json.loads(base.read_text())["cells"].values() if c["decoder"] == "speculative")
    assert spec["equality_check"] == "n/a (sampled)" and spec["equal_to_vanilla"] is None
    assert spec["temperature"] == "0.7" and spec["sampling_seeds"] == ["3"]
    assert gate(base, run) == 0
    out = capsys.readouterr().out
    eq = next(line for line in out.splitlines() if "speculative" in line and "equal_to_vanilla" in line)
    assert "n/a" in eq and "note" in eq
    assert gate(base, _doctor(run, tmp_path / "doctored", "speculative", "num_steps", 1)) == 1
    capsys.readouterr()
    greedy = _quiet(real_run(tmp_path / "greedy"))
    assert gate(base, greedy) == 2
    assert "temperature" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ load
MACHINE = "AMD EPYC [25/17] (2 cores, avx2+avx512f+avx512_bf16)"
#: Per decoder: its true speedup on each of the tiny gate's 3 prompts, and its decode steps for 48 tokens.
TINY = {"vanilla": ((1.0, 1.0, 1.0), 48), "speculative": ((0.82, 0.80, 0.83), 11),
        "prompt_lookup": ((2.1, 1.9, 1.3), 19), "lookahead": ((1.5, 1.2, 1.0), 22),
        "ouroboros": ((1.05, 1.02, 0.97), 7)}
QUIET_TPS = (900.0, 1000.0, 1100.0)  # vanilla's quiet one-thread tokens/s per prompt


def _call_wait(rng: random.Random, burners: int, cores: int) -> float:
    """The share of a call's wall time spent waiting for a CPU beside ``burners`` CPU-bound processes: with
    more runnable threads than cores each gets ``cores / runnable`` of a core, so a call waits ``1 - share``
    of its wall time (+-60 %, as slices fall); with a core to itself, a few preemptions (3 % of calls wait
    1-15 %: a hiccup the run delay sees)."""
    share = min(1.0, cores / (burners + 1))
    if share < 1.0:
        return min(0.9, (1.0 - share) * rng.uniform(0.4, 1.6))
    return rng.uniform(0.01, 0.15) if rng.random() < 0.03 else rng.expovariate(1 / 0.003)


def tiny_gate_rows(run_id: str, *, load: float, seed: int, repeats: int = 5, cores: int = 2,
                   sigma: float | None = None, outliers: float | None = None, burst: tuple[float, float] = (1.2, 2.0),
                   slow: dict[str, float] | None = None, process: float | None = None,
                   burners: int | None = None) -> list[dict]:
    """Rows shaped like ``benchmarks/ci_regress.sh``'s run: 3 HumanEval prompts x 5 decoders x ``repeats``,
    greedy float32, 48 new tokens, the decoders in a rotating order, every row carrying the runner's load
    columns (``load`` +- 0.2: the lagging 1-minute average) and ``cores`` usable cores.

    Timing model, after what the project's 2-core runner showed with one torch thread: a call's tokens/s is the
    quiet figure x ``exp(sigma x N(0, 1))``, and with probability ``outliers`` a burst the scheduler does not
    see (caches, a busy SMT sibling) slows that one call by a factor drawn from ``burst``. Defaults: sigma
    12 %; 5 % outliers when quiet (load <= cores), 10 % when loaded, slowed 1.2-2x. Measured there (robust
    sigma of ln values around each prompt's median, 3 runs x 5 repeats): quiet (the committed baseline)
    tokens/s 14-18 %, speedup 16-22 %.
    On top, every process runs at its own speed: a factor ``exp(process)`` on all its rows, by default drawn
    from N(0, 0.15) clipped to +-0.3 (nine quiet one-thread runs there had vanilla at 690-1074 tok/s, ln sd
    0.15, with speedups within +-6 %: the factor cancels in a speedup, not in tokens/s).
    ``burners``: CPU-bound processes beside the run; each call waits :func:`_call_wait` of its wall time for a
    CPU (its tokens/s x (1 - wait)), recorded as ``run_delay_s`` with ``cpu_time_s`` (the runner's contention
    columns). ``None``: rows of an older runner (no contention columns), their tokens/s x ``min(1, cores /
    load)``.
    ``slow``: decoder -> factor its tokens/s is divided by (a real slowdown; "*" slows every decoder, vanilla
    included)."""
    rng = random.Random(f"{run_id}/{seed}")
    busy = load > cores
    sigma = 0.12 if sigma is None else sigma
    process = max(-0.3, min(0.3, rng.gauss(0.0, 0.15))) if process is None else process
    outliers = (0.10 if busy else 0.05) if outliers is None else outliers
    slow = slow or {}
    names = list(TINY)
    rows = []
    for i in range(3):
        for rep in range(repeats):
            k = (i + rep) % len(names)
            for position, dec in enumerate(names[k:] + names[:k]):
                row_load = max(0.0, load + rng.uniform(-0.2, 0.2))
                wait = _call_wait(rng, burners, cores) if burners is not None else None
                share = 1.0 - wait if wait is not None else min(1.0, cores / max(row_load, 1e-9))
                tps = QUIET_TPS[i] * TINY[dec][0][i] * share * math.exp(process)
                tps *= math.exp(sigma * rng.gauss(0.0, 1.0)) / slow.get(dec, 1.0) / slow.get("*", 1.0)
                if rng.random() < outliers:
                    tps /= rng.uniform(*burst)
                steps = TINY[dec][1]
                drafted = 48 - steps if dec != "vanilla" else 0
                wall = 48 / tps
                rows.append({
                    "run_id": run_id, "attempt_id": "a0", "model": "tiny-random", "target_model": "tiny-random-qwen2",
                    "draft_model": "tiny-random-qwen2-twin", "dtype": "float32", "device": "cpu",
                    "device_name": MACHINE, "git_commit": "abc123", "task": "humaneval", "task_version": "1.0",
                    "sample_id": f"HumanEval/{i}", "sample_index": i, "turn": 0, "repeat": rep,
                    "order_position": position, "decoder": dec, "decoder_params": "{}", "max_new_tokens": 48,
                    "temperature": 0.0, "top_p": 1.0, "top_k": 0, "prompt_tokens": 300 + i,
                    "cpu_count": cores, "cpu_affinity": cores,
                    "new_tokens": 48, "num_steps": steps, "accept_length": 48 / steps, "num_drafted": drafted,
                    "num_accepted": drafted, "draft_forwards": drafted if dec in ("speculative", "ouroboros") else 0,
                    "wall_time_s": wall, "tokens_per_s": tps, "matches_vanilla": True,
                    "equality_check": "exact", "first_divergence": None, "load_1m_before": row_load,
                    "load_1m_after": row_load, "status": "ok", "completion": f"answer {i}",
                    **({"run_delay_s": wait * wall, "cpu_time_s": (1 - wait) * wall} if wait is not None else {}),
                    **({"token_ids": list(range(48))} if dec == "vanilla" else {})})
    return rows


def ci_args() -> list[str]:
    return [str(x) for kv in _ci_gate_args().items() for x in kv]


def ci_repeats() -> int:
    """The timed repeats per cell ``benchmarks/ci_regress.sh`` runs (its ``REPEATS`` default)."""
    return int(re.search(r"REPEATS=\$\{REPEATS:-(\d+)\}", (ROOT / "benchmarks" / "ci_regress.sh").read_text())[1])


@pytest.fixture(scope="module")
def tiny_baseline(tmp_path_factory):
    """The CI baseline's shape: 3 quiet runs (no process beside them) of the CI gate's repeats."""
    d = tmp_path_factory.mktemp("tiny")
    runs = [write_run(d / f"b{i}", tiny_gate_rows(f"b{i}", load=1.0, seed=100 + i, burners=0, repeats=ci_repeats()))
            for i in range(3)]
    return regress.write_baseline(runs, d / "tiny.json")


def ci_gate(baseline, rows, tmp_path, name):
    return gate(baseline, write_run(tmp_path / name, rows), *ci_args())


def speed_checks(out: str) -> list[str]:
    return [line for line in out.splitlines() if " speedup " in line]


def test_contention_is_measured_per_call(monkeypatch):
    # The runner's timed call records the CPU seconds and the run-queue wait of the process (harness.job.cell):
    # a CPU-bound call uses about its wall time in CPU; readings that lack the wait say so (None), never 0.
    from harness.job import timing
    from harness.job.cell import contention_columns
    from harness.job.timing import sched_clock

    before = sched_clock()
    t0 = time.perf_counter()
    x = 0
    while time.perf_counter() - t0 < 0.05:
        x += 1
    wall = time.perf_counter() - t0
    cols = contention_columns(before, sched_clock())
    assert 0 < cols["cpu_time_s"] <= wall * 1.05 + 0.01
    if Path("/proc/self/task").is_dir():
        assert cols["run_delay_s"] is not None and 0 <= cols["run_delay_s"] <= wall + 0.01
        # CPU time and waiting account for the wall time of a CPU-bound call (up to timer resolution)
        assert cols["cpu_time_s"] + cols["run_delay_s"] == pytest.approx(wall, abs=0.02 + 0.2 * wall)
    assert contention_columns((1.0, None), (1.5, 2.0)) == {"cpu_time_s": 0.5, "run_delay_s": None}
    assert contention_columns((1.0, 3.0), (1.5, 3.25)) == {"cpu_time_s": 0.5, "run_delay_s": 0.25}
    assert columns.ROW["run_delay_s"].type == columns.ROW["cpu_time_s"].type == "float"

    def no_proc(path):
        raise FileNotFoundError(path)

    monkeypatch.setattr(timing.os, "scandir", no_proc)                   # no /proc (macOS): not measured
    assert sched_clock()[1] is None and sched_clock()[0] > 0


def test_row_contention_and_pairs_left_out(tmp_path):
    rows = tiny_gate_rows("c", load=1.0, seed=1, burners=0)
    for r in rows:
        r["run_delay_s"] = 0.5 * r["wall_time_s"] if r["decoder"] == "speculative" and r["repeat"] == 0 else 0.0
    cells = gate_cells.summarize_cells([write_run(tmp_path / "c", rows)])["cells"]
    spec = next(c for c in cells.values() if c["decoder"] == "speculative")
    assert spec["contention"]["timed"] == 15 and spec["contention"]["over"] == 3     # 3 of 15 pairs contended
    assert sum(len(v) for v in spec["speedup_values"].values()) == 12    # left out of the figure
    legacy = [{k: v for k, v in r.items() if k not in ("run_delay_s", "cpu_time_s")} for r in rows]
    cells = gate_cells.summarize_cells([write_run(tmp_path / "legacy", legacy)])["cells"]
    assert all(c["contention"]["measured"] == 0 for c in cells.values())


@pytest.mark.parametrize("burners, seed", [(0, 0), (1, 1), (2, 2), (3, 3), (0, 4), (1, 5), (2, 6), (3, 7),
                                           (2, 8), (3, 9)])
def test_unchanged_run_never_fails_beside_cpu_burners(burners, seed, tiny_baseline, tmp_path, capsys):
    # Reproducer: with two or three CPU-bound processes beside the gate (1-minute load 2.2-2.8 on 2 cores,
    # below its 5.0 "too busy" cut: the average lags) unchanged code failed tokens/s checks: the load
    # promised a CPU share the calls did not get. Now the calls' run-queue wait is measured: with a core to
    # itself the run is judged and passes; beside 2-3 burners every call waits, and the gate says "not
    # judged" (exit 3), never a regression.
    rows = tiny_gate_rows(f"u{seed}", load=min(2.5, 1.0 + burners), seed=seed, burners=burners,
                          repeats=ci_repeats() if burners <= 1 else 10)   # judged: the CI gate's shape
    status = ci_gate(tiny_baseline, rows, tmp_path, "unchanged")
    out = capsys.readouterr().out
    assert not regressions(out), out
    lines = speed_checks(out)
    assert len(lines) == 4
    if burners <= 1:
        assert status == 0 and all(" ok " in line or " improved " in line for line in lines), out
    else:
        assert status == gate_checks.EXIT_UNJUDGED and all(" UNGATED " in line and "contended: " in line
                                                           for line in lines), out
        assert "NOT A PASS" in out and "timed pairs waited > 5% of their wall time for a CPU" in out


@pytest.mark.parametrize("seed", range(1))
@pytest.mark.parametrize("decoder", ["speculative", "prompt_lookup", "lookahead", "ouroboros"])
def test_2x_slowdown_of_one_decoder_fails_beside_a_burner(decoder, seed, tiny_baseline, tmp_path, capsys):
    # a 2x slower decoder fails with one CPU-bound process beside the run, and nothing else is flagged
    rows = tiny_gate_rows(f"s{seed}", load=2.0, seed=seed, slow={decoder: 2.0}, burners=1, repeats=10)
    assert ci_gate(tiny_baseline, rows, tmp_path, "slow") == 1
    bad = regressions(capsys.readouterr().out)
    assert bad and all(f"| {decoder} " in line and " speedup " in line for line in bad)


def test_ten_percent_slower_decoder_fails_four_times_in_five_quiet(tiny_baseline, tmp_path, capsys):
    # Reproducer: with 5 repeats per cell and k = 3 the margins were ~20 %: one decoder 10 % slower passed on a
    # quiet machine (a 25 % one was caught). With the CI gate's repeats and tolerances, one decoder whose calls
    # take 1.1x as long fails in at least 4 of 5 quiet runs (the goal benchmarks/gate_under_load.py checks on
    # the real machine), and nothing else is flagged.
    caught = 0
    for seed in range(5):
        rows = tiny_gate_rows(f"t{seed}", load=1.0, seed=200 + seed, slow={"speculative": 1.1}, burners=0,
                              repeats=ci_repeats())
        status = ci_gate(tiny_baseline, rows, tmp_path, f"ten{seed}")
        bad = regressions(capsys.readouterr().out)
        assert status in (0, 1) and all("| speculative " in line for line in bad)
        caught += status == 1
    assert caught >= 4


def test_tokens_per_s_is_reported_not_gated(tiny_baseline, tmp_path, capsys):
    # tokens/s is absolute speed, which differs between processes and under load: reported with its baseline
    # (a note), never gated; every decoder 2x slower (vanilla too) leaves every paired speedup unchanged and
    # is not a speed regression (counters and equality still gate what is computed).
    rows = tiny_gate_rows("all", load=1.0, seed=3, slow={"*": 2.0}, burners=0, repeats=10)
    assert ci_gate(tiny_baseline, rows, tmp_path, "all_slow") == 0
    out = capsys.readouterr().out
    tps = [line for line in out.splitlines() if " tokens_per_s " in line]
    assert len(tps) == 5 and all(" note " in line and "not gated" in line for line in tps)


def test_busy_machine_is_refused_not_passed(tiny_baseline, tmp_path, capsys):
    # Contention measured: three burners, the calls wait ~half their wall time: not judged (exit 3), for an
    # unchanged run and a 2x slower one alike. Older rows without the measurement: the 1-minute load decides
    # (load 6 on 2 cores > 2.5 x cores).
    for name, slow in (("busy", None), ("busy_slow", {"speculative": 2.0})):
        rows = tiny_gate_rows(name, load=2.4, seed=1, slow=slow, burners=3)
        assert ci_gate(tiny_baseline, rows, tmp_path, name) == gate_checks.EXIT_UNJUDGED == 3
        out = capsys.readouterr().out
        assert "NOT A PASS" in out and "contended: " in out
        assert len([line for line in speed_checks(out) if " UNGATED " in line]) == 4 and not regressions(out)
        rows = tiny_gate_rows(name, load=6.0, seed=1, slow=slow)
        assert ci_gate(tiny_baseline, rows, tmp_path, name + "_legacy") == 3
        out = capsys.readouterr().out
        assert "machine busy: load 6." in out and "on 2 usable cores" in out and not regressions(out)


def test_counter_regression_on_a_busy_machine_still_fails(tiny_baseline, tmp_path, capsys):
    # counters do not depend on load: a changed counter is a regression (exit 1) even when speed is unjudged
    rows = tiny_gate_rows("busy", load=2.4, seed=1, burners=3)
    next(r for r in rows if r["decoder"] == "ouroboros")["num_steps"] += 1
    assert ci_gate(tiny_baseline, rows, tmp_path, "busy_counter") == 1
    out = capsys.readouterr().out
    assert any("num_steps" in line for line in regressions(out)) and "NOT JUDGED" in out


def test_loaded_run_without_repeats_is_refused(tiny_baseline, tmp_path, capsys):
    # Rows without the contention columns, one timed call per prompt and decoder at load 3: the run measures
    # nothing about its own noise; the quiet baseline's sigma would understate it. Not judged: exit 3.
    rows = tiny_gate_rows("once", load=3.0, seed=2, repeats=1)
    assert ci_gate(tiny_baseline, rows, tmp_path, "once") == 3
    out = capsys.readouterr().out
    assert "no repeats to measure its noise" in out and "load 3." in out


def test_two_thread_chaos_is_refused_not_passed(tiny_baseline, tmp_path, capsys):
    # With 2 torch threads under load the runner saw per-call slowdowns of 2-20x (speedups 0.13-19.7) that no
    # run-queue wait explains (the OpenMP team stalls): the measured noise is so large that a 2x slowdown would
    # hide in it. The gate says so (exit 3), with or without the slowdown.
    for name, slow in (("chaos", None), ("chaos_slow", {"speculative": 2.0})):
        rows = tiny_gate_rows(name, load=2.4, seed=3, sigma=1.0, outliers=0.3, burst=(2.0, 20.0), slow=slow,
                              burners=0)
        assert ci_gate(tiny_baseline, rows, tmp_path, name) == 3
        out = capsys.readouterr().out
        assert "noise too large" in out and "NOT A PASS" in out


def test_write_baseline_refuses_busy_rows(tmp_path, capsys):
    for name, kw in (("contended", {"burners": 2}), ("legacy", {})):
        run = write_run(tmp_path / name, tiny_gate_rows(name, load=3.0, seed=0, **kw))
        assert regress.main(["--write-baseline", str(run), "--out", str(tmp_path / "b.json")]) == 2
        err = capsys.readouterr().err
        assert ("under contention" if kw else "loaded machine") in err and not (tmp_path / "b.json").exists()
        assert regress.main(["--write-baseline", str(run), "--out", str(tmp_path / "b.json"), "--allow-busy"]) == 0
        (tmp_path / "b.json").unlink()


def test_tokens_per_s_note_names_thread_counts(tiny_baseline, tmp_path, capsys):
    base = json.loads(tiny_baseline.read_text())
    base["meta"]["torch_num_threads"] = 2
    cur = gate_cells.summarize_cells([write_run(tmp_path / "t", tiny_gate_rows("t", load=1.0, seed=4, burners=0))])
    cur["meta"]["torch_num_threads"] = 1
    notes = [c for c in gate_checks.compare(base, cur, ci_tolerances()) if c.metric == "tokens_per_s"]
    assert notes and all(c.verdict == "note" and "thread count" in c.limit for c in notes)
