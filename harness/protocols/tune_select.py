"""Step 2 of the tuning protocol, the choice: grid points of tuning runs grouped into families and judged.

The rules (families, the dev split, what refuses a family or the whole call) are stated in
:mod:`harness.protocols.tune` and docs/experiments.md ("Tuning protocol"). Input: rows of
:func:`harness.rows.results.load_rows` (one per cell) and :func:`harness.rows.metrics.aggregate`'s frame (one row
per run group, task and decoder); output: one :class:`Choice` per family. Imports no torch.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd

from harness.config.schemas import SCHEMAS, OptTreeConfig, OuroborosConfig
from harness.rows import columns, grouping
from tasks.mbpp import SPLIT_IDS as MBPP_SPLIT_IDS

#: ``_target_`` -> the families a point of that decoder class belongs to (``ouroboros`` only when paper-faithful).
FAMILIES_OF_TARGET: dict[str, tuple[str, ...]] = {
    "decoders.speculative.SpeculativeDecoder": ("speculative",),
    "decoders.lookahead.LookaheadDecoder": ("lookahead",),
    "decoders.prompt_lookup.PromptLookupDecoder": ("prompt_lookup",),
    "decoders.hf_assisted.HFAssistedDecoder": ("hf_assisted",),
    "decoders.ouroboros.OuroborosDecoder": ("ouroboros", "ouroboros_best"),
    "decoders.opt_tree.OptTreeDecoder": ("opt_tree", "opt_tree_best"),
}
FAMILIES = ("speculative", "lookahead", "prompt_lookup", "hf_assisted", "ouroboros", "ouroboros_best", "opt_tree",
            "opt_tree_best")
#: Decoders that are references of the race, never tuned.
REFERENCE_TARGETS = ("decoders.vanilla.VanillaDecoder", "decoders.hf_assisted.HFGreedyDecoder")
#: Ouroboros options that are not in the paper (Zhao et al. 2024): a point with any of them away from its
#: default is not paper-faithful (pool_from_prompt is LookaheadDecoding's POOL_FROM_PROMPT; the rest are
#: cheaper-drafting options, the draft window among them: the paper's draft reads the whole context).
OUROBOROS_EXTENSIONS = ("pool_from_prompt", "free_draft_min_match", "draft_vocab_size", "stop_confidence",
                        "branch_confidence", "max_branches", "draft_window")
#: Options of OPT-Tree that are not in the paper (Wang et al. 2024): the cost-aware rule, the hybrid tree, guesses,
#: the reduced draft vocabulary, the draft window (the paper's draft reads the whole context).
OPT_TREE_EXTENSIONS = ("cost_aware", "copy_tokens", "draft_on_copy", "copy_min_match", "guess_tokens",
                       "draft_vocab_size", "draft_window")
#: Paper-faithful family -> (its schema's defaults, the options that must stay at them).
PAPER_FAITHFUL = {
    "ouroboros": ({f.name: f.default for f in fields(OuroborosConfig)}, OUROBOROS_EXTENSIONS),
    "opt_tree": ({f.name: f.default for f in fields(OptTreeConfig)}, OPT_TREE_EXTENSIONS),
}
#: Config keys that are not hyper-parameters (harness.rows.grouping.NON_PARAM_KEYS).
META_KEYS = grouping.NON_PARAM_KEYS
#: HumanEval problems of the dev split: 0-19. The held-out race starts at 20.
HUMANEVAL_DEV = range(0, 20)


def _number(sample_id: Any) -> int | None:
    m = re.search(r"(\d+)$", str(sample_id))
    return int(m.group(1)) if m else None


#: task -> (is this sample id in the dev split?, the dev split in words).
DEV_SPLITS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "humaneval": (lambda s: _number(s) in HUMANEVAL_DEV, "HumanEval/0-19"),
    "mbpp": (lambda s: _number(s) is not None and _number(s) not in MBPP_SPLIT_IDS["test"],
             "MBPP validation (task ids 511-600; prompt and train ids also qualify, test ids 11-510 do not)"),
}


class Refused(Exception):
    """The input cannot be tuned from (exit status 2); the message says what to change, one line per reason."""


#: What ``--combine`` admits: runs that differ in one of these are refused without it.
COMBINABLE = ("task", "dtype", "machine")


def _value(v: Any) -> str:
    x = columns.norm(v)
    return "unrecorded" if x is None or (isinstance(x, float) and math.isnan(x)) else str(x)


def _spread(rows: pd.DataFrame, columns: Sequence[str]) -> dict[str, list[str]]:
    """Each distinct value of ``columns`` (joined with " / ") -> the run folders holding it, in order of appearance."""
    cols = [c for c in columns if c in rows]
    out: dict[str, list[str]] = {}
    if not cols:
        return out
    where = rows["run_dir"].astype(str) if "run_dir" in rows else pd.Series(["?"] * len(rows), index=rows.index)
    for value, run in zip(rows[cols].apply(lambda r: " / ".join(_value(v) for v in r), axis=1), where):
        runs = out.setdefault(value, [])
        if run not in runs:
            runs.append(run)
    return out


def _describe(spread: dict[str, list[str]]) -> str:
    return "; ".join(f"{v} in {', '.join(runs[:3])}{f' (+{len(runs) - 3} more)' if len(runs) > 3 else ''}"
                     for v, runs in spread.items())


#: what -> (row columns, why a mixed score misleads)
COMBINE_CHECKS: dict[str, tuple[tuple[str, ...], str]] = {
    "dtype": (("dtype",), "a score averaged over them mixes precisions (on a CPU without bf16 units bf16 speedups "
                          "differ several-fold from float32 ones)"),
    "machine": (("device_name", "cpu_isa"), "speedups do not carry across machine classes"),
    "task": (("task",), "each point's score would be the mean over these tasks"),
}


def check_combination(rows: pd.DataFrame, combine: Sequence[str] = ()) -> list[str]:
    """One line per way the runs differ (dtype, machine class: ``device_name`` / ``cpu_isa``, task) that
    ``combine`` does not admit; empty when they may be tuned from together."""
    problems = []
    for what, (cols, why) in COMBINE_CHECKS.items():
        spread = _spread(rows, cols)
        if len(spread) <= 1 or what in combine:
            continue
        label = f"machine ({' / '.join(c for c in cols if c in rows)})" if what == "machine" else what
        problems.append(f"the runs differ in {label}: {_describe(spread)}; {why}. Tune from runs that agree, or pass "
                        f"--combine {what} to combine them (the tuned config's header then says so)")
    return problems


def differing(rows: pd.DataFrame, combine: Sequence[str]) -> list[str]:
    """The names of ``combine`` in which the runs really differ (more than one value), in ``COMBINABLE`` order: what
    a tuned config's header may say was combined."""
    return [c for c in COMBINABLE if c in combine and len(_spread(rows, COMBINE_CHECKS[c][0])) > 1]


def combined_values(rows: pd.DataFrame) -> dict[str, Any]:
    """The ``tuned-on`` record of ``rows``: dtype, device_name, cpu_isa and task, each a string, or a sorted list
    where the rows hold several values."""
    out: dict[str, Any] = {}
    for col in ("dtype", "device_name", "cpu_isa", "task"):
        vals = sorted({_value(v) for v in rows[col]}) if col in rows else ["unrecorded"]
        out[col] = vals[0] if len(vals) == 1 else vals
    return out


def family_of(family: str, target: str, params: dict[str, Any]) -> bool:
    """Whether a point (``_target_`` and hyper-parameters) belongs to ``family``."""
    if family not in FAMILIES_OF_TARGET.get(target, ()):
        return False
    if family in PAPER_FAITHFUL:
        defaults, extensions = PAPER_FAITHFUL[family]
        return all(columns.norm(params.get(k, defaults[k])) == columns.norm(defaults[k]) for k in extensions)
    return True


def schema_name(target: str) -> str:
    """The ConfigStore name of the decoder schema for ``target`` (``base_decoder_speculative``)."""
    for name, schema in SCHEMAS["decoder"].items():
        if schema._target_ == target:
            return name
    raise Refused(f"no decoder registered for {target} (decoders/settings.py)")


def compact_ids(ids: Sequence[Any]) -> str:
    """``HumanEval/0..9`` -> ``HumanEval/0-9``; ``mbpp/511, 512, 514`` -> ``mbpp/511-512, 514``."""
    by_prefix: dict[str, list[int]] = {}
    other: list[str] = []
    for s in ids:
        n = _number(s)
        if n is None:
            other.append(str(s))
        else:
            by_prefix.setdefault(str(s)[: len(str(s)) - len(str(n))], []).append(n)
    parts = []
    for prefix, nums in by_prefix.items():
        nums = sorted(set(nums))
        runs, start = [], nums[0]
        for a, b in zip(nums, nums[1:] + [None]):
            if b != a + 1:
                runs.append(f"{start}" if start == a else f"{start}-{a}")
                start = b
        parts.append(prefix + ", ".join(runs))
    return ", ".join(parts + other)


# --------------------------------------------------------------------------------------------------------- input
def decoder_nodes(rows: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """decoder name -> its config node (``_target_``, ``_partial_``, ``uses_draft``, hyper-parameters) from the
    ``meta.json`` of every run folder in ``rows``; refuses a name whose config differs between folders or from
    the rows' ``decoder_params``."""
    nodes: dict[str, dict[str, Any]] = {}
    for run_dir, g in rows.groupby("run_dir", sort=False):
        meta_path = Path(str(run_dir)) / "meta.json"
        if not meta_path.is_file():
            raise Refused(f"{meta_path} is missing: tune.py reads each grid point's config from the run folder's "
                          "meta.json (written by run.py); point it at run or sweep folders of run.py")
        config = json.loads(meta_path.read_text()).get("config", {}).get("decoder", {})
        for name, dg in g.groupby("decoder", sort=False):
            node = config.get(name)
            if not isinstance(node, dict) or "_target_" not in node:
                raise Refused(f"{meta_path}: no config for decoder {name!r}")
            params = {k: columns.norm(v) for k, v in node.items() if k not in META_KEYS}
            for s in dg["decoder_params"].dropna().unique():
                stored = {k: columns.norm(v) for k, v in json.loads(s).items()}
                if stored != params:
                    raise Refused(f"{run_dir}: rows of {name} carry decoder_params {stored} but meta.json says "
                                  f"{params}; the folder mixes configurations (use a fresh folder per tuning run)")
            if name in nodes and nodes[name] != node:
                raise Refused(f"grid point {name} has different configs in different runs ({nodes[name]} vs {node}); "
                              "tune from runs of the same grid")
            nodes[name] = node
    return nodes


def check_input(rows: pd.DataFrame, any_split: bool) -> None:
    """Refuse sampled rows and held-out samples (see the module docstring)."""
    if "temperature" in rows and (columns.num(rows["temperature"]).fillna(0) > 0).any():
        raise Refused("rows with temperature > 0: tuning is greedy (speedups are paired on identical outputs); "
                      "tune from a run with runner.temperature=0")
    if any_split:
        return
    for task, g in rows.groupby("task", sort=False):
        rule = DEV_SPLITS.get(str(task))
        if rule is None:
            raise Refused(f"task {task} has no dev split in the tuning protocol (dev: {', '.join(DEV_SPLITS)}); "
                          "tune on the dev split, or pass --any-split (the tuned config's header then says so)")
        bad = sorted({s for s in g["sample_id"] if not rule[0](s)}, key=lambda s: (_number(s) or 0, str(s)))
        if bad:
            raise Refused(f"{task} rows include held-out samples ({compact_ids(bad)}): tuning uses the dev split "
                          f"only ({rule[1]}), so that the held-out race measures settings chosen elsewhere; "
                          "pass --any-split to tune on them anyway")


def error_counts(rows: pd.DataFrame) -> dict[tuple[str, str], int]:
    """(task, decoder) -> cells whose latest row has status ``error`` (skips such as ``prompt_too_long`` are not
    errors: they are deterministic and hit vanilla too)."""
    if "status" not in rows:
        return {}
    bad = rows[rows["status"] == "error"]
    return {(str(t), str(d)): int(n) for (t, d), n in bad.groupby(["task", "decoder"]).size().items()}


# --------------------------------------------------------------------------------------------------------- select
@dataclass
class Point:
    """One grid point across the dev tasks."""

    name: str
    node: dict[str, Any]
    per_task: dict[str, pd.Series]        # task -> its aggregate row
    score: float = math.nan
    width: float = math.nan
    notes: list[str] = field(default_factory=list)

    @property
    def params(self) -> dict[str, Any]:
        return {k: v for k, v in self.node.items() if k not in META_KEYS}


@dataclass
class Choice:
    family: str
    points: list[Point]
    chosen: Point | None = None
    refused: str | None = None
    excluded: list[str] = field(default_factory=list)


def select(agg: pd.DataFrame, nodes: dict[str, dict[str, Any]], metric: str = "speedup_total",
           families: Sequence[str] = FAMILIES, tie_tolerance: float = 0.005,
           errors: dict[tuple[str, str], int] | None = None, allow_half_divergence: bool = False) -> list[Choice]:
    """The choice (or the refusal) per family from :func:`harness.rows.metrics.aggregate`'s frame ``agg``;
    ``errors`` counts cells with status ``error`` per (task, decoder) (:func:`error_counts`). A point whose
    output differs from vanilla on some dev sample is not a candidate (half precision; listed in
    ``Choice.excluded``) unless ``allow_half_divergence``; in float32 it refuses its whole family (a bug).

    Raises:
        Refused: several run groups for one task, or a missing metric.
    """
    tasks, vanilla = _dev_tasks(agg, metric)
    points: dict[str, Point] = {}
    for _, r in agg.iterrows():
        name = str(r["decoder"])
        if name == "vanilla" or nodes.get(name, {}).get("_target_") in REFERENCE_TARGETS:
            continue
        points.setdefault(name, Point(name, nodes[name], {})).per_task[str(r["task"])] = r
    choices = []
    for family in families:
        members = [p for p in points.values() if family_of(family, p.node["_target_"], p.params)]
        choice = Choice(family, members)
        choices.append(choice)
        if not members:
            choice.refused = (f"no grid points of {family} in these runs (run experiment=tune_all, or "
                              f"tune_{family.replace('_best', '')}, on the dev split)")
            continue
        problems, eligible = [], []
        for p in members:
            if p.params.get("pool_scope") == "task":
                choice.excluded.append(f"{p.name}: warm pool (pool_scope=task) not eligible: with the race's "
                                       "runner.repeats=2 it would see each sample again")
                continue
            found, diverged = _judge(p, tasks, vanilla, metric, errors or {}, allow_half_divergence)
            problems += found  # any problem refuses the whole family
            if diverged:
                choice.excluded.extend(diverged)
            elif not found:
                eligible.append(p)
        if problems:
            choice.refused = "; ".join(problems)
            continue
        if not eligible:
            choice.refused = f"no eligible points of {family} ({'; '.join(choice.excluded)})"
            continue
        best = max(p.score for p in eligible)
        tied = [p for p in eligible if best - p.score <= tie_tolerance]
        choice.chosen = min(tied, key=lambda p: (p.width, p.name))
        if len(tied) > 1:
            others = ", ".join(p.name for p in tied if p is not choice.chosen)
            choice.chosen.notes.append(f"tie within {tie_tolerance:g} with {others}: narrower interval")
    return choices


def _dev_tasks(agg: pd.DataFrame, metric: str) -> tuple[list[str], dict[str, pd.DataFrame]]:
    """The dev tasks of ``agg`` and each one's vanilla rows.

    Raises:
        Refused: a missing metric, several run groups for one task, or a task without vanilla.
    """
    if metric not in agg:
        numeric = [c for c in agg.columns if c.endswith("_low") and c[:-4] in agg]
        raise Refused(f"--metric {metric}: not a column of harness.rows.metrics.aggregate; with intervals: "
                      f"{', '.join(c[:-4] for c in numeric)}")
    per_task = agg.groupby("task", sort=False)["group"].nunique()
    if (per_task > 1).any():
        task = per_task[per_task > 1].index[0]
        groups = list(dict.fromkeys(agg.loc[agg["task"] == task, "group"]))
        raise Refused(f"task {task} has {len(groups)} run identities ({'; '.join(groups)}): tune from one run per "
                      "dev task (same code, machine, dtype and budget), or resume the interrupted one")
    tasks = list(dict.fromkeys(agg["task"]))
    vanilla = {t: agg[(agg["task"] == t) & (agg["decoder"] == "vanilla")] for t in tasks}
    for t, v in vanilla.items():
        if v.empty:
            raise Refused(f"task {t}: no vanilla rows, so no paired speedup; tuning runs include vanilla")
    return tasks, vanilla


def _judge(p: Point, tasks: list[str], vanilla: dict[str, pd.DataFrame], metric: str,
           errors: dict[tuple[str, str], int], allow_half_divergence: bool) -> tuple[list[str], list[str]]:
    """Score grid point ``p`` (its ``score`` and ``width``); returns (problems that refuse its family, reasons it
    is excluded): missing tasks, incomplete or failed cells, a float32 divergence, no metric value; a
    half-precision divergence only excludes it (unless ``allow_half_divergence``)."""
    low, high = f"{metric}_low", f"{metric}_high"
    absent = [t for t in tasks if t not in p.per_task]
    if absent:
        return [f"{p.name} was not measured on {', '.join(absent)} (every scored point must run on every dev "
                "task)"], []
    problems, diverged = [], []
    for t, r in p.per_task.items():
        n_vanilla = int(vanilla[t]["samples"].iloc[0])
        failed = errors.get((t, p.name), 0)
        if failed or int(r["samples"]) < n_vanilla:
            problems.append(f"{p.name} is incomplete on {t}: {int(r['samples'])} of {n_vanilla} samples, "
                            f"{failed} failed cells (resume the tuning run: the same command again; failed "
                            "cells are retried)")
        if columns.num_value(r.get("equal_to_vanilla")) < 1:
            where = f"on {t} (samples {', '.join(r.get('divergent_samples') or []) or '?'})"
            if str(r.get("dtype")) == "float32":
                problems.append(f"{p.name} differs from vanilla in float32 {where}: a lossless decoder must "
                                "not; fix the decoder before tuning it")
            elif not allow_half_divergence:
                diverged.append(f"{p.name}: output differs from vanilla in {r.get('dtype')} {where}; equality "
                                "is required (--allow-half-divergence admits half-precision divergences)")
    vals = [columns.num_value(p.per_task[t].get(metric)) for t in tasks]
    widths = [columns.num_value(p.per_task[t].get(high))
              - columns.num_value(p.per_task[t].get(low)) for t in tasks]
    p.score = float(sum(vals) / len(vals))
    p.width = float(sum(widths) / len(widths)) if all(math.isfinite(w) for w in widths) else math.inf
    if not math.isfinite(p.score):
        return problems + [f"{p.name} has no {metric} value"], []
    return problems, diverged
