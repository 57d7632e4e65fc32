"""Aggregation: result rows -> cells -> summary. Every number of ``summary.csv``, the paper report, the
regression gate, the run comparison and the figures is computed from result rows by this module and its
neighbours, pure functions of DataFrames (pandas and numpy only; no torch, no decoders, no tasks):

* :mod:`harness.rows.columns`: the rows schema (every column declared once) and reading cell values;
* :mod:`harness.rows.grouping`: checks, defaults, configuration labels and run groups of the rows;
* :mod:`harness.rows.stats`: the bootstrap, t and Wilson intervals, Leviathan et al.'s theory;
* this module: pairing with vanilla, one row per (group, configuration) (:func:`aggregate`), the summary;
* :mod:`harness.rows.cell_figures`: the figures of one cell (speed and its intervals, latency, theory, quality);
* :mod:`harness.rows.flags`: the warnings attached to cells (load, emulated bf16, noise, lossless quality);
* :mod:`harness.report.tables`, :mod:`harness.report.compare`, :mod:`harness.report.figdata`: markdown, run comparison,
  figure data.

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

import logging
import math
import re
from typing import Any, Sequence

import numpy as np
import pandas as pd

from harness.rows import cells as coverage
from harness.rows.cell_figures import (cell_latency, cell_quality, cell_stats, cell_theory, cost_ratio_of,
                                       counters)
from harness.rows.columns import (PAIR_KEYS, RUN_IDENTITY_FIELDS, SUMMARY_COLUMNS, SUMMARY_ID_COLUMNS, fmt_value,
                                  norm, num, num_value)
from harness.rows.flags import (LOAD_MARGIN, emulated_half_warning, load_stats, run_warnings, load_warning,
                                lossless_quality_flags, replicate_noise)
from harness.rows.grouping import (decoder_param_columns, ok_rows, params_of, prepare,
                                   quality_columns as find_quality, run_ids, settings_label)

#: Re-exported: the per-cell figures live in :mod:`harness.rows.cell_figures`.
__all__ = ["aggregate", "cost_ratio_of", "counters", "figure_rows", "ordered_labels", "paired_speedups", "summarize"]

log = logging.getLogger(__name__)


def paired_speedups(rows: pd.DataFrame) -> pd.DataFrame:
    """Per-row speedup of every decoder against vanilla in the same run.

    Args:
        rows: result rows with ``run_id, task, sample_id, decoder, tokens_per_s, wall_time_s, new_tokens,
            status`` (``turn`` / ``repeat`` / ``decode_tokens_per_s`` / ``attempt_id`` /
            ``paired_across_processes`` where present).

    Returns:
        ``rows`` (status ``ok`` only) with ``vanilla_tokens_per_s``, ``vanilla_wall_time_s``,
        ``vanilla_new_tokens``, ``vanilla_tpot_s`` (where rows have ``tpot_s``), ``speedup`` (NaN where vanilla
        has no ok row), ``decode_speedup`` (the paired ratio of ``decode_tokens_per_s``; NaN where either side has
        none), ``cross_process`` (the row is paired with a vanilla row written by another process: the row says
        so, or the two ``attempt_id`` differ), ``in_figures`` (the row is a figure row: paired, or in a group
        without vanilla rows) and ``vanilla_status`` (:func:`harness.rows.cells.mark_pairs`).
    """
    ok = ok_rows(rows).copy()
    keys = [k for k in PAIR_KEYS if k in ok.columns]
    extra = [c for c in ("decode_tokens_per_s", "attempt_id", "tpot_s") if c in ok.columns]
    vanilla = ok[ok["decoder"] == "vanilla"][keys + ["tokens_per_s", "wall_time_s", "new_tokens", *extra]]
    vanilla = vanilla.drop_duplicates(keys, keep="last").rename(columns={
        "tokens_per_s": "vanilla_tokens_per_s", "wall_time_s": "vanilla_wall_time_s",
        "new_tokens": "vanilla_new_tokens", "decode_tokens_per_s": "vanilla_decode_tokens_per_s",
        "attempt_id": "vanilla_attempt_id", "tpot_s": "vanilla_tpot_s"})
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


def _order(agg: pd.DataFrame) -> pd.DataFrame:
    """Table order: groups first-seen; within a group vanilla, then decoders first-seen, configurations by
    hyper-parameter values (numbers numerically)."""
    if agg.empty:
        return agg
    dec_order = list(dict.fromkeys(["vanilla", *agg["decoder"]]))
    groups = {g: i for i, g in enumerate(dict.fromkeys(agg["group"]))}
    params = decoder_param_columns(agg)

    def natural(v: Any) -> tuple:
        n = num_value(v)
        return (0, float(n), "") if not pd.isna(n) else (1, 0.0, str(v))

    records = agg[[c for c in ("group", "decoder", "decoder_params", "label") if c in agg]].to_dict("records")

    def key(i: int) -> tuple:
        r = records[i]
        p = params_of(r.get("decoder_params"))
        return (groups[r["group"]], dec_order.index(r["decoder"]), *[natural(p.get(k)) for k in params],
                [natural(part) for part in re.split(r"(\d+(?:\.\d+)?)", str(r["label"]))])  # gamma=2 before =12

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
            rec.update(cell_stats(g, n_boot, level, seed, disagree_rel, warnings))
            rec.update(cell_latency(g))
            rec.update(cell_theory(g, rec, cost_ratio))
            rec.update(cell_quality(g, rec, quality, level, warnings))
            rec["speedup_repeat_std"], rec["replicates"] = replicate_noise(g, "speedup")
            rec["tokens_per_s_repeat_std"], _ = replicate_noise(g, "tokens_per_s")
            rec["paired_across_processes"] = int(g["cross_process"].sum())
            if rec["paired_across_processes"]:
                warnings.append(f"{rec['label']} ({rec['group']}): {rec['paired_across_processes']} of {len(g)} "
                                "rows are paired with a vanilla row measured in another process (a resumed run; "
                                "column paired_across_processes): their speedups compare timings of two processes")
            runs = _runs(all_g)
            if rec["decoder"] == "vanilla" and len(runs) > 1:
                warnings.append(f"{rec['label']} ({rec['group']}): this row pools the vanilla rows of {len(runs)} "
                                "runs that no decoder setting tells apart (each run measured its own vanilla); every "
                                "other row's speedup is paired with its own run's vanilla, so its tok/s over this "
                                "row's is not its speedup")
            rec["load_max"], rec["rows_over_load"], rec["usable_cores"] = load_stats(ok_rows(all_g), load_margin)
            load_note, half_note = notes[key[0]]
            warnings += [w for w in (load_note if rec["rows_over_load"] else None, half_note) if w]
        rec["warnings"] = warnings
        out.append(rec)
    agg = _int_params(_order(pd.DataFrame(out)), params)
    lossless_quality_flags(agg, rows, quality)
    _untimed_prefill_warning(agg)
    return agg.drop(columns=["_untimed_prefill_rows"], errors="ignore")


def _runs(g: pd.DataFrame) -> list[str]:
    """The runs ``g``'s rows come from (:func:`harness.rows.grouping.run_ids`)."""
    return list(run_ids(g).dropna().unique())


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
    rec["decoder_class"] = first["decoder_class"]  # every prepared row has one (harness.rows.legacy.upgrade)
    rec["decoder_params"] = first["decoder_params"]
    rec["settings"] = settings_label(first["decoder_params"], decoder_class=str(rec["decoder_class"]))
    p = params_of(first["decoder_params"])
    for k in params:
        rec[k] = norm(p.get(k))
    return rec


def _int_params(agg: pd.DataFrame, params: Sequence[str]) -> pd.DataFrame:
    """Integral hyper-parameters stay integers (gamma=4, not 4.0)."""
    for k in params:
        vals = agg[k].dropna()
        if len(vals) and all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
                             and float(v).is_integer() for v in vals):
            agg[k] = agg[k].astype("Int64")
    return agg


#: The decode-only figures a cell whose rows predate the timing of the draft's prefill cannot have.
UNTIMED_PREFILL_BLANKS = ("decode_tokens_per_s", "decode_speedup", "decode_speedup_low", "decode_speedup_high")


def _untimed_prefill_warning(agg: pd.DataFrame) -> None:
    """The decode-only figures (:data:`UNTIMED_PREFILL_BLANKS`) of the draft decoders whose rows predate the timing
    of the draft's prefill are blanked, in place (they would count that prefill as decode time, and
    ``hf_assisted``'s never did: a known bias is not printed as a number); one warning per group, on each cell it
    concerns, names them."""
    if "_untimed_prefill_rows" not in agg:
        return
    untimed = agg["_untimed_prefill_rows"].fillna(0) > 0
    for group, g in agg[untimed].groupby("group", sort=False):
        text = (f"decode_speedup ({group}): the rows of {', '.join(map(str, g['label']))} predate the timing of the "
                "draft's prefill, so their decode-only figures are left blank (they would count the draft's "
                "prefill as decode time; transformers' assisted generation has it before its first token): "
                "compare end-to-end speedup")
        for ws in g["warnings"]:
            ws.append(text)
    agg.loc[untimed, [c for c in UNTIMED_PREFILL_BLANKS if c in agg]] = math.nan


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
