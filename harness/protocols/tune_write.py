"""Step 2 of the tuning protocol, the output: the table of every grid point and the ``<family>_tuned.yaml`` text.

What the written config holds (header lines, the ``tuned-on`` record, the schema default line) is stated in
:mod:`harness.protocols.tune` and docs/experiments.md ("Tuning protocol"). Imports no torch (Hydra only inside
:func:`validate_written`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
import yaml

from harness.config.compose import TUNED_GROUP, TUNED_ON_PREFIX
from harness.protocols.tune_select import (COMBINABLE, COMBINE_CHECKS, Choice, combined_values, compact_ids,
                                           schema_name)
from harness.report.tables import md_table
from harness.rows import columns


def _fmt(v: Any, spec: str = ".2f") -> str:
    x = columns.num(pd.Series([v])).iloc[0]
    return "" if pd.isna(x) else format(float(x), spec)


def _with_interval(r: dict, metric: str) -> str:
    """``1.86 [1.67, 2.03]``, or ``0.61 (n too small)`` where the aggregation gave no interval (fewer than 5
    samples), as the run summaries say."""
    low, high = _fmt(r.get(metric + "_low")), _fmt(r.get(metric + "_high"))
    return f"{_fmt(r.get(metric))} " + (f"[{low}, {high}]" if low or high else "(n too small)")


def table(choices: Sequence[Choice], metric: str) -> str:
    """Every point of every family: per-task metric [interval], the score, accept length, equality with vanilla."""
    rows: list[list[str]] = []
    for c in choices:
        if not c.points:
            rows.append([c.family, "–", "–", "", "", "", "", f"REFUSED: {c.refused}"])
            continue
        for p in sorted(c.points, key=lambda p: (-p.score if math.isfinite(p.score) else math.inf, p.name)):
            per = "; ".join(f"{t} {_with_interval(r, metric)}" for t, r in p.per_task.items())
            tau = "; ".join(_fmt(r.get("accept_length")) for r in p.per_task.values())
            eq = "; ".join(f"{_fmt(r.get('equal_to_vanilla'), '.0%')} ({r.get('dtype')})" for r in p.per_task.values())
            width = _fmt(p.width, ".3f") if math.isfinite(p.width) else "–"
            rows.append([c.family, p.name, per, _fmt(p.score, ".3f"), width, tau, eq,
                         "**chosen**" if p is c.chosen else ""])
        if c.refused:
            rows.append([c.family, "", "", "", "", "", "", f"REFUSED: {c.refused}"])
        rows += [[c.family, "", "", "", "", "", "", f"excluded: {e}"] for e in c.excluded]
    header = ["family", "point", f"{metric} per task [95% CI]", "score", "CI width", "accept length",
              "equal to vanilla", "selection"]
    return md_table(header, [False] * 3 + [True] * 3 + [False] * 2, rows)


def tuned_yaml(choice: Choice, metric: str, sources: Sequence[str], rows: pd.DataFrame, any_split: bool,
               allow_half_divergence: bool = False, combine: Sequence[str] = ()) -> str:
    """The text of ``conf/decoder/tuned/<family>_tuned.yaml`` for a chosen point (``combine``: what ``--combine``
    admitted, stated in the header)."""
    p = choice.chosen
    assert p is not None
    name = f"{choice.family}_tuned"
    ok = rows[rows["status"] == "ok"] if "status" in rows else rows
    split = "; ".join(f"{t} {compact_ids(list(dict.fromkeys(g['sample_id'])))} ({g['sample_id'].nunique()} samples)"
                      for t, g in ok.groupby("task", sort=False))
    first = p.per_task[next(iter(p.per_task))]

    def one(col: str) -> str:
        vals = sorted({columns.fmt_value(v) for v in ok[col].dropna()}) if col in ok else []
        return ", ".join(vals) or "?"

    commit = ", ".join(v[:12] for v in one("git_commit").split(", "))
    if "git_dirty" in ok and ok["git_dirty"].fillna(False).astype(bool).any():
        commit += " (with uncommitted changes)"
    machine = one("device_name")
    cpu = one("cpu_model")
    if cpu != "?" and cpu not in machine:
        machine += f" ({cpu})"
    per = ", ".join(f"{t} {_with_interval(r, metric)}" for t, r in p.per_task.items())
    eq = ", ".join(f"{t} {_fmt(r.get('equal_to_vanilla'), '.0%')}" for t, r in p.per_task.items())
    tau = ", ".join(f"{t} {_fmt(r.get('accept_length'))}" for t, r in p.per_task.items())
    others = sorted((q for q in choice.points if q is not p and math.isfinite(q.score)), key=lambda q: -q.score)
    params = ", ".join(f"{k}={columns.fmt_value(v)}" for k, v in p.params.items())
    header = [
        f"# @package decoder.{name}",
        f"# {choice.family} tuned on the dev split: grid point {p.name} of benchmarks/tune.py's selection.",
        f"# Setting: {params}.",
        "# The tuning protocol (docs/experiments.md, \"Tuning protocol\"); do not edit by hand:",
        "# re-run the tuning and tune.py (--force replaces this file).",
        f"# Tuning runs: {', '.join(sources)}.",
        f"# Split: {split}{' (NOT the dev split: --any-split)' if any_split else ''}.",
        f"# dtype {one('dtype')}, max_new_tokens {one('max_new_tokens')}, model pair {first.get('model_pair')}, "
        f"commit {commit}.",
        f"# Machine: {machine}.",
        f"# Criterion: the highest {metric} (harness.rows.metrics.aggregate, paired with the same run's vanilla; "
        "speedup_total = total tokens / total time ratio, speedup = mean of per-sample ratios), equality with "
        f"vanilla on every dev sample {'NOT required (--allow-half-divergence)' if allow_half_divergence else 'required'}",
        f"# Score {p.score:.3f} = the mean over dev tasks of {metric} [95% bootstrap interval]: {per}.",
        f"# Accept length: {tau}. Equal to vanilla: {eq}.",
    ]
    record = combined_values(ok if len(ok) else rows)
    admitted = [c for c in COMBINABLE if c in combine]
    if admitted:
        def shown(col: str) -> str:
            return ", ".join(record[col]) if isinstance(record[col], list) else record[col]

        parts = [f"{c} ({'; '.join(shown(col) for col in COMBINE_CHECKS[c][0])})" for c in admitted]
        header.append(f"# Combined on request (--combine {','.join(admitted)}): {', '.join(parts)}; the score "
                      "averages over what differs.")
    header.append(TUNED_ON_PREFIX + json.dumps({**record, "combined": admitted}))
    if p.notes:
        header.append(f"# Note: {'; '.join(p.notes)}.")
    if others:
        header.append("# Other points: " + ", ".join(f"{q.name} {q.score:.3f}" for q in others) + ".")
    body = {k: p.node[k] for k in ("_target_", "_partial_", "uses_draft") if k in p.node}
    body.update(p.params)
    defaults = (f"defaults:\n  - /decoder/{schema_name(p.node['_target_'])}@_here_   # schema: harness/config/schemas.py "
                "(unknown keys and bad values are refused)\n  - _self_\n")
    return "\n".join(header) + "\n" + defaults + yaml.safe_dump(body, sort_keys=False, default_flow_style=False)


def validate_written(conf_dir: Path, name: str) -> None:
    """Compose ``decoder=[vanilla,tuned/<name>]`` with the conf tree holding ``conf_dir`` (harness.config.compose.compose:
    schema, types and bounds). Raises ConfigError. Skipped when ``conf_dir`` is not a conf tree's
    ``decoder/tuned`` folder."""
    root = conf_dir.parent.parent
    if (conf_dir.name, conf_dir.parent.name) != ("tuned", "decoder") or not (root / "config.yaml").is_file():
        return
    from hydra.core.global_hydra import GlobalHydra

    from harness.config.compose import compose

    GlobalHydra.instance().clear()
    compose([f"decoder=[vanilla,{TUNED_GROUP}/{name}]"], config_dir=root.resolve())
