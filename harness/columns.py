"""The rows schema: every column of a result row (``results.jsonl``) and of a summary row (``summary.csv``),
declared once with its type, unit, the stage that fills it and its meaning.

The runner, resume, the aggregation (:mod:`harness.metrics`), the regression gate, the report and the
Spec-Bench import read their column lists from here (the named groups at the end). Adding a metric: declare
it here (one :class:`Column`, with ``summary_md=True`` to print it in ``summary.md``) and compute it in its
producer; the summary, its CSV and its legend pick it up. A decoder's hyper-parameters (one column each, plus
``decoder_params``) and a task's quality columns (named per row in ``quality_columns``) are open-ended and not
listed; the statistics a decoder adds to its rows (``DecodeResult.extra``) are.

Stages: ``runner`` (identity and bookkeeping, :mod:`harness.runner`), ``environment`` (machine and code,
:mod:`harness.results`), ``decoder`` (its :meth:`decoders.types.DecodeResult.summary` counters), ``stopwatch``
(timings, :mod:`harness.timing`), ``task`` (scores), ``summary`` (computed by :mod:`harness.metrics`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class Column:
    """One column.

    Attributes:
        name: the column name.
        type: ``str``, ``int``, ``float``, ``bool`` or ``list`` (a JSON list in the rows).
        stage: who fills it (see the module docstring).
        meaning: one sentence, with the unit where there is one.
        summary_md: printed in ``summary.md`` (summary columns; the CSV has them all).
    """

    name: str
    type: str
    stage: str
    meaning: str
    summary_md: bool = False


def _cols(stage: str, *specs: tuple[str, str, str]) -> tuple[Column, ...]:
    return tuple(Column(name, type_, stage, meaning) for name, type_, meaning in specs)


ROW_COLUMNS: tuple[Column, ...] = (
    *_cols(
        "runner",
        ("run_id", "str", "one run (a process writing a folder; shards and resumed processes share it)"),
        ("attempt_id", "str", "one process of a run (a resumed run has several)"),
        ("run_identity", "str", "hash of everything that makes the run what it is (config, data, code, machine)"),
        ("group_identity", "str", "run_identity without the decoder list and runner.seed: rows of one setting"),
        ("shard", "str", "the shard spec (i/n) of a sharded run, else null"),
        ("model", "str", "the model pair's config name"),
        ("target_model", "str", "the target model's name"),
        ("draft_model", "str", "the draft model's name (null without a draft)"),
        ("task", "str", "task name"),
        ("task_version", "str", "the task's prompt/scoring version"),
        ("sample_id", "str", "the sample's id in its dataset (HumanEval/20)"),
        ("sample_index", "int", "position of the sample in the run's selection"),
        ("turn", "int", "turn of a multi-turn conversation (0 otherwise)"),
        ("repeat", "int", "repeat index of the measurement"),
        ("order_position", "int", "position of the decoder in this sample's rotated order"),
        ("category", "str", "the sample's category, where the task has them"),
        ("subtask", "str", "the sample's subtask, where the task has them"),
        ("decoder", "str", "the decoder configuration's name"),
        ("decoder_params", "str", "JSON of the decoder configuration's hyper-parameters"),
        ("decoder_class", "str", "the decoder's class (LookaheadDecoder): configurations of one algorithm"),
        ("draft_shape", "str", "what a step verifies: none, chain, dynamic chain, tree, phrases, n-grams, copy"),
        ("max_new_tokens", "int", "generation budget (new tokens)"),
        ("temperature", "float", "sampling temperature (0 = greedy)"),
        ("top_p", "float", "nucleus sampling threshold (1 = off)"),
        ("top_k", "int", "top-k sampling (0 = off)"),
        ("sampling_seed", "int", "runner.seed of a sampled run (null when greedy)"),
        ("sample_seed", "int", "the seed of this sample's generator (null when greedy)"),
        ("prompt_tokens", "int", "tokens of the prompt"),
        ("prompt_matches_vanilla", "bool", "a later turn's prompt equals vanilla's (its history is the same)"),
        ("quality_columns", "list", "the task's quality (score) columns"),
        ("cpu_count", "int", "cores present"),
        ("cpu_affinity", "int", "cores the process may use"),
        ("source", "str", "where imported rows came from (spec_bench_import); absent for the runner's rows"),
        ("status", "str", "ok, error or a skip (prompt_too_long, empty_prompt, ...)"),
        ("reason", "str", "why a row is not ok"),
        ("wall_time_s", "float", "seconds of the whole generate call (device synchronized)"),
        ("tokens_per_s", "float", "new_tokens / wall_time_s"),
        ("matches_vanilla", "bool", "the tokens equal vanilla's on this sample, turn and repeat (greedy only)"),
        ("equality_check", "str", "exact (greedy rows compared with vanilla) or n/a (sampled)"),
        ("first_divergence", "int", "index of the first token that differs from vanilla's"),
        ("paired_across_processes", "bool", "paired with a vanilla row of another process (a resumed run)"),
        ("load_1m_before", "float", "1-minute load average before the timed call"),
        ("load_1m_after", "float", "1-minute load average after the timed call"),
        ("completion", "str", "the decoded new text"),
        ("token_ids", "list", "the new token ids"),
    ),
    *_cols(
        "environment",
        ("dtype", "str", "the models' resolved dtype (bfloat16, float32)"),
        ("device", "str", "torch device"),
        ("device_name", "str", "the machine: CPU model, cores and ISA, or the GPU"),
        ("cpu_model", "str", "CPU model name"),
        ("cpu_isa", "str", "vector extensions that decide bf16 speed (avx512_bf16, amx)"),
        ("native_half_precision", "bool", "the device computes bf16 natively (not emulated)"),
        ("git_commit", "str", "the code's commit"),
        ("git_dirty", "bool", "tracked files differed from the commit"),
        ("git_diff_sha256", "str", "sha256 of the uncommitted diff"),
    ),
    *_cols(
        "decoder",
        ("new_tokens", "int", "tokens generated"),
        ("num_steps", "int", "target forwards (prefill included)"),
        ("accept_length", "float", "new_tokens / num_steps (tau)"),
        ("num_drafted", "int", "draft tokens proposed for verification"),
        ("num_accepted", "int", "draft tokens accepted"),
        ("acceptance_rate", "float", "num_accepted / num_drafted (alpha)"),
        ("draft_forwards", "int", "draft model forwards"),
        ("draft_forwards_per_step", "float", "draft forwards per decode step"),
        ("target_tokens_fed_per_step", "float", "tokens fed to the target per decode step"),
        ("accepted_per_step", "list", "accepted draft tokens per decode step"),
        ("drafted_per_step", "list", "drafted tokens per decode step"),
    ),
    # a decoder's own statistics (DecodeResult.extra); its hyper-parameters are columns too, not listed here
    *_cols(
        "decoder",
        ("pool_hit_rate", "float", "lookahead: share of steps whose guesses came from the n-gram pool"),
        ("guess_tokens_fed", "int", "lookahead: n-gram guess tokens fed for verification"),
        ("pool_entries", "int", "lookahead, Ouroboros: n-grams in the pool at the end of the sample"),
        ("lookup_hit_rate", "float", "prompt lookup: share of steps that found a match in the context"),
        ("tree_depth_per_step", "float", "OPT-Tree: mean depth of the verified tree"),
        ("tree_nodes_per_step", "float", "OPT-Tree: mean nodes of the verified tree"),
        ("cost_points", "str", "OPT-Tree cost-aware: the measured forward costs, k:target_ms/draft_ms"),
        ("copy_step_rate", "float", "OPT-Tree hybrid: share of steps that used a context copy"),
        ("draft_forwards_per_target_forward", "float", "Ouroboros: draft forwards per decode step"),
        ("draft_tokens_per_draft_forward", "float", "Ouroboros: draft tokens per lookahead forward"),
        ("draft_tokens_fed_per_forward", "float", "Ouroboros: tokens fed per draft lookahead forward"),
        ("target_tokens_fed_per_forward", "float", "Ouroboros: tokens fed per target forward"),
        ("draft_pool_hit_rate", "float", "Ouroboros: share of draft forwards whose guesses hit the pool"),
        ("suffix_offer_rate", "float", "Ouroboros: share of steps that offered a pool suffix"),
        ("suffix_hit_rate", "float", "Ouroboros: share of offered suffixes with an accepted token"),
        ("suffix_tokens_fed", "int", "Ouroboros: suffix tokens fed for verification"),
        ("suffix_tokens_accepted", "int", "Ouroboros: suffix tokens accepted"),
        ("free_steps", "int", "Ouroboros free drafts: steps drafted by copying, no draft forward"),
        ("free_tokens_drafted", "int", "Ouroboros free drafts: tokens copied"),
        ("free_tokens_accepted", "int", "Ouroboros free drafts: copied tokens accepted"),
        ("branch_tokens_fed", "int", "Ouroboros branches: runner-up tokens fed"),
        ("branch_tokens_accepted", "int", "Ouroboros branches: runner-up tokens accepted"),
    ),
    *_cols(
        "stopwatch",
        ("ttft_s", "float", "seconds to the first new token, as a user sees it"),
        ("tpot_s", "float", "seconds per output token after the first: (wall - ttft) / (new_tokens - 1)"),
        ("draft_prefill_s", "float", "seconds of the draft model's prompt prefill (its first forward)"),
        ("prefill_s", "float", "seconds on the prefill side: to the first token plus a draft prefill run after it"),
        ("first_tokens", "int", "new tokens known at the first token (assisted generation emits several)"),
        ("decode_tokens_per_s", "float", "(new_tokens - first_tokens) / (wall - prefill_s): after both prefills"),
        ("draft_time_s", "float", "seconds lapped as drafting (decoders that split their time)"),
        ("verify_time_s", "float", "seconds lapped as verification (target prefill included)"),
        ("peak_memory_mb", "float", "MiB: CUDA max allocated during the call, else the process's peak RSS"),
    ),
    *_cols("task", ("score_error", "str", "why scoring this row failed")),
)

SUMMARY_COLUMNS_DECLARED: tuple[Column, ...] = tuple(
    Column(name, type_, "summary", meaning, md) for name, type_, meaning, md in (
        ("group_samples", "int", "distinct samples of the group (any decoder, any status)", False),
        ("samples", "int", "distinct samples measured (ok rows)", True),
        ("paired_samples", "int", "samples every figure of the row is computed over (paired with vanilla)", True),
        ("unpaired", "int", "ok rows left out for want of a vanilla pair", True),
        ("failed", "int", "cells without a measurement (errors, skips)", True),
        ("failed_statuses", "str", "failed cells by status", False),
        ("rows", "int", "figure rows (samples x turns x repeats x runs)", True),
        ("repeats", "int", "distinct repeats", True),
        ("seeds", "int", "distinct sampling seeds (0 when greedy)", True),
        ("replicates", "int", "measurements per sample (the fewest over samples)", False),
        ("tokens_per_s", "float", "mean tokens/s over rows", True),
        ("tokens_per_s_low", "float", "its interval's lower bound", False),
        ("tokens_per_s_high", "float", "its interval's upper bound", False),
        ("tokens_per_s_total", "float", "total new tokens / total seconds", False),
        ("speedup", "float", "mean over samples of tokens/s(decoder) / tokens/s(vanilla), paired in one run",
         True),
        ("speedup_low", "float", "its interval's lower bound", False),
        ("speedup_high", "float", "its interval's upper bound", False),
        ("speedup_total", "float", "ratio of totals: vanilla s/token / decoder s/token over the same rows", True),
        ("speedup_total_low", "float", "its interval's lower bound", False),
        ("speedup_total_high", "float", "its interval's upper bound", False),
        ("decode_tokens_per_s", "float", "mean decode-only tokens/s (after both prefills)", False),
        ("decode_speedup", "float", "the paired mean of decode-only tokens/s ratios", True),
        ("decode_speedup_low", "float", "its interval's lower bound", False),
        ("decode_speedup_high", "float", "its interval's upper bound", False),
        ("ttft_s", "float", "mean seconds to the first new token", True),
        ("ttft_s_p50", "float", "median ttft_s over rows", False),
        ("ttft_s_p90", "float", "90th percentile of ttft_s over rows", False),
        ("ttft_s_p99", "float", "99th percentile of ttft_s over rows", False),
        ("tpot_s", "float", "mean seconds per output token after the first", True),
        ("tpot_s_p50", "float", "median tpot_s over rows", False),
        ("tpot_s_p90", "float", "90th percentile of tpot_s over rows", False),
        ("tpot_s_p99", "float", "99th percentile of tpot_s over rows", False),
        ("prefill_share", "float", "mean prefill_s / wall_time_s (both prefills)", True),
        ("peak_memory_mb", "float", "largest peak_memory_mb of the rows (MiB)", False),
        ("accept_length", "float", "new tokens / target forwards (prefill included; vanilla = 1)", True),
        ("accept_length_low", "float", "its interval's lower bound", False),
        ("accept_length_high", "float", "its interval's upper bound", False),
        ("acceptance_rate", "float", "accepted / drafted tokens", True),
        ("target_tokens_fed_per_step", "float", "mean tokens fed to the target per decode step", True),
        ("draft_forwards_per_step", "float", "mean draft forwards per decode step", True),
        ("equality_check", "str", "exact, or n/a (sampled)", False),
        ("equal_to_vanilla", "float", "share of greedy rows equal to vanilla", True),
        ("paired_across_processes", "int", "rows paired with vanilla measured in another process", True),
        ("speedup_repeat_std", "float", "standard deviation of speedup over replicates", False),
        ("tokens_per_s_repeat_std", "float", "standard deviation of tokens/s over replicates", False),
        ("load_max", "float", "largest 1-minute load average of the rows", True),
        ("rows_over_load", "int", "rows measured on a loaded machine", False),
        ("usable_cores", "int", "cores the run could use", False),
        ("warnings", "str", "what a reader must know about this row's numbers", False),
    ))

ROW = {c.name: c for c in ROW_COLUMNS}
SUMMARY = {c.name: c for c in SUMMARY_COLUMNS_DECLARED}

# ------------------------------------------------------------------------------------------------ groups
#: The sampling settings, and what rows written before they existed mean (greedy decoding).
SAMPLING = ("temperature", "top_p", "top_k")
SAMPLING_DEFAULTS = {"temperature": 0.0, "top_p": 1.0, "top_k": 0}
#: Row columns that make a group (one setting): rows that differ in any of them are never pooled.
RUN_IDENTITY_FIELDS = ("task", "task_version", "model", "target_model", "draft_model", "dtype", "device_name",
                       "git_commit", "git_dirty", "max_new_tokens", *SAMPLING, "group_identity", "source")
#: Identity columns of a summary row.
SUMMARY_ID_COLUMNS = ["task", "task_version", "model", "target_model", "draft_model", "dtype", "device_name",
                      "git_commit", "max_new_tokens", *SAMPLING, "run_identity", "group", "label", "decoder",
                      "decoder_params", "settings", "draft_shape"]
#: The numbers of a summary row (summary.csv), in order; ``summary.md`` prints those marked ``summary_md``.
SUMMARY_COLUMNS = [c.name for c in SUMMARY_COLUMNS_DECLARED]
SUMMARY_MD_COLUMNS = ["group", "label", *[c.name for c in SUMMARY_COLUMNS_DECLARED if c.summary_md]]
#: Columns every ok row carries (the runner writes them all); only tokens_per_s may be null.
REQUIRED_OK_COLUMNS = ("decoder", "sample_id", "new_tokens", "num_steps", "wall_time_s", "tokens_per_s")
NULLABLE_OK_COLUMNS = ("tokens_per_s",)
#: Counters that are deterministic for a given code, model, data, seeds and float32 (the gate checks them).
COUNTER_COLUMNS = ("new_tokens", "num_steps", "draft_forwards", "num_drafted", "num_accepted")
#: Load columns (1-minute load average around the timed call), the names older rows used, and the cores.
LOAD_COLUMNS = ("load_1m_before", "load_1m_after")
LEGACY_LOAD_COLUMNS = ("load_avg_1m_before", "load_avg_1m_after")
CORE_COLUMNS = ("cpu_affinity", "cpu_count")
#: Keys pairing a decoder's row with vanilla's (same run, sample, turn and repeat).
PAIR_KEYS = ("run_id", "task", "sample_id", "turn", "repeat")
#: ``equality_check`` of a sampled row (the runner's value), and what a cell of greedy rows says.
EQUALITY_SAMPLED = "n/a (sampled)"
EQUALITY_EXACT = "exact"
#: Percentiles of ttft_s and tpot_s over a cell's rows in the summary (as serving benchmarks report).
LATENCY_PERCENTILES = (50, 90, 99)


def legend(names: list[str] | tuple[str, ...]) -> str:
    """``name = meaning`` for each declared summary column of ``names`` (interval bounds left out), joined
    with ``; ``: the legend under a summary table."""
    return "; ".join(f"{n} = {SUMMARY[n].meaning}" for n in names
                     if n in SUMMARY and not n.endswith(("_low", "_high")))


# ------------------------------------------------------------------------------------------------ values
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
