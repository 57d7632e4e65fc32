"""Aggregation: result rows -> cells -> summary. Every number of ``summary.csv``, the paper report, the
regression gate, the run comparison and the figures is computed from result rows by this module and its
neighbours, pure functions of DataFrames (pandas and numpy only; no torch, no decoders, no tasks):

* :mod:`harness.rows.columns`: the rows schema (every column declared once) and reading cell values;
* :mod:`harness.rows.grouping`: checks, defaults, configuration labels and run groups of the rows;
* :mod:`harness.rows.stats`: the bootstrap, t and Wilson intervals, Leviathan et al.'s theory;
* this module: pairing with vanilla, one row per (group, configuration) (:func:`aggregate`), the summary;
* :mod:`harness.rows.flags`: the warnings attached to cells (load, emulated bf16, noise, lossless quality);
* :mod:`harness.report.tables`, :mod:`harness.report.compare`, :mod:`harness.report.figdata`: markdown, run comparison, figure data.

Loading files and drawing live elsewhere (:mod:`harness.report.build`, :mod:`plots`).

Definitions (stated once, used everywhere):

* ``tokens_per_s`` of a row: new tokens / wall seconds of the whole ``generate`` call (prefill included);
  a cell's ``tokens_per_s`` is the mean over its rows, ``tokens_per_s_total`` the ratio of totals.
* ``speedup`` (end to end) of a decoder: the mean over rows of the paired ratio
  ``tokens_per_s(decoder) / tokens_per_s(vanilla)`` on the same sample, turn and repeat in the same run
  (``run_id``); ``speedup_total`` is the ratio of totals (vanilla seconds per token summed over the same
  rows / the decoder's). Spec-Bench's ``speed.py`` uses a ratio of mean tokens/s, a third estimator.
* ``decode_speedup``: the same paired mean for ``decode_tokens_per_s`` (tokens after the first emission /
  seconds after both models' prefills, :meth:`harness.job.timing.Stopwatch.columns`): what the decoder does once
  the prompt is prefilled, like with like -- this project's decoders prefill the draft after the first token,
  transformers' assisted generation before it, and the draft's prefill is counted on the prefill side for
  both. Rows with one new token have no decode rate and no decode pair.
* ``ttft_s``: seconds to the first new token (the target's prefill, plus whatever a decoder does before it:
  ``hf_assisted`` drafts first), and ``tpot_s`` (seconds per output token after the first), each as the mean
  and the 50th/90th/99th percentiles over rows, as serving benchmarks report them. ``prefill_share``: mean
  over rows of ``prefill_s / wall_time_s``, the share of a call spent in both prefills -- large on
  short-answer tasks, where the end-to-end speedup cannot exceed what the decode-only speedup shows.
  ``peak_memory_mb``: the largest of the rows (CUDA: max allocated during a call; CPU: the process's RSS).
* ``accept_length`` (tau): total new tokens / total target forwards (prefill included; vanilla = 1.0).
* ``acceptance_rate`` (alpha): total accepted draft tokens / total drafted tokens.
* ``equal_to_vanilla``: share of rows whose tokens equal vanilla's (``matches_vanilla``), over greedy rows
  only. Sampled rows (``equality_check = "n/a (sampled)"``, ``matches_vanilla: null``) make no token
  claim: their cell's ``equality_check`` says ``n/a (sampled)``, ``equal_to_vanilla`` is empty, and they are
  never listed as divergent (their losslessness is a distribution property, tested in CI).
* Quality (the task's ``quality_columns``): the mean over rows with an interval over samples (Wilson for a
  0/1 score such as pass@1, the bootstrap for ROUGE); for sampled runs over several seeds (``sampling_seed``,
  i.e. ``runner.seed``), the mean over seeds of each seed's mean, with a Student-t interval over seeds
  (``<q>_low`` / ``<q>_high``, ``seeds - 1`` degrees of freedom) and ``<q>_seed_std``: how much the score
  moves with the seed on these samples (not with other samples). A greedy decoder whose quality differs
  from vanilla's on the same samples is flagged (:func:`harness.rows.flags.lossless_quality_flags`).
* Intervals of speed figures: percentile bootstrap (default 95 %, 2000 resamples, seeded) that resamples
  samples and, within each drawn sample, its observations (repeats, turns, seeds, several runs of the same
  identity). ``*_low`` / ``*_high`` are its bounds, ``*_std`` the bootstrap standard error. No bounds below
  :data:`harness.rows.stats.MIN_INTERVAL_SAMPLES` samples: the tables print "n too small".
* Theory (Leviathan et al. 2023, eq. 1 and Thm 3.8: ``theory_accept_length``, ``theory_speedup``): only for
  ``draft_shape == "chain"`` (a fixed number of draft tokens in a line); dynamic draft lengths
  (``hf_assisted``), trees, Ouroboros' phrases and n-gram guesses are outside its model, and left blank.
* Which rows a figure stands on (:mod:`harness.rows.cells`): every figure of a cell -- tokens/s included --
  is computed over its *figure rows*, the ``ok`` rows paired with an ``ok`` vanilla row of the same run,
  sample, turn and repeat (every ``ok`` row in a group without vanilla rows). Unpaired rows, failed and
  skipped cells are counted and named in a warning, never in a figure; configurations of one group that cover
  different samples are named in a warning; a cell measured twice (duplicate rows) is counted once, with a
  warning.
* Counts: ``group_samples`` = distinct samples of the group (any decoder, any status); ``samples`` = distinct
  samples with an ok row of the cell; ``paired_samples`` = distinct samples of its figure rows (what its
  figures are over); ``unpaired`` = ok rows left out for want of a vanilla pair; ``failed`` = rows without a
  measurement (errors and skips), ``failed_statuses`` the same by status (``2 error, 1 prompt_too_long``);
  ``rows`` = figure rows (samples x turns x repeats x runs); ``repeats`` = distinct ``repeat`` values;
  ``seeds`` = distinct sampling seeds (0 for greedy rows); ``replicates`` = how many times each sample was
  measured (``(run_id, repeat)`` pairs, the fewest over samples: shards of one run cover different samples and
  do not add replicates).
* Run-to-run noise: the standard deviation of a cell's figure over *replicates* that cover the same
  samples -- what the regression gate's speed margin is built from.

Runs that differ are never pooled: a *group* is one setting (:data:`RUN_IDENTITY_FIELDS`: task and its
version, model pair, dtype, machine, code version, generation budget, sampling settings, and the runner's
``group_identity`` -- the hash of the full run identity without the list of decoders and without
``runner.seed``); rows of different settings land in different groups (and different table rows) unless
``pool=True`` is asked for, which logs what was pooled. Within a group a *cell* is one decoder configuration
(``label``). So: shards of one run (same ``run_identity``, different ``shard``) merge; the jobs of a decoder
sweep (``decoder.speculative.gamma=2,4``) are one group whose cells are told apart by their labels; runs that
differ only in ``runner.seed`` are one group whose cells pool the seeds (speedups stay paired within each
run; quality gets its interval over seeds); any other difference (a model seed, the prompt style, the
warm-up) makes another group. Rows written before ``group_identity`` existed fall back to ``run_identity``
(when present), which is never coarser.
"""

from __future__ import annotations

import hashlib
import logging
import math
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from harness.rows import cells as coverage
from harness.rows.columns import (EQUALITY_EXACT, EQUALITY_SAMPLED, fmt_value, norm, num, COUNTER_COLUMNS,
                             LATENCY_PERCENTILES, PAIR_KEYS, RUN_IDENTITY_FIELDS, SUMMARY_COLUMNS, SUMMARY_ID_COLUMNS)
from harness.rows.flags import (LOAD_MARGIN, emulated_half_warning, load_stats, run_warnings, load_warning,
                           lossless_quality_flags, replicate_noise)
from harness.rows.grouping import (decoder_param_columns, draft_shape, is_sampled, ok_rows, params_of, prepare,
                              quality_columns as find_quality, settings_label)
from harness.rows.stats import (MIN_INTERVAL_SAMPLES, bootstrap_weights, expected_accept_length, interval,
                           seed_interval, theory_speedup, wilson_interval)

log = logging.getLogger(__name__)

# ------------------------------------------------------------------------------------------------ constants
# (the column lists live in :mod:`harness.rows.columns`, the rows schema)


# ------------------------------------------------------------------------------------------------ helpers


# ------------------------------------------------------------------------------------------------ labels


# ------------------------------------------------------------------------------------------------ pairing
def paired_speedups(rows: pd.DataFrame) -> pd.DataFrame:
    """Per-row speedup of every decoder against vanilla in the same run.

    Args:
        rows: result rows with ``run_id, task, sample_id, decoder, tokens_per_s, wall_time_s, new_tokens,
            status`` (``turn`` / ``repeat`` / ``decode_tokens_per_s`` / ``attempt_id`` /
            ``paired_across_processes`` where present).

    Returns:
        ``rows`` (status ``ok`` only) with ``vanilla_tokens_per_s``, ``vanilla_wall_time_s``,
        ``vanilla_new_tokens``, ``speedup`` (NaN where vanilla has no ok row), ``decode_speedup`` (the paired
        ratio of ``decode_tokens_per_s``; NaN where either side has none), ``cross_process`` (the row is
        paired with a vanilla row written by another process: the row says so, or the two ``attempt_id``
        differ), ``in_figures`` (the row is a figure row: paired, or in a group without vanilla rows) and
        ``vanilla_status`` (:func:`harness.rows.cells.mark_pairs`).
    """
    ok = ok_rows(rows).copy()
    keys = [k for k in PAIR_KEYS if k in ok.columns]
    extra = [c for c in ("decode_tokens_per_s", "attempt_id") if c in ok.columns]
    vanilla = ok[ok["decoder"] == "vanilla"][keys + ["tokens_per_s", "wall_time_s", "new_tokens", *extra]]
    vanilla = vanilla.drop_duplicates(keys, keep="last").rename(columns={
        "tokens_per_s": "vanilla_tokens_per_s", "wall_time_s": "vanilla_wall_time_s",
        "new_tokens": "vanilla_new_tokens", "decode_tokens_per_s": "vanilla_decode_tokens_per_s",
        "attempt_id": "vanilla_attempt_id"})
    merged = coverage.mark_pairs(ok.merge(vanilla, on=keys, how="left", indicator="_vanilla"), rows, keys)
    merged["speedup"] = num(merged["tokens_per_s"]) / num(merged["vanilla_tokens_per_s"])
    if "decode_tokens_per_s" in merged:
        merged["decode_speedup"] = num(merged["decode_tokens_per_s"]) / num(merged["vanilla_decode_tokens_per_s"])
    else:
        merged["decode_speedup"] = math.nan
    cross = pd.Series(False, index=merged.index, dtype=bool)
    if "paired_across_processes" in merged:
        cross |= merged["paired_across_processes"].map(lambda v: norm(v) is True)
    if "attempt_id" in merged:
        both = merged["attempt_id"].notna() & merged["vanilla_attempt_id"].notna()
        cross |= both & (merged["attempt_id"].astype(str) != merged["vanilla_attempt_id"].astype(str))
    merged["cross_process"] = cross & (merged["decoder"] != "vanilla")
    return merged


def figure_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The ``ok`` rows every figure is computed over (:mod:`harness.rows.cells`): paired with an ``ok`` vanilla row
    (all ``ok`` rows in a group without vanilla rows). Rows without the columns pairing needs are taken as they
    are (their ``ok`` rows)."""
    if not {"decoder", "tokens_per_s", "wall_time_s", "new_tokens"} <= set(rows.columns):
        return ok_rows(rows)
    merged = paired_speedups(rows)
    return merged[merged["in_figures"]]


# ------------------------------------------------------------------------------------------------ bootstrap


# ------------------------------------------------------------------------------------------------ theory


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


# ------------------------------------------------------------------------------------------------ noise


# ------------------------------------------------------------------------------------------------ quality


# ------------------------------------------------------------------------------------------------ aggregate
def _order(agg: pd.DataFrame) -> pd.DataFrame:
    """Table order: groups first-seen; within a group vanilla, then decoders first-seen, configurations by
    hyper-parameter values (numbers numerically)."""
    if agg.empty:
        return agg
    dec_order = list(dict.fromkeys(["vanilla", *agg["decoder"]]))
    groups = {g: i for i, g in enumerate(dict.fromkeys(agg["group"]))}
    params = decoder_param_columns(agg)

    def natural(v: Any) -> tuple:
        n = num(pd.Series([v])).iloc[0]
        return (0, float(n), "") if not pd.isna(n) else (1, 0.0, str(v))

    def key(i: int) -> tuple:
        r = agg.iloc[i]
        p = params_of(r.get("decoder_params"))
        return (groups[r["group"]], dec_order.index(r["decoder"]), *[natural(p.get(k)) for k in params],
                str(r["label"]))

    return agg.iloc[sorted(range(len(agg)), key=key)].reset_index(drop=True)


def ordered_labels(agg: pd.DataFrame) -> list[str]:
    """Configuration labels in table order (see :func:`aggregate`)."""
    return list(dict.fromkeys(_order(agg)["label"])) if not agg.empty else []


def aggregate(rows: pd.DataFrame, *, quality: Sequence[str] | None = None, cost_ratio: float | None = None,
              n_boot: int = 2000, level: float = 0.95, seed: int = 0, pool: bool = False,
              by: Sequence[str] = (), disagree_rel: float = 0.10, load_margin: float = LOAD_MARGIN) -> pd.DataFrame:
    """One row per (group, extra keys ``by``, decoder configuration) with every reported number.

    Every figure of a cell is computed over its *figure rows* (:mod:`harness.rows.cells`): its ``ok`` rows paired
    with an ``ok`` vanilla row of the same run, sample, turn and repeat (all ``ok`` rows in a group without
    vanilla rows); unpaired rows, failed and skipped cells are counted and named in the warnings, never in a
    figure; duplicate cells are counted once, with a warning.

    Args:
        rows: result rows (any of :func:`prepare`'s columns may be missing; they are added).
        quality: the task's quality columns; None = :func:`quality_columns` of the rows.
        cost_ratio: c for every theory prediction; None = :func:`cost_ratio_of`.
        n_boot, level, seed: the bootstrap (see the module docstring).
        pool: pool run identities that differ (only task and model pair separate groups); logged loudly.
        by: further columns to split cells by (e.g. ``("category",)`` for per-category tables).
        disagree_rel: warn when the two speedup estimators differ by more than this fraction and beyond
            their bootstrap noise.
        load_margin: warn when a row's load average exceeds its usable cores by more than this
            (:data:`LOAD_MARGIN`).

    Returns:
        Columns: group, the identity fields, run_identity (the distinct values, comma-joined), ``by``, label,
        decoder, decoder_params, the hyper-parameters, the coverage columns
        (:data:`harness.rows.cells.COVERAGE_COLUMNS`: group_samples, samples, paired_samples, unpaired, failed,
        failed_statuses), rows (figure rows), repeats, seeds, replicates,
        tokens_per_s[_low/_high/_std], tokens_per_s_total, speedup[_low/_high/_std],
        speedup_total[_low/_high], decode_tokens_per_s, decode_speedup[_low/_high/_std], ttft_s,
        prefill_share, accept_length[_low/_high], acceptance_rate, target_tokens_fed_per_step,
        draft_forwards_per_step, equality_check, equal_to_vanilla, divergent_samples, paired_across_processes,
        gamma_used, cost_ratio, cost_ratio_source, theory_accept_length, theory_speedup, efficiency,
        speedup_repeat_std, tokens_per_s_repeat_std, load_max, rows_over_load, usable_cores (``cpu_affinity``,
        else ``cpu_count``),
        warnings (a list of strings), and per quality column its mean (with ``_low``, ``_high``,
        ``_seed_std`` over seeds when there are several).
    """
    if rows.empty:
        return pd.DataFrame()
    rows, duplicates = coverage.collapse_duplicates(prepare(rows, pool))
    quality = find_quality(rows, quality)
    params = decoder_param_columns(rows)
    keys = ["group", *by, "label"]
    merged = paired_speedups(rows)
    figures = merged[merged["in_figures"]]
    paired = {k: g for k, g in figures.groupby(keys, sort=False, dropna=False)}
    unpaired = {k: g for k, g in merged[~merged["in_figures"]].groupby(keys, sort=False, dropna=False)}
    groups = coverage.group_coverage(rows, figures, keys[:-1])
    notes = {grp: [load_warning(str(grp), ok_rows(g), load_margin), emulated_half_warning(str(grp), g)]
             for grp, g in rows.groupby("group", sort=False)}
    out = []
    for key, all_g in rows.groupby(keys, sort=False, dropna=False):
        g = paired.get(key, merged.iloc[0:0])
        rec = _cell_identity(dict(zip(keys, key)), all_g, params)
        rec["group_samples"], rec["group_cells"], group_warnings = groups[tuple(key[:-1])]
        cov, warnings = coverage.cell_coverage(all_g, g, unpaired.get(key))
        rec.update(cov)
        warnings = [*duplicates, *group_warnings, *warnings]
        rec["rows"] = len(g)
        rec["repeats"] = int(g["repeat"].nunique()) if len(g) else 0
        rec["seeds"] = int(g["sampling_seed"].map(norm).dropna().nunique()) if "sampling_seed" in g else 0
        if len(g):
            rec.update(_cell_stats(g, n_boot, level, seed, disagree_rel, warnings))
            rec.update(_latency(g))
            rec.update(_cell_theory(g, rec, cost_ratio))
            rec.update(_cell_quality(g, rec, quality, level, warnings))
            rec["speedup_repeat_std"], rec["replicates"] = replicate_noise(g, "speedup")
            rec["tokens_per_s_repeat_std"], _ = replicate_noise(g, "tokens_per_s")
            rec["paired_across_processes"] = int(g["cross_process"].sum())
            if rec["paired_across_processes"]:
                warnings.append(f"{rec['label']} ({rec['group']}): {rec['paired_across_processes']} of {len(g)} "
                                "rows are paired with a vanilla row measured in another process (a resumed run; "
                                "column paired_across_processes): their speedups compare timings of two processes")
            rec["load_max"], rec["rows_over_load"], rec["usable_cores"] = load_stats(ok_rows(all_g), load_margin)
            load_note, half_note = notes[key[0]]
            warnings += [w for w in (load_note if rec["rows_over_load"] else None, half_note) if w]
        rec["warnings"] = warnings
        out.append(rec)
    agg = _int_params(_order(pd.DataFrame(out)), params)
    lossless_quality_flags(agg, rows, quality)
    _untimed_prefill_warning(agg)
    return agg.drop(columns=["_untimed_prefill_rows"], errors="ignore")


def _cell_identity(rec: dict[str, Any], all_g: pd.DataFrame, params: Sequence[str]) -> dict[str, Any]:
    """The identity columns of one cell (its keys ``rec`` plus identity fields, model pair, decoder and its
    hyper-parameters)."""
    first = all_g.iloc[0]
    for f in (f for f in RUN_IDENTITY_FIELDS if f in all_g):
        vals = {norm(v) for v in all_g[f]}
        rec[f] = norm(first[f]) if len(vals) == 1 else ", ".join(sorted(map(fmt_value, vals)))
    if "run_identity" in all_g:
        rec["run_identity"] = ", ".join(dict.fromkeys(str(v) for v in all_g["run_identity"].dropna()))
    rec["model_pair"] = first["model_pair"]
    rec["decoder"] = first["decoder"]
    rec["decoder_class"] = first["decoder_class"] if "decoder_class" in all_g else first["decoder"]
    rec["decoder_params"] = first["decoder_params"]
    rec["settings"] = settings_label(first["decoder_params"])
    p = params_of(first["decoder_params"])
    for k in params:
        rec[k] = norm(p.get(k))
    return rec


def _cell_theory(g: pd.DataFrame, rec: Mapping[str, Any], cost_ratio: float | None) -> dict[str, Any]:
    """Acceptance, per-step counts, equality, prefill and the theory columns of one cell's figure rows."""
    p = params_of(rec["decoder_params"])
    drafted = num(g["num_drafted"]).sum() if "num_drafted" in g else 0.0
    decode_steps = (num(g["num_steps"]) - 1).clip(lower=0).sum()
    alpha = num(g["num_accepted"]).sum() / drafted if drafted else math.nan
    gamma = num(pd.Series([p.get("gamma")])).iloc[0]
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
        **_equality(g),
        "gamma_used": gamma,
        "cost_ratio": c,
        "cost_ratio_source": c_src,
        "theory_accept_length": expected_accept_length(alpha, gamma) if drafted and chain else math.nan,
        "theory_speedup": theory_speedup(alpha, gamma, c) if drafted and chain else math.nan,
    }
    out["efficiency"] = rec["speedup"] / rec["accept_length"] if rec["accept_length"] else math.nan
    return out


def _cell_quality(g: pd.DataFrame, rec: Mapping[str, Any], quality: Sequence[str], level: float,
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


def _int_params(agg: pd.DataFrame, params: Sequence[str]) -> pd.DataFrame:
    """Integral hyper-parameters stay integers (gamma=4, not 4.0)."""
    for k in params:
        vals = agg[k].dropna()
        if len(vals) and all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
                             and float(v).is_integer() for v in vals):
            agg[k] = agg[k].astype("Int64")
    return agg


def _equality(g: pd.DataFrame) -> dict[str, Any]:
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


def _latency(g: pd.DataFrame) -> dict[str, float]:
    """Latency figures of one cell's rows (NaN for columns the rows do not carry): mean
    ``decode_tokens_per_s``; ``ttft_s`` and ``tpot_s`` at their mean and 50th/90th/99th percentiles over rows
    (:data:`LATENCY_PERCENTILES`); ``prefill_share`` (mean of ``prefill_s / wall_time_s``, ``ttft_s`` for rows
    without ``prefill_s``); ``peak_memory_mb`` (the largest); ``_untimed_prefill_rows``: draft-model rows written
    before the draft's prefill was timed (their decode-only figures hold it; one warning per group)."""
    out: dict[str, float] = {"decode_tokens_per_s": num(g["decode_tokens_per_s"]).mean()
                             if "decode_tokens_per_s" in g else math.nan}
    for col in ("ttft_s", "tpot_s"):
        x = num(g[col]).dropna() if col in g else pd.Series(dtype=float)
        out[col] = float(x.mean()) if len(x) else math.nan
        for p in LATENCY_PERCENTILES:
            out[f"{col}_p{p}"] = float(np.percentile(x, p)) if len(x) else math.nan
    prefill = num(g["prefill_s"]) if "prefill_s" in g else pd.Series(math.nan, index=g.index)
    if "ttft_s" in g:
        prefill = prefill.fillna(num(g["ttft_s"]))
    with np.errstate(invalid="ignore", divide="ignore"):
        out["prefill_share"] = float((prefill / num(g["wall_time_s"]).where(lambda w: w > 0)).mean())
    out["peak_memory_mb"] = float(num(g["peak_memory_mb"]).max()) if "peak_memory_mb" in g else math.nan
    drafts = num(g["draft_forwards"]).fillna(0) > 0 if "draft_forwards" in g else pd.Series(False, index=g.index)
    decode = num(g["decode_tokens_per_s"]).notna() if "decode_tokens_per_s" in g else pd.Series(False, index=g.index)
    untimed = drafts & decode & (num(g["draft_prefill_s"]).isna() if "draft_prefill_s" in g else True)
    out["_untimed_prefill_rows"] = int(untimed.sum())  # one warning per group: _untimed_prefill_warning
    return out


def _untimed_prefill_warning(agg: pd.DataFrame) -> None:
    """One warning per group, on each cell it concerns, naming the draft decoders whose rows predate the timing
    of the draft's prefill (their decode-only speed holds that prefill; ``hf_assisted``'s never did)."""
    if "_untimed_prefill_rows" not in agg:
        return
    for group, g in agg[agg["_untimed_prefill_rows"].fillna(0) > 0].groupby("group", sort=False):
        text = (f"decode_speedup ({group}): the rows of {', '.join(map(str, g['label']))} predate the timing of the "
                "draft's prefill, so their decode-only tokens/s count the draft's prefill as decode time; "
                "transformers' assisted generation has it before its first token: compare end-to-end speedup")
        for ws in g["warnings"]:
            ws.append(text)


def _cell_stats(g: pd.DataFrame, n_boot: int, level: float, seed: int, disagree_rel: float,
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
    clusters = (g["task"].astype(str) + "/" + g["sample_id"].astype(str)).tolist()
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


def summarize(rows: pd.DataFrame, quality_columns: Sequence[str] | None = None, **kwargs: Any) -> pd.DataFrame:
    """The tidy per-run summary (``summary.csv``): one row per (group, decoder configuration) carrying the
    identity (task, task version, model pair, dtype, hardware, code version, budget, sampling settings, run
    identity), each hyper-parameter as its own column, then the numbers of :data:`SUMMARY_COLUMNS` and the
    quality means (with their intervals over seeds where there are several seeds).

    ``summary.attrs["warnings"]`` lists the warnings (:func:`run_warnings`); :func:`to_markdown` prints them
    above the table. Keyword arguments go to :func:`aggregate`.
    """
    if rows.empty:
        return pd.DataFrame(columns=SUMMARY_ID_COLUMNS + SUMMARY_COLUMNS)
    agg = aggregate(rows, quality=quality_columns, **kwargs)
    params = decoder_param_columns(agg)
    qual = [q for q in find_quality(prepare(rows), quality_columns) if q in agg]
    qual_cols = [c for q in qual for c in (q, f"{q}_low", f"{q}_high", f"{q}_seed_std") if c in agg]
    cols = [c for c in SUMMARY_ID_COLUMNS if c in agg] + [p for p in params if p in agg] + \
        [c for c in SUMMARY_COLUMNS if c in agg] + qual_cols
    summary = agg[cols].copy()
    summary["warnings"] = ["; ".join(w) for w in agg["warnings"]]
    summary.attrs["warnings"] = run_warnings(agg)
    summary.attrs["quality"] = qual
    summary.attrs["params"] = params
    return summary


# ------------------------------------------------------------------------------------------------ tables


# ------------------------------------------------------------------------------------------------ comparison


# ------------------------------------------------------------------------------------------------ figures' frames


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


