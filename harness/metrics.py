"""The one aggregation module: every number in ``summary.csv``, the paper report, the regression gate, the
run comparison and the figures is computed here, from result rows -- and so is every warning about them
(machine load, cross-process pairs, disagreeing estimators). Pure functions of DataFrames (pandas and numpy
only; no torch, no decoders, no tasks). Loading files, formatting tables and drawing live elsewhere
(:mod:`harness.report`, :mod:`plots`); the runner adds only the note that a run was interrupted.

Definitions (stated once, used everywhere):

* ``tokens_per_s`` of a row: new tokens / wall seconds of the whole ``generate`` call (prefill included);
  a cell's ``tokens_per_s`` is the mean over its rows, ``tokens_per_s_total`` the ratio of totals.
* ``speedup`` (end to end) of a decoder: the mean over rows of the paired ratio
  ``tokens_per_s(decoder) / tokens_per_s(vanilla)`` on the same sample, turn and repeat in the same run
  (``run_id``); ``speedup_total`` is the ratio of totals (vanilla seconds per token summed over the same
  rows / the decoder's). Spec-Bench's ``speed.py`` uses a ratio of mean tokens/s, a third estimator.
* ``decode_speedup``: the same paired mean for ``decode_tokens_per_s`` (new tokens after the first /
  seconds after the first token, the runner's stopwatch): what the decoder does once the prompt is
  prefilled. Rows with one new token have no decode rate and no decode pair.
* ``ttft_s``: mean seconds to the first new token (the target's prefill, plus whatever a decoder does
  before it: ``hf_assisted`` drafts first). ``prefill_share``: mean over rows of ``ttft_s / wall_time_s``,
  the share of a call spent before its first new token -- large on short-answer tasks, where the end-to-end
  speedup cannot exceed what the decode-only speedup shows.
* ``accept_length`` (tau): total new tokens / total target forwards (prefill included; vanilla = 1.0).
* ``acceptance_rate`` (alpha): total accepted draft tokens / total drafted tokens.
* ``equal_to_vanilla``: share of rows whose tokens equal vanilla's (``matches_vanilla``), over greedy rows
  only. Sampled rows (``equality_check = "n/a (sampled)"``, ``matches_vanilla: null``) make no token
  claim: their cell's ``equality_check`` says ``n/a (sampled)``, ``equal_to_vanilla`` is empty, and they are
  never listed as divergent (their losslessness is a distribution property, tested in CI).
* Quality (the task's ``quality_columns``): the mean over rows; for sampled runs over several seeds
  (``sampling_seed``, i.e. ``runner.seed``), the mean over seeds of each seed's mean, with a Student-t
  interval over seeds (``<q>_low`` / ``<q>_high``, ``seeds - 1`` degrees of freedom) and ``<q>_seed_std``:
  how much the score moves with the seed on these samples (not with other samples).
* Intervals of speed figures: percentile bootstrap (default 95 %, 2000 resamples, seeded) that resamples
  samples and, within each drawn sample, its observations (repeats, turns, seeds, several runs of the same
  identity). ``*_low`` / ``*_high`` are its bounds, ``*_std`` the bootstrap standard error.
* Which rows a figure stands on (:mod:`harness.coverage`): every figure of a cell -- tokens/s included --
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
import json
import logging
import math
import re
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from harness import coverage
from harness.results import emulated_half_note

log = logging.getLogger(__name__)

# ------------------------------------------------------------------------------------------------ constants
#: Row columns that make a group (one setting). Rows that differ in any of them (where present) are different
#: runs and are never pooled (``pool=True`` keeps only task and model pair). ``group_identity`` is the
#: runner's hash of everything else (see the module docstring); the named fields are listed so that a group's
#: label can say what differs.
RUN_IDENTITY_FIELDS = ("task", "task_version", "model", "target_model", "draft_model", "dtype", "device_name",
                       "git_commit", "git_dirty", "max_new_tokens", "temperature", "top_p", "top_k",
                       "group_identity", "source")
#: Identity fields that are hashes: shown in a group label only when no readable field tells the groups apart.
HASH_IDENTITY_FIELDS = ("group_identity",)
#: Identity fields kept when pooling (``pool=True``).
POOLED_IDENTITY_FIELDS = ("task", "target_model", "draft_model")
#: Columns every ``ok`` row must carry (the runner writes them all): without them a figure would be computed from
#: nothing and print as a number; :func:`prepare` refuses such rows, naming what is missing.
REQUIRED_OK_COLUMNS = ("decoder", "sample_id", "new_tokens", "num_steps", "wall_time_s", "tokens_per_s")
NULLABLE_OK_COLUMNS = ("tokens_per_s",)
#: Values that rows written before the sampling columns existed mean (greedy decoding).
SAMPLING_DEFAULTS = {"temperature": 0.0, "top_p": 1.0, "top_k": 0}
#: Keys pairing a decoder's row with vanilla's (same run, sample, turn and repeat).
PAIR_KEYS = ("run_id", "task", "sample_id", "turn", "repeat")
#: Score columns recognised when neither the caller nor the rows declare a task's quality columns.
KNOWN_QUALITY_COLUMNS = ("pass@1", "accuracy", "exact_match", "rouge1", "rouge2", "rougeL", "rougeLsum")
#: Load columns the runner records per row (1-minute load average before/after the timed call), then the names
#: older rows used; the usable core count (``cpu_affinity``), then the cores present (``cpu_count``).
LOAD_COLUMNS = ("load_1m_before", "load_1m_after")
LEGACY_LOAD_COLUMNS = ("load_avg_1m_before", "load_avg_1m_after")
CORE_COLUMNS = ("cpu_affinity", "cpu_count")
#: A row ran on a loaded machine when its load average exceeded the usable cores by more than this: the run's
#: own threads (up to one per core) load the machine up to the core count, anything above is other work.
LOAD_MARGIN = 0.5
#: ``equality_check`` of a sampled row (the runner's value), and what a cell of greedy rows says.
EQUALITY_SAMPLED = "n/a (sampled)"
EQUALITY_EXACT = "exact"
#: Hyper-parameter keys of a decoder config that are not hyper-parameters.
NON_PARAM_KEYS = ("_target_", "_partial_", "uses_draft")
#: Columns of a tidy summary row that say which run and configuration it belongs to.
SUMMARY_ID_COLUMNS = ["task", "task_version", "model", "target_model", "draft_model", "dtype", "device_name",
                      "git_commit", "max_new_tokens", "temperature", "top_p", "top_k", "run_identity", "group",
                      "label", "decoder", "decoder_params"]
SUMMARY_COLUMNS = [
    "group_samples", "samples", "paired_samples", "unpaired", "failed", "failed_statuses", "rows", "repeats",
    "seeds", "replicates", "tokens_per_s", "tokens_per_s_low",
    "tokens_per_s_high", "tokens_per_s_total", "speedup", "speedup_low", "speedup_high", "speedup_total",
    "speedup_total_low", "speedup_total_high", "decode_tokens_per_s", "decode_speedup", "decode_speedup_low",
    "decode_speedup_high", "ttft_s", "prefill_share", "accept_length", "accept_length_low",
    "accept_length_high", "acceptance_rate", "target_tokens_fed_per_step", "draft_forwards_per_step",
    "equality_check", "equal_to_vanilla", "paired_across_processes", "speedup_repeat_std",
    "tokens_per_s_repeat_std", "load_max", "rows_over_load", "usable_cores", "warnings",
]
#: Columns of ``summary.md`` (the CSV has them all): the label, the headline numbers and their intervals
#: (``x``, ``x_low``, ``x_high`` print as one ``x [low, high]`` cell).
SUMMARY_MD_COLUMNS = ["group", "label", "samples", "paired_samples", "unpaired", "failed", "rows", "repeats", "seeds",
                      "tokens_per_s", "speedup", "speedup_total", "decode_speedup", "ttft_s", "prefill_share",
                      "accept_length", "acceptance_rate", "target_tokens_fed_per_step", "draft_forwards_per_step",
                      "equal_to_vanilla", "paired_across_processes", "load_max"]
#: Figures of ``summary.md`` printed with their interval (``x [low, high]``), besides the quality columns.
MD_INTERVALS = ("speedup", "decode_speedup")
#: The legend under the summary's table (and the report's definitions).
SUMMARY_LEGEND = (
    "speedup = mean over samples of tokens/s(decoder) / tokens/s(vanilla), paired within one run (speedup_total "
    "= ratio of totals); decode_speedup = the same for decode-only tokens/s (after the first token); ttft_s = "
    "mean seconds to the first new token; prefill_share = mean ttft_s / wall_time_s; accept_length = new tokens "
    "/ target forwards (prefill included); equal_to_vanilla = share of greedy rows equal to vanilla (n/a for "
    "sampled rows); [low, high] = 95% bootstrap interval over samples and repeats (quality: t-interval over "
    "seeds); samples = distinct samples measured (ok rows), paired_samples = samples every figure of the row is "
    "computed over (ok rows paired with an ok vanilla row of the same sample, turn and repeat; tok/s too), "
    "unpaired = ok rows left out for want of that pair, failed = cells without a measurement (errors, skips; "
    "by status), rows = figure rows, replicates = measurements per sample")
#: Counters that are deterministic for a given code, model, data, seeds and float32 (the gate checks them
#: exactly).
COUNTER_COLUMNS = ("new_tokens", "num_steps", "draft_forwards", "num_drafted", "num_accepted")


# ------------------------------------------------------------------------------------------------ helpers
def num(s: Any) -> pd.Series:
    """``s`` as floats (non-numbers -> NaN)."""
    return pd.to_numeric(s, errors="coerce")


def norm(value: Any) -> Any:
    """Canonical form of a cell value for keys: NaN/None -> None, integral floats -> int, numpy scalars ->
    Python, lists -> tuples."""
    if value is None:
        return None
    if isinstance(value, (list, tuple, np.ndarray)):
        return tuple(norm(v) for v in value)
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if value.is_integer():
            return int(value)
    return value


def fmt_value(value: Any) -> str:
    """A parameter value as a person writes it: ``3`` not ``3.0``, ``None`` as ``null``."""
    v = norm(value)
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return format(v, "g")
    return str(v)


def _ok(rows: pd.DataFrame) -> pd.DataFrame:
    return rows[rows["status"] == "ok"] if "status" in rows else rows


def _params(s: Any) -> dict[str, Any]:
    if isinstance(s, str):
        try:
            p = json.loads(s)
            return p if isinstance(p, dict) else {}
        except json.JSONDecodeError:
            return {}
    return {}


# ------------------------------------------------------------------------------------------------ labels
def decoder_param_columns(rows: pd.DataFrame) -> list[str]:
    """Hyper-parameter names found in the rows' ``decoder_params`` JSON, in first-seen order."""
    names: dict[str, None] = {}
    if "decoder_params" not in rows:
        return []
    for s in rows["decoder_params"].dropna().unique():
        names.update(dict.fromkeys(_params(s)))
    return list(names)


def swept_params(rows: pd.DataFrame) -> dict[str, list[str]]:
    """decoder -> the hyper-parameters that take more than one value among its rows."""
    out: dict[str, list[str]] = {}
    if "decoder_params" not in rows:
        return {d: [] for d in dict.fromkeys(rows["decoder"])}
    for decoder, g in rows.groupby("decoder", sort=False):
        params = [_params(s) for s in g["decoder_params"].dropna().unique()]
        keys = dict.fromkeys(k for p in params for k in p)
        out[decoder] = [k for k in keys if len({json.dumps(norm(p.get(k))) for p in params}) > 1]
    return out


def config_labels(rows: pd.DataFrame) -> pd.Series:
    """Label of each row's decoder configuration: the decoder name, plus ``(k=v, ...)`` for its
    hyper-parameters that vary among the rows (a gamma sweep gives ``speculative (gamma=2)``, ...). Integral
    values print as integers."""
    varying = swept_params(rows)
    params = rows["decoder_params"] if "decoder_params" in rows else pd.Series([None] * len(rows), index=rows.index)
    labels = []
    for dec, ps in zip(rows["decoder"], params):
        keys = varying.get(dec) or []
        if not keys:
            labels.append(str(dec))
            continue
        p = _params(ps)
        labels.append(f"{dec} (" + ", ".join(f"{k}={fmt_value(p.get(k))}" for k in keys) + ")")
    return pd.Series(labels, index=rows.index, dtype=object)


def model_pair(rows: pd.DataFrame) -> pd.Series:
    """``target / draft`` per row (``target`` alone without a draft)."""
    target = rows["target_model"] if "target_model" in rows else pd.Series([None] * len(rows), index=rows.index)
    if "model" in rows:
        target = target.where(target.notna(), rows["model"])
    draft = rows["draft_model"] if "draft_model" in rows else pd.Series([None] * len(rows), index=rows.index)
    return pd.Series([str(t) if d is None or (isinstance(d, float) and math.isnan(d)) else f"{t} / {d}"
                      for t, d in zip(target, draft)], index=rows.index, dtype=object)


def identity_fields(rows: pd.DataFrame, pool: bool = False) -> list[str]:
    """The run-identity columns present in ``rows`` (:data:`RUN_IDENTITY_FIELDS`, or
    :data:`POOLED_IDENTITY_FIELDS` when pooling)."""
    fields = POOLED_IDENTITY_FIELDS if pool else RUN_IDENTITY_FIELDS
    return [f for f in fields if f in rows]


def _short(field: str, value: Any) -> str:
    v = fmt_value(value)
    if field in HASH_IDENTITY_FIELDS:
        return v[:8]
    return v[:7] if field == "git_commit" and len(v) > 12 else v


def run_groups(rows: pd.DataFrame, pool: bool = False) -> tuple[pd.Series, list[str]]:
    """Group label of each row (one group per setting, see the module docstring) and the identity fields that
    vary.

    The label is ``task: target / draft``, plus ``(field=value, ...)`` for the readable identity fields that
    differ between the groups (``git_commit`` shortened to 7 characters, e.g. ``temperature=0.7``); the hash
    ``group_identity`` (8 characters) is added only to labels that the readable fields leave equal for
    different groups (two runs that differ in, say, a model seed or the prompt style). With ``pool=True`` only
    task and model pair separate groups, and a warning names the identity fields that were pooled.

    Returns:
        ``(labels, varying)``: a Series aligned with ``rows`` and the varying identity fields.
    """
    fields = identity_fields(rows, pool)
    keys = [tuple(norm(v) for v in t) for t in rows[fields].itertuples(index=False, name=None)] if fields else \
        [()] * len(rows)
    shown = {"task", "model", "target_model", "draft_model"}
    varying = [f for i, f in enumerate(fields) if len({k[i] for k in keys}) > 1]  # None counts as a value
    extra = [(i, f) for i, f in enumerate(fields) if f in varying and f not in shown
             and f not in HASH_IDENTITY_FIELDS]
    hashed = [(i, f) for i, f in enumerate(fields) if f in varying and f in HASH_IDENTITY_FIELDS]
    task = rows["task"].astype(str) if "task" in rows else pd.Series(["-"] * len(rows), index=rows.index)
    base = task + ": " + model_pair(rows)
    if extra:
        base = base + [" (" + ", ".join(f"{f}={_short(f, k[i])}" for i, f in extra) + ")" for k in keys]
    if hashed:
        label_keys: dict[str, set] = {}
        for lab, k in zip(base, keys):
            label_keys.setdefault(lab, set()).add(k)
        base = pd.Series([lab if len(label_keys[lab]) == 1 else
                          f"{lab} [" + ", ".join(f"{f}={_short(f, k[i])}" for i, f in hashed) + "]"
                          for lab, k in zip(base, keys)], index=rows.index, dtype=object)
    if pool:
        hidden = [f for f in identity_fields(rows) if f not in fields and len({norm(v) for v in rows[f]}) > 1]
        if hidden:
            log.warning("POOLING rows that differ in %s (pool=True): the numbers mix runs that are not the same "
                        "experiment", ", ".join(hidden))
    return base.astype(object), varying


def is_sampled(rows: pd.DataFrame) -> pd.Series:
    """Per row: whether it was sampled (``equality_check`` says so, or ``temperature > 0``); rows without
    either column were greedy (the harness sampled nothing before these columns existed)."""
    out = pd.Series(False, index=rows.index, dtype=bool)
    if "equality_check" in rows:
        out |= rows["equality_check"].astype(str).str.startswith("n/a")
    if "temperature" in rows:
        out |= num(rows["temperature"]).fillna(0) > 0
    return out


def prepare(rows: pd.DataFrame, pool: bool = False) -> pd.DataFrame:
    """``rows`` with the columns every aggregate needs: ``model_pair``, ``label`` (decoder configuration),
    ``group`` (run identity) and defaults for missing bookkeeping columns: the greedy defaults of the sampling
    columns where a row lacks them (:data:`SAMPLING_DEFAULTS`), and ``group_identity`` from ``run_identity``
    for rows written before it existed. Idempotent."""
    rows = rows.copy()
    check_columns(rows)
    for c, default in (("status", "ok"), ("decoder_params", "{}"), ("turn", 0), ("repeat", 0), ("run_id", "run")):
        if c not in rows:
            rows[c] = default
    for c in ("tokens_per_s", "wall_time_s", "new_tokens", "num_steps"):  # rows that never ran (no ok row)
        if c not in rows:
            rows[c] = math.nan
    rows["turn"] = rows["turn"].fillna(0)
    rows["repeat"] = rows["repeat"].fillna(0)
    for c, default in SAMPLING_DEFAULTS.items():
        if c in rows:
            rows[c] = rows[c].where(rows[c].notna(), default)
    if "run_identity" in rows:
        fallback = rows["run_identity"]
        rows["group_identity"] = rows["group_identity"].where(rows["group_identity"].notna(), fallback) \
            if "group_identity" in rows else fallback
    rows["model_pair"] = model_pair(rows)
    if "label" not in rows:
        rows["label"] = config_labels(rows)
    if "group" not in rows or pool:
        rows["group"], _ = run_groups(rows, pool)
    return rows


def check_columns(rows: pd.DataFrame) -> None:
    """Refuse rows whose ``ok`` rows lack a column of :data:`REQUIRED_OK_COLUMNS` (or miss its value; only
    ``tokens_per_s`` may be null, where a call took no measurable time: such a row is left out of the speed
    figures, never counted as 0).

    Raises:
        ValueError: naming the missing columns and how many ok rows lack them; the rows were not written by
            this harness's runner (or :mod:`harness.specbench`'s import), or were edited.
    """
    ok = _ok(rows)
    if ok.empty:
        return
    absent = [c for c in REQUIRED_OK_COLUMNS if c not in ok]
    empty = {c: int(ok[c].isna().sum()) for c in REQUIRED_OK_COLUMNS
             if c in ok and c not in NULLABLE_OK_COLUMNS and ok[c].isna().any()}
    if absent or empty:
        what = [f"{c} (no such column)" for c in absent] + [f"{c} (null in {n} of {len(ok)} ok rows)"
                                                              for c, n in empty.items()]
        raise ValueError(f"result rows with status ok lack {', '.join(what)}: every number of the summary, report "
                         "and gate is computed from these columns; re-run the cells with the harness's runner "
                         "(or fix the rows) rather than aggregate them")


def quality_columns(rows: pd.DataFrame, declared: Sequence[str] | None = None) -> list[str]:
    """The quality (score) columns to report, in this order of preference:

    1. ``declared``: a task's ``quality_columns`` (the runner passes them), those present in ``rows``;
    2. a ``quality_columns`` column in the rows (a list, or JSON text of one);
    3. the score columns of the project's tasks found in the rows (:data:`KNOWN_QUALITY_COLUMNS`).
    """
    if declared is not None:
        return [c for c in declared if c in rows]
    if "quality_columns" in rows:
        names: dict[str, None] = {}
        for v in rows["quality_columns"].dropna():
            if isinstance(v, str):
                try:
                    v = json.loads(v)
                except json.JSONDecodeError:
                    v = [v]
            names.update(dict.fromkeys(str(x) for x in v))
        return [c for c in names if c in rows]
    return [c for c in KNOWN_QUALITY_COLUMNS if c in rows and num(rows[c]).notna().any()]


_find_quality = quality_columns  # summarize()'s argument shadows the name


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
        ``vanilla_status`` (:func:`harness.coverage.mark_pairs`).
    """
    ok = _ok(rows).copy()
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
    """The ``ok`` rows every figure is computed over (:mod:`harness.coverage`): paired with an ``ok`` vanilla row
    (all ``ok`` rows in a group without vanilla rows). Rows without the columns pairing needs are taken as they
    are (their ``ok`` rows)."""
    if not {"decoder", "tokens_per_s", "wall_time_s", "new_tokens"} <= set(rows.columns):
        return _ok(rows)
    merged = paired_speedups(rows)
    return merged[merged["in_figures"]]


# ------------------------------------------------------------------------------------------------ bootstrap
def bootstrap_weights(clusters: Sequence[Any], n_boot: int = 2000, seed: int = 0) -> np.ndarray:
    """Two-level bootstrap weights: ``W[b, i]`` = how often observation ``i`` is drawn in resample ``b``.

    Each resample draws as many clusters (samples) as there are, with replacement, and within each drawn
    cluster as many of its observations (repeats, turns, runs) as it has, with replacement. Statistics are
    then weighted sums (``W @ x``). With one observation per cluster this is the ordinary bootstrap.

    Args:
        clusters: cluster id of each observation (length N).
        n_boot: resamples B.
        seed: RNG seed (the weights are reproducible).

    Returns:
        float64 array of shape (B, N).
    """
    codes, uniq = pd.factorize(pd.Series(list(clusters), dtype=object))
    n_obs, n_cl = len(codes), len(uniq)
    rng = np.random.default_rng(seed)
    w = np.zeros((n_boot, n_obs))
    if n_obs == 0:
        return w
    counts = rng.multinomial(n_cl, np.full(n_cl, 1.0 / n_cl), size=n_boot)  # (B, clusters)
    for c in range(n_cl):
        idx = np.flatnonzero(codes == c)
        if len(idx) == 1:
            w[:, idx[0]] = counts[:, c]
        else:
            w[:, idx] = rng.multinomial(counts[:, c] * len(idx), np.full(len(idx), 1.0 / len(idx)))
    return w


def _interval(draws: np.ndarray, level: float) -> tuple[float, float, float]:
    d = draws[np.isfinite(draws)]
    if len(d) < 2:
        return math.nan, math.nan, math.nan
    a = (1.0 - level) / 2.0
    return float(np.quantile(d, a)), float(np.quantile(d, 1.0 - a)), float(d.std(ddof=1))


def bootstrap_mean_ci(values: Sequence[float], n_boot: int = 2000, level: float = 0.95, seed: int = 0,
                      clusters: Sequence[Any] | None = None) -> dict[str, float]:
    """Mean of ``values`` with a percentile bootstrap interval (two-level when ``clusters`` is given).

    Returns:
        ``{"mean", "low", "high", "std"}``; ``std`` is the bootstrap standard error. With fewer than two
        values (or one cluster) the interval and std are NaN.
    """
    x = np.asarray([np.nan if v is None else v for v in values], dtype=float)
    cl = list(range(len(x))) if clusters is None else list(clusters)
    keep = ~np.isnan(x)
    x, cl = x[keep], [c for c, k in zip(cl, keep) if k]
    if len(x) == 0:
        return {"mean": math.nan, "low": math.nan, "high": math.nan, "std": math.nan}
    mean = float(x.mean())
    if len(x) < 2 or len(set(cl)) < 2:
        return {"mean": mean, "low": math.nan, "high": math.nan, "std": math.nan}
    w = bootstrap_weights(cl, n_boot, seed)
    lo, hi, sd = _interval((w @ x) / w.sum(axis=1), level)
    return {"mean": mean, "low": lo, "high": hi, "std": sd}


# ------------------------------------------------------------------------------------------------ theory
def expected_accept_length(alpha: float, gamma: float) -> float:
    """Leviathan et al. 2023, eq. 1: E[tau] = (1 - alpha^(gamma+1)) / (1 - alpha) (gamma + 1 at alpha=1)."""
    if alpha is None or gamma is None or math.isnan(alpha) or math.isnan(gamma):
        return math.nan
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1.0)) / (1.0 - alpha)


def theory_speedup(alpha: float, gamma: float, cost_ratio: float) -> float:
    """Leviathan et al. 2023 (Thm 3.8): S = (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)).

    Assumes i.i.d. acceptance with probability ``alpha`` and that verifying gamma+1 tokens costs one target
    step. Worked numbers (ALGORITHMS.md section 6): alpha=0.8, gamma=4, c=0.1 -> 2.40.
    """
    if cost_ratio is None or math.isnan(cost_ratio):
        return math.nan
    return expected_accept_length(alpha, gamma) / (gamma * cost_ratio + 1.0)


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
def replicate_noise(g: pd.DataFrame, value: str) -> tuple[float, int]:
    """Run-to-run noise of a cell's figure: the standard deviation, over replicates ``(run_id, repeat)``, of
    the replicate's mean ``value``, pooled over replicates that cover the same samples (shards cover
    different samples and are not compared with each other).

    Args:
        g: the cell's rows (with ``value``, ``run_id``, ``repeat``, ``task``, ``sample_id``, ``turn``).
        value: column to average per replicate (``speedup``, ``tokens_per_s``).

    Returns:
        ``(std, replicates)``; std is NaN when no sample set has two replicates; ``replicates`` is how many
        replicates measured each sample, the fewest over the cell's samples (two shards of one run are one
        replicate, three seeds or repeats of every sample are three).
    """
    if g.empty or value not in g:
        return math.nan, 0
    x = num(g[value])
    rep = g["run_id"].astype(str) + "#" + g["repeat"].astype(str)
    sample = g["task"].astype(str) + "/" + g["sample_id"].astype(str) + "#" + g["turn"].astype(str)
    means = x.groupby(rep, sort=False).mean()
    sets = sample.groupby(rep, sort=False).agg(lambda s: hash(frozenset(s)))
    ss, dof = 0.0, 0
    for _, reps in sets.groupby(sets, sort=False):
        m = means[reps.index].dropna()
        if len(m) >= 2:
            ss += float(((m - m.mean()) ** 2).sum())
            dof += len(m) - 1
    per_sample = rep.groupby(sample, sort=False).nunique()
    return (math.sqrt(ss / dof) if dof else math.nan), int(per_sample.min())


def load_columns(rows: pd.DataFrame) -> list[str]:
    """The load-average columns ``rows`` carry: the runner's (:data:`LOAD_COLUMNS`), else the older names
    (:data:`LEGACY_LOAD_COLUMNS`)."""
    cols = [c for c in LOAD_COLUMNS if c in rows]
    return cols or [c for c in LEGACY_LOAD_COLUMNS if c in rows]


def usable_cores(rows: pd.DataFrame) -> pd.Series:
    """Per row: the cores the run could use (``cpu_affinity``; ``cpu_count`` where that is missing); NaN when
    rows record neither."""
    out = pd.Series(math.nan, index=rows.index, dtype=float)
    for c in reversed(CORE_COLUMNS):  # cpu_affinity wins where both exist
        if c in rows:
            v = num(rows[c])
            out = v.where(v.notna(), out)
    return out


def load_stats(g: pd.DataFrame, margin: float = LOAD_MARGIN) -> tuple[float, int | None, float]:
    """``(max load average, rows whose load exceeded their usable cores + margin, usable cores)`` of rows that
    record load (:func:`load_columns`, :func:`usable_cores`); ``(NaN, None, NaN)`` when they do not."""
    cols = load_columns(g)
    cores = usable_cores(g)
    if not cols or cores.isna().all():
        return math.nan, None, math.nan
    load = pd.concat([num(g[c]) for c in cols], axis=1).max(axis=1)
    over = int((load > cores + margin).sum())
    return (float(load.max()) if load.notna().any() else math.nan), over, float(cores.max())


def _load_warning(group: str, rows: pd.DataFrame, margin: float) -> str | None:
    """One warning for a group whose rows ran on a loaded machine (None when none did)."""
    peak, over, cores = load_stats(rows, margin)
    if not over:
        return None
    return (f"machine load ({group}): the 1-minute load average reached {peak:.1f} on {fmt_value(cores)} usable "
            f"cores; {over} of {len(rows)} rows were measured above {fmt_value(cores)} + {margin:g} (columns "
            f"{', '.join(load_columns(rows))}): other work shared the machine, so timings and speedups are "
            "unreliable; rerun on a quiet machine")


def _emulated_half_warning(group: str, rows: pd.DataFrame) -> str | None:
    """One warning for a group measured in a half-precision dtype its CPU lacks instructions for (rows whose
    ``native_half_precision`` is False, as the runner records it; :func:`harness.results.emulated_half_note`),
    else None. Older rows without the column get no warning."""
    if "native_half_precision" not in rows:
        return None
    emulated = rows[rows["native_half_precision"].map(lambda v: v is False or v == "False")]
    if emulated.empty:
        return None
    return f"{group}: {emulated_half_note(emulated.iloc[0].to_dict())}"


# ------------------------------------------------------------------------------------------------ quality
def t_quantile(p: float, dof: int) -> float:
    """Quantile ``p`` (0.5 < p < 1) of Student's t distribution with ``dof`` degrees of freedom, by bisection
    on its CDF (Simpson's rule over the density; |error| < 1e-6 for the quantiles used here).

    Example: ``t_quantile(0.975, 2)`` is 4.303, ``t_quantile(0.975, 1)`` is 12.706.
    """
    if not 0.5 < p < 1 or dof < 1:
        raise ValueError(f"t_quantile needs 0.5 < p < 1 and dof >= 1, got p={p}, dof={dof}")
    c = math.exp(math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2)) / math.sqrt(dof * math.pi)

    def cdf(t: float) -> float:
        x = np.linspace(0.0, t, 4001)
        y = c * (1.0 + x * x / dof) ** (-(dof + 1) / 2)
        h = t / 4000
        return 0.5 + h / 3 * (y[0] + y[-1] + 4 * y[1:-1:2].sum() + 2 * y[2:-1:2].sum())

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        lo, hi = hi, hi * 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def seed_interval(g: pd.DataFrame, column: str, level: float = 0.95) -> dict[str, float]:
    """A quality column of one cell over sampling seeds: each seed's mean over its rows, then their mean,
    standard deviation and Student-t interval (``seeds - 1`` degrees of freedom).

    Args:
        g: the cell's ok rows, with ``column`` and ``sampling_seed``.

    Returns:
        ``{"mean", "low", "high", "seed_std", "seeds"}`` (for a column whose values all lie in [0, 1], such as
        pass@1, accuracy or ROUGE, the interval is clipped to [0, 1]); with fewer than two seeds the mean is over rows and the
        rest NaN (``seeds`` counts the distinct non-null seeds).
    """
    x = num(g[column])
    seeds = g["sampling_seed"].map(norm) if "sampling_seed" in g else pd.Series([None] * len(g), index=g.index)
    keep = x.notna() & seeds.notna()
    per_seed = x[keep].groupby(seeds[keep].astype(str), sort=False).mean()
    n = len(per_seed)
    if n < 2:
        return {"mean": float(x.mean()) if x.notna().any() else math.nan, "low": math.nan, "high": math.nan,
                "seed_std": math.nan, "seeds": n}
    mean, sd = float(per_seed.mean()), float(per_seed.std(ddof=1))
    half = t_quantile(1.0 - (1.0 - level) / 2.0, n - 1) * sd / math.sqrt(n)
    low, high = mean - half, mean + half
    if x[keep].between(0.0, 1.0).all():  # a rate or a ROUGE score: the interval stays inside [0, 1]
        low, high = max(low, 0.0), min(high, 1.0)
    return {"mean": mean, "low": low, "high": high, "seed_std": sd, "seeds": n}


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
        p = _params(r.get("decoder_params"))
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

    Every figure of a cell is computed over its *figure rows* (:mod:`harness.coverage`): its ``ok`` rows paired
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
        (:data:`harness.coverage.COVERAGE_COLUMNS`: group_samples, samples, paired_samples, unpaired, failed,
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
    quality = _find_quality(rows, quality)
    params = decoder_param_columns(rows)
    keys = ["group", *by, "label"]
    merged = paired_speedups(rows)
    figures = merged[merged["in_figures"]]
    paired = {k: g for k, g in figures.groupby(keys, sort=False, dropna=False)}
    unpaired = {k: g for k, g in merged[~merged["in_figures"]].groupby(keys, sort=False, dropna=False)}
    groups = coverage.group_coverage(rows, figures, keys[:-1])
    notes = {grp: [_load_warning(str(grp), _ok(g), load_margin), _emulated_half_warning(str(grp), g)]
             for grp, g in rows.groupby("group", sort=False)}
    out = []
    for key, all_g in rows.groupby(keys, sort=False, dropna=False):
        g = paired.get(key, merged.iloc[0:0])
        rec = _cell_identity(dict(zip(keys, key)), all_g, params)
        rec["group_samples"], group_warnings = groups[tuple(key[:-1])]
        cov, warnings = coverage.cell_coverage(all_g, g, unpaired.get(key))
        rec.update(cov)
        warnings = [*duplicates, *group_warnings, *warnings]
        rec["rows"] = len(g)
        rec["repeats"] = int(g["repeat"].nunique()) if len(g) else 0
        rec["seeds"] = int(g["sampling_seed"].map(norm).dropna().nunique()) if "sampling_seed" in g else 0
        if len(g):
            rec.update(_cell_stats(g, n_boot, level, seed, disagree_rel, warnings))
            rec.update(_cell_theory(g, rec, cost_ratio))
            rec.update(_cell_quality(g, rec, quality, level, warnings))
            rec["speedup_repeat_std"], rec["replicates"] = replicate_noise(g, "speedup")
            rec["tokens_per_s_repeat_std"], _ = replicate_noise(g, "tokens_per_s")
            rec["paired_across_processes"] = int(g["cross_process"].sum())
            if rec["paired_across_processes"]:
                warnings.append(f"{rec['label']} ({rec['group']}): {rec['paired_across_processes']} of {len(g)} "
                                "rows are paired with a vanilla row measured in another process (a resumed run; "
                                "column paired_across_processes): their speedups compare timings of two processes")
            rec["load_max"], rec["rows_over_load"], rec["usable_cores"] = load_stats(_ok(all_g), load_margin)
            load_note, half_note = notes[key[0]]
            warnings += [w for w in (load_note if rec["rows_over_load"] else None, half_note) if w]
        rec["warnings"] = warnings
        out.append(rec)
    return _int_params(_order(pd.DataFrame(out)), params)


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
    rec["decoder_params"] = first["decoder_params"]
    p = _params(first["decoder_params"])
    for k in params:
        rec[k] = norm(p.get(k))
    return rec


def _cell_theory(g: pd.DataFrame, rec: Mapping[str, Any], cost_ratio: float | None) -> dict[str, Any]:
    """Acceptance, per-step counts, equality, prefill and the theory columns of one cell's figure rows."""
    p = _params(rec["decoder_params"])
    drafted = num(g["num_drafted"]).sum() if "num_drafted" in g else 0.0
    decode_steps = (num(g["num_steps"]) - 1).clip(lower=0).sum()
    alpha = num(g["num_accepted"]).sum() / drafted if drafted else math.nan
    gamma = num(pd.Series([p.get("gamma")])).iloc[0]
    if pd.isna(gamma):
        gamma = drafted / decode_steps if drafted and decode_steps else math.nan
    chain = "gamma" in p or (num(g["draft_forwards"]).sum() > 0 if "draft_forwards" in g else False)
    c, c_src = cost_ratio_of(g, cost_ratio) if drafted and chain else (math.nan, "n/a (no chain draft)")
    out = {
        "acceptance_rate": alpha,
        "target_tokens_fed_per_step": num(g["target_tokens_fed_per_step"]).mean()
        if "target_tokens_fed_per_step" in g else math.nan,
        "draft_forwards_per_step": num(g["draft_forwards_per_step"]).mean()
        if "draft_forwards_per_step" in g else math.nan,
        **_equality(g),
        **_prefill(g),
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
    """The quality means of one cell's figure rows (over seeds: with a t-interval); a cell scored in part says
    so in ``warnings``."""
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
            out[q] = num(g[q]).mean()
    return out


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


def _prefill(g: pd.DataFrame) -> dict[str, float]:
    """Mean ``decode_tokens_per_s``, ``ttft_s`` and ``prefill_share`` (mean of ``ttft_s / wall_time_s``) of one
    cell's ok rows; NaN for columns the rows do not carry."""
    out = {"decode_tokens_per_s": num(g["decode_tokens_per_s"]).mean() if "decode_tokens_per_s" in g else math.nan,
           "ttft_s": math.nan, "prefill_share": math.nan}
    if "ttft_s" in g:
        ttft = num(g["ttft_s"])
        out["ttft_s"] = ttft.mean()
        with np.errstate(invalid="ignore", divide="ignore"):
            out["prefill_share"] = (ttft / num(g["wall_time_s"]).where(lambda w: w > 0)).mean()
    return out


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
        lo, hi, sd = _interval(d, level) if len(set(clusters)) > 1 else (math.nan, math.nan, math.nan)
        rec[f"{k}_low"], rec[f"{k}_high"], rec[f"{k}_std"] = lo, hi, sd
    with np.errstate(invalid="ignore", divide="ignore"):
        rec["tokens_per_s_total"] = float(np.nansum(new[fin]) / np.nansum(wall[fin])) if fin.any() else math.nan
    sp, spt = point["speedup"], point["speedup_total"]
    if paired.sum() >= 2 and np.isfinite(sp) and np.isfinite(spt) and spt > 0:
        lo, hi, _ = _interval(draws["speedup"] - draws["speedup_total"], level)
        if abs(sp - spt) > disagree_rel * spt and np.isfinite(lo) and (lo > 0 or hi < 0):
            warnings.append(f"estimators disagree for {g['label'].iloc[0]} ({g['group'].iloc[0]}): mean of per-sample "
                            f"speedups {sp:.2f} vs ratio of totals {spt:.2f} (difference {level:.0%} CI "
                            f"[{lo:.2f}, {hi:.2f}]); per-sample speedups vary with sample length or over time "
                            f"(load, order effects): report both")
    return rec


def run_warnings(agg: pd.DataFrame) -> list[str]:
    """The distinct warnings of an aggregate (machine load, once per group; cross-process pairs and
    disagreeing estimators, per cell), in table order: what ``summary.md``, ``report.md`` and the runner's
    log print."""
    return iter_warnings([agg])


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
    qual = [q for q in _find_quality(prepare(rows), quality_columns) if q in agg]
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
def to_markdown(df: pd.DataFrame, floatfmt: str = ".3f", columns: Sequence[str] | None = None,
                notes: Sequence[str] = ()) -> str:
    """Markdown table (numbers right-aligned; pandas' ``to_markdown`` needs tabulate, this does not).

    For a :func:`summarize` frame: the columns of :data:`SUMMARY_MD_COLUMNS` plus the quality means, a
    figure with an interval printed as one ``x [low, high]`` cell, ``equal_to_vanilla`` as ``n/a`` for
    sampled cells; columns that say nothing here are left out (the group when there is one, repeats and
    rows without repeats, seeds of greedy runs, prefill columns the rows do not record, cross-process
    pairs when there are none, load when not recorded). ``notes`` and ``attrs["warnings"]`` precede the
    table as a list.
    """
    warnings = list(dict.fromkeys([*notes, *df.attrs.get("warnings", [])]))
    if columns is None and "quality" in df.attrs:
        df, columns = _summary_md_frame(df)
    elif columns is None:
        columns = [c for c in df.columns if c != "warnings"]
    cells = [[_md_cell(v, floatfmt) for v in df[c]] for c in columns]
    numeric = [c != "label" and c != "group" and (pd.api.types.is_numeric_dtype(df[c])
                                                   or c in _md_interval_columns(df.attrs))
               and not pd.api.types.is_bool_dtype(df[c]) for c in columns]
    lines = ["| " + " | ".join(map(str, columns)) + " |",
             "|" + "|".join("---:" if n else "---" for n in numeric) + "|"]
    for i in range(len(df)):
        lines.append("| " + " | ".join(col[i] for col in cells) + " |")
    text = "\n".join(lines)
    if warnings:
        text = "Warnings:\n" + "\n".join(f"- {w}" for w in warnings) + "\n\n" + text
    return text


def _md_interval_columns(attrs: Mapping[str, Any]) -> list[str]:
    return list(attrs.get("_interval_columns", []))


def _summary_md_frame(summary: pd.DataFrame, floatfmt: str = ".3f") -> tuple[pd.DataFrame, list[str]]:
    """The frame and columns :func:`to_markdown` prints for a :func:`summarize` frame."""
    df = summary.copy()
    quality = list(summary.attrs.get("quality", []))

    def blank(c: str) -> bool:
        return c not in df or num(df[c]).isna().all()

    columns = [c for c in SUMMARY_MD_COLUMNS if c in df] + [q for q in quality if q in df]
    intervals: list[str] = []  # columns printed as text but aligned as numbers
    drop = {"group"} if "group" in df and df["group"].nunique() <= 1 else set()
    if "repeats" in df and (num(df["repeats"]).fillna(1) <= 1).all():
        drop.add("repeats")
    if {"rows", "samples"} <= set(df.columns) and (num(df["rows"]) == num(df["samples"])).all():
        drop.add("rows")
    if {"paired_samples", "samples"} <= set(df.columns) and (num(df["paired_samples"]) == num(df["samples"])).all():
        drop.add("paired_samples")
    if "unpaired" in df and (num(df["unpaired"]).fillna(0) == 0).all():
        drop.add("unpaired")
    if "failed" in df and "failed_statuses" in df:  # how many and why: "2 error, 1 prompt_too_long"
        df["failed"] = [s if isinstance(s, str) and s else _md_cell(n, "g") for n, s in
                        zip(df["failed"], df["failed_statuses"])]
        intervals.append("failed")
    if "seeds" in df and (num(df["seeds"]).fillna(0) <= 1).all():
        drop.add("seeds")
    if "paired_across_processes" in df and (num(df["paired_across_processes"]).fillna(0) == 0).all():
        drop.add("paired_across_processes")
    drop |= {c for c in ("decode_speedup", "ttft_s", "prefill_share", "load_max") if blank(c)}
    columns = [c for c in columns if c not in drop]
    for c in columns:
        if (c in MD_INTERVALS or c in quality) and f"{c}_low" in df and num(df[f"{c}_low"]).notna().any():
            df[c] = [_md_cell(v, floatfmt) + ("" if pd.isna(lo) else f" [{lo:{floatfmt}}, {hi:{floatfmt}}]")
                     for v, lo, hi in zip(df[c], num(df[f"{c}_low"]), num(df[f"{c}_high"]))]
            intervals.append(c)
    if "equal_to_vanilla" in df and "equality_check" in df:
        sampled = df["equality_check"].astype(str) == EQUALITY_SAMPLED
        df["equal_to_vanilla"] = [("n/a" if s else v) for s, v in zip(sampled, df["equal_to_vanilla"])]
        intervals.append("equal_to_vanilla")
    df.attrs["_interval_columns"] = intervals
    return df, columns


def _md_cell(v: Any, floatfmt: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, (float, np.floating)):
        return format(float(v), floatfmt)
    if isinstance(v, (list, tuple)):
        return ", ".join(map(str, v))
    return str(v).replace("|", "\\|").replace("\n", " ")


# ------------------------------------------------------------------------------------------------ comparison
def compare_runs(rows_a: pd.DataFrame, rows_b: pd.DataFrame, n_boot: int = 2000, level: float = 0.95,
                 seed: int = 0) -> pd.DataFrame:
    """Side-by-side comparison of two runs, per (task, model pair, decoder configuration).

    For tokens/s, speedup and accept length: the figure in A, in B, the ratio B / A and a bootstrap interval
    for the ratio. Each side's figures are over its figure rows (:mod:`harness.coverage`: ok rows paired with
    the same run's vanilla) on the samples *both* sides cover, and the bootstrap is paired by sample (one draw
    of samples serves both runs). ``samples_a`` / ``samples_b`` are the samples each side covers,
    ``common_samples`` those compared; ``note`` says when they differ, and what each side lost (failed or
    skipped cells, unpaired rows: ``failed_a``, ``unpaired_a``, ...). ``attrs["warnings"]``: duplicate cells
    collapsed on either side.

    Raises:
        ValueError: a side holds several run identities for one cell (compare one run with one run).
    """
    out = []
    sides: dict[str, dict] = {}
    counts: dict[str, dict] = {}
    warnings: list[str] = []
    for name, rows in (("A", rows_a), ("B", rows_b)):
        rows, dup = coverage.collapse_duplicates(prepare(rows))
        warnings += [f"run {name}: {w}" for w in dup]
        rows["label"] = config_labels(rows)
        rows["_cell"] = list(zip(rows["task"].astype(str), rows["model_pair"], rows["label"]))
        m = paired_speedups(rows)
        for cell, g in m.groupby("_cell", sort=False):
            if g["group"].nunique() > 1:
                raise ValueError(f"run {name} holds several run identities for {' | '.join(cell)}: "
                                 f"{sorted(g['group'].unique())}; compare one run identity per side")
        sides[name] = {c: g for c, g in m[m["in_figures"]].groupby("_cell", sort=False)}
        left = {c: g for c, g in m[~m["in_figures"]].groupby("_cell", sort=False)}
        counts[name] = {cell: {**coverage.cell_coverage(g, sides[name].get(cell, m.iloc[0:0]), left.get(cell))[0],
                               "decoder": g["decoder"].iloc[0]} for cell, g in rows.groupby("_cell", sort=False)}
        empty = m.iloc[0:0]
    for cell in dict.fromkeys([*counts["A"], *counts["B"]]):
        ga, gb = sides["A"].get(cell, empty), sides["B"].get(cell, empty)
        ca, cb = counts["A"].get(cell, {}), counts["B"].get(cell, {})
        rec: dict[str, Any] = {"task": cell[0], "model_pair": cell[1], "label": cell[2],
                               "decoder": (ca or cb)["decoder"],
                               **{f"{k}_{s}": c.get(k, 0) for s, c in (("a", ca), ("b", cb))
                                  for k in ("failed", "unpaired")}}
        ga, gb, info = coverage.on_common_samples(ga, gb)
        rec.update({k: v for k, v in info.items() if k != "coverage_note"})
        notes = [info["coverage_note"], coverage.side_note("A", ca), coverage.side_note("B", cb)]
        if not ca or not cb:
            notes = ["only in " + ("B" if not ca else "A")]
        elif not info["common_samples"]:
            notes.insert(0, "no sample measured on both sides")
        rec["note"] = "; ".join(n for n in notes if n)
        rec["paired"] = bool(info["common_samples"])
        if rec["paired"]:
            rec.update(_compare_cell(ga, gb, n_boot, level, seed))
        out.append(rec)
    cmp = pd.DataFrame(out)
    cmp.attrs["warnings"] = warnings
    return cmp


def _side_draws(g: pd.DataFrame, weights: np.ndarray) -> dict[str, np.ndarray]:
    x = {c: np.nan_to_num(num(g[c]).to_numpy(float)) for c in ("tokens_per_s", "speedup", "new_tokens", "num_steps")}
    fin = np.isfinite(num(g["speedup"]).to_numpy(float))
    wp = weights * fin
    with np.errstate(invalid="ignore", divide="ignore"):
        return {"tokens_per_s": (weights @ x["tokens_per_s"]) / weights.sum(axis=1),
                "speedup": (wp @ x["speedup"]) / wp.sum(axis=1),
                "accept_length": (weights @ x["new_tokens"]) / (weights @ x["num_steps"])}


def _compare_cell(ga: pd.DataFrame, gb: pd.DataFrame, n_boot: int, level: float, seed: int) -> dict[str, Any]:
    """Figures of both sides (on the same samples) and the paired bootstrap of their ratios."""
    rec: dict[str, Any] = {}
    pa = _side_draws(ga, np.ones((1, len(ga))))
    pb = _side_draws(gb, np.ones((1, len(gb))))
    # one draw of samples for both sides; within a drawn sample each side resamples its own observations
    samples = sorted(set(ga["sample_id"].astype(str)))
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(len(samples), np.full(len(samples), 1.0 / len(samples)), size=n_boot)
    wa, wb = (_weights_from_counts(g, samples, counts, rng) for g in (ga, gb))
    da, db = _side_draws(ga, wa), _side_draws(gb, wb)
    for k in ("tokens_per_s", "speedup", "accept_length"):
        a, b = float(pa[k][0]), float(pb[k][0])
        rec[f"{k}_a"], rec[f"{k}_b"] = a, b
        rec[f"{k}_ratio"] = b / a if a else math.nan
        with np.errstate(invalid="ignore", divide="ignore"):
            lo, hi, _ = _interval(db[k] / da[k], level)
        rec[f"{k}_ratio_low"], rec[f"{k}_ratio_high"] = lo, hi
    return rec


def _weights_from_counts(g: pd.DataFrame, samples: list[str], counts: np.ndarray,
                         rng: np.random.Generator) -> np.ndarray:
    sid = g["sample_id"].astype(str).to_numpy()
    w = np.zeros((counts.shape[0], len(g)))
    for j, s in enumerate(samples):
        idx = np.flatnonzero(sid == s)
        w[:, idx] = rng.multinomial(counts[:, j] * len(idx), np.full(len(idx), 1.0 / len(idx)))
    return w


# ------------------------------------------------------------------------------------------------ figures' frames
def acceptance_per_position(rows: pd.DataFrame) -> pd.DataFrame:
    """Acceptance by draft position, from the per-step ``accepted_per_step`` / ``drafted_per_step`` lists.

    For position ``i`` (0-based) over all decode steps of a configuration: ``drafted`` = steps that drafted
    more than ``i`` tokens, ``accepted`` = steps that accepted more than ``i`` tokens; ``rate`` =
    accepted / drafted (vLLM's per-position acceptance), ``conditional`` = P(position i accepted | positions
    < i accepted and position i drafted), which is constant (= alpha) under the i.i.d. model of Leviathan et
    al. 2023.

    Example: steps (accepted, drafted) = (2, 4), (0, 4), (4, 4) give at position 0 rate 2/3, at position 2
    rate 1/3 (only the third step got past position 1) and conditional 1/2 at position 2.

    Returns:
        Columns ``group, label, position, drafted, accepted, rate, conditional``.
    """
    cols = ["group", "label", "position", "drafted", "accepted", "rate", "conditional"]
    out = []
    ok = figure_rows(rows)
    if "accepted_per_step" not in ok or "drafted_per_step" not in ok:
        return pd.DataFrame(columns=cols)
    if "group" not in ok:
        ok = ok.assign(group="")
    for (grp, lab), g in ok.groupby(["group", "label"], sort=False):
        acc, dr = [], []
        for a, d in zip(g["accepted_per_step"], g["drafted_per_step"]):
            if isinstance(a, (list, tuple, np.ndarray)) and isinstance(d, (list, tuple, np.ndarray)):
                acc.extend(a)
                dr.extend(d)
        if not dr or max(dr) == 0:
            continue
        acc_a, dr_a = np.asarray(acc), np.asarray(dr)
        for i in range(int(dr_a.max())):
            drafted = int((dr_a > i).sum())
            accepted = int((acc_a > i).sum())
            reached = int(((dr_a > i) & (acc_a >= i)).sum())
            out.append({"group": grp, "label": lab, "position": i, "drafted": drafted, "accepted": accepted,
                        "rate": accepted / drafted if drafted else math.nan,
                        "conditional": accepted / reached if reached else math.nan})
    return pd.DataFrame(out, columns=cols)


def time_breakdown(rows: pd.DataFrame) -> pd.DataFrame:
    """Milliseconds per generated token by phase, per (group, configuration): ``prefill_ms`` (to the first new
    token, ``ttft_s``), ``draft_ms`` / ``verify_ms`` (the per-phase timers ``draft_time_s`` /
    ``verify_time_s`` of decoders that lap them; a prefill lapped as ``verify``, as Ouroboros does, is taken
    out of ``verify_ms``: it is in ``prefill_ms``), ``decode_ms`` (the rest of the decode when the phases are
    not split) and ``other_ms`` (the rest of a split decode: host work, bookkeeping). Rows need ``ttft_s`` or
    both timers; empty when none has them.

    Example: a row of 10 new tokens, 1.0 s wall, ttft 0.2 s, no timers -> prefill 20 ms, decode 80 ms per
    token; with draft 0.3 s and verify 0.6 s (prefill included) -> prefill 20, draft 30, verify 40, other 10.
    """
    cols = ["group", "label", "prefill_ms", "draft_ms", "verify_ms", "decode_ms", "other_ms"]
    ok = figure_rows(rows)
    timers = {"draft_time_s", "verify_time_s"} <= set(ok.columns)
    if not timers and "ttft_s" not in ok:
        return pd.DataFrame(columns=cols)
    ok = ok.assign(
        _ttft=num(ok["ttft_s"]) if "ttft_s" in ok else math.nan,
        _draft=num(ok["draft_time_s"]) if timers else math.nan,
        _verify=num(ok["verify_time_s"]) if timers else math.nan)
    split = ok["_draft"].notna() & ok["_verify"].notna()
    ok = ok[split | ok["_ttft"].notna()]
    if ok.empty:
        return pd.DataFrame(columns=cols)
    if "group" not in ok:
        ok = ok.assign(group="")
    ttft = ok["_ttft"].fillna(0.0)
    wall = num(ok["wall_time_s"])
    ok = ok.assign(
        _prefill=ttft,
        _draft=ok["_draft"].where(split, 0.0),
        _verify=(ok["_verify"] - ttft).clip(lower=0).where(split, 0.0),
        _decode=(wall - ttft).clip(lower=0).where(~split, 0.0))
    ok = ok.assign(_other=(wall - ok["_prefill"] - ok["_draft"] - ok["_verify"]).clip(lower=0).where(split, 0.0))
    per = ok.groupby(["group", "label"], sort=False)[["_prefill", "_draft", "_verify", "_decode", "_other",
                                                      "new_tokens"]].sum()
    ms = 1000.0 / num(per["new_tokens"])
    out = pd.DataFrame({"prefill_ms": per["_prefill"] * ms, "draft_ms": per["_draft"] * ms,
                        "verify_ms": per["_verify"] * ms, "decode_ms": per["_decode"] * ms,
                        "other_ms": per["_other"] * ms})
    return out.reset_index()[cols]


def scope_free_names(rows: pd.DataFrame) -> dict[str, str]:
    """decoder name -> one name per configuration that ignores ``pool_scope`` (to pair cold and warm runs of
    one configuration): decoders whose hyper-parameters differ only in ``pool_scope`` share a name, that of
    the cold one (else the name without ``_warm``)."""

    def key(row: Mapping[str, Any]) -> str:
        params = _params(row.get("decoder_params"))
        params.pop("pool_scope", None)
        return json.dumps(params, sort_keys=True) if params else str(row["decoder"])

    first = rows.drop_duplicates("decoder")
    keys = {str(r["decoder"]): key(r) for r in first.to_dict("records")}
    scopes = dict(zip(first["decoder"].astype(str), first["pool_scope"] if "pool_scope" in first else
                      [None] * len(first)))
    names: dict[str, str] = {}
    for k in dict.fromkeys(keys.values()):
        members = [d for d, kk in keys.items() if kk == k]
        cold = [d for d in members if scopes.get(d) == "sample"]
        base = (cold or members)[0]
        names.update({d: re.sub(r"_warm$", "", base) for d in members})
    return names


def warm_cold(rows: pd.DataFrame, **kwargs: Any) -> pd.DataFrame:
    """Aggregate for the warm-vs-cold figure: one row per (group, configuration, scope), ``config`` = the
    scope-free configuration name, ``label`` = ``cold`` / ``warm``. Empty when rows have no ``pool_scope``.
    Keyword arguments go to :func:`aggregate`."""
    if "pool_scope" not in rows or rows["pool_scope"].dropna().empty:
        return pd.DataFrame()
    rows = prepare(rows)
    scoped = rows["pool_scope"].notna() & (rows["decoder"] != "vanilla")
    # one aggregate per (decoder, scope); vanilla rows stay in for the pairing
    rows.loc[scoped, "label"] = rows.loc[scoped, "decoder"].astype(str) + " | " + \
        rows.loc[scoped, "pool_scope"].astype(str)
    agg = aggregate(rows, **kwargs)
    agg = agg[agg["label"].astype(str).str.contains(" | ", regex=False)].copy()
    scope = agg["label"].str.split(" | ", regex=False).str[-1]
    agg["config"] = agg["decoder"].map(scope_free_names(rows))
    agg["label"] = scope.map({"sample": "cold", "task": "warm"}).fillna(scope)
    return agg.sort_values("label", kind="stable").reset_index(drop=True)


def category_column(rows: pd.DataFrame) -> str | None:
    """The column per-category tables split by: ``subtask`` (Spec-Bench's six) when rows carry it, else
    ``category`` (MT-Bench's eight); None when neither varies."""
    for c in ("subtask", "category"):
        if c in rows and rows[c].dropna().nunique() >= 1 and rows[c].notna().any():
            return c
    return None


def counters(g: pd.DataFrame) -> dict[str, Any]:
    """Deterministic counters of one cell's ok rows, one observation per (sample, turn) -- per (sample, turn,
    seed, repeat) for sampled rows, whose repeats and seeds draw different tokens (each draw is deterministic
    given its ``sample_seed``): totals of :data:`COUNTER_COLUMNS`, a digest of the per-observation values, and
    whether repeats of one greedy sample disagree.

    Returns:
        ``{"totals": {col: int}, "digest": str, "inconsistent_samples": [sample ids]}``.
    """
    g = _ok(g)
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


def iter_warnings(frames: Iterable[pd.DataFrame]) -> list[str]:
    """Distinct warnings of aggregates (their ``warnings`` lists), in order."""
    seen: dict[str, None] = {}
    for f in frames:
        if "warnings" in f:
            for ws in f["warnings"]:
                seen.update(dict.fromkeys(ws if isinstance(ws, list) else []))
    return list(seen)
