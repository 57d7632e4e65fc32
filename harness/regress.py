"""Regression gate: compare a run against a small JSON baseline; exit 1 on a regression.

Usage::

    python -m harness.regress --write-baseline RUN [RUN ...] --out baseline.json   # baseline from run(s)
    python -m harness.regress --baseline baseline.json --current RUN [RUN ...]

A *cell* is (task, model pair, decoder configuration); all numbers come from :mod:`harness.metrics`. Per
cell the gate checks:

1. **Equality with vanilla.** float32: no sample that matched vanilla in the baseline may diverge now. Half
   precision (where batched verification may flip near-ties): the equality rate may drop by at most
   ``--equality-tolerance``. Sampled runs (``equality_check = "n/a (sampled)"``) make no token claim: the
   check says ``n/a`` and is not gated (their losslessness is a distribution property, tested in CI).
2. **Deterministic counters.** float32: the totals of new tokens, target forwards, draft forwards, drafted
   and accepted tokens over the samples, and a digest of their per-sample values, must equal the
   baseline's EXACTLY (so accept length, target forwards per token and draft forwards per token are gated
   exactly); repeats of one greedy sample that disagree fail too. Sampled rows count once per (sample, seed,
   repeat): each draw is deterministic given its seed, and baseline and run must use the same seeds. Half precision: accept length may drop by
   ``--accept-length-tolerance`` (relative).
3. **Speed, against run-to-run noise.** For every decoder but vanilla its speedup (paired, within the run),
   and for every decoder its tokens/s when baseline and run come from the same machine (``device_name``),
   must stay above ``baseline - margin``, with::

       margin = k * sigma * sqrt(1/R_baseline + 1/R_current), clipped to [min-margin, max-margin] x baseline

   ``sigma`` is the run-to-run noise of the cell's figure: the standard deviation over *replicates* (one
   ``(run, repeat)``; ``runner.repeats`` or several runs given to ``--write-baseline``), pooled between
   baseline and run where both measured it. Without replicates it is ``--assumed-noise`` x baseline
   (default 3 %), and the output says it was assumed. ``R`` counts replicates. How samples differ from each
   other never enters the margin: the gate asks whether the same samples ran slower than last time.

A cell of the baseline missing from the run fails (``--allow-missing`` to accept); a new cell is listed.
Runs over a different sample set, budget, task version, sampling settings or seeds than the baseline's are
refused (exit 2).

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


from harness import metrics
from harness.report import find_result_files, load_rows

BASELINE_VERSION = 2


def _sample_digest(sample_ids: Sequence[str]) -> str:
    return hashlib.sha1("\n".join(sorted(set(map(str, sample_ids)))).encode()).hexdigest()[:12]


def _cell_name(task: str, model_pair: str, label: str) -> str:
    return f"{task} | {model_pair} | {label}"


#: Per-cell settings that must agree between baseline and run for the numbers to be comparable (checked where
#: both sides record them; baselines written before the sampling settings existed were greedy).
SETTINGS = ("max_new_tokens", "task_version", "temperature", "top_p", "top_k", "sampling_seeds")


def _finite(v: Any) -> float | None:
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) or math.isinf(v) else v


def summarize_cells(paths: Sequence[str | Path], n_boot: int = 200, seed: int = 0) -> dict[str, Any]:
    """The baseline-shaped summary of the runs under ``paths``: ``{"meta": ..., "cells": {name: stats}}``.

    Raises:
        ValueError: no rows, or one cell holds rows of several run identities (gate one identity at a time).
    """
    rows = load_rows(paths)
    if rows.empty:
        raise ValueError(f"no result rows under {', '.join(map(str, paths))}")
    agg = metrics.aggregate(rows, n_boot=n_boot, seed=seed)
    ok = rows[rows["status"] == "ok"]
    cells: dict[str, Any] = {}
    for _, r in agg.iterrows():
        name = _cell_name(r["task"], r["model_pair"], r["label"])
        if name in cells:
            raise ValueError(f"{name}: the rows hold several run identities ({cells[name]['group']} and "
                             f"{r['group']}); give the gate one run identity (one code version, dtype, machine)")
        mine = ok[(ok["group"] == r["group"]) & (ok["label"] == r["label"])]
        counters = metrics.counters(mine)
        cells[name] = {
            "group": r["group"],
            "task": r["task"],
            "model_pair": r["model_pair"],
            "decoder": r["decoder"],
            "label": r["label"],
            "dtype": metrics.fmt_value(r.get("dtype")),
            "device_name": metrics.fmt_value(r.get("device_name")),
            **{k: metrics.fmt_value(r.get(k)) for k in SETTINGS if k in r},
            **({"sampling_seeds": sorted(metrics.fmt_value(v) for v in mine["sampling_seed"].dropna().unique())}
               if "sampling_seed" in mine and mine["sampling_seed"].notna().any() else {}),
            "equality_check": r.get("equality_check") if isinstance(r.get("equality_check"), str) else None,
            "samples": int(r["samples"]),
            "replicates": int(r.get("replicates") or 1),
            "failed": int(r.get("failed", 0) or 0),
            "sample_digest": _sample_digest(mine["sample_id"].astype(str).tolist()),
            "equal_to_vanilla": _finite(r.get("equal_to_vanilla")),
            "divergent_samples": list(r["divergent_samples"]) if isinstance(r.get("divergent_samples"), list) else [],
            "accept_length": _finite(r.get("accept_length")),
            "counters": counters["totals"],
            "counters_digest": counters["digest"],
            "inconsistent_samples": counters["inconsistent_samples"],
            "speedup": _finite(r.get("speedup")),
            "speedup_noise": _finite(r.get("speedup_repeat_std")),
            "tokens_per_s": _finite(r.get("tokens_per_s")),
            "tokens_per_s_noise": _finite(r.get("tokens_per_s_repeat_std")),
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

    accept_length: float = 0.01       # relative accept-length drop allowed outside float32
    equality: float = 0.02            # equality-rate drop allowed outside float32
    k: float = 2.0                    # margin in standard errors of the baseline-vs-run difference
    assumed_noise: float = 0.03       # relative run-to-run noise assumed where no replicates measured it
    min_margin: float = 0.02          # the margin is at least this fraction of the baseline ...
    max_margin: float = 0.5           # ... and at most this fraction (limits stay positive)
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


def speed_margin(base: float, b_noise: float | None, b_reps: int, c_noise: float | None, c_reps: int,
                 tol: Tolerances) -> tuple[float, str]:
    """The speed check's margin (absolute, in the figure's units) and how it was obtained.

    ``sigma`` pools the replicate standard deviations measured on each side (degrees of freedom R - 1);
    without any, it is ``assumed_noise * base``. margin = k * sigma * sqrt(1/R_b + 1/R_c), clipped to
    ``[min_margin, max_margin] * base``.
    """
    parts = [(s, r) for s, r in ((b_noise, b_reps), (c_noise, c_reps)) if s is not None and r >= 2]
    if parts:
        sigma = math.sqrt(sum(s * s * (r - 1) for s, r in parts) / sum(r - 1 for _, r in parts))
        how = f"k={tol.k:g} x sigma {sigma / base:.1%} measured over replicates"
    else:
        sigma = tol.assumed_noise * base
        how = f"k={tol.k:g} x sigma {tol.assumed_noise:.1%} ASSUMED (no replicates)"
    margin = tol.k * sigma * math.sqrt(1.0 / max(b_reps, 1) + 1.0 / max(c_reps, 1))
    how += f" x sqrt(1/{b_reps}+1/{c_reps})"
    if margin < tol.min_margin * base:
        margin, how = tol.min_margin * base, how + f"; raised to the {tol.min_margin:.0%} floor"
    elif margin > tol.max_margin * base:
        margin, how = tol.max_margin * base, how + f"; CAPPED at {tol.max_margin:.0%} (noise too large to gate " \
                                                   f"well: expect false alarms, measure on a quieter machine)"
    return margin, how


def compare(baseline: dict[str, Any], current: dict[str, Any], tol: Tolerances) -> list[Check]:
    """All checks of ``current`` against ``baseline`` (both as returned by :func:`summarize_cells`).

    Raises:
        ValueError: when a cell was measured on a different sample set, budget or task version.
    """
    checks: list[Check] = []
    base_cells, cur_cells = baseline["cells"], current["cells"]
    for name, b in base_cells.items():
        c = cur_cells.get(name)
        if c is None:
            checks.append(Check(name, "present", "yes", "missing", "-", "note" if tol.allow_missing else "REGRESSION"))
            continue
        for k in SETTINGS:
            if k in b and _setting(c, k) != _setting(b, k):
                raise ValueError(f"{name}: {k} is {_setting(c, k)} in the run but {_setting(b, k)} in the baseline; the "
                                 f"numbers are not comparable (rerun with the baseline's settings or write a "
                                 f"new baseline)")
        if c["sample_digest"] != b["sample_digest"] or c["samples"] != b["samples"]:
            raise ValueError(f"{name}: the run covers {c['samples']} samples (digest {c['sample_digest']}), the "
                             f"baseline {b['samples']} (digest {b['sample_digest']}); compare runs over the same "
                             f"samples (task.limit, max_new_tokens) or write a new baseline")
        if c.get("failed"):
            checks.append(Check(name, "failed cells", str(b.get("failed", 0)), str(c["failed"]), "0", "REGRESSION"))
        fp32 = (c.get("dtype") or b.get("dtype")) == "float32"
        checks += _equality(name, b, c, fp32, tol)
        checks += _counters(name, b, c, fp32, tol)
        checks += _speed(name, b, c, tol)
    for name in cur_cells.keys() - base_cells.keys():
        checks.append(Check(name, "present", "no", "yes", "-", "new"))
    return checks


def _setting(cell: dict, key: str) -> Any:
    """A cell's setting, with the greedy default for sampling settings a cell (or an older baseline) lacks."""
    if key not in cell and key in metrics.SAMPLING_DEFAULTS:
        return metrics.fmt_value(metrics.SAMPLING_DEFAULTS[key])
    return cell.get(key)


def _equality(name: str, b: dict, c: dict, fp32: bool, tol: Tolerances) -> list[Check]:
    if b["decoder"] == "vanilla":
        return []
    if metrics.EQUALITY_SAMPLED in (b.get("equality_check"), c.get("equality_check")):
        # sampled rows make no token-for-token claim (matches_vanilla is null); their counters are still gated
        return [Check(name, "equal_to_vanilla", "n/a", "n/a", "not gated: sampled run (lossless in distribution, "
                      "checked by the distribution tests)", "note")]
    be, ce = b.get("equal_to_vanilla") or 0.0, c.get("equal_to_vanilla") or 0.0
    if fp32:
        new = sorted(set(c.get("divergent_samples", [])) - set(b.get("divergent_samples", [])))
        chk = Check(name, "equal_to_vanilla", _f(be), _f(ce), "no new divergence (float32)",
                    "REGRESSION" if new else ("improved" if ce > be else "ok"))
        if new:
            chk.current += f" (new: {', '.join(new[:5])}{' ...' if len(new) > 5 else ''})"
        return [chk]
    limit = be - tol.equality
    return [Check(name, "equal_to_vanilla", _f(be), _f(ce), f">= {limit:.3f}",
                  "REGRESSION" if ce < limit - 1e-12 else "ok")]


def _counters(name: str, b: dict, c: dict, fp32: bool, tol: Tolerances) -> list[Check]:
    if fp32:
        out = []
        bt, ct = b.get("counters") or {}, c.get("counters") or {}
        for k in bt:
            out.append(Check(name, k, str(bt[k]), str(ct.get(k, "-")), "== (float32)",
                             "ok" if ct.get(k) == bt[k] else "REGRESSION"))
        if all(ct.get(k) == bt[k] for k in bt) and c.get("counters_digest") != b.get("counters_digest"):
            out.append(Check(name, "per-sample counters", b.get("counters_digest", "-"), c.get("counters_digest", "-"),
                             "== (float32)", "REGRESSION"))
        if c.get("inconsistent_samples"):
            out.append(Check(name, "repeats agree", "yes", "no: " + ", ".join(c["inconsistent_samples"][:5]),
                             "== (float32)", "REGRESSION"))
        return out
    if b.get("accept_length") is None:
        return []
    limit = b["accept_length"] * (1.0 - tol.accept_length)
    cur = c.get("accept_length")
    bad = cur is None or cur < limit - 1e-12
    better = cur is not None and cur > b["accept_length"] * (1.0 + tol.accept_length)
    return [Check(name, "accept_length", _f(b["accept_length"]), _f(cur), f">= {limit:.3f}",
                  "REGRESSION" if bad else ("improved" if better else "ok"))]


def _speed(name: str, b: dict, c: dict, tol: Tolerances) -> list[Check]:
    out = []
    same_machine = b.get("device_name") == c.get("device_name")
    for metric, noise in (("speedup", "speedup_noise"), ("tokens_per_s", "tokens_per_s_noise")):
        base = b.get(metric)
        if base is None or (metric == "speedup" and b["decoder"] == "vanilla"):
            continue
        if metric == "tokens_per_s" and not same_machine:
            out.append(Check(name, metric, _f(base), _f(c.get(metric)), "not gated: other machine "
                             f"({c.get('device_name')} vs {b.get('device_name')})", "note"))
            continue
        margin, how = speed_margin(base, b.get(noise), int(b.get("replicates") or 1), c.get(noise),
                                   int(c.get("replicates") or 1), tol)
        cur = c.get(metric)
        limit = base - margin
        bad = cur is None or cur < limit
        better = cur is not None and cur > base + margin
        out.append(Check(name, metric, _f(base), _f(cur),
                         f">= {limit:.3f} (margin {margin / base:.1%}: {how})",
                         "REGRESSION" if bad else ("improved" if better else "ok")))
    return out


def format_checks(checks: Sequence[Check]) -> str:
    """A readable table, regressions first."""
    order = {"REGRESSION": 0, "improved": 1, "new": 2, "note": 3, "ok": 4}
    checks = sorted(checks, key=lambda c: (order.get(c.verdict, 5), c.cell, c.metric))
    head = ("cell", "metric", "baseline", "current", "verdict", "limit")
    table = [head] + [(c.cell, c.metric, c.baseline, c.current, c.verdict, c.limit) for c in checks]
    widths = [max(len(r[i]) for r in table) for i in range(len(head) - 1)]
    lines = ["  ".join([*(v.ljust(w) for v, w in zip(r[:-1], widths)), r[-1]]).rstrip() for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths) + "  -----")
    return "\n".join(lines)


def write_baseline(paths: Sequence[str | Path], out: str | Path, n_boot: int = 200, seed: int = 0) -> Path:
    """Write the baseline JSON of the runs under ``paths`` to ``out`` (several runs of one identity count as
    replicates for the noise)."""
    data = summarize_cells(paths, n_boot=n_boot, seed=seed)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.regress", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write-baseline", nargs="+", metavar="RUN", help="write a baseline from these runs "
                      "(several runs of one configuration = replicates that measure run-to-run noise)")
    mode.add_argument("--baseline", help="baseline JSON to compare against")
    parser.add_argument("--out", help="with --write-baseline: the JSON to write")
    parser.add_argument("--current", nargs="+", metavar="RUN", help="with --baseline: the run(s) to judge")
    parser.add_argument("--accept-length-tolerance", type=float, default=0.01,
                        help="relative accept-length drop allowed outside float32 (float32: counters exact)")
    parser.add_argument("--equality-tolerance", type=float, default=0.02,
                        help="equality-rate drop allowed outside float32 (float32: no new divergence)")
    parser.add_argument("--k", type=float, default=2.0, help="speed margin in standard errors of the difference")
    parser.add_argument("--assumed-noise", type=float, default=0.03,
                        help="relative run-to-run noise assumed when no replicates measured it")
    parser.add_argument("--min-margin", type=float, default=0.02, help="smallest speed margin (fraction)")
    parser.add_argument("--max-margin", type=float, default=0.5, help="largest speed margin (fraction)")
    parser.add_argument("--allow-missing", action="store_true", help="a baseline cell missing from the run is "
                        "not a regression")
    args = parser.parse_args(argv)
    try:
        if args.write_baseline:
            if not args.out:
                parser.error("--write-baseline needs --out")
            path = write_baseline(args.write_baseline, args.out)
            cells = json.loads(path.read_text())["cells"]
            reps = sorted({c["replicates"] for c in cells.values()})
            print(f"baseline with {len(cells)} cells ({'/'.join(map(str, reps))} replicates) written to {path}")
            return 0
        if not args.current:
            parser.error("--baseline needs --current RUN")
        baseline = json.loads(Path(args.baseline).read_text())
        if baseline.get("meta", {}).get("version") != BASELINE_VERSION:
            raise ValueError(f"{args.baseline}: baseline version {baseline.get('meta', {}).get('version')} != "
                             f"{BASELINE_VERSION}; write a new baseline (--write-baseline)")
        current = summarize_cells(args.current)
        tol = Tolerances(args.accept_length_tolerance, args.equality_tolerance, args.k, args.assumed_noise,
                         args.min_margin, args.max_margin, args.allow_missing)
        checks = compare(baseline, current, tol)
    except (FileNotFoundError, ValueError, json.JSONDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"baseline: {args.baseline} (commit {baseline['meta'].get('git_commit')}, "
          f"{baseline['meta'].get('device_name')})")
    print(f"current:  {', '.join(args.current)} (commit {current['meta'].get('git_commit')}, "
          f"{current['meta'].get('device_name')})\n")
    print(format_checks(checks))
    failed = [c for c in checks if c.failed]
    print(f"\n{len(failed)} regression(s) in {len(checks)} checks" if failed else
          f"\nno regression ({len(checks)} checks)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
