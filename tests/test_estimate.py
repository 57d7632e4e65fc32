"""The time a command will take, said before it starts (harness/config/estimate.py; benchmarks/costs.py refreshes
the cost table from measured runs)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.config import estimate
from harness.config.compose import compose
from harness.config.precheck import precheck
from tasks import TASK_SIZES
from tests.fixture_rows import fixture_rows, write_run

ROOT = Path(__file__).resolve().parents[1]
ENTRY = {"vanilla_tokens_per_s": 2.0, "prefill_s": 1.0, "tasks": {"gsm8k": {"vanilla_tokens_per_s": 4.0,
                                                                            "prefill_s": 3.0}},
         "speedup": {"speculative": 2.0}, "class_speedup": {"SpeculativeDecoder": 1.6},
         "source": ["results/x"], "device_name": "test cpu"}


def test_a_job_is_priced_cell_by_cell():
    job = estimate.Job("humaneval", {"vanilla": "decoders.vanilla.VanillaDecoder",
                                     "speculative": "decoders.speculative.SpeculativeDecoder",
                                     "speculative_wide": "decoders.speculative.SpeculativeDecoder",
                                     "lookahead": "decoders.lookahead.LookaheadDecoder"},
                       cells=3, tokens=64, warmup_calls=1, warmup_tokens=16)
    seconds, unmeasured = estimate.price(job, ENTRY)
    # per decoder: 3 x (1 + 64 / rate) + (1 + 16 / rate); rates 2 (vanilla), 4 (measured), 3.2 (its class), 2
    expected = sum(3 * (1 + 64 / r) + (1 + 16 / r) for r in (2.0, 4.0, 3.2, 2.0))
    assert seconds == pytest.approx(expected)
    assert unmeasured == ["speculative_wide", "lookahead"]
    gsm8k = estimate.Job("gsm8k", {"vanilla": "decoders.vanilla.VanillaDecoder"}, 2, 10, 0, 16)
    assert estimate.price(gsm8k, ENTRY)[0] == pytest.approx(2 * (3.0 + 10 / 4.0))  # the task's own measurement


def test_a_call_is_priced_by_the_answer_lengths_measured():
    # Reproducer: every call was priced at its whole budget, so the quick presets' estimates ran 27-69 % above
    # their measured times on the AMX Xeon (most answers end at an EOS before 96 tokens)
    measured = {"budget": 96, "mean_new_tokens": 80.0, "capped_share": 0.5}
    assert [estimate.expected_tokens(b, measured) for b in (64, 96, 256)] == [64.0, 80.0, 160.0]  # the docstring's
    assert estimate.expected_tokens(256, {}) == 256.0                       # nothing measured: the whole budget
    assert estimate.expected_tokens(256, dict(measured, mean_new_tokens=96.0, capped_share=1.0)) == 256.0  # all cut
    entry = dict(ENTRY, tasks={"gsm8k": {"vanilla_tokens_per_s": 4.0, "prefill_s": 3.0, **measured}})
    job = estimate.Job("gsm8k", {"vanilla": "decoders.vanilla.VanillaDecoder"}, 2, 256, 1, 16)
    assert estimate.price(job, entry)[0] == pytest.approx(2 * (3.0 + 160 / 4.0) + (3.0 + 16 / 4.0))


@pytest.mark.parametrize("overrides, cells, tokens", [
    (["task=humaneval", "task.limit=3", "runner.max_new_tokens=null"], 3, 512),     # the task's own budget
    (["task=mt_bench", "task.limit=3", "runner.max_new_tokens=64"], 6, 64),         # two turns per question
    (["task=humaneval", "task.limit=null", "task.offset=160", "runner.repeats=2"], 8, 128),  # 4 left, twice
    (["task=humaneval", "runner.sample_ids=[HumanEval/1,HumanEval/3]"], 2, 128),   # the main job's budget
])
def test_a_jobs_cells_and_budget_come_from_its_config(overrides, cells, tokens):
    job = estimate.job_of(compose(overrides), TASK_SIZES)
    assert (job.cells, job.tokens) == (cells, tokens)
    assert set(job.decoders) == set(compose(overrides)["decoder"])


def test_a_job_of_unknown_size_is_not_guessed():
    validation = compose(["task=mbpp", "task.split=validation", "task.limit=null"])
    assert estimate.job_of(validation, TASK_SIZES) is None  # its size is not the registered test split's
    assert "known only once its task data is read" in estimate.estimate([None], 1, "k", {"entries": {"k": ENTRY}})


def test_no_entry_for_the_machine_says_what_adds_one():
    line = estimate.estimate([], 1, estimate.machine_key("m", "float32", "avx2"), {"entries": {}})
    assert line.startswith("estimated time: unknown (no measured costs for m, float32, avx2")
    assert "benchmarks/costs.py" in line


def test_a_sweep_is_priced_job_by_job(tmp_path, monkeypatch):
    """experiment=gamma_ablation: 7 jobs (one per gamma), each priced from its composed config."""
    table = tmp_path / "costs.json"
    table.write_text(json.dumps({"entries": {estimate.machine_key("qwen2.5-coder-1.5b", "float32", "testisa"): ENTRY}}))
    monkeypatch.setattr(estimate, "COSTS_FILE", table)
    folder = precheck(["experiment=gamma_ablation", f"hydra.sweep.dir={tmp_path / 'sweep'}"])
    assert folder.njobs == 7
    line = estimate.line(folder.configs, folder.njobs, "testisa", native_bf16=False)  # dtype auto: float32 here
    assert line.startswith("estimated time: ~") and "(7 jobs; 3 decoders x 5 cells x at most 96 tokens" in line, line
    assert "not measured, priced by their class or as vanilla: ouroboros" in line
    job = estimate.job_of(compose(["experiment=gamma_ablation", "decoder.speculative.gamma=1", "task.limit=5",
                                   "runner.max_new_tokens=96"]), TASK_SIZES)
    minutes = 7 * estimate.price(job, ENTRY)[0] / 60
    assert line.startswith(f"estimated time: {estimate.say(minutes)}")


#: The presets that reproduce a paper's table or figure (docs/papers.md): each one's own size is its quick size.
PAPER_PRESETS = ("main_result", "gamma_ablation", "warm_cold", "lookahead_sweep", "opt_tree_comparison",
                 "opt_tree_scaling")


@pytest.mark.parametrize("name", PAPER_PRESETS)
def test_a_paper_preset_fits_one_sitting_on_a_bf16_cpu(name, tmp_path):
    """Each paper preset's quick size: at most 60 minutes as priced by every bf16 CPU entry of the committed cost
    table (an upper bound: the budget is priced in full); the full size is the command line's."""
    data = Path(os.environ.get("SPECDEC_DATA_DIR") or ROOT.parent / "shared" / "data")
    if not data.is_dir():
        pytest.skip(f"the shared task data is not at {data}")
    folder = precheck([f"experiment={name}", f"hydra.sweep.dir={tmp_path / 'sweep'}", f"data_dir={data}"])
    costs = estimate.load_costs()
    keys = [k for k, e in costs["entries"].items() if e["dtype"] == "bfloat16" and "avx512_bf16" in e["cpu_isa"]
            and e["model"] == "qwen2.5-coder-1.5b"]
    assert len(keys) >= 2                                       # Zen 4 and the AMX Xeon, measured
    for key in keys:
        line = estimate.line(folder.configs, folder.njobs, costs["entries"][key]["cpu_isa"], native_bf16=True)
        minutes = float(line.split("~", 1)[1].split(" ", 1)[0])
        assert "h" not in line.split("(", 1)[0] and minutes <= 60, (key, line)


def test_run_py_says_the_estimate_before_the_run(tmp_path):
    proc = subprocess.run([sys.executable, "run.py", "model=tiny-random", "task.limit=1", "runner.max_new_tokens=2",
                           "decoder=[vanilla]", f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    first = proc.stdout.splitlines()[0]
    assert first.startswith("estimated time: unknown (no measured costs for tiny-random, float32"), first


def test_costs_py_writes_an_entry_per_machine_class(tmp_path):
    rows = fixture_rows("a", tasks=["humaneval"], ttft_share=0.1)
    for r in rows:
        r["cpu_isa"] = "avx2"
    write_run(tmp_path / "run", rows)
    table = tmp_path / "costs.json"
    proc = subprocess.run([sys.executable, "benchmarks/costs.py", str(tmp_path / "run"), "--write", "--table",
                           str(table)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    entry = json.loads(table.read_text())["entries"]["fixture|float32|avx2"]
    vanilla = [r for r in rows if r["decoder"] == "vanilla"]
    assert entry["vanilla_tokens_per_s"] == pytest.approx(sum(r["tokens_per_s"] for r in vanilla) / len(vanilla),
                                                          rel=1e-3)
    assert entry["speedup"]["speculative"] > 1 and set(entry["tasks"]) == {"humaneval"}
    lengths = entry["tasks"]["humaneval"]                        # how long the answers ran, at which budget
    assert lengths["budget"] == max(int(r["max_new_tokens"]) for r in vanilla)
    assert lengths["mean_new_tokens"] == pytest.approx(sum(r["new_tokens"] for r in vanilla) / len(vanilla))
    assert lengths["capped_share"] == pytest.approx(
        sum(r["new_tokens"] >= lengths["budget"] for r in vanilla) / len(vanilla))
    bad = subprocess.run([sys.executable, "benchmarks/costs.py", str(tmp_path / "nope")], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.startswith("error: no such run folder")


BATCHED = dict(ENTRY, batch={"2": {"throughput_ratio": 2.0, "base_tokens_per_s": 5.0, "speedup": {"speculative": 1.5},
                                   "class_speedup": {"SpeculativeDecoder": 1.2}, "budget": 64}},
               batch_source=["results/b"])


def test_a_batch_job_is_priced_by_the_batch_costs_measured_at_or_below_its_size():
    # Reproducer: batch jobs were priced as single-request calls (experiment=batch_sweep said ~1.9 h; it took 27.5 min)
    decoders = {"vanilla": "decoders.vanilla.VanillaDecoder", "speculative": "decoders.speculative.SpeculativeDecoder",
                "speculative_wide": "decoders.speculative.SpeculativeDecoder"}
    job = estimate.Job("humaneval", decoders, cells=8, tokens=50, warmup_calls=1, warmup_tokens=10, batch_size=3)
    seconds, unmeasured = estimate.price(job, BATCHED)  # batch size 3 is priced by the costs measured at 2
    per = (8 * 50 / 5.0 + 1 * 3 * 10 / 5.0) / 2.0      # cells and warm-up rows at base speed / throughput ratio
    assert seconds == pytest.approx(per / 1.0 + per / 1.5 + per / 1.2) and unmeasured == ["speculative_wide"]
    line = estimate.estimate([job], 1, "k", {"entries": {"k": BATCHED}})
    assert "batch size 3 by 2 priced by the batch costs measured at that size (results/b)" in line
    alone = estimate.Job("humaneval", decoders, cells=8, tokens=50, warmup_calls=1, warmup_tokens=10)
    assert estimate.price(dataclasses.replace(job, batch_size=1), BATCHED) == estimate.price(alone, ENTRY)
    single = estimate.estimate([job], 1, "k", {"entries": {"k": ENTRY}})  # no batch costs: the upper bound, said
    assert "batch size 3 priced as single-request calls: an upper bound" in single
    assert estimate.price(job, ENTRY) == estimate.price(alone, ENTRY)


def _batch_rows():
    """Fixture rows at batch size 1 (speculative 2x) and the same rows as batch size 2 (speculative 1.5x, vanilla's
    batch throughput 3x its batch-1 tokens/s)."""
    rows = fixture_rows("a", tasks=["humaneval"], n=6, ttft_share=0.1)
    for r in rows:
        r["cpu_isa"], r["batch_size"] = "avx2", 1
    vanilla = {r["sample_id"]: r for r in rows if r["decoder"] == "vanilla"}
    base = sum(r["tokens_per_s"] for r in vanilla.values()) / len(vanilla)
    batched = []
    for r in rows:
        factor = 1.5 if r["decoder"] == "speculative" else 1.0
        rate = vanilla[r["sample_id"]]["tokens_per_s"] * factor
        index = int(r["sample_id"].rsplit("/", 1)[1])
        batched.append(dict(r, run_id="b2", batch_size=2, batch_index=index // 2, batch_rows=2, tokens_per_s=rate,
                            wall_time_s=r["new_tokens"] / rate, batch_tokens_per_s=3 * base * factor))
    return rows, batched, base


def test_costs_py_writes_batch_costs_and_merges_them_alone(tmp_path):
    rows, batched, base = _batch_rows()
    write_run(tmp_path / "single", rows)
    write_run(tmp_path / "sweep" / "0_b1", rows)  # one job per batch size, as experiment=batch_sweep writes them
    write_run(tmp_path / "sweep" / "1_b2", batched)
    table = tmp_path / "costs.json"

    def costs(*args):
        return subprocess.run([sys.executable, "benchmarks/costs.py", *args, "--write", "--table", str(table)],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)

    refused = costs(str(tmp_path / "sweep"), "--batch-only")  # no entry of the class yet
    assert refused.returncode == 2 and "--batch-only needs batch rows and an existing entry" in refused.stderr
    assert costs(str(tmp_path / "single")).returncode == 0
    single = json.loads(table.read_text())["entries"]["fixture|float32|avx2"]
    assert "batch" not in single
    assert costs(str(tmp_path / "sweep"), "--batch-only").returncode == 0
    entry = json.loads(table.read_text())["entries"]["fixture|float32|avx2"]
    block = entry["batch"]["2"]
    assert block["base_tokens_per_s"] == pytest.approx(base, rel=1e-3)
    assert block["throughput_ratio"] == pytest.approx(3.0, rel=1e-3)
    assert block["speedup"]["speculative"] == pytest.approx(1.5, rel=1e-3)
    assert {k: v for k, v in entry.items() if k not in ("batch", "batch_source")} == single  # batch-1 costs kept
    assert entry["batch_source"] == [str(tmp_path / "sweep")]
    assert costs(str(tmp_path / "single")).returncode == 0  # rewritten without batch rows: the batch block stays
    assert json.loads(table.read_text())["entries"]["fixture|float32|avx2"]["batch"] == entry["batch"]


def test_each_cpu_generation_is_priced_by_its_own_costs_and_else_by_its_class(tmp_path):
    # Reproducer: a Zen 4 and a Zen 5 share one instruction-set class; tune_all was priced ~59 min by the Zen 4's
    # costs on the Zen 5 and took 19.7 min there
    rows = fixture_rows("a", tasks=["humaneval"], ttft_share=0.1)
    for r in rows:
        r["cpu_isa"], r["device_name"] = "avx2", "AMD EPYC [26/2] (2 cores, avx2)"
    write_run(tmp_path / "run", rows)
    table = tmp_path / "costs.json"
    proc = subprocess.run([sys.executable, "benchmarks/costs.py", str(tmp_path / "run"), "--write", "--table",
                           str(table)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    written = json.loads(table.read_text())["entries"]
    assert set(written) == {"fixture|float32|avx2|26/2", "fixture|float32|avx2"}  # its own, and its class's
    assert written["fixture|float32|avx2|26/2"]["cpu"] == "26/2"
    assert estimate.cpu_of("AMD EPYC [26/2] (2 cores, avx2)") == "26/2" and estimate.cpu_of("test cpu") is None
    assert estimate.machine_key("m", "bfloat16", "avx2", "25/17") == "m|bfloat16|avx2|25/17"
    faster = dict(ENTRY, vanilla_tokens_per_s=2 * ENTRY["vanilla_tokens_per_s"])
    costs = {"entries": {"k|26/2": faster, "k": ENTRY}}
    job = estimate.Job("humaneval", {"vanilla": "decoders.vanilla.VanillaDecoder"}, cells=20, tokens=200,
                       warmup_calls=0, warmup_tokens=0)
    own = estimate.estimate([job], 1, ["k|26/2", "k"], costs)
    other = estimate.estimate([job], 1, ["k|25/17", "k"], costs)  # no entry of its own: its class's, said
    assert "no costs measured on this CPU" not in own
    assert "no costs measured on this CPU (25/17): priced by another CPU of its instruction-set class" in other
    assert estimate.price(job, faster)[0] < estimate.price(job, ENTRY)[0]
    assert estimate.estimate([job], 1, ["k|1/1", "x"], {"entries": {}}).startswith(
        "estimated time: unknown (no measured costs for x")
