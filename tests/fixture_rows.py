"""Synthetic result rows with known answers, for the report, plot, Spec-Bench and regression-gate tests.

Every speculative row runs exactly ``spec_factor`` times vanilla's tokens/s on the same sample, so its
paired speedup is ``spec_factor`` for every sample; accept lengths follow from the per-step lists. Options
add repeats (with seeded timing jitter), quality scores, categories, turns and machine-load columns.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from harness.rows.results import ResultWriter

IDENTITY = {"model": "fixture", "target_model": "target-7b", "draft_model": "draft-1b", "dtype": "float32",
            "device": "cpu", "device_name": "test cpu", "git_commit": "abc123"}


def spec_steps(gamma: int, pattern: Iterable[int], steps: int) -> tuple[list[int], list[int]]:
    """``(accepted_per_step, drafted_per_step)`` for ``steps`` decode steps cycling through ``pattern``."""
    pattern = list(pattern)
    acc = [min(gamma, pattern[i % len(pattern)]) for i in range(steps)]
    return acc, [gamma] * steps


def _row(run_id: str, task: str, sample: int, decoder: str, params: dict[str, Any], **stats: Any) -> dict:
    return {"run_id": run_id, "attempt_id": "a0", **IDENTITY, "task": task, "task_version": "1",
            "sample_id": f"{task}/{sample}", "repeat": 0, "decoder": decoder, **params,
            "decoder_params": json.dumps(params, sort_keys=True), "max_new_tokens": 64, "prompt_tokens": 20,
            **stats, "status": "ok"}


def fixture_rows(run_id: str = "run1", tasks: Iterable[str] = ("humaneval", "mbpp"), n: int = 4, gamma: int = 4,
                 spec_factor: float | Iterable[float] = 2.0, pattern: Iterable[int] = (4, 1, 2), decode_steps: int = 8,
                 divergent: Iterable[int] = (), timers: bool = True, lookahead_scope: str | None = None,
                 lookahead_factor: float = 1.5, repeats: int = 1, jitter: float = 0.0, seed: int = 0,
                 scores: Sequence[str] = (), categories: Sequence[str] | None = None, turns: int = 1,
                 identity: Mapping[str, Any] | None = None, load: float | None = None, cpu_count: int = 2,
                 vanilla_factor: float = 1.0, temperature: float = 0.0, sampling_seed: int = 0,
                 ttft_share: float | None = None) -> list[dict]:
    """Rows of one run: vanilla and speculative (gamma) on ``n`` samples of each task, optionally lookahead.

    Args:
        spec_factor: speculative tokens/s / vanilla tokens/s, one number or one per sample.
        pattern: accepted draft tokens per decode step, cycled.
        divergent: sample indices where speculative's output differs from vanilla's.
        timers: add ``draft_time_s`` (30 % of wall) and ``verify_time_s`` (60 %).
        lookahead_scope: add a lookahead decoder with this ``pool_scope``.
        repeats: rows per (sample, turn, decoder), ``repeat`` 0..repeats-1.
        jitter: relative standard deviation of a seeded random factor on every row's tokens/s (timing noise).
        seed: seed of the jitter.
        scores: quality columns to add; sample ``i`` scores ``1.0`` when ``i`` is even, else ``0.0``.
        categories: ``category`` of sample ``i`` is ``categories[i % len(categories)]``.
        turns: chat turns per sample (rows per turn, ``turn`` 0..turns-1).
        identity: overrides of the run identity columns (e.g. ``{"git_commit": "def456"}``).
        load: add the runner's ``load_1m_before/after`` = ``load``, ``cpu_count`` and ``cpu_affinity`` (both
            ``cpu_count``) to every row.
        vanilla_factor: multiplies vanilla's tokens/s (a slower or faster reference).
        temperature: > 0 makes the rows sampled, as the runner writes them: ``temperature``, ``top_p``,
            ``top_k``, ``sampling_seed`` (= ``sampling_seed``), ``equality_check = "n/a (sampled)"`` and
            ``matches_vanilla = None`` (``divergent`` is then ignored).
        ttft_share: add the stopwatch's columns: every row's ``ttft_s`` is this share of vanilla's wall time on
            the sample (the same prefill for every decoder), ``decode_tokens_per_s`` = (new tokens - 1) /
            (wall - ttft).
    """
    factors = [spec_factor] * n if isinstance(spec_factor, (int, float)) else list(spec_factor)
    rng = random.Random(f"{run_id}/{seed}")
    rows = []
    for task in tasks:
        for i in range(n):
            for turn in range(turns):
                for rep in range(repeats):
                    rows += _sample_rows(run_id, task, i, turn, rep, gamma, factors[i], pattern, decode_steps,
                                         divergent, timers, lookahead_scope, lookahead_factor, vanilla_factor,
                                         lambda: 1.0 + jitter * rng.gauss(0.0, 1.0) if jitter else 1.0)
    for r in rows:
        r.update(identity or {})
        i = int(r["sample_id"].rsplit("/", 1)[1])
        r.update({c: float(i % 2 == 0) for c in scores})
        if categories:
            r["category"] = categories[i % len(categories)]
        if turns > 1 or "turn" in r:
            r["turn"] = r.get("turn", 0)
        if load is not None:
            r.update(load_1m_before=load, load_1m_after=load, cpu_count=cpu_count, cpu_affinity=cpu_count)
        if temperature > 0:
            r.update(temperature=temperature, top_p=1.0, top_k=0, sampling_seed=sampling_seed,
                     equality_check="n/a (sampled)", matches_vanilla=None, first_divergence=None)
    if ttft_share is not None:
        vanilla_wall = {(r["task"], r["sample_id"], r.get("turn", 0), r["repeat"]): r["wall_time_s"]
                        for r in rows if r["decoder"] == "vanilla"}
        for r in rows:
            ttft = ttft_share * vanilla_wall[(r["task"], r["sample_id"], r.get("turn", 0), r["repeat"])]
            r.update(ttft_s=ttft, decode_tokens_per_s=(r["new_tokens"] - 1) / (r["wall_time_s"] - ttft))
    return rows


def _sample_rows(run_id: str, task: str, i: int, turn: int, rep: int, gamma: int, factor: float,
                 pattern: Iterable[int], decode_steps: int, divergent: Iterable[int], timers: bool,
                 lookahead_scope: str | None, lookahead_factor: float, vanilla_factor: float, noise: Any) -> list[dict]:
    rows: list[dict] = []
    acc, dr = spec_steps(gamma, pattern, decode_steps)
    new_tokens = 1 + sum(a + 1 for a in acc)
    v_tps = (10.0 + i) * vanilla_factor * noise()
    rows.append(_row(run_id, task, i, "vanilla", {}, new_tokens=new_tokens, num_steps=new_tokens,
                     accept_length=1.0, num_drafted=0, num_accepted=0, acceptance_rate=None,
                     draft_forwards=0, wall_time_s=new_tokens / v_tps, tokens_per_s=v_tps,
                     matches_vanilla=True, first_divergence=None, token_ids=list(range(new_tokens)),
                     completion=f"answer {i}.{turn}"))
    s_tps = v_tps * factor * noise()
    wall = new_tokens / s_tps
    spec = dict(new_tokens=new_tokens, num_steps=1 + decode_steps,
                accept_length=new_tokens / (1 + decode_steps),
                num_drafted=sum(dr), num_accepted=sum(acc), acceptance_rate=sum(acc) / sum(dr),
                draft_forwards=sum(dr), accepted_per_step=acc, drafted_per_step=dr, wall_time_s=wall,
                tokens_per_s=s_tps, matches_vanilla=i not in divergent,
                first_divergence=3 if i in divergent else None,
                completion=f"answer {i}.{turn}" + (" (diverged)" if i in divergent else ""))
    if timers:
        spec.update(draft_time_s=0.3 * wall, verify_time_s=0.6 * wall)
    rows.append(_row(run_id, task, i, "speculative", {"gamma": gamma}, **spec))
    if lookahead_scope:
        la_acc, la_dr = spec_steps(3, (3, 0), decode_steps)
        la_new = 1 + sum(a + 1 for a in la_acc)
        la_params = {"window_size": 5, "ngram_size": 4, "guess_set_size": 5, "pool_scope": lookahead_scope}
        rows.append(_row(run_id, task, i, "lookahead", la_params,
                         new_tokens=la_new, num_steps=1 + decode_steps,
                         accept_length=la_new / (1 + decode_steps), num_drafted=sum(la_dr),
                         num_accepted=sum(la_acc), acceptance_rate=sum(la_acc) / sum(la_dr), draft_forwards=0,
                         accepted_per_step=la_acc, drafted_per_step=la_dr,
                         wall_time_s=la_new / (v_tps * lookahead_factor), tokens_per_s=v_tps * lookahead_factor,
                         matches_vanilla=True, first_divergence=None, completion=f"answer {i}.{turn}"))
    for r in rows:
        r["repeat"] = rep
        if turn:
            r["turn"] = turn
    return rows


def write_run(run_dir: str | Path, rows: Iterable[dict]) -> Path:
    """Write rows as ``<run_dir>/results.jsonl``; returns ``run_dir``."""
    writer = ResultWriter(run_dir)
    for r in rows:
        writer.write(r)
    return Path(run_dir)


def real_run(run_dir: str | Path, *overrides: str) -> Path:
    """One real run through ``harness.job.app.main_job`` on the tiny random models (greedy float32, 2 samples, 8 new
    tokens, vanilla and speculative, no scoring unless ``overrides`` say otherwise): the rows exactly as the
    runner writes them. Returns ``run_dir``."""
    from hydra import compose, initialize_config_dir

    from harness.job.app import main_job

    conf = Path(__file__).resolve().parent.parent / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            "model=tiny-random", "task.limit=2", "runner.max_new_tokens=8", "runner.warmup_tokens=2",
            "runner.score=false", "decoder=[vanilla,speculative]", f"+output_dir={run_dir}", *overrides])
    main_job(cfg)
    return Path(run_dir)
