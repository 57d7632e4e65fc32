"""Speedup-regression gate: compare a run against a small JSON baseline; exit non-zero on a regression.

Usage::

    python -m harness.regress --write-baseline RUN_DIR --out baseline.json      # baseline from a run
    python -m harness.regress --baseline baseline.json --current RUN_DIR [--speedup-tolerance 0.05]

A *cell* is (task, model pair, decoder configuration). Per cell the gate checks, in this order:

1. **Equality with vanilla.** In float32 every sample that matched vanilla in the baseline must still match
   (any new divergence fails). In half precision batched verification may legitimately flip near-ties, so
   the equality rate may drop by at most ``--equality-tolerance`` (default 0.02).
2. **Accept length** (new tokens / target forwards). Deterministic for a given model, data and float32, so
   it fails when it drops by more than ``--accept-length-tolerance`` (relative, default 0.01).
3. **Speedup vs vanilla**, measured within the same run (paired per-sample ratios). It fails when below
   ``baseline - max(abs_tol, rel_tol * baseline, k * sqrt(std_baseline^2 + std_current^2))``, where the stds
   are bootstrap standard errors over samples (``--speedup-tolerance``, ``--speedup-rel-tolerance``,
   ``--speedup-k``).

A cell of the baseline missing from the run fails (``--allow-missing`` to accept); a cell new in the run is
listed, not judged. Runs over a different sample set than the baseline's are refused (exit 2): accept
length and speedup are only comparable on the same samples.

Exit status: 0 no regression, 1 regression, 2 usage error or incomparable runs. Reads result files only
(no torch).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from harness.report import aggregate, find_result_files, load_rows

BASELINE_VERSION = 1


def _sample_digest(sample_ids: Sequence[str]) -> str:
    return hashlib.sha1("\n".join(sorted(map(str, sample_ids))).encode()).hexdigest()[:12]


def _cell_name(task: str, model_pair: str, label: str) -> str:
    return f"{task} | {model_pair} | {label}"


#: Per-cell settings that must agree between baseline and run for the numbers to be comparable.
SETTINGS = ("max_new_tokens", "task_version")


def _setting(rows: pd.DataFrame, col: str) -> Any:
    if col not in rows or rows.empty:
        return None
    values = sorted({str(v) for v in rows[col].dropna()})
    return values[0] if len(values) == 1 else (values or None)


def _finite(v: Any) -> float | None:
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) or math.isinf(v) else v


def summarize_cells(paths: Sequence[str | Path], n_boot: int = 2000, seed: int = 0) -> dict[str, Any]:
    """The baseline-shaped summary of the runs under ``paths``: ``{"meta": ..., "cells": {name: stats}}``."""
    rows = load_rows(paths)
    if rows.empty:
        raise ValueError(f"no result rows under {', '.join(map(str, paths))}")
    agg = aggregate(rows, n_boot=n_boot, seed=seed)
    ok = rows[rows["status"] == "ok"]
    cells: dict[str, Any] = {}
    for _, r in agg.iterrows():
        mine = ok[(ok["task"] == r["task"]) & (ok["model_pair"] == r["model_pair"]) & (ok["label"] == r["label"])]
        cells[_cell_name(r["task"], r["model_pair"], r["label"])] = {
            "task": r["task"],
            "model_pair": r["model_pair"],
            "decoder": r["decoder"],
            "label": r["label"],
            "dtype": str(mine["dtype"].iloc[0]) if len(mine) else None,
            **{k: _setting(mine, k) for k in SETTINGS},
            "samples": int(r["samples"]),
            "failed": int(r.get("failed", 0) or 0),
            "sample_digest": _sample_digest(mine["sample_id"].astype(str).tolist()),
            "equal_to_vanilla": _finite(r.get("equal_to_vanilla")),
            "divergent_samples": list(r.get("divergent_samples") or []) if isinstance(
                r.get("divergent_samples"), list) else [],
            "accept_length": _finite(r.get("accept_length")),
            "speedup": _finite(r.get("speedup")),
            "speedup_std": _finite(r.get("speedup_std")),
            "tokens_per_s": _finite(r.get("tokens_per_s")),
        }
    first = rows.iloc[0]
    meta = {
        "version": BASELINE_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "sources": [str(f) for f in find_result_files(paths)],
        "git_commit": first.get("git_commit") if isinstance(first.get("git_commit"), str) else None,
        "device_name": first.get("device_name") if isinstance(first.get("device_name"), str) else None,
    }
    return {"meta": meta, "cells": cells}


@dataclass
class Tolerances:
    """Thresholds of the gate (see the module docstring)."""

    accept_length: float = 0.01       # relative drop allowed
    equality: float = 0.02            # equality-rate drop allowed outside float32
    speedup_abs: float = 0.05
    speedup_rel: float = 0.0
    speedup_k: float = 2.0
    allow_missing: bool = False


@dataclass
class Check:
    cell: str
    metric: str
    baseline: str
    current: str
    limit: str
    verdict: str  # ok | REGRESSION | improved | new | note

    @property
    def failed(self) -> bool:
        return self.verdict == "REGRESSION"


def _f(v: float | None, fmt: str = ".3f") -> str:
    return "-" if v is None else format(v, fmt)


def compare(baseline: dict[str, Any], current: dict[str, Any], tol: Tolerances) -> list[Check]:
    """All checks of ``current`` against ``baseline`` (both as returned by :func:`summarize_cells`).

    Raises:
        ValueError: when a cell was measured on a different sample set than the baseline's.
    """
    checks: list[Check] = []
    base_cells, cur_cells = baseline["cells"], current["cells"]
    for name, b in base_cells.items():
        c = cur_cells.get(name)
        if c is None:
            checks.append(Check(name, "present", "yes", "missing", "-", "note" if tol.allow_missing else "REGRESSION"))
            continue
        for k in SETTINGS:
            if k in b and c.get(k) != b.get(k):
                raise ValueError(f"{name}: {k} is {c.get(k)} in the run but {b.get(k)} in the baseline; the "
                                 f"numbers are not comparable (rerun with the baseline's settings or write a "
                                 f"new baseline)")
        if c["sample_digest"] != b["sample_digest"] or c["samples"] != b["samples"]:
            raise ValueError(f"{name}: the run covers {c['samples']} samples (digest {c['sample_digest']}), the "
                             f"baseline {b['samples']} (digest {b['sample_digest']}); compare runs over the same "
                             f"samples (task.limit, max_new_tokens) or write a new baseline")
        if c.get("failed"):
            checks.append(Check(name, "failed cells", str(b.get("failed", 0)), str(c["failed"]), "0", "REGRESSION"))
        # 1. equality with vanilla
        if b["decoder"] != "vanilla":
            if (c.get("dtype") or b.get("dtype")) == "float32":
                new = sorted(set(c.get("divergent_samples", [])) - set(b.get("divergent_samples", [])))
                checks.append(Check(name, "equal_to_vanilla", _f(b["equal_to_vanilla"]), _f(c["equal_to_vanilla"]),
                                    "no new divergence (float32)",
                                    "REGRESSION" if new else ("improved" if (c["equal_to_vanilla"] or 0) >
                                                              (b["equal_to_vanilla"] or 0) else "ok")))
                if new:
                    checks[-1].current += f" (new: {', '.join(new[:5])}{' ...' if len(new) > 5 else ''})"
            else:
                limit = (b["equal_to_vanilla"] or 0.0) - tol.equality
                bad = (c["equal_to_vanilla"] or 0.0) < limit - 1e-12
                checks.append(Check(name, "equal_to_vanilla", _f(b["equal_to_vanilla"]), _f(c["equal_to_vanilla"]),
                                    f">= {limit:.3f}", "REGRESSION" if bad else "ok"))
        # 2. accept length
        if b.get("accept_length") is not None:
            limit = b["accept_length"] * (1.0 - tol.accept_length)
            cur = c.get("accept_length")
            bad = cur is None or cur < limit - 1e-12
            better = cur is not None and cur > b["accept_length"] * (1.0 + tol.accept_length)
            checks.append(Check(name, "accept_length", _f(b["accept_length"]), _f(cur), f">= {limit:.3f}",
                                "REGRESSION" if bad else ("improved" if better else "ok")))
        # 3. speedup (vanilla is 1 by definition)
        if b["decoder"] != "vanilla" and b.get("speedup") is not None:
            spread = tol.speedup_k * math.sqrt((b.get("speedup_std") or 0.0) ** 2 + (c.get("speedup_std") or 0.0) ** 2)
            margin = max(tol.speedup_abs, tol.speedup_rel * b["speedup"], spread)
            limit = b["speedup"] - margin
            cur = c.get("speedup")
            bad = cur is None or cur < limit
            better = cur is not None and cur > b["speedup"] + margin
            checks.append(Check(name, "speedup", _f(b["speedup"]), _f(cur), f">= {limit:.3f} (margin {margin:.3f})",
                                "REGRESSION" if bad else ("improved" if better else "ok")))
    for name in cur_cells.keys() - base_cells.keys():
        checks.append(Check(name, "present", "no", "yes", "-", "new"))
    return checks


def format_checks(checks: Sequence[Check]) -> str:
    """A readable table, regressions first."""
    order = {"REGRESSION": 0, "improved": 1, "new": 2, "note": 3, "ok": 4}
    checks = sorted(checks, key=lambda c: (order.get(c.verdict, 5), c.cell, c.metric))
    head = ("cell", "metric", "baseline", "current", "limit", "verdict")
    table = [head] + [(c.cell, c.metric, c.baseline, c.current, c.limit, c.verdict) for c in checks]
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_baseline(paths: Sequence[str | Path], out: str | Path, n_boot: int = 2000, seed: int = 0) -> Path:
    """Write the baseline JSON of the runs under ``paths`` to ``out``."""
    data = summarize_cells(paths, n_boot=n_boot, seed=seed)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.regress", description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write-baseline", nargs="+", metavar="RUN_DIR", help="write a baseline from these runs")
    mode.add_argument("--baseline", help="baseline JSON to compare against")
    parser.add_argument("--out", help="with --write-baseline: the JSON to write")
    parser.add_argument("--current", nargs="+", metavar="RUN_DIR", help="with --baseline: the run(s) to judge")
    parser.add_argument("--accept-length-tolerance", type=float, default=0.01, help="relative drop allowed")
    parser.add_argument("--equality-tolerance", type=float, default=0.02,
                        help="equality-rate drop allowed outside float32 (float32: no new divergence)")
    parser.add_argument("--speedup-tolerance", type=float, default=0.05, help="absolute speedup drop allowed")
    parser.add_argument("--speedup-rel-tolerance", type=float, default=0.0,
                        help="speedup drop allowed as a fraction of the baseline's")
    parser.add_argument("--speedup-k", type=float, default=2.0, help="drop allowed in combined bootstrap stds")
    parser.add_argument("--allow-missing", action="store_true", help="a baseline cell missing from the run is "
                        "not a regression")
    parser.add_argument("--bootstrap", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        if args.write_baseline:
            if not args.out:
                parser.error("--write-baseline needs --out")
            path = write_baseline(args.write_baseline, args.out, args.bootstrap, args.seed)
            cells = json.loads(path.read_text())["cells"]
            print(f"baseline with {len(cells)} cells written to {path}")
            return 0
        if not args.current:
            parser.error("--baseline needs --current RUN_DIR")
        baseline = json.loads(Path(args.baseline).read_text())
        if baseline.get("meta", {}).get("version") != BASELINE_VERSION:
            raise ValueError(f"{args.baseline}: baseline version {baseline.get('meta', {}).get('version')} != "
                             f"{BASELINE_VERSION}; write a new baseline")
        current = summarize_cells(args.current, args.bootstrap, args.seed)
        tol = Tolerances(args.accept_length_tolerance, args.equality_tolerance, args.speedup_tolerance,
                         args.speedup_rel_tolerance, args.speedup_k, args.allow_missing)
        checks = compare(baseline, current, tol)
    except (FileNotFoundError, ValueError, json.JSONDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"baseline: {args.baseline} (commit {baseline['meta'].get('git_commit')}, "
          f"{baseline['meta'].get('device_name')})")
    print(f"current:  {', '.join(args.current)} (commit {current['meta'].get('git_commit')})\n")
    print(format_checks(checks))
    failed = [c for c in checks if c.failed]
    print(f"\n{len(failed)} regression(s) in {len(checks)} checks" if failed else
          f"\nno regression ({len(checks)} checks)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
