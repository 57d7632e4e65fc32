"""The machine a run measures on is named precisely enough that different hardware is never pooled, and a
half-precision run on a CPU that emulates it says so (in the log, every row, the summary and the report)."""

import json

import pandas as pd
import pytest

from harness.results import cpu_isa, device_name, emulated_half_note, native_half_precision, parse_cpuinfo
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
    import harness.results
    names = []
    for text in (ZEN3, ZEN4):
        monkeypatch.setattr(harness.results, "_cpuinfo", lambda t=text: parse_cpuinfo(t))
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
    import harness.results
    from harness import metrics

    monkeypatch.setattr(harness.results, "_cpuinfo", lambda: parse_cpuinfo(cpuinfo))
    _run(tmp_path, "model.dtype=bfloat16", "decoder=[vanilla,speculative]")
    rows = _rows(tmp_path)
    assert {r["native_half_precision"] for r in rows} == {not warned}
    assert {r["cpu_isa"] for r in rows} == {cpu_isa(parse_cpuinfo(cpuinfo)["flags"])}
    summary = (tmp_path / "summary.md").read_text()
    log_text = caplog.text
    assert ("torch emulates it" in summary) is warned
    assert ("torch emulates it" in log_text) is warned
    # the report and the gate read rows through the same aggregation: the warning travels with the rows
    agg = metrics.aggregate(metrics.prepare(pd.DataFrame(rows)))
    assert any("torch emulates it" in w for w in metrics.run_warnings(agg)) is warned
