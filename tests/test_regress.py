"""harness.regress: a gate that can fail. It passes an identical re-run and fails a 10 % slowdown of any single
decoder on the reference race rows, doctored counters, a new divergence and a missing cell; its speed margin
comes from run-to-run noise (replicates), never from how samples differ; incomparable runs are refused.

Load: on synthetic tiny-gate rows measured at load ~3 on 2 cores, with the timing noise and
preemption outliers measured on the project's 2-core runner, an unchanged run passes and a 2x slowdown of one
decoder, or of all of them, fails; a busier machine, a loaded run without repeats, or noise too large to judge
give exit 3 (not a pass). No test here times anything: the rows are seeded and synthetic."""

from __future__ import annotations

import copy
import json
import math
import random
import re
from pathlib import Path

import pytest

from fixture_rows import fixture_rows, real_run, write_run
from harness import regress

ROOT = Path(__file__).resolve().parent.parent
RACE = ROOT / "results" / "reference" / "race20_cpu"
TINY_BASELINE = ROOT / "benchmarks" / "baselines" / "tiny_random.json"
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
    assert data["meta"]["version"] == regress.BASELINE_VERSION == 3
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


@pytest.mark.parametrize("decoder", ["vanilla", "speculative", "lookahead", "prompt_lookup", "hf_assisted", "ouroboros",
                                     "ouroboros_warm", "ouroboros_prompt", "ouroboros_prompt_warm"])
def test_race_ten_percent_slowdown_of_any_single_decoder_fails(decoder, race_baseline, tmp_path, capsys):
    # Reproducer: on the 20-problem race the old margin was 3 % of baseline for speculative but 16 % for
    # prompt_lookup (sample-to-sample spread), so a 14 % slowdown of prompt_lookup passed; a slower vanilla
    # (which raises every speedup) was not gated at all.
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
    tol = regress.Tolerances()
    one = {"noise": None, "counts": [1, 1], "replicates": 1}
    m, how = regress.speed_margin(one, one, tol)                          # assumed 3 % per side, k=2
    assert m == pytest.approx(1 - math.exp(-2 * 0.03 * 2 ** 0.5)) and "ASSUMED" in how
    three = {"noise": None, "counts": [3, 3], "replicates": 3}
    m, _ = regress.speed_margin(three, one, tol)
    assert m == pytest.approx(1 - math.exp(-2 * 0.03 * (1 / 3 + 1) ** 0.5))
    # measured: baseline se = sigma x sqrt(sum c_s / n_s) / S (per-sample medians), run se = sigma x sqrt(c / N)
    # (one median over all its N values); c = pi/2 for medians of >= 3 values
    b = {"noise": 0.10, "counts": [5, 5, 5], "replicates": 5}
    c = {"noise": 0.20, "counts": [5, 5, 5], "replicates": 5}
    se_b, se_c = 0.10 * (3 * math.pi / 2 / 5) ** 0.5 / 3, 0.20 * (math.pi / 2 / 15) ** 0.5
    m, how = regress.speed_margin(b, c, tol)
    assert m == pytest.approx(1 - math.exp(-2 * (se_b ** 2 + se_c ** 2) ** 0.5)) and "measured" in how
    m, how = regress.speed_margin(b, one, tol)                            # the run borrows the baseline's sigma
    assert m == pytest.approx(1 - math.exp(-2 * (se_b ** 2 + 0.10 ** 2 / 2) ** 0.5))
    assert "other's sigma" in how
    tiny = {"noise": 0.001, "counts": [5, 5], "replicates": 5}
    m, how = regress.speed_margin(tiny, tiny, tol)                        # floor
    assert m == pytest.approx(0.02) and "floor" in how
    assert regress.speed_margin(tiny, tiny, tol, floor=0.25)[0] == pytest.approx(0.25)
    # a margin beyond max_margin is not capped into a pass: the check cannot be judged
    wild = {"noise": 2.0, "counts": [5, 5], "replicates": 5}
    m, how = regress.speed_margin(b, wild, tol)
    assert m is None and "noise too large" in how


def test_tokens_per_s_gated_on_the_same_machine_only(baseline, tmp_path, capsys):
    # vanilla 10 % slower: speedups rise, but vanilla's own tokens/s regresses
    slow = write_run(tmp_path / "slow", fixture_rows("x", vanilla_factor=0.9, spec_factor=2.0 / 0.9))
    assert gate(baseline, slow) == 1
    bad = regressions(capsys.readouterr().out)
    assert bad and all("| vanilla " in line and "tokens_per_s" in line for line in bad)
    other = write_run(tmp_path / "other", fixture_rows("y", vanilla_factor=0.5, identity={"device_name": "gpu"}))
    assert gate(baseline, other) == 0
    assert "not gated: other machine" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------ the tiny CI gate
def _limits(out: str) -> list[float]:
    return [float(m) for m in re.findall(r">= (-?[0-9.]+) \(margin", out)]


def test_ci_gate_limits_are_positive_and_catch_a_slowdown(capsys):
    # Reproducer: the tiny-model CI gate had limits like `>= -0.513`: it could not fail on speed.
    data = json.loads(TINY_BASELINE.read_text())
    assert data["meta"]["version"] == regress.BASELINE_VERSION
    tol = ci_tolerances()
    same = regress.compare(data, data, tol)
    text = regress.format_checks(same)
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
        assert [c.cell for c in regress.compare(data, slow, tol) if c.failed] == [name]


def _ci_gate_args() -> dict[str, float]:
    """The tolerances benchmarks/ci_regress.sh passes to the gate (its ``GATE=(...)`` line)."""
    script = (ROOT / "benchmarks" / "ci_regress.sh").read_text()
    line = script[script.index("\nGATE=("):]
    line = line[:line.index(")")]
    pairs = re.findall(r"(--[a-z-]+) ([0-9.]+)", line)
    return {k: float(v) for k, v in pairs}


def ci_tolerances() -> regress.Tolerances:
    args = _ci_gate_args()
    return regress.Tolerances(k=args["--k"], min_margin=args["--min-margin"], max_margin=args["--max-margin"],
                              tokens_per_s_min_margin=args["--tokens-per-s-min-margin"],
                              max_load_per_core=args["--max-load-per-core"])


def test_committed_baseline_is_current_and_gates_tokens_per_s():
    # Reproducer: the committed baseline named the machine "AMD EPYC (2 cores)", a device_name format the
    # runner no longer writes, so tokens/s was "not gated: other machine" on every CI run.
    data = json.loads(TINY_BASELINE.read_text())
    meta = data["meta"]
    assert re.search(r"\[\d+/\d+\] \(\d+ cores, ", meta["device_name"]), meta["device_name"]
    assert meta["torch_num_threads"] == 1                   # benchmarks/ci_regress.sh runs one torch thread
    assert meta["load"]["rows_over"] == 0 and meta["load"]["peak"] < meta["load"]["cores"] + 0.5  # quiet
    args = _ci_gate_args()
    for cell in data["cells"].values():
        assert cell["device_name"] == meta["device_name"]
        assert cell["replicates"] >= 3 * 5 and cell["tokens_per_s_noise"] is not None   # 3 runs x 5 repeats
        if cell["decoder"] != "vanilla":
            assert cell["speedup_noise"] is not None
    checks = regress.compare(data, data, ci_tolerances())
    tps = [c for c in checks if c.metric == "tokens_per_s"]
    assert len(tps) == len(data["cells"]) and all(c.verdict == "ok" for c in tps)
    assert all(float(c.limit.split()[1]) > 0.5 * float(c.baseline) for c in tps)   # a 2x slowdown fails
    assert args["--max-margin"] < 0.5


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
    """``run`` with its rows' load columns set to a quiet 0.0, in place: these tests check how the runner's rows
    are read, and must not depend on how busy the test machine is (load is tested on synthetic rows)."""
    lines = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    for r in lines:
        r.update({c: 0.0 for c in ("load_1m_before", "load_1m_after") if c in r})
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return run


def test_gate_on_the_runners_rows(tmp_path, capsys):
    # The gate reads the merged runner's rows as written (load_1m_*, cpu_affinity, ttft_s, run_identity,
    # equality_check, paired_across_processes): its own run passes; a doctored counter fails exactly.
    run = _quiet(real_run(tmp_path / "greedy"))
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


def tiny_gate_rows(run_id: str, *, load: float, seed: int, repeats: int = 5, cores: int = 2,
                   sigma: float | None = None, outliers: float | None = None, burst: tuple[float, float] = (1.2, 2.0),
                   slow: dict[str, float] | None = None, process: float | None = None) -> list[dict]:
    """Rows shaped like ``benchmarks/ci_regress.sh``'s run: 3 HumanEval prompts x 5 decoders x ``repeats``,
    greedy float32, 48 new tokens, the decoders in a rotating order, every row carrying the runner's load
    columns (``load`` +- 0.2) and ``cores`` usable cores.

    Timing model, after what the project's 2-core runner showed with one torch thread: a call's tokens/s is the
    quiet figure x its CPU share ``min(1, cores / load)`` x ``exp(sigma x N(0, 1))``, and with probability
    ``outliers`` a burst of other work slows that one call by a factor drawn from ``burst``. Defaults: sigma
    12 %; 5 % outliers when quiet (load <= cores), 10 % when loaded, slowed 1.2-2x. Measured there (robust
    sigma of ln values around each prompt's median, 3 runs x 5 repeats): quiet (load 1.2-1.3, the committed
    baseline) tokens/s 14-18 %, speedup 16-22 %; at load 4.4-5.4 tokens/s 12 % with 5 % / 1 % quantiles
    -0.40 / -0.61 (preemption only slows a call), speedup 11 %, quantiles -0.23..+0.33 (5-95 %).
    On top, every process runs at its own speed: a factor ``exp(process)`` on all its rows, by default drawn
    from N(0, 0.15) clipped to +-0.3 (nine quiet one-thread runs there had vanilla at 690-1074 tok/s, ln sd
    0.15, with speedups within +-6 %: the factor cancels in a speedup, not in tokens/s).
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
                tps = QUIET_TPS[i] * TINY[dec][0][i] * min(1.0, cores / max(row_load, 1e-9)) * math.exp(process)
                tps *= math.exp(sigma * rng.gauss(0.0, 1.0)) / slow.get(dec, 1.0) / slow.get("*", 1.0)
                if rng.random() < outliers:
                    tps /= rng.uniform(*burst)
                steps = TINY[dec][1]
                drafted = 48 - steps if dec != "vanilla" else 0
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
                    "wall_time_s": 48 / tps, "tokens_per_s": tps, "matches_vanilla": True,
                    "equality_check": "exact", "first_divergence": None, "load_1m_before": row_load,
                    "load_1m_after": row_load, "status": "ok", "completion": f"answer {i}",
                    **({"token_ids": list(range(48))} if dec == "vanilla" else {})})
    return rows


def ci_args() -> list[str]:
    return [str(x) for kv in _ci_gate_args().items() for x in kv]


@pytest.fixture(scope="module")
def tiny_baseline(tmp_path_factory):
    """The CI baseline's shape: 3 quiet runs (load ~1: the run's own thread) of 5 repeats."""
    d = tmp_path_factory.mktemp("tiny")
    runs = [write_run(d / f"b{i}", tiny_gate_rows(f"b{i}", load=1.0, seed=100 + i)) for i in range(3)]
    return regress.write_baseline(runs, d / "tiny.json")


def ci_gate(baseline, rows, tmp_path, name):
    return gate(baseline, write_run(tmp_path / name, rows), *ci_args())


def speed_checks(out: str) -> list[str]:
    return [line for line in out.splitlines() if " speedup " in line or " tokens_per_s " in line]


@pytest.mark.parametrize("seed", range(6))
def test_unchanged_run_passes_at_load_3_on_2_cores(seed, tiny_baseline, tmp_path, capsys):
    # Reproducer: under load 3-6 three of four gate runs flagged decoders that had not changed. With paired,
    # interleaved ratios, medians over repeats and load-scaled tokens/s, an unchanged run at load ~3 passes,
    # and every speed check was judged (none UNGATED).
    rows = tiny_gate_rows(f"u{seed}", load=3.0, seed=seed)
    assert ci_gate(tiny_baseline, rows, tmp_path, "unchanged") == 0
    out = capsys.readouterr().out
    lines = speed_checks(out)
    assert len(lines) == 4 + 5 and all(" ok " in line or " improved " in line for line in lines), out
    assert "no regression" in out and "peak 1-minute load 3." in out


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("decoder", ["speculative", "prompt_lookup", "lookahead", "ouroboros"])
def test_2x_slowdown_of_one_decoder_fails_at_load_3(decoder, seed, tiny_baseline, tmp_path, capsys):
    # Reproducer: an unchanged run passed with speculative at 1.555 against 0.816 (load inflated it 2x), so a
    # real 2x slowdown could pass too. Now a 2x slower decoder fails at load ~3, on speedup and tokens/s, and
    # nothing else is flagged.
    rows = tiny_gate_rows(f"s{seed}", load=3.0, seed=seed, slow={decoder: 2.0})
    assert ci_gate(tiny_baseline, rows, tmp_path, "slow") == 1
    bad = regressions(capsys.readouterr().out)
    assert bad and all(f"| {decoder} " in line for line in bad)
    assert any(" speedup " in line for line in bad)


@pytest.mark.parametrize("seed", range(3))
def test_2x_slowdown_of_every_decoder_fails_at_load_3(seed, tiny_baseline, tmp_path, capsys):
    # Every decoder (vanilla too) 2x slower: the speedups do not move, so only tokens/s can see it; the load
    # columns explain a third of the drop (2 cores / load 3), not half of it. (Its 40 % floor misses this when
    # the run's process happens to be > 20 % faster than the baseline's: ~8 % of seeds in simulation.)
    rows = tiny_gate_rows(f"a{seed}", load=3.0, seed=seed, slow={"*": 2.0})
    assert ci_gate(tiny_baseline, rows, tmp_path, "all_slow") == 1
    bad = regressions(capsys.readouterr().out)
    assert len(bad) == 5 and all(" tokens_per_s " in line for line in bad)


def test_quiet_run_gates_small_slowdowns(tiny_baseline, tmp_path, capsys):
    # on a quiet runner the margin is the 5 % floor or a little more: a 25 % slowdown of one decoder fails
    assert ci_gate(tiny_baseline, tiny_gate_rows("q", load=1.0, seed=9), tmp_path, "quiet") == 0
    capsys.readouterr()
    rows = tiny_gate_rows("q25", load=1.0, seed=9, slow={"speculative": 1.25})
    assert ci_gate(tiny_baseline, rows, tmp_path, "quiet_slow") == 1
    assert any(" speedup " in line and "| speculative " in line for line in regressions(capsys.readouterr().out))


def test_busy_machine_is_refused_not_passed(tiny_baseline, tmp_path, capsys):
    # load 6 on 2 cores (> 2.5 x cores): the speed checks are not judged, the gate exits 3 naming the load,
    # for an unchanged run and for a 2x slower one alike (it cannot tell them apart reliably)
    for name, slow in (("busy", None), ("busy_slow", {"speculative": 2.0})):
        rows = tiny_gate_rows(name, load=6.0, seed=1, slow=slow)
        assert ci_gate(tiny_baseline, rows, tmp_path, name) == regress.EXIT_UNJUDGED == 3
        out = capsys.readouterr().out
        assert "NOT A PASS" in out and "machine busy: load 6." in out and "on 2 usable cores" in out
        assert len([line for line in speed_checks(out) if " UNGATED " in line]) == 9
        assert not regressions(out)


def test_counter_regression_on_a_busy_machine_still_fails(tiny_baseline, tmp_path, capsys):
    # counters do not depend on load: a changed counter is a regression (exit 1) even when speed is unjudged
    rows = tiny_gate_rows("busy", load=6.0, seed=1)
    next(r for r in rows if r["decoder"] == "ouroboros")["num_steps"] += 1
    assert ci_gate(tiny_baseline, rows, tmp_path, "busy_counter") == 1
    out = capsys.readouterr().out
    assert any("num_steps" in line for line in regressions(out)) and "NOT JUDGED" in out


def test_loaded_run_without_repeats_is_refused(tiny_baseline, tmp_path, capsys):
    # Reproducer (the old CI gate's shape): one timed call per prompt and decoder at load 3 measures nothing
    # about its own noise; the quiet baseline's sigma would understate it. Not judged: exit 3.
    rows = tiny_gate_rows("once", load=3.0, seed=2, repeats=1)
    assert ci_gate(tiny_baseline, rows, tmp_path, "once") == 3
    out = capsys.readouterr().out
    assert "no repeats to measure its noise" in out and "load 3." in out


def test_two_thread_chaos_is_refused_not_passed(tiny_baseline, tmp_path, capsys):
    # With 2 torch threads under load the runner saw per-call slowdowns of 2-20x (speedups 0.13-19.7): the
    # measured noise is so large that a 2x slowdown would hide in it. The gate says so (exit 3), with or
    # without the slowdown; the old gate passed such a run ("improved").
    for name, slow in (("chaos", None), ("chaos_slow", {"speculative": 2.0})):
        rows = tiny_gate_rows(name, load=2.4, seed=3, sigma=1.0, outliers=0.3, burst=(2.0, 20.0))
        assert ci_gate(tiny_baseline, rows, tmp_path, name) == 3
        out = capsys.readouterr().out
        assert "noise too large" in out and "NOT A PASS" in out


def test_write_baseline_refuses_busy_rows(tmp_path, capsys):
    run = write_run(tmp_path / "busy", tiny_gate_rows("busy", load=3.0, seed=0))
    assert regress.main(["--write-baseline", str(run), "--out", str(tmp_path / "b.json")]) == 2
    assert "loaded machine" in capsys.readouterr().err and not (tmp_path / "b.json").exists()
    assert regress.main(["--write-baseline", str(run), "--out", str(tmp_path / "b.json"), "--allow-busy"]) == 0
    assert json.loads((tmp_path / "b.json").read_text())["meta"]["load"]["peak"] > 2.5


def test_tokens_per_s_not_compared_across_thread_counts(tiny_baseline, tmp_path, capsys):
    base = json.loads(tiny_baseline.read_text())
    base["meta"]["torch_num_threads"] = 2
    cur = regress.summarize_cells([write_run(tmp_path / "t", tiny_gate_rows("t", load=1.0, seed=4))])
    cur["meta"]["torch_num_threads"] = 1
    notes = [c for c in regress.compare(base, cur, ci_tolerances()) if c.metric == "tokens_per_s"]
    assert notes and all(c.verdict == "note" and "thread count" in c.limit for c in notes)
