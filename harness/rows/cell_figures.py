"""The figures of one cell: what :func:`harness.rows.metrics.aggregate` computes over a cell's figure rows (its
``ok`` rows paired with vanilla), one function per family -- speed with its bootstrap intervals
(:func:`cell_stats`), latency (:func:`cell_latency`), acceptance, equality and theory (:func:`cell_theory`),
quality (:func:`cell_quality`) -- and the deterministic counters the regression gate checks (:func:`counters`).
Each returns a dict of summary columns (declared in :mod:`harness.rows.columns`); the definitions are in
:mod:`harness.rows.metrics`' docstring and docs/measurement.md.

A new cell figure is one declared summary column and one key of the dict its family returns here.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from harness.rows.columns import (COUNTER_COLUMNS, EQUALITY_EXACT, EQUALITY_SAMPLED, LATENCY_PERCENTILES, fmt_value,
                                  norm, num, num_value)
from harness.rows.grouping import draft_shape, is_sampled, ok_rows, params_of
from harness.rows.stats import (MIN_INTERVAL_SAMPLES, bootstrap_weights, expected_accept_length, interval,
                                seed_interval, theory_speedup, wilson_interval)


def cost_ratio_of(g: pd.DataFrame, override: float | None = None) -> tuple[float, str]:
    """Draft/target forward cost ratio c of one cell's paired rows, and where it came from.

    In order of preference: ``override`` (``"option"``); per-phase timers ``draft_time_s`` /
    ``verify_time_s`` (``"timers"``): ``c = (draft_time_s / draft_forwards) / (verify_time_s / num_steps)``;
    a wall-time fit under the theory's assumption that one verification costs one vanilla step
    (``"wall-time fit"``): ``c = (wall_time_s - num_steps * t_ar) / (draft_forwards * t_ar)``, ``t_ar`` =
    vanilla's seconds per token on the same sample, clipped at 0.
    """
    if override is not None:
        return float(override), "option"
    draft_fwd = num(g["draft_forwards"]).sum() if "draft_forwards" in g else 0.0
    if not draft_fwd:
        return 0.0, "no draft forwards"
    if {"draft_time_s", "verify_time_s"} <= set(g.columns):
        d, v = num(g["draft_time_s"]), num(g["verify_time_s"])
        if d.notna().all() and v.notna().all() and v.sum() > 0:
            return float((d.sum() / draft_fwd) / (v.sum() / num(g["num_steps"]).sum())), "timers"
    t_ar = num(g["vanilla_wall_time_s"]) / num(g["vanilla_new_tokens"])
    ok = t_ar.notna() & num(g["wall_time_s"]).notna()
    if not ok.any():
        return math.nan, "unmeasured"
    spare = (num(g["wall_time_s"]) - num(g["num_steps"]) * t_ar)[ok].sum()
    return max(0.0, float(spare / (num(g["draft_forwards"]) * t_ar)[ok].sum())), "wall-time fit"


def cost_curve(text: Any) -> list[tuple[float, float]]:
    """A row's ``"k:ratio,..."`` cost curve (``target_cost_curve``, ``draft_cost_curve``) as sorted ``(k, ratio)``
    pairs; ``[]`` for an empty or unreadable value."""
    if not isinstance(text, str) or not text:
        return []
    try:
        return sorted((float(k), float(r)) for k, r in (part.split(":") for part in text.split(",")))
    except ValueError:
        return []


def curve_at(curve: Sequence[tuple[float, float]], k: float) -> float:
    """The curve's cost at ``k`` tokens: linear between its points; NaN outside them (a forward of more tokens
    than the last point timed was not measured: holding the last point's value would understate it), for an
    empty curve or a NaN ``k``."""
    if not curve or not np.isfinite(k) or not curve[0][0] <= k <= curve[-1][0]:
        return math.nan
    ks, rs = zip(*curve)
    return float(np.interp(k, ks, rs))


def draft_prefill_tokens(prompt_tokens: Any, window_cut: Any = 0) -> Any:
    """Tokens the draft's prompt prefill feeds (its first forward): its view of the prompt, less what a draft window
    cut (``draft_window_cut``), and the pending token. Floats or pandas Series alike. (Ouroboros' drafter prefills
    the prompt alone, one token fewer: ~0.5 % of its prefill, not told apart.)"""
    return prompt_tokens - window_cut + 1


def window_cut(cut: Any, decoder_params: Any) -> float:
    """Prompt tokens a draft window cut from a row's draft prefill: its ``draft_window_cut``; where the row records
    none, 0 for a decoder without a draft window and NaN (unknown) for one with a window (rows written before the
    column): its draft prefill, and what its later draft forwards fed, are then unknown."""
    value = num_value(cut)
    if pd.notna(value):
        return float(value)
    window = num_value(params_of(decoder_params).get("draft_window"))
    return math.nan if pd.notna(window) and window > 0 else 0.0


def step_costs(g: pd.DataFrame) -> dict[str, float]:
    """In-situ step costs of one cell's paired rows, in two units.

    In units of vanilla's seconds per output token on the same samples (``vanilla_tpot_s``: one one-token target
    forward plus vanilla's host work; 1.0 = what a plain decode step costs here):

    * ``verify_cost``: seconds lapped as verification after the first token (``verify_time_s - ttft_s``) over
      the decode steps (``num_steps - 1``), i.e. the verify forward of the whole draft plus the acceptance rule,
      cache compaction and bookkeeping of the step;
    * ``draft_cost``: seconds lapped as drafting after the draft's prefill (``draft_time_s`` less a prefill run
      after the first token, ``prefill_s - ttft_s``) over the draft forwards after it.

    In units of the target's bare one-token forward (``bare_token_s``, timed once per job after the warm-up), set
    beside what the bare models' cost curves (``target_cost_curve``, ``draft_cost_curve``) give for the same
    forwards: ``verify_bare`` (the same seconds as ``verify_cost``) against ``verify_bare_curve`` (the target's
    curve at the row's tokens fed per verify, ``target_tokens_fed_per_step``), ``draft_bare`` against
    ``draft_bare_curve`` (the draft's curve at ``draft_tokens_per_forward``: tokens fed per draft forward after the
    prefill, which is taken to feed :func:`draft_prefill_tokens`). The difference is what the decoder's own
    work (cache edits, masks, host round trips) adds to its forwards. Rows without the curves (older rows, runs
    without a warm-up) leave these NaN.

    All are ratios of totals over the rows that have the timers (the driver's decoders: speculative, prompt
    lookup, Lookahead, Ouroboros, the trees); NaN elsewhere, and the draft's NaN without draft forwards."""
    keys = ("verify_cost", "draft_cost", "verify_bare", "verify_bare_curve", "draft_bare", "draft_bare_curve",
            "draft_tokens_per_forward")
    out = dict.fromkeys(keys, math.nan)
    if not {"verify_time_s", "ttft_s", "num_steps"} <= set(g.columns):
        return out
    ttft = num(g["ttft_s"])
    steps = num(g["num_steps"]) - 1
    verify = (num(g["verify_time_s"]) - ttft).clip(lower=0)
    unit = num(g["vanilla_tpot_s"]) if "vanilla_tpot_s" in g else pd.Series(math.nan, index=g.index)
    bare = num(g["bare_token_s"]) if "bare_token_s" in g else pd.Series(math.nan, index=g.index)
    has_draft = {"draft_time_s", "draft_forwards"} <= set(g.columns)
    if has_draft:
        prefill = ((num(g["prefill_s"]) - ttft).clip(lower=0) if "prefill_s" in g else pd.Series(0.0, index=g.index)
                   ).fillna(0.0)
        forwards = num(g["draft_forwards"]) - (prefill > 0)
        draft = (num(g["draft_time_s"]) - prefill).clip(lower=0)
    for name, per, base in (("verify", verify, steps), ("draft", draft if has_draft else None,
                                                       forwards if has_draft else None)):
        if per is None:
            continue
        for key, scale in ((f"{name}_cost", unit), (f"{name}_bare", bare)):
            ok = scale.notna() & (scale > 0) & per.notna() & (base > 0)
            if ok.any():
                out[key] = float(per[ok].sum() / (base[ok] * scale[ok]).sum())
    curves = {"verify": g["target_cost_curve"] if "target_cost_curve" in g else None,
              "draft": g["draft_cost_curve"] if "draft_cost_curve" in g else None}
    # each curve value beside an in-situ one and over the same rows: none when a row counted there has no curve
    # value (no curve, or tokens per forward outside the curve's timed points)
    counted = bare.notna() & (bare > 0)
    if curves["verify"] is not None and "target_tokens_fed_per_step" in g and not math.isnan(out["verify_bare"]):
        rows = counted & verify.notna() & (steps > 0)
        k = num(g["target_tokens_fed_per_step"])
        at = pd.Series([curve_at(cost_curve(c), x) for c, x in zip(curves["verify"], k)], index=g.index)
        if at[rows].notna().all():
            out["verify_bare_curve"] = float((at[rows] * steps[rows]).sum() / steps[rows].sum())
    if has_draft and "draft_tokens_fed" in g:
        prompt = num(g["prompt_tokens"]) if "prompt_tokens" in g else pd.Series(0.0, index=g.index)
        cuts = g["draft_window_cut"] if "draft_window_cut" in g else pd.Series(None, index=g.index, dtype=object)
        params = g["decoder_params"] if "decoder_params" in g else pd.Series(None, index=g.index, dtype=object)
        cut = pd.Series([window_cut(c, p) for c, p in zip(cuts, params)], index=g.index)
        fed = num(g["draft_tokens_fed"]) - (prefill > 0) * draft_prefill_tokens(prompt, cut)
        drafting = forwards > 0
        ok = drafting & (fed > 0)
        if ok.any() and fed[drafting].notna().all():  # a row's unknown prefill leaves the cell's value unknown
            per_forward = fed / forwards
            out["draft_tokens_per_forward"] = float(fed[ok].sum() / forwards[ok].sum())
            if curves["draft"] is not None and not math.isnan(out["draft_bare"]):
                rows = counted & draft.notna() & ok
                at = pd.Series([curve_at(cost_curve(c), x) for c, x in zip(curves["draft"], per_forward)],
                               index=g.index)
                if rows.any() and at[rows].notna().all():
                    out["draft_bare_curve"] = float((at[rows] * forwards[rows]).sum() / forwards[rows].sum())
    return out


def cell_theory(g: pd.DataFrame, rec: Mapping[str, Any], cost_ratio: float | None) -> dict[str, Any]:
    """Acceptance, per-step counts, equality, prefill and the theory columns of one cell's figure rows."""
    p = params_of(rec["decoder_params"])
    drafted = num(g["num_drafted"]).sum() if "num_drafted" in g else 0.0
    decode_steps = (num(g["num_steps"]) - 1).clip(lower=0).sum()
    alpha = num(g["num_accepted"]).sum() / drafted if drafted else math.nan
    gamma = num_value(p.get("gamma"))
    if pd.isna(gamma):
        gamma = drafted / decode_steps if drafted and decode_steps else math.nan
    shape = draft_shape(g)
    chain = shape == "chain"  # eq. 1 models a fixed number of draft tokens in a line, nothing else
    c, c_src = cost_ratio_of(g, cost_ratio) if drafted and chain else (math.nan, f"n/a (draft shape: {shape})")
    out = {
        "draft_shape": shape,
        "acceptance_rate": alpha,
        "target_tokens_fed_per_step": num(g["target_tokens_fed_per_step"]).mean()
        if "target_tokens_fed_per_step" in g else math.nan,
        "draft_forwards_per_step": num(g["draft_forwards_per_step"]).mean()
        if "draft_forwards_per_step" in g else math.nan,
        **cell_equality(g),
        "gamma_used": gamma,
        "cost_ratio": c,
        "cost_ratio_source": c_src,
        "theory_accept_length": expected_accept_length(alpha, gamma) if drafted and chain else math.nan,
        "theory_speedup": theory_speedup(alpha, gamma, c) if drafted and chain else math.nan,
        **step_costs(g),
    }
    out["efficiency"] = rec["speedup"] / rec["accept_length"] if rec["accept_length"] else math.nan
    return out


def cell_quality(g: pd.DataFrame, rec: Mapping[str, Any], quality: Sequence[str], level: float,
                  warnings: list[str]) -> dict[str, Any]:
    """The quality means of one cell's figure rows with an interval: over seeds (a Student-t interval) when
    there are several, else over samples (a Wilson interval for a 0/1 score such as pass@1, a bootstrap one
    otherwise; none below :data:`harness.rows.stats.MIN_INTERVAL_SAMPLES` samples). A cell scored in part says so
    in ``warnings``."""
    out: dict[str, Any] = {}
    for q in quality:
        # a cell with no value at all is another task's column (a mixed report) or unscored: blank, not a
        # number; a cell scored in part (scoring failed on some rows) says so
        missing = int(num(g[q]).isna().sum())
        failed = int(g["score_error"].notna().sum()) if "score_error" in g else 0
        if missing and (missing < len(g) or failed):
            warnings.append(f"{rec['label']} ({rec['group']}): {q} is missing in {missing} of {len(g)} rows "
                            f"({failed} with score_error): its mean covers the other rows only")
        if rec["seeds"] >= 2:
            si = seed_interval(g, q, level)
            out[q], out[f"{q}_low"], out[f"{q}_high"], out[f"{q}_seed_std"] = (si["mean"], si["low"], si["high"],
                                                                              si["seed_std"])
        else:
            out[q], out[f"{q}_low"], out[f"{q}_high"] = _sample_interval(g, q, level)
    return out


def _sample_interval(g: pd.DataFrame, column: str, level: float) -> tuple[float, float, float]:
    """Mean of a quality column over one cell's rows and its interval over samples (each sample's mean first):
    Wilson where every per-sample value is 0 or 1, else the bootstrap over samples."""
    x = num(g[column])
    keep = x.notna()
    if not keep.any():
        return math.nan, math.nan, math.nan
    per_sample = x[keep].groupby(g.loc[keep, "sample_id"].astype(str), sort=False).mean()
    mean = float(x[keep].mean())
    if per_sample.isin([0.0, 1.0]).all():
        lo, hi = wilson_interval(float(per_sample.sum()), len(per_sample), level)
        return mean, lo, hi
    if len(per_sample) < MIN_INTERVAL_SAMPLES:
        return mean, math.nan, math.nan
    w = bootstrap_weights(list(per_sample.index), seed=0)
    lo, hi, _ = interval((w @ per_sample.to_numpy(float)) / w.sum(axis=1), level)
    return mean, lo, hi


def cell_equality(g: pd.DataFrame) -> dict[str, Any]:
    """``equality_check``, ``equal_to_vanilla`` and ``divergent_samples`` of one cell's ok rows: greedy rows
    with a ``matches_vanilla`` value are compared; sampled rows and rows without a reference (vanilla gave
    no output) are neither equal nor divergent."""
    sampled = is_sampled(g)
    mv = g["matches_vanilla"].map(norm) if "matches_vanilla" in g else pd.Series([None] * len(g), index=g.index)
    compared = mv.notna() & ~sampled
    if sampled.all():
        check = EQUALITY_SAMPLED
    elif compared.any():
        check = EQUALITY_EXACT if not sampled.any() else f"{EQUALITY_EXACT} ({int(sampled.sum())} sampled rows n/a)"
    else:
        check = None
    equal = mv[compared].astype(bool)
    return {"equality_check": check, "equal_to_vanilla": float(equal.mean()) if compared.any() else math.nan,
            "divergent_samples": sorted(map(str, g.loc[equal.index[~equal.to_numpy()], "sample_id"].unique()))}


def percentile_needs(p: float) -> int:
    """The fewest rows whose ``p``-th percentile is more than their largest value: at least one row above it
    (2 for the median, 10 for p90, 100 for p99)."""
    return math.ceil(round(100 / (100 - p), 9))


def cell_latency(g: pd.DataFrame) -> dict[str, float]:
    """Latency figures of one cell's rows (NaN for columns the rows do not carry): mean
    ``decode_tokens_per_s``; ``ttft_s`` and ``tpot_s`` at their mean and 50th/90th/99th percentiles over rows
    (:data:`LATENCY_PERCENTILES`; NaN where the rows are too few for it, :func:`percentile_needs`: over 13 rows a
    "p99" would only be the maximum); ``prefill_share`` (mean of ``prefill_s / wall_time_s``, ``ttft_s`` for rows
    without ``prefill_s``); ``peak_memory_mb`` (the largest); for static batches ``batch_size`` and
    ``batch_tokens_per_s`` (the throughput over the cell's batch calls: their tokens / their seconds);
    ``_untimed_prefill_rows``: draft-model rows written
    before the draft's prefill was timed (their decode-only figures hold it; one warning per group)."""
    out: dict[str, float] = {"decode_tokens_per_s": num(g["decode_tokens_per_s"]).mean()
                             if "decode_tokens_per_s" in g else math.nan}
    for col in ("ttft_s", "tpot_s"):
        x = num(g[col]).dropna() if col in g else pd.Series(dtype=float)
        out[col] = float(x.mean()) if len(x) else math.nan
        for p in LATENCY_PERCENTILES:
            out[f"{col}_p{p}"] = float(np.percentile(x, p)) if len(x) >= percentile_needs(p) else math.nan
    prefill = num(g["prefill_s"]) if "prefill_s" in g else pd.Series(math.nan, index=g.index)
    if "ttft_s" in g:
        prefill = prefill.fillna(num(g["ttft_s"]))
    with np.errstate(invalid="ignore", divide="ignore"):
        out["prefill_share"] = float((prefill / num(g["wall_time_s"]).where(lambda w: w > 0)).mean())
    out["peak_memory_mb"] = float(num(g["peak_memory_mb"]).max()) if "peak_memory_mb" in g else math.nan
    out["batch_size"] = float(num(g["batch_size"]).max()) if "batch_size" in g else math.nan
    out["batch_tokens_per_s"] = math.nan
    if {"batch_index", "batch_tokens_per_s"} <= set(g.columns) and g["batch_index"].notna().any():
        calls = g[g["batch_index"].notna()].groupby(["run_id", "repeat", "batch_index"], dropna=False)
        wall, rate = num(calls["wall_time_s"].first()), num(calls["batch_tokens_per_s"].first())
        out["batch_tokens_per_s"] = float((rate * wall).sum() / wall.sum())
    drafts = num(g["draft_forwards"]).fillna(0) > 0 if "draft_forwards" in g else pd.Series(False, index=g.index)
    decode = num(g["decode_tokens_per_s"]).notna() if "decode_tokens_per_s" in g else pd.Series(False, index=g.index)
    untimed = drafts & decode & (num(g["draft_prefill_s"]).isna() if "draft_prefill_s" in g else True)
    out["_untimed_prefill_rows"] = int(untimed.sum())  # one warning per group: _untimed_prefill_warning
    return out


def resampling_units(g: pd.DataFrame) -> pd.Series:
    """What the bootstrap of speed figures resamples, per row: its sample (``task/sample_id``), or for a request of
    a static batch (``batch_index`` set) its batch: the requests of one batch share one call's time, so they are
    one observation of speed, not ``B``."""
    units = g["sample_id"].astype(str)
    if "batch_index" in g:
        batch = g["batch_index"]
        units = units.where(batch.isna(), "batch " + batch.map(fmt_value))
    return g["task"].astype(str) + "/" + units


def cell_stats(g: pd.DataFrame, n_boot: int, level: float, seed: int, disagree_rel: float,
                warnings: list[str]) -> dict[str, Any]:
    """Point estimates and bootstrap intervals of one cell's paired rows."""
    tps, new, steps, wall = (num(g[c]).to_numpy(float) for c in ("tokens_per_s", "new_tokens", "num_steps",
                                                                   "wall_time_s"))
    ratio = num(g["speedup"]).to_numpy(float)
    decode = num(g["decode_speedup"]).to_numpy(float)
    v_wall, v_new = num(g["vanilla_wall_time_s"]).to_numpy(float), num(g["vanilla_new_tokens"]).to_numpy(float)
    paired = np.isfinite(ratio) & np.isfinite(v_wall) & np.isfinite(v_new) & np.isfinite(wall)
    dpaired = np.isfinite(decode)
    fin = np.isfinite(tps)
    clusters = resampling_units(g).tolist()
    w = bootstrap_weights(clusters, n_boot, seed)
    one = np.ones((1, len(g)))

    def stats(weights: np.ndarray) -> dict[str, np.ndarray]:
        wp, wf, wd = weights * paired, weights * fin, weights * dpaired
        with np.errstate(invalid="ignore", divide="ignore"):
            sp = (wp @ np.nan_to_num(ratio)) / wp.sum(axis=1)
            spt = ((wp @ np.nan_to_num(v_wall)) / (wp @ np.nan_to_num(v_new))) / (
                (wp @ np.nan_to_num(wall)) / (wp @ np.nan_to_num(new)))
            return {
                "speedup": sp, "speedup_total": spt,
                "decode_speedup": (wd @ np.nan_to_num(decode)) / wd.sum(axis=1),
                "tokens_per_s": (wf @ np.nan_to_num(tps)) / wf.sum(axis=1),
                "accept_length": (weights @ np.nan_to_num(new)) / (weights @ np.nan_to_num(steps)),
            }

    point = {k: float(v[0]) for k, v in stats(one).items()}
    draws = stats(w)
    rec: dict[str, Any] = dict(point)
    for k, d in draws.items():
        lo, hi, sd = interval(d, level) if len(set(clusters)) > 1 else (math.nan, math.nan, math.nan)
        if len(set(clusters)) < MIN_INTERVAL_SAMPLES:  # a bootstrap over so few samples covers far less
            lo = hi = math.nan
        rec[f"{k}_low"], rec[f"{k}_high"], rec[f"{k}_std"] = lo, hi, sd
    with np.errstate(invalid="ignore", divide="ignore"):
        rec["tokens_per_s_total"] = float(np.nansum(new[fin]) / np.nansum(wall[fin])) if fin.any() else math.nan
    sp, spt = point["speedup"], point["speedup_total"]
    if paired.sum() >= 2 and np.isfinite(sp) and np.isfinite(spt) and spt > 0:
        lo, hi, _ = interval(draws["speedup"] - draws["speedup_total"], level)
        if abs(sp - spt) > disagree_rel * spt and np.isfinite(lo) and (lo > 0 or hi < 0):
            warnings.append(f"estimators disagree for {g['label'].iloc[0]} ({g['group'].iloc[0]}): mean of per-sample "
                            f"speedups {sp:.2f} vs ratio of totals {spt:.2f} (difference {level:.0%} CI "
                            f"[{lo:.2f}, {hi:.2f}]); per-sample speedups vary with sample length or over time "
                            f"(load, order effects): report both")
    return rec


def counters(g: pd.DataFrame) -> dict[str, Any]:
    """Deterministic counters of one cell's ok rows, one observation per (sample, turn) -- per (sample, turn,
    seed, repeat) for sampled rows, whose repeats and seeds draw different tokens (each draw is deterministic
    given its ``sample_seed``): totals of :data:`COUNTER_COLUMNS`, a digest of the per-observation values, and
    whether repeats of one greedy sample disagree.

    Returns:
        ``{"totals": {col: int}, "digest": str, "inconsistent_samples": [sample ids]}``.
    """
    g = ok_rows(g)
    cols = [c for c in COUNTER_COLUMNS if c in g]
    key = g["sample_id"].astype(str) + "#" + (g["turn"].astype(str) if "turn" in g else "0")
    sampled = is_sampled(g)
    if sampled.any():
        seed = g["sampling_seed"].map(fmt_value) if "sampling_seed" in g else "-"
        rep = g["repeat"].map(fmt_value) if "repeat" in g else "0"
        key = key.where(~sampled, key + "#seed=" + seed + "#repeat=" + rep)
    per: dict[str, tuple] = {}
    bad: list[str] = []
    for k, vals in zip(key, g[cols].itertuples(index=False, name=None)):
        v = tuple(norm(x) for x in vals)
        if k in per and per[k] != v and k not in bad:
            bad.append(k)
        per.setdefault(k, v)
    totals = {c: int(sum((v[i] or 0) for v in per.values())) for i, c in enumerate(cols)}
    text = "\n".join(f"{k}:{per[k]}" for k in sorted(per))
    return {"totals": totals, "digest": hashlib.sha1(text.encode()).hexdigest()[:12], "inconsistent_samples": bad}
