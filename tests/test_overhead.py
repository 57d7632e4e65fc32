"""Host-overhead profiling (harness/job/overhead.py), its CI gate (benchmarks/host_overhead.py --check), and the
device refusals that come before any data or weights load."""

from __future__ import annotations

import copy
import shutil
import sys
import time
from pathlib import Path

import pytest
import torch

from decoders.speculative import SpeculativeDecoder
from decoders.types import DecodeResult, StepRecord
from decoders.vanilla import VanillaDecoder
from harness.config.precheck import check_launcher
from harness.config.compose import ConfigError, compose
from harness.job.models import fit_problem, weight_bytes
from harness.job.overhead import PHASES, ForwardTimer, PhaseProfiler, profile, summarize

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import host_overhead  # noqa: E402


def test_vanilla_profile_splits_host_time_by_phase(target, prompt_ids):
    dec = VanillaDecoder(target)
    with ForwardTimer([target], torch.device("cpu")) as timer:
        runs = profile(dec, prompt_ids[:2], 12, timer)
    assert [r.steps for r in runs] == [11, 11] and [r.new_tokens for r in runs] == [12, 12]
    for r in runs:
        assert {"forward", "rule", "bookkeeping"} <= set(r.phases_ms) <= set(PHASES)
        assert r.forward_ms > 0 and r.host_ms > 0
        assert r.host_ms == pytest.approx(sum(r.phases_ms.values()))
    o = summarize(runs)
    assert o.runs == 2 and o.steps == 11 and o.tokens_per_step == pytest.approx(1.0)


def test_driver_marks_every_phase_of_a_step(target, prompt_ids):
    dec = SpeculativeDecoder(target, copy.deepcopy(target), gamma=4)  # a twin draft: every draft accepted
    with ForwardTimer([target, dec.draft_model], torch.device("cpu")) as timer:
        (run,) = profile(dec, prompt_ids[:1], 21, timer)
    assert set(PHASES) - {"other"} <= set(run.phases_ms)
    assert run.steps == 4 and run.new_tokens == 21  # 1 + 4 steps x 5 tokens


class _SlowModel(torch.nn.Module):
    def forward(self, x):
        time.sleep(0.02)
        return x


class _FakeDecoder:
    """Two 20 ms 'forwards' per step and almost no host work: the profiler must charge them to forward."""

    def __init__(self, model):
        self.model = model

    def generate(self, ids, max_new_tokens, stopwatch):
        stopwatch.first_token()
        for _ in range(3):
            self.model(ids)
            stopwatch.mark("propose")
            self.model(ids)
            stopwatch.mark("forward")
        return DecodeResult(tuple(range(4)), tuple(StepRecord(1, 1) for _ in range(4)))


def test_forward_time_is_subtracted_from_host_time():
    model = _SlowModel()
    with ForwardTimer([model, model], torch.device("cpu")) as timer:  # the same module twice: timed once
        (run,) = profile(_FakeDecoder(model), [torch.zeros(1, 1)], 4, timer)
        assert timer.calls == 6
    assert run.forward_ms >= 39  # 2 x 20 ms per step
    assert run.host_ms < run.forward_ms / 4
    assert not model._forward_hooks and not model._forward_pre_hooks  # hooks removed on exit


def test_profiler_counts_nothing_before_the_first_token():
    prof = PhaseProfiler(ForwardTimer([], torch.device("cpu")))
    prof.mark("propose")
    assert prof.host_s == {} and prof.forward_s == 0.0


def _doc(ratios: dict[str, float], **settings) -> dict:
    base = {"max_new_tokens": 64, "prompt_tokens": 400, "prompts": 2, "dtype": "float32", "device": "cpu", "threads": 1}
    return {"settings": {**base, **settings},
            "decoders": {n: {"ratio_to_vanilla": r, "host_ms": 0.02 * r,
                             "phases_ms": {"propose": 0.01 * r, "rule": 0.01}} for n, r in ratios.items()}}


def test_gate_passes_within_the_margin_and_fails_a_doubled_decoder_naming_the_phase():
    baseline = _doc({"vanilla": 1.0, "speculative": 4.0, "lookahead": 20.0})
    status, lines = host_overhead.check(baseline, _doc({"vanilla": 1.0, "speculative": 7.5, "lookahead": 18.0}), 1.0)
    assert status == 0 and lines[-1].startswith("host-overhead gate: passed")
    status, lines = host_overhead.check(baseline, _doc({"vanilla": 1.0, "speculative": 9.0, "lookahead": 20.0}), 1.0)
    assert status == 1
    (fail,) = [ln for ln in lines if ": FAIL " in ln]
    assert lines[-1].startswith("host-overhead gate: FAILED, 1 decoder(s)")
    assert fail.startswith("speculative: FAIL") and "phase grown most: propose" in fail
    # vanilla's own host time fell (a ratio that grows while the decoder's host time does not): no alarm
    current = _doc({"vanilla": 1.0, "speculative": 9.0, "lookahead": 20.0})
    current["decoders"]["speculative"]["host_ms"] = baseline["decoders"]["speculative"]["host_ms"] * 1.2
    assert host_overhead.check(baseline, current, 1.0)[0] == 0


def test_gate_refuses_other_settings_and_lists_one_sided_decoders():
    baseline = _doc({"vanilla": 1.0, "speculative": 4.0})
    status, lines = host_overhead.check(baseline, _doc({"vanilla": 1.0, "speculative": 4.0}, max_new_tokens=32), 0.5)
    assert status == 2 and "max_new_tokens is 64 in the baseline, 32 now" in lines[0]
    status, lines = host_overhead.check(baseline, _doc({"vanilla": 1.0, "opt_tree": 9.0}), 0.5)
    assert status == 0
    assert "opt_tree: only in the current run (not gated)" in lines
    assert "speculative: only in the baseline (not gated)" in lines


def test_committed_baseline_covers_every_decoder_config():
    import json

    root = Path(__file__).resolve().parents[1]
    baseline = json.loads((root / "benchmarks/baselines/host_overhead.json").read_text())
    configs = {p.stem for p in (root / "conf/decoder").rglob("*.yaml")}
    assert set(baseline["decoders"]) == configs
    assert baseline["settings"] == {"max_new_tokens": 64, "prompt_tokens": 400, "prompts": 2, "dtype": "float32",
                                    "device": "cpu", "threads": 1}


# ------------------------------------------------------------------------------------- device refusals
@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_cuda_without_cuda_is_one_line():
    with pytest.raises(ConfigError) as e:
        compose(["model=tiny-random", "decoder=[vanilla]", "device=cuda"])
    msg = str(e.value)
    assert msg.startswith("device=cuda: ") and "\n" not in msg
    assert any(why in msg for why in ("is a CPU build", "no NVIDIA driver", "sees no CUDA device")), msg


@pytest.mark.skipif(shutil.which("sbatch") is not None, reason="this machine can submit SLURM jobs")
def test_slurm_launcher_without_sbatch_is_one_line():
    target = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    with pytest.raises(ConfigError, match=r"^hydra/launcher=slurm_gpu: submits SLURM jobs with `sbatch`") as e:
        check_launcher({"_target_": target}, "slurm_gpu")
    assert "\n" not in str(e.value)
    check_launcher({"_target_": "hydra._internal.core_plugins.basic_launcher.BasicLauncher"}, "basic")  # no error


def test_weights_that_do_not_fit_are_refused_in_one_line():
    spec = {"source": "tiny_random", "config": {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
                                                "num_hidden_layers": 2, "num_attention_heads": 4,
                                                "num_key_value_heads": 2, "vocab_size": 260}}
    model = harness_tiny(spec)
    assert weight_bytes(spec, torch.bfloat16) == 2 * sum(p.numel() for p in model.parameters())
    gib = 2 ** 30
    line = fit_problem("qwen2.5-coder-7b", 15 * gib, 10 * gib, 80 * gib, torch.device("cuda:0"), torch.bfloat16)
    assert line.startswith("model=qwen2.5-coder-7b needs 15.0 GiB for its weights in bfloat16 but cuda:0 has "
                           "10.0 GiB free of 80.0 GiB") and "\n" not in line
    assert fit_problem("x", 8 * gib, 10 * gib, 80 * gib, torch.device("cuda:0"), torch.bfloat16) is None


def harness_tiny(spec):
    from harness.job.models import build_tiny_random

    return build_tiny_random(spec["config"], seed=0, vocab_size=260)


def test_markdown_of_a_file_that_is_no_measurement_is_one_line(tmp_path, capsys):
    (tmp_path / "empty.json").write_text("{}")
    for path in (tmp_path / "missing.json", tmp_path / "empty.json"):
        assert host_overhead.main(["--markdown", str(path)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: --markdown {path}: not a saved measurement")
