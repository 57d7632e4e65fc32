"""The rows schema: every column of a result row (``results.jsonl``) and of a summary row (``summary.csv``),
declared once with its type, unit, the stage that fills it and its meaning.

The runner, resume, the aggregation (:mod:`harness.rows.metrics`), the regression gate, the report and the
Spec-Bench import read their column lists from here (the named groups at the end). Adding a metric: declare
it here (one :class:`Column`: ``summary_md=True`` prints it in ``summary.md``; ``report="main"`` shows it in the
report's main table under its ``display`` name, in its ``fmt``) and compute it in its producer; the summary, its
CSV, its legend and the report's tables pick it up. A decoder's hyper-parameters (one column each, plus
``decoder_params``) and a task's quality columns (named per row in ``quality_columns``) are open-ended and not
listed; the statistics a decoder adds to its rows (``DecodeResult.extra``) are declared next to the decoders
(:mod:`decoders.columns`) and gathered here.

Stages: ``runner`` (identity and bookkeeping, :mod:`harness.job.runner`), ``environment`` (machine and code,
:mod:`harness.rows.results`), ``decoder`` (its :meth:`decoders.types.DecodeResult.summary` counters), ``stopwatch``
(timings, :mod:`harness.job.timing`), ``task`` (scores), ``summary`` (computed by :mod:`harness.rows.metrics`).

After the declarations: the named column groups, the lookups filled from the declarations (:func:`gather`) and
the check of a result row against the schema (:func:`row_problem`). A value's canonical form and text
(:func:`num`, :func:`norm`, :func:`format_value`) live in :mod:`harness.rows.values`, importable from here too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from decoders.columns import statistics as decoder_statistics
# the value helpers every reader of the schema uses, kept importable from here (columns.num, columns.format_value)
from harness.rows.values import fmt_value, format_value, norm, num, num_value  # noqa: F401


@dataclass(frozen=True)
class Column:
    """One column.

    Attributes:
        name: the column name.
        type: ``str``, ``int``, ``float``, ``bool`` or ``list`` (a JSON list in the rows).
        stage: who fills it (see the module docstring).
        meaning: one sentence, with the unit where there is one.
        summary_md: printed in ``summary.md`` (summary columns; the CSV has them all).
        display: its header in the report's tables (``""``: the name).
        fmt: the format spec of its value in the report's tables (``".2f"``, ``".0%"``).
        scale: the factor its value is shown multiplied by (seconds shown as milliseconds: 1000).
        interval: shown with its ``[low, high]`` interval (``<name>_low`` / ``<name>_high``).
        report: its place in the report's main table: ``"main"`` (always shown), ``"prefill"`` (shown when the
            rows record the runner's stopwatch), ``"recorded"`` (shown then where a row has a value) or ``""``
            (not shown); columns appear in declaration order.
        page: kept in the LaTeX main table (False: main.md and main.csv only, so the table fits a page).
        compare: one of the figures ``--compare`` sets side by side (:mod:`harness.report.compare`: each run's
            value, the ratio B / A and its interval, headed by the display name), in declaration order; the
            comparison computes it from each side's rows on the samples both cover.
    """

    name: str
    type: str
    stage: str
    meaning: str
    summary_md: bool = False
    display: str = ""
    fmt: str = ".2f"
    scale: float = 1.0
    interval: bool = False
    report: str = ""
    page: bool = True
    compare: bool = False

    @property
    def header(self) -> str:
        """Its header in the report's tables: the display name, ``[95% CI]`` after one shown with its
        interval."""
        return (self.display or self.name) + (" [95% CI]" if self.interval else "")

    def cell(self, value: Any) -> str:
        """``value`` as a cell of the report's tables (:func:`format_value` with :attr:`fmt`, times
        :attr:`scale`; ``-`` when missing)."""
        if self.scale != 1.0 and value is not None and not pd.isna(value):
            value = value * self.scale
        return format_value(value, self.fmt, missing="-")


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
        ("batch_size", "int", "runner.batch_size: requests decoded together (1: one at a time; absent in older rows)"),
        ("batch_index", "int", "the static batch of the run this request was decoded in (batch size > 1)"),
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
        ("draft_tokens_fed", "int", "tokens fed to the draft model over its forwards (its prompt prefill included)"),
        ("draft_forwards_per_step", "float", "draft forwards per decode step"),
        ("target_tokens_fed_per_step", "float", "tokens fed to the target per decode step"),
        ("accepted_per_step", "list", "accepted draft tokens per decode step"),
        ("drafted_per_step", "list", "drafted tokens per decode step"),
    ),
    # a decoder's own statistics (DecodeResult.extra), declared next to the decoders; its hyper-parameters are
    # columns too, not listed here
    *(Column(s.name, s.type, "decoder", s.meaning) for s in decoder_statistics()),
    *_cols(
        "stopwatch",
        ("ttft_s", "float", "seconds to the first new token, as a user sees it"),
        ("latency_s", "float", "seconds from the call's start to this request's last token (a batch's requests "
                               "end at different times)"),
        ("batch_rows", "int", "requests in this row's batch (the last batch of a run may hold fewer)"),
        ("batch_tokens_per_s", "float", "the batch's throughput: new tokens of all its requests / wall_time_s"),
        ("batch_cost_curve", "str", "the target's bare forward of batch_size rows x k tokens, in multiples of one "
                                    "token at batch size 1 (k:ratio,...), timed once per job before its batches"),
        ("bare_token_s", "float", "seconds of the target's bare one-token forward after the job's first prompt, timed "
                                  "once per job after the warm-up: the unit of the two cost curves"),
        ("target_cost_curve", "str", "the target's bare forward of k tokens after that prompt, in bare_token_s "
                                     "units (k:ratio,...)"),
        ("draft_cost_curve", "str", "the draft model's bare forward of k tokens after that prompt, in bare_token_s "
                                    "units (k:ratio,...); empty when no decoder of the job drafts with it"),
        ("tpot_s", "float", "seconds per output token after the first: (wall - ttft) / (new_tokens - 1)"),
        ("draft_prefill_s", "float", "seconds of the draft model's prompt prefill (its first forward)"),
        ("prefill_s", "float", "seconds on the prefill side: to the first token plus a draft prefill run after it"),
        ("first_tokens", "int", "new tokens known at the first token (assisted generation emits several)"),
        ("decode_tokens_per_s", "float", "(new_tokens - first_tokens) / (wall - prefill_s): after both prefills"),
        ("draft_time_s", "float", "seconds lapped as drafting (decoders that split their time)"),
        ("verify_time_s", "float", "seconds lapped as verification (target prefill included)"),
        ("peak_memory_mb", "float", "MiB: CUDA max allocated during the call, else the process's peak RSS"),
        ("cpu_time_s", "float", "CPU seconds the process used during the timed call (all threads)"),
        ("run_delay_s", "float", "seconds the process's threads waited for a CPU during the timed call (Linux "
                                 "schedstat); / wall_time_s = the contention the call met"),
    ),
    *_cols("task", ("score_error", "str", "why scoring this row failed"),
           ("code_isolation", "str", "how the row's model-written code ran: namespaces:root or namespaces:userns "
                                     "(OS isolation, tasks/sandbox.py) or none (the Python guard only)")),
)

#: What summary.md and the report say for each ``code_isolation`` value (the sandbox: tasks/sandbox.py).
CODE_ISOLATION_TEXT = {
    "namespaces:root": "OS isolation (root): PID, network, IPC, UTS and mount namespaces; uid/gid 65534, no "
                       "capabilities, no_new_privs; read-only filesystem, a size-capped tmpfs as the only writable "
                       "folder",
    "namespaces:userns": "OS isolation (userns): PID, network, IPC, UTS and mount namespaces; a user namespace's root "
                         "with no capabilities, no_new_privs; read-only filesystem, a size-capped tmpfs as the only "
                         "writable folder",
    "none": "code executed without OS isolation (the Python guard only)",
}


def code_isolation_text(value: str | None) -> str:
    """The sentence for a row's ``code_isolation`` value (``None`` or unknown: the value itself, or no isolation)."""
    return CODE_ISOLATION_TEXT.get("none" if value is None else str(value), str(value))


SUMMARY_COLUMNS_DECLARED: tuple[Column, ...] = tuple(
    Column(name, type_, "summary", meaning, md, **(shown[0] if shown else {}))
    for name, type_, meaning, md, *shown in (
        ("group_samples", "int", "distinct samples of the group (any decoder, any status)", False),
        ("samples", "int", "distinct samples measured (ok rows)", True),
        ("paired_samples", "int", "samples every figure of the row is computed over (paired with vanilla)", True),
        ("group_cells", "int", "distinct (sample, turn) cells of the group (any decoder, any status)", False),
        ("cells", "int", "distinct (sample, turn) cells measured (ok rows)", False),
        ("paired_cells", "int", "(sample, turn) cells every figure of the row is computed over", False),
        ("unpaired", "int", "ok rows left out for want of a vanilla pair", True),
        ("failed", "int", "cells without a measurement (errors, skips)", True),
        ("failed_statuses", "str", "failed cells by status", False),
        ("rows", "int", "figure rows (samples x turns x repeats x runs)", True),
        ("repeats", "int", "distinct repeats", True),
        ("seeds", "int", "distinct sampling seeds (0 when greedy)", True),
        ("replicates", "int", "measurements per sample (the fewest over samples)", False),
        ("tokens_per_s", "float", "mean tokens/s over rows", True,
         dict(display="tok/s", report="main", page=False, compare=True)),
        ("tokens_per_s_low", "float", "its interval's lower bound", False),
        ("tokens_per_s_high", "float", "its interval's upper bound", False),
        ("tokens_per_s_total", "float", "total new tokens / total seconds", False),
        ("speedup", "float", "mean over samples of tokens/s(decoder) / tokens/s(vanilla), paired in one run",
         True, dict(interval=True, report="main", compare=True)),
        ("speedup_low", "float", "its interval's lower bound", False),
        ("speedup_high", "float", "its interval's upper bound", False),
        ("speedup_total", "float", "ratio of totals: vanilla s/token / decoder s/token over the same rows", True),
        ("speedup_total_low", "float", "its interval's lower bound", False),
        ("speedup_total_high", "float", "its interval's upper bound", False),
        ("decode_tokens_per_s", "float", "mean decode-only tokens/s (after both prefills)", False),
        ("decode_speedup", "float", "the paired mean of decode-only tokens/s ratios", True,
         dict(display="decode speedup", interval=True, report="prefill", page=False)),
        ("decode_speedup_low", "float", "its interval's lower bound", False),
        ("decode_speedup_high", "float", "its interval's upper bound", False),
        ("ttft_s", "float", "mean seconds to the first new token", True,
         dict(display="TTFT ms", fmt=".1f", scale=1000.0, report="recorded", page=False)),
        ("ttft_s_p50", "float", "median ttft_s over rows", False),
        ("ttft_s_p90", "float", "90th percentile of ttft_s over rows (null below 10 rows)", False),
        ("ttft_s_p99", "float", "99th percentile of ttft_s over rows (null below 100 rows)", False),
        ("tpot_s", "float", "mean seconds per output token after the first", True,
         dict(display="TPOT ms", fmt=".1f", scale=1000.0, report="recorded", page=False)),
        ("tpot_s_p50", "float", "median tpot_s over rows", False),
        ("tpot_s_p90", "float", "90th percentile of tpot_s over rows (null below 10 rows)", False),
        ("tpot_s_p99", "float", "99th percentile of tpot_s over rows (null below 100 rows)", False),
        ("prefill_share", "float", "mean prefill_s / wall_time_s (both prefills)", True,
         dict(display="prefill", fmt=".0%", report="prefill", page=False)),
        ("peak_memory_mb", "float", "largest peak_memory_mb of the rows (MiB)", False),
        ("batch_size", "int", "requests decoded together (runner.batch_size; empty for older rows)", False),
        ("batch_tokens_per_s", "float", "throughput of static batches: the batch calls' new tokens / their seconds",
         False, dict(display="batch tok/s", report="recorded", page=False)),
        ("accept_length", "float", "new tokens / target forwards (prefill included; vanilla = 1)", True,
         dict(display="τ", report="main", compare=True)),
        ("accept_length_low", "float", "its interval's lower bound", False),
        ("accept_length_high", "float", "its interval's upper bound", False),
        ("acceptance_rate", "float", "accepted / drafted tokens", True,
         dict(display="α", report="main")),
        ("target_tokens_fed_per_step", "float", "mean tokens fed to the target per decode step", True),
        ("draft_forwards_per_step", "float", "mean draft forwards per decode step", True),
        ("equality_check", "str", "exact, or n/a (sampled)", False),
        ("equal_to_vanilla", "float", "share of greedy rows equal to vanilla", True,
         dict(display="eq.", report="main")),
        ("paired_across_processes", "int", "rows paired with vanilla measured in another process", True),
        ("speedup_repeat_std", "float", "standard deviation of speedup over replicates", False),
        ("tokens_per_s_repeat_std", "float", "standard deviation of tokens/s over replicates", False),
        ("load_max", "float", "largest 1-minute load average of the rows", True),
        ("rows_over_load", "int", "rows measured on a loaded machine", False),
        ("usable_cores", "int", "cores the run could use", False),
        ("warnings", "str", "what a reader must know about this row's numbers", False),
    ))

#: Figures of the report's aggregate that summary.csv leaves out (the theory table's: detail.csv and theory.csv).
THEORY_COLUMNS_DECLARED: tuple[Column, ...] = tuple(
    Column(name, type_, "summary", meaning, False, **shown) for name, type_, meaning, shown in (
        ("gamma_used", "float", "configured draft length (else drafted tokens per step)", dict(display="γ")),
        ("cost_ratio", "float", "draft / target forward cost c", dict(display="c", fmt=".3f")),
        ("cost_ratio_source", "str", "where c came from (option, timers, wall-time fit)", dict(display="c from")),
        ("theory_accept_length", "float", "Leviathan et al. 2023 eq. 1: (1 - alpha^(gamma+1)) / (1 - alpha)",
         dict(display="E[τ] theory")),
        ("theory_speedup", "float", "E[tau] / (gamma c + 1)", dict(display="speedup theory")),
        ("efficiency", "float", "measured speedup / measured tau", dict(display="efficiency")),
        ("verify_cost", "float", "in-situ seconds per verify step / vanilla's seconds per output token on the same "
         "samples (1 = a plain decode step)", dict(display="verify cost")),
        ("draft_cost", "float", "in-situ seconds per draft forward / vanilla's seconds per output token on the "
         "same samples", dict(display="draft cost", fmt=".3f")),
        ("verify_bare", "float", "in-situ seconds per verify step / the target's bare one-token forward "
         "(bare_token_s)", {}),
        ("verify_bare_curve", "float", "the target's bare cost curve at the tokens fed per verify, in bare_token_s "
         "units: what verify_bare would be without the decoder's own work (empty beyond the curve's last point)",
         {}),
        ("draft_bare", "float", "in-situ seconds per draft forward after the prefill / bare_token_s", {}),
        ("draft_bare_curve", "float", "the draft's bare cost curve at draft_tokens_per_forward, in bare_token_s "
         "units (empty beyond the curve's last point)", {}),
        ("draft_tokens_per_forward", "float", "tokens fed per draft forward after the draft's prefill", {}),
    ))

ROW: dict[str, Column] = {}
SUMMARY: dict[str, Column] = {}
THEORY = {c.name: c for c in THEORY_COLUMNS_DECLARED}


@dataclass(frozen=True)
class Bound:
    """The range of a numeric row column: ``low <= x`` (``low < x`` when ``open_low``) and ``x <= high``;
    ``None`` = unbounded on that side. Every number must also be finite."""

    low: float | None = None
    high: float | None = None
    open_low: bool = False

    def check(self, x: float) -> str | None:
        """Why ``x`` is out of range (``"must be >= 0"``), or None."""
        if self.low is not None and (x <= self.low if self.open_low else x < self.low):
            return f"must be {'>' if self.open_low else '>='} {self.low:g}" + (
                f" and <= {self.high:g}" if self.high is not None else "")
        if self.high is not None and x > self.high:
            return f"must be <= {self.high:g}"
        return None


_COUNT, _POSITIVE, _SHARE = Bound(0), Bound(0, open_low=True), Bound(0, 1)
#: The range of each bounded numeric row column (a column not named here is checked for its type and, when a
#: number, for being finite). Times, rates, counts and loads cannot be negative; shares lie in [0, 1]. A decoder's
#: statistics bring their bound with their declaration (:mod:`decoders.columns`).
ROW_BOUNDS: dict[str, Bound] = {
    **dict.fromkeys(("sample_index", "turn", "repeat", "order_position", "prompt_tokens", "top_k", "temperature",
                     "first_divergence", "load_1m_before", "load_1m_after", "tokens_per_s", "new_tokens",
                     "num_steps", "accept_length", "num_drafted", "num_accepted", "draft_forwards",
                     "draft_forwards_per_step", "target_tokens_fed_per_step", "ttft_s", "tpot_s", "draft_prefill_s",
                     "prefill_s", "first_tokens", "decode_tokens_per_s", "draft_time_s", "verify_time_s",
                     "peak_memory_mb", "cpu_time_s", "run_delay_s", "batch_index", "latency_s", "batch_tokens_per_s"),
                    _COUNT),
    **dict.fromkeys(("wall_time_s", "max_new_tokens", "cpu_count", "cpu_affinity", "batch_size", "batch_rows"),
                    _POSITIVE),
    "acceptance_rate": _SHARE,
    **{s.name: {"count": _COUNT, "share": _SHARE}[s.bound] for s in decoder_statistics() if s.bound},
    "top_p": Bound(0, 1, open_low=True),
}
#: Keys every row carries, whatever its status (the cell it belongs to).
REQUIRED_COLUMNS = ("decoder", "sample_id")
#: How far a row's ``tokens_per_s`` may lie from ``new_tokens / wall_time_s`` (relative): the runner computes it
#: so, from the wall seconds of the whole ``generate`` call (prefill included; the decode-only rate is
#: ``decode_tokens_per_s``), and JSON keeps the floats exactly.
TOKENS_PER_S_RTOL = 1e-3

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
SUMMARY_COLUMNS: list[str] = []
SUMMARY_MD_COLUMNS: list[str] = []
#: Columns every ok row carries (the runner writes them all); only tokens_per_s may be null.
REQUIRED_OK_COLUMNS = ("decoder", "sample_id", "new_tokens", "num_steps", "wall_time_s", "tokens_per_s")
NULLABLE_OK_COLUMNS = ("tokens_per_s",)
#: Counters that are deterministic for a given code, model, data, seeds and float32 (the gate checks them).
COUNTER_COLUMNS = ("new_tokens", "num_steps", "draft_forwards", "num_drafted", "num_accepted")
#: Load columns (1-minute load average around the timed call; older names: :mod:`harness.rows.legacy`), the cores.
LOAD_COLUMNS = ("load_1m_before", "load_1m_after")
CORE_COLUMNS = ("cpu_affinity", "cpu_count")
#: Keys pairing a decoder's row with vanilla's (same run, sample, turn and repeat).
PAIR_KEYS = ("run_id", "task", "sample_id", "turn", "repeat")
#: ``equality_check`` of a sampled row (the runner's value), and what a cell of greedy rows says.
EQUALITY_SAMPLED = "n/a (sampled)"
EQUALITY_EXACT = "exact"
#: Percentiles of ttft_s and tpot_s over a cell's rows in the summary (as serving benchmarks report).
LATENCY_PERCENTILES = (50, 90, 99)


def gather() -> None:
    """Fill the lookups from the declarations, in place (a module that imported one sees the change):
    :data:`ROW`, :data:`SUMMARY`, :data:`SUMMARY_COLUMNS`, :data:`SUMMARY_MD_COLUMNS`. Run at import, and again
    after the declarations change (a test declaring an example column)."""
    ROW.clear()
    ROW.update({c.name: c for c in ROW_COLUMNS})
    SUMMARY.clear()
    SUMMARY.update({c.name: c for c in SUMMARY_COLUMNS_DECLARED})
    SUMMARY_COLUMNS[:] = [c.name for c in SUMMARY_COLUMNS_DECLARED]
    SUMMARY_MD_COLUMNS[:] = ["group", "label", *[c.name for c in SUMMARY_COLUMNS_DECLARED if c.summary_md]]


gather()


def shown(name: str) -> Column:
    """The declaration of a figure the report's tables show (a summary or theory column), for its header and
    format.

    Raises:
        KeyError: ``name`` is declared in neither.
    """
    return SUMMARY[name] if name in SUMMARY else THEORY[name]


def main_table_columns(*places: str) -> list[Column]:
    """The summary columns of the report's main table at ``places`` (``"main"``, ``"prefill"``, ``"recorded"``:
    see :class:`Column`), in declaration order."""
    return [c for c in SUMMARY_COLUMNS_DECLARED if c.report in places]


def compared_columns() -> list[Column]:
    """The summary columns ``--compare`` sets side by side (declared ``compare=True``), in declaration order."""
    return [c for c in SUMMARY_COLUMNS_DECLARED if c.compare]


def legend(names: list[str] | tuple[str, ...]) -> str:
    """``name = meaning`` for each declared summary column of ``names`` (interval bounds left out), joined
    with ``; ``: the legend under a summary table."""
    return "; ".join(f"{n} = {SUMMARY[n].meaning}" for n in names
                     if n in SUMMARY and not n.endswith(("_low", "_high")))


# ------------------------------------------------------------------------------------------------ validation
_TYPES = {"str": (str,), "list": (list,), "bool": (bool,)}


def _number_problem(name: str, value: Any, kind: str) -> str | None:
    """Why ``value`` is not a valid ``kind`` (``int`` / ``float``) value of column ``name``, or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{name}={value!r}: not a number ({kind} expected)"
    try:
        x = float(value)
    except OverflowError:
        return f"{name}: a {len(str(value))}-digit number, beyond any float"
    if not math.isfinite(x):
        return f"{name}={value!r}: not a finite number"
    if kind == "int" and not x.is_integer():
        return f"{name}={value!r}: not an integer"
    bound = ROW_BOUNDS.get(name)
    why = bound.check(x) if bound else None
    return f"{name}={value!r}: {why}" if why else None


def value_problem(name: str, value: Any) -> str | None:
    """Why ``value`` cannot be column ``name`` of a result row (its declared type in :data:`ROW`, its range in
    :data:`ROW_BOUNDS`; booleans only ``true``/``false``), or None. ``null`` is valid here (required columns
    are :func:`row_problem`'s); an undeclared column (a hyper-parameter, a quality score) is checked only for
    being a finite number when it is one."""
    if value is None:
        return None
    col = ROW.get(name)
    if col is None:
        if isinstance(value, float) and not math.isfinite(value):
            return f"{name}={value!r}: not a finite number"
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                float(value)
            except OverflowError:
                return f"{name}: a {len(str(value))}-digit number, beyond any float"
        return None
    if col.type in ("int", "float"):
        return _number_problem(name, value, col.type)
    if not isinstance(value, _TYPES[col.type]):
        return f"{name}={value!r}: not a {'boolean (true or false)' if col.type == 'bool' else col.type}"[:200]
    return None


def row_problem(row: Any) -> str | None:
    """Why ``row`` (one parsed line of ``results.jsonl``) is not a result row, or None when it is one.

    A row is a JSON object with :data:`REQUIRED_COLUMNS`; an ``ok`` row (or one without ``status``, written
    before the column existed) also has every :data:`REQUIRED_OK_COLUMNS` value (``tokens_per_s`` may be
    null); every value has its declared type and range (:func:`value_problem`); and ``tokens_per_s``, when
    given, equals ``new_tokens / wall_time_s`` within :data:`TOKENS_PER_S_RTOL`.

    Returns:
        One line naming the first problem (``"tokens_per_s=NaN: not a finite number"``).
    """
    if not isinstance(row, dict):
        kind = {list: "a list", str: "a string", type(None): "null", bool: "a boolean"}.get(type(row), "a number")
        return f"not a JSON object ({kind})"
    ok = row.get("status", "ok") == "ok"
    needed = [*REQUIRED_COLUMNS, *(c for c in REQUIRED_OK_COLUMNS if ok and c not in REQUIRED_COLUMNS)]
    missing = [c for c in needed if c not in row or (row[c] is None and c not in NULLABLE_OK_COLUMNS)]
    if missing:
        return f"lacks {', '.join(missing)}" + (" (required in an ok row)" if ok else "")
    for name, value in row.items():
        why = value_problem(str(name), value)
        if why:
            return why
    tps, new, wall = row.get("tokens_per_s"), row.get("new_tokens"), row.get("wall_time_s")
    if ok and tps is not None and new is not None and wall:
        expected = new / wall
        if abs(tps - expected) > TOKENS_PER_S_RTOL * max(abs(expected), 1e-9):
            return (f"tokens_per_s={tps:g} but new_tokens / wall_time_s = {new} / {wall:g} = {expected:g} (the "
                    "runner's tokens/s is over the whole generate call): the row was edited or mixes two cells")
    return None


#: The status of a row read from a file but not valid (:func:`row_problem`): its cell counts as not measured.
STATUS_INVALID = "invalid"
#: What a row measured (left out of an invalid row, whose measurement cannot be believed).
MEASURED_COLUMNS = frozenset({c.name for c in ROW_COLUMNS if c.stage in ("decoder", "stopwatch", "task")} | {
    "status", "reason", "wall_time_s", "tokens_per_s", "matches_vanilla", "equality_check", "first_divergence",
    "paired_across_processes", "load_1m_before", "load_1m_after", "completion", "token_ids"})


def invalid_row(row: Any, why: str) -> dict[str, Any] | None:
    """What is left of an invalid row: the cell it names (its identity, decoder and settings; the measured
    columns dropped), with ``status`` :data:`STATUS_INVALID` and ``reason`` ``why``, so that tables count the
    cell as not measured and say why. None when the row names no cell (not an object, or
    :data:`REQUIRED_COLUMNS` missing or of the wrong type)."""
    if not isinstance(row, dict) or any(not isinstance(row.get(c), str) for c in REQUIRED_COLUMNS):
        return None
    kept = {k: v for k, v in row.items() if k not in MEASURED_COLUMNS and value_problem(str(k), v) is None}
    return {**kept, "status": STATUS_INVALID, "reason": f"invalid row: {why}"}
