"""Projected speedups: counters priced on a cost curve by hand (harness.rows.projection), both modes of
benchmarks/project_speedup.py, and its refusals."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import project_speedup as ps  # noqa: E402

from harness.rows import projection as pj  # noqa: E402
from harness.rows.cell_figures import draft_prefill_tokens  # noqa: E402

SHARED = Path(os.environ.get("SPECDEC_DATA_DIR") or ROOT.parent / "shared" / "data")

CURVES = pj.Curves(target=pj.envelope([(1, 1.0), (2, 0.8), (4, 1.2), (8, 1.6)]),
                   draft=pj.envelope([(1, 0.3), (4, 0.4)]), prefill_per_token=0.01, unit_s=0.2, cost_points=(),
                   source="test")


def test_the_curves_are_read_through_their_running_maximum_and_extended_along_their_last_slope():
    assert CURVES.target_cost(2) == 1.0  # the 2-token point measured below the 1-token one is noise
    assert CURVES.target_cost(3) == pytest.approx(1.1)
    assert CURVES.target_cost(16) == pytest.approx(1.6 + 0.1 * 8)  # (1.6 - 1.2) / 4 per token past 8
    assert CURVES.draft_cost(2) == pytest.approx(0.3 + 0.1 / 3)


def test_a_sample_costs_its_verifies_its_draft_forwards_and_one_draft_prefill():
    # a 99-token prompt: the draft's first forward feeds it and the pending token (100), as speculative does
    prompt = draft_prefill_tokens(99, 0)
    assert prompt == 100 and draft_prefill_tokens(99, 40) == 60  # a draft window's cut is not fed
    steps = [pj.Step(4, 3, 100 + 2), pj.Step(4, 2, 2), pj.Step(1)]
    # step 1: verify of 4 (1.2), the 100-token draft prefill (1.0), two 1-token draft forwards (0.3 each);
    # step 2: verify 1.2 and two 1-token forwards; step 3: a plain 1-token step
    expected = 1.2 + 1.0 + 2 * 0.3 + 1.2 + 2 * 0.3 + 1.0
    assert pj.sample_cost(steps, CURVES, draft_prompt=prompt) == pytest.approx(expected)
    # a reduced draft head scales every draft forward but the prefill (one row of logits)
    head = 0.5
    assert pj.sample_cost(steps, CURVES, prompt, head) == pytest.approx(1.2 + 1.2 + 1.0 + 1.0 + head * 4 * 0.3)
    # no prompt to prefill (a proposer without a draft prompt): every forward at the step's mean
    assert pj.sample_cost([pj.Step(1, 2, 8)], CURVES, 0) == pytest.approx(1.0 + 2 * 0.4)


def _row(decoder: str, sample: str, **kw) -> dict:
    """A valid result row (harness.rows.columns.row_problem) with a job's curves."""
    base = {"decoder": decoder, "sample_id": sample, "status": "ok", "prompt_tokens": 100, "decoder_params": "{}",
            "new_tokens": 9, "num_steps": 9, "wall_time_s": 1.8, "tokens_per_s": 5.0,
            "target_cost_curve": "1:1.0,2:0.8,4:1.2,8:1.6", "draft_cost_curve": "1:0.3,4:0.4",
            "bare_token_s": 0.2, "device_name": "test CPU", "dtype": "bfloat16"}
    return {**base, **kw}


def test_rows_mode_prices_each_row_and_pairs_it_with_vanilla(tmp_path):
    rows = [_row("vanilla", "a", new_tokens=9, num_steps=9, target_tokens_fed_per_step=1.0, tpot_s=0.2),
            _row("speculative", "a", new_tokens=9, num_steps=3, target_tokens_fed_per_step=4.0,
                 draft_forwards_per_step=3.0, draft_tokens_fed=101 + 5, tpot_s=0.1, draft_prefill_s=0.202),
            _row("hf_assisted", "a", decoder_class="HFAssistedDecoder", new_tokens=9, num_steps=2,
                 target_tokens_fed_per_step=9.0, tpot_s=0.1)]
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    curves = pj.load_curves(pj.read_rows(str(path)), str(path))
    assert curves.prefill_per_token == pytest.approx(0.202 / 0.2 / 101)  # per token fed: prompt + pending
    out = {r["decoder"]: r for r in pj.project_rows(pj.read_rows(str(path)), curves, 0.78)}
    assert out["vanilla"]["projected"] == pytest.approx(1.0) and out["vanilla"]["measured"] == pytest.approx(1.0)
    # 8 decode tokens over 2 steps: 2 verifies of 4 (1.2 each), the prefill (101 x 0.01), 5 draft forwards
    # feeding 5 tokens (0.3 each)
    assert out["speculative"]["projected"] == pytest.approx(8 / (2 * 1.2 + 1.01 + 5 * 0.3))
    assert "projected" not in out["hf_assisted"]  # its counters include its pre-TTFT step: not priced
    assert out["speculative"]["measured"] == pytest.approx(2.0)
    assert out["speculative"]["tokens_per_step"] == pytest.approx(4.0)
    # a run folder is read as its results.jsonl
    assert pj.read_rows(str(tmp_path)) == pj.read_rows(str(path))


def test_a_draft_windows_cut_is_not_priced_as_prefill(tmp_path):
    # a 600-token prompt of which a window cut 500: the draft's prefill fed 101 tokens (0.202 s = 1.01 units)
    rows = [_row("vanilla", "a", prompt_tokens=600, new_tokens=9, num_steps=9, target_tokens_fed_per_step=1.0),
            _row("speculative", "a", prompt_tokens=600, draft_window_cut=500, new_tokens=9, num_steps=3,
                 target_tokens_fed_per_step=4.0, draft_forwards_per_step=3.0, draft_tokens_fed=101 + 5,
                 draft_prefill_s=0.202)]
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rows = pj.read_rows(str(path))
    curves = pj.load_curves(rows, str(path))
    assert curves.prefill_per_token == pytest.approx(0.01)  # 1.01 units over 101 tokens, not over 601
    out = {r["decoder"]: r for r in pj.project_rows(rows, curves, 0.78)}
    assert out["speculative"]["projected"] == pytest.approx(8 / (2 * 1.2 + 1.01 + 5 * 0.3))


@pytest.mark.skipif(not (SHARED / "humaneval").is_dir(), reason="no HumanEval data")
def test_decode_mode_prices_every_step_of_a_real_decode(tmp_path, capsys):
    # target flat at 1.0, every draft forward 0.5, no prefill measured (free): one sample's projection is its new
    # tokens over steps + 0.5 x (draft forwards - the prefill one)
    row = _row("vanilla", "a", target_cost_curve="1:1.0,64:1.0", draft_cost_curve="1:0.5,64:0.5")
    curves = tmp_path / "curves.jsonl"
    curves.write_text(json.dumps(row) + "\n")
    assert ps.main(["--curves", str(curves), "decode", "--model", "tiny-random", "--limit", "1",
                    "--max-new-tokens", "12", "--data-dir", str(SHARED), "vanilla", "speculative:gamma=3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "decoding humaneval, 1 problem (HumanEval/0) at 12 new tokens here" in out[0]
    assert "'measured'" not in out[0]  # nothing measured in decode mode
    assert "draft prefills are priced at 0" in out[1]
    lines = {line.split()[0]: line.split() for line in out[3:]}
    assert lines["vanilla"][5] == "1.00"
    _, _, steps, per_step, forwards, projected, _ = lines["speculative:gamma=3"]
    steps, per_step, forwards = int(steps), float(per_step), float(forwards)
    expected = per_step * steps / (steps + 0.5 * (forwards * steps - 1))
    assert float(projected) == pytest.approx(expected, abs=0.02)
    assert float(projected) < per_step  # the draft forwards cost something


def test_a_cost_aware_tree_is_given_the_curve_jobs_costs():
    import torch

    from conftest import PROMPTS, TINY, make_noisy_draft
    from decoders.common.stopping import collect_eos_token_ids
    from harness.job.models import ModelPair, build_byte_tokenizer, build_tiny_random

    tok = build_byte_tokenizer()
    target = build_tiny_random(TINY, seed=0, vocab_size=len(tok))
    pair = ModelPair(target, make_noisy_draft(target), tok, "tiny-random", "noisy-draft", target.dtype, target.device)
    eos = collect_eos_token_ids(tok, target.generation_config)
    points = ((1, 0.2, 0.05), (8, 0.21, 0.06), (33, 0.3, 0.09))
    curves = pj.Curves(CURVES.target, CURVES.draft, 0.0, 0.2, points, "test")
    decoder = ps.build("opt_tree_cost", {"num_nodes": 32}, pair, eos, curves)
    res = decoder.generate(torch.tensor([tok(PROMPTS[0], add_special_tokens=False).input_ids]), 16)
    assert res.extra["cost_points"] == "1:200.00/50.00,8:210.00/60.00,33:300.00/90.00"  # not this machine's
    bare = ps.given_costs(pj.Curves(CURVES.target, CURVES.draft, 0.0, 0.2, (), "test"))
    assert bare.target_time(4) == pytest.approx(1.2 * 0.2) and bare.draft_time(1) == pytest.approx(0.3 * 0.2)


@pytest.mark.parametrize("args, says", [
    (["--curves", "/nonexistent.jsonl", "rows", "x.jsonl"], "no such file"),
    (["--reduced-head", "1.5", "--curves", "C", "rows", "x"], "--reduced-head must be in (0, 1]"),
    (["--curves", "C", "decode", "nosuchdecoder"], "unknown decoder 'nosuchdecoder'"),
    (["--curves", "C", "decode", "speculative:gama=3"], "decoder 'speculative:gama=3'"),
    (["--curves", "C", "decode", "speculative:gamma"], "write overrides as name:key=value"),
    (["--curves", "C", "decode", "--model", "nosuchmodel", "vanilla"], "unknown model 'nosuchmodel'"),
    (["--curves", "C", "decode", "--dtype", "float33", "vanilla"], "float33"),
    (["--curves", "C", "decode", "--model", "smollm2-135m", "speculative"], "has none"),
    (["--curves", "C", "decode", "speculative:gamma=[1"], "is not a value"),
    (["--curves", "C", "decode", "--max-new-tokens", "1", "vanilla"], "--max-new-tokens must be >= 2"),
    (["--curves", "NOCURVE", "rows", "x"], "no row has a target_cost_curve"),
    (["--curves", "C", "decode", "hf_assisted"], "is not priced"),
    (["--curves", "C", "rows", "BATCH"], "rows of a batched run"),
    (["--curves", "C", "rows", "BIN"], "line 1: not UTF-8"),
    (["--curves", "BIN", "rows", "C"], "line 1: not UTF-8"),
    (["--curves", "C", "rows", "EMPTY"], "no result row (an empty file)"),
    (["--curves", "C", "rows", "ERRORS"], "no row with status ok (1 of other statuses)"),
    (["--curves", "C", "rows", "TORN"], "resume the run, which cuts a torn line off"),
    (["--curves", "C", "decode", "--limit", "0", "vanilla"], "--limit 0: must be an integer >= 1"),
    (["--curves", "C", "rows", "NOSTEP"], "no row could be priced"),
    (["--curves", "ZERO", "rows", "C"], "not a positive number"),
    (["--curves", "C", "rows", "BADLINE"], "line 2: not JSON"),
    (["--curves", "C", "rows", "EDITED"], "tokens_per_s=7 but new_tokens / wall_time_s"),
    (["--curves", "NAN", "rows", "C"], "bare_token_s"),
    (["--curves", "C", "decode", "--split", "validation", "vanilla"], "task humaneval has no splits"),
    (["--curves", "C", "decode", "--task", "mbpp", "--split", "nosuchsplit", "vanilla"], "nosuchsplit"),
    (["--curves", "C", "rows", "/"], "/results.jsonl: no such file"),
    (["--curves", "NOBARE", "rows", "C"], "no positive bare_token_s"),
])
def test_bad_input_is_refused_in_one_line_before_any_model_loads(tmp_path, capsys, monkeypatch, args, says):
    files = {"C": _row("vanilla", "a"), "NOCURVE": _row("vanilla", "a", target_cost_curve="", draft_cost_curve=""),
             "NOSTEP": _row("vanilla", "a", new_tokens=1, num_steps=1, tokens_per_s=1 / 1.8),
             "EDITED": _row("vanilla", "a", tokens_per_s=7), "NOBARE": _row("vanilla", "a", bare_token_s=0),
             "BATCH": _row("vanilla", "a", batch_size=8, new_tokens=9, num_steps=9),
             "ZERO": _row("vanilla", "a", target_cost_curve="1:0,2:0,4:0")}
    paths = {}
    for name, row in files.items():
        paths[name] = tmp_path / f"{name}.jsonl"
        paths[name].write_text(json.dumps(row) + "\n")
    valid = json.dumps(_row("vanilla", "a"))
    raw = {"BIN": b"\x89PNG\x00\xff\n", "EMPTY": b"", "BADLINE": valid.encode() + b"\n{oops\n",
           "TORN": valid.encode() + b"\n" + valid.encode()[:40],
           "ERRORS": json.dumps({"decoder": "vanilla", "sample_id": "a", "status": "error"}).encode() + b"\n",
           "NAN": valid.replace('"bare_token_s": 0.2', '"bare_token_s": NaN').encode()}
    for name, data in raw.items():
        paths[name] = tmp_path / f"{name}.jsonl"
        paths[name].write_bytes(data)
    args = [str(paths[a]) if a in paths else a for a in args]
    import harness.api

    monkeypatch.setattr(harness.api, "load_pair_by_name", lambda *a, **k: pytest.fail("a model was loaded"))
    assert ps.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and says in err[0], err


def test_a_draft_decoder_without_a_draft_curve_is_refused_before_any_model_loads(tmp_path, capsys, monkeypatch):
    curves = tmp_path / "curves.jsonl"
    curves.write_text(json.dumps(_row("vanilla", "a", draft_cost_curve="")) + "\n")
    import harness.api

    monkeypatch.setattr(harness.api, "load_pair_by_name", lambda *a, **k: pytest.fail("a model was loaded"))
    assert ps.main(["--curves", str(curves), "decode", "--data-dir", str(SHARED), "speculative"]) == 2
    assert "has no draft_cost_curve" in capsys.readouterr().err


def test_a_noisy_curve_is_said_and_transformers_assisted_rows_are_listed_unpriced(tmp_path, capsys):
    rows = [_row("vanilla", "a", new_tokens=9, num_steps=9, target_tokens_fed_per_step=1.0, tpot_s=0.2,
                 target_cost_curve="1:1.0,8:1.6,16:2.7,32:1.7"),
            _row("hf_assisted", "a", new_tokens=9, num_steps=2, target_tokens_fed_per_step=9.0, tpot_s=0.1)]
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert ps.main(["--curves", str(path), "rows", str(path)]) == 0
    out = capsys.readouterr().out
    assert "not monotone" in out and "target 32: 1.70 -> 2.70" in out
    path.write_text(path.read_text() + json.dumps({"decoder": "speculative", "sample_id": "a", "status": "error"})
                    + "\n")
    assert ps.main(["--curves", str(path), "rows", str(path)]) == 0
    assert "1 row of a status other than ok (errors, skips) left out" in capsys.readouterr().out
    assert "hf_assisted" in out and pj.NOT_PRICED_WHY in out


def test_windowed_rows_without_a_recorded_cut_are_listed_unpriced(tmp_path, capsys):
    """A draft window's cut decides the draft prefill taken out of a row's draft tokens: rows of a windowed decoder
    written before draft_window_cut are not priced (their prefill is unknown); with the cut they are."""
    windowed = dict(new_tokens=9, num_steps=3, target_tokens_fed_per_step=4.0, draft_forwards_per_step=3.0,
                    draft_tokens_fed=41 + 5, tpot_s=0.1, draft_prefill_s=0.08,
                    decoder_params=json.dumps({"gamma": 3, "draft_window": 36}))
    path = tmp_path / "results.jsonl"
    for cut, priced in (({}, False), ({"draft_window_cut": 60}, True)):
        rows = [_row("vanilla", "a", target_tokens_fed_per_step=1.0, tpot_s=0.2),
                _row("speculative_w36", "a", **windowed, **cut)]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        assert ps.main(["--curves", str(path), "rows", str(path)]) == 0
        out = capsys.readouterr().out
        assert (pj.UNKNOWN_CUT_WHY in out) is not priced, out


def test_a_refusal_is_one_line_on_stderr_outside_pytest_too(tmp_path):
    # read_results logs what it leaves out; the tool says it once, as its refusal (pytest's log capture would hide
    # a second line, so this runs the command as a user does)
    import subprocess

    path = tmp_path / "results.jsonl"
    path.write_bytes(json.dumps(_row("vanilla", "a")).encode() + b"\n{oops\n")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "project_speedup.py"), "--curves", str(path),
                           "rows", str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [f"error: {path}: 1 line unreadable (line 2: not JSON): the tool "
                                                "prices whole files only (restore or re-run the file)"]


@pytest.mark.skipif(not (SHARED / "mbpp").is_dir(), reason="no MBPP data")
def test_split_picks_the_tasks_dev_split(tmp_path):
    curves = pj.Curves(CURVES.target, CURVES.draft, 0.0, 0.2, (), "test")
    args = ps.argparse.Namespace(max_new_tokens=8, model="tiny-random", dtype="float32", decoders=["vanilla"],
                                 task="mbpp", split="validation", offset=0, limit=2, data_dir=str(SHARED))
    ps.check_decode_args(args, curves)
    assert args.task_obj.split == "validation"
    assert [s.sample_id for s in args.task_obj.samples()] == ["mbpp/511", "mbpp/512"]  # validation: 511-600
