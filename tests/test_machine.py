"""The machine a run measures on is named precisely enough that different hardware is never pooled, and a
half-precision run on a CPU that emulates it says so (in the log, every row, the summary and the report)."""

import json

import pandas as pd
import pytest

from harness.rows.machine import cpu_isa, device_name, emulated_half_note, native_half_precision, parse_cpuinfo
from tests.test_runner import _rows, _run

# Two machines sold as "AMD EPYC": Zen 3 (AVX2 only) and Zen 4 (AVX-512 with bf16 dot products).
ZEN3 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC
flags\t\t: fpu sse sse2 avx fma avx2 bmi2

processor\t: 1
model name\t: AMD EPYC
flags\t\t: fpu sse sse2 avx fma avx2 bmi2 avx512_bf16
"""
ZEN4 = ZEN3.replace("model\t\t: 1\n", "model\t\t: 17\n").replace("avx2 bmi2\n", "avx2 bmi2 avx512f avx512_bf16\n", 1)


def test_cpuinfo_tells_apart_two_machines_of_one_model_name(monkeypatch):
    zen3, zen4 = parse_cpuinfo(ZEN3), parse_cpuinfo(ZEN4)
    assert zen3["model_name"] == zen4["model_name"] == "AMD EPYC"
    assert (zen3["family"], zen3["model"]) == ("25", "1")
    assert "avx512_bf16" not in zen3["flags"]             # the first processor's block only
    assert cpu_isa(zen3["flags"]) == "avx2" and cpu_isa(zen4["flags"]) == "avx2+avx512f+avx512_bf16"
    assert cpu_isa([]) == "unknown"
    assert native_half_precision("bfloat16", zen3["flags"]) is False
    assert native_half_precision("torch.bfloat16", zen4["flags"]) is True
    assert native_half_precision("float16", zen4["flags"]) is False   # avx512_bf16 is not fp16
    assert native_half_precision("float32", zen3["flags"]) is True
    assert native_half_precision("bfloat16", []) is None                 # unknown: no claim either way
    import harness.rows.machine
    names = []
    for text in (ZEN3, ZEN4):
        monkeypatch.setattr(harness.rows.machine, "_cpuinfo", lambda t=text: parse_cpuinfo(t))
        names.append(device_name("cpu"))
    assert names[0] != names[1] and names[0].startswith("AMD EPYC [25/1] (") and names[0].endswith(", avx2)")


def test_emulated_half_note_only_for_half_precision_on_a_cpu_without_its_units():
    env = {"device": "cpu", "dtype": "bfloat16", "native_half_precision": False, "cpu_isa": "avx2"}
    note = emulated_half_note(env)
    assert "torch emulates it" in note and "avx512_bf16" in note and "model.dtype=float32" in note
    assert emulated_half_note({**env, "native_half_precision": True}) is None
    assert emulated_half_note({**env, "native_half_precision": None}) is None
    assert emulated_half_note({**env, "device": "cuda:0"}) is None


@pytest.mark.parametrize("cpuinfo, warned", [(ZEN3, True), (ZEN4, False)])
def test_bf16_run_on_a_cpu_without_bf16_units_is_flagged(tmp_path, monkeypatch, caplog, cpuinfo, warned):
    import harness.rows.machine
    from harness.rows import flags
    from harness.rows import grouping
    from harness.rows import metrics

    monkeypatch.setattr(harness.rows.machine, "_cpuinfo", lambda: parse_cpuinfo(cpuinfo))
    _run(tmp_path, "model.dtype=bfloat16", "decoder=[vanilla,speculative]")
    rows = _rows(tmp_path)
    assert {r["native_half_precision"] for r in rows} == {not warned}
    assert {r["cpu_isa"] for r in rows} == {cpu_isa(parse_cpuinfo(cpuinfo)["flags"])}
    summary = (tmp_path / "summary.md").read_text()
    log_text = caplog.text
    assert ("torch emulates it" in summary) is warned
    assert ("torch emulates it" in log_text) is warned
    # the report and the gate read rows through the same aggregation: the warning travels with the rows
    agg = metrics.aggregate(grouping.prepare(pd.DataFrame(rows)))
    assert any("torch emulates it" in w for w in flags.run_warnings(agg)) is warned


@pytest.mark.parametrize("cpuinfo, expected", [(ZEN3, "float32"), (ZEN4, "bfloat16"), ("", "float32")])
def test_dtype_auto_is_bfloat16_only_where_the_cpu_computes_it(monkeypatch, cpuinfo, expected):
    """model.dtype=auto: bfloat16 on a CPU with bf16 units, float32 where torch would emulate it (or the flags
    are unreadable); bfloat16 on CUDA; explicit names are taken as they are."""
    import torch

    import harness.rows.machine
    from harness.job.models import resolve_dtype

    monkeypatch.setattr(harness.rows.machine, "_cpuinfo", lambda: parse_cpuinfo(cpuinfo))
    assert resolve_dtype("auto", "cpu") == getattr(torch, expected)
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype("bfloat16", "cpu") == torch.bfloat16 and resolve_dtype("float32", "cpu") == torch.float32
    with pytest.raises(ValueError, match="auto"):
        resolve_dtype("bf16", "cpu")


@pytest.mark.parametrize("cpuinfo, expected", [(ZEN3, "float32"), (ZEN4, "bfloat16")])
def test_dtype_auto_records_the_resolved_dtype_in_rows_and_meta(tmp_path, monkeypatch, cpuinfo, expected):
    import harness.rows.machine

    monkeypatch.setattr(harness.rows.machine, "_cpuinfo", lambda: parse_cpuinfo(cpuinfo))
    _run(tmp_path, "model.dtype=auto", "decoder=[vanilla,speculative]")
    rows = _rows(tmp_path)
    assert {r["dtype"] for r in rows} == {expected}
    assert {r["native_half_precision"] for r in rows} == {True}      # auto never picks an emulated dtype
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["environment"]["dtype"] == expected
    assert "torch emulates it" not in (tmp_path / "summary.md").read_text()


def test_tuning_mismatches_names_decoders_tuned_on_another_dtype_or_machine(tmp_path):
    from harness.config.compose import TUNED_ON_PREFIX, tuning_mismatches

    (tmp_path / "decoder" / "tuned").mkdir(parents=True)
    record = {"dtype": "bfloat16", "device_name": "AMD EPYC [25/17] (2 cores, avx2+avx512f+avx512_bf16)"}
    (tmp_path / "decoder" / "tuned" / "speculative_tuned.yaml").write_text(
        f"# header\n{TUNED_ON_PREFIX}{json.dumps(record)}\ngamma: 8\n")
    (tmp_path / "decoder" / "speculative.yaml").write_text("gamma: 4\n")   # hand-written: no record, no claim
    names = ["vanilla", "speculative", "speculative_tuned"]
    assert tuning_mismatches(names, "bfloat16", record["device_name"], tmp_path) == []
    [line] = tuning_mismatches(names, "float32", record["device_name"], tmp_path)
    assert line.startswith("decoder speculative_tuned was tuned on another setup: dtype 'bfloat16' (this run: "
                           "'float32')") and "device_name" not in line and "Re-tune here" in line
    [line] = tuning_mismatches(names, "bfloat16", "AMD EPYC [25/1] (2 cores, avx2)", tmp_path)
    assert "device_name" in line and "dtype" not in line


def test_a_run_with_a_config_tuned_elsewhere_says_so_in_summary_and_meta(tmp_path):
    """The committed *_tuned configs record bfloat16; a float32 tiny-model run of one is flagged, not refused."""
    _run(tmp_path, "decoder=[vanilla,tuned/speculative_tuned]")
    assert {r["status"] for r in _rows(tmp_path)} == {"ok"}
    summary = (tmp_path / "summary.md").read_text()
    assert "decoder speculative_tuned was tuned on another setup: dtype 'bfloat16' (this run: 'float32')" in summary
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert any("speculative_tuned" in n for n in meta["notes"])
