"""The gate's checks and verdict: two cell summaries (:func:`harness.regress.cells.summarize_cells`, baseline and
run) compared cell by cell into :class:`Check` lines, a table of them, and the exit status.

Per cell: equality with vanilla, the deterministic counters, and speed as paired speedups judged against the
noise model's margin (:func:`harness.regress.noise.speed_margin`) unless contention or load says the timings
cannot be judged. What each check demands and why: docs/measurement.md, "The regression gate's statistics".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from harness.regress.cells import SETTINGS
from harness.regress.noise import MAX_CONTENTION, MIN_CLEAN_SHARE, shift, speed_margin
from harness.rows import columns

#: Exit status of a gate that found no regression but could not judge every speed check (busy or noisy).
EXIT_UNJUDGED = 3


@dataclass
class Tolerances:
    """Thresholds of the gate (``python -m harness.regress --help``; docs/measurement.md)."""

    accept_length: float = 0.01       # relative accept-length drop allowed outside float32
    equality: float = 0.02            # equality-rate drop allowed outside float32
    k: float = 2.0                    # margin in standard errors of the baseline-vs-run difference
    assumed_noise: float = 0.03       # relative noise of a figure assumed where no repeats measured it
    min_margin: float = 0.02          # the margin is at least this fraction of the baseline ...
    max_margin: float = 0.5           # ... and a larger margin needed means the check cannot be judged
    allow_missing: bool = False
    max_load_per_core: float = 2.5   # rows without measured contention, above this load x cores: not judged
    max_contention: float = MAX_CONTENTION  # pairs that waited longer for a CPU (share of wall) are left out


@dataclass(frozen=True)
class CrossClass:
    """A run judged against the baseline of another machine class (:mod:`harness.regress.classes`).

    Attributes:
        spread: per cell, the spread of its speedup between the recorded machine classes (``ln(max / min)``,
            after each class's common shift; :func:`harness.regress.classes.spreads`): the speed margin is widened
            by it; a cell without one is not judged (UNGATED).
        against: the baseline's machine class in words.
        shift: per cell, this run's common shift against that class estimated from the OTHER cells, ``ln`` of the
            factor the run's speedups sit above (or below) the class's (:func:`harness.regress.classes.
            common_shift`); the cell's speedup is divided by ``exp(shift)`` before it is judged. A cell without
            one: none.
    """

    spread: Mapping[str, float]
    against: str
    shift: Mapping[str, float] = field(default_factory=dict)


@dataclass
class Check:
    """One line of the gate's table: a metric of a cell, its baseline and current values (text), the limit it
    was held to, and the verdict."""

    cell: str
    metric: str
    baseline: str
    current: str
    limit: str
    verdict: str  # ok | REGRESSION | UNGATED | improved | new | note
    reason: str = ""  # UNGATED: why, in a few words (for the gate's last line)

    @property
    def failed(self) -> bool:
        return self.verdict == "REGRESSION"

    @property
    def unjudged(self) -> bool:
        """A speed check the gate could not judge (machine busy or noise too large): not a pass."""
        return self.verdict == "UNGATED"


def fmt_number(v: float | None, fmt: str = ".3f") -> str:
    """``v`` formatted with ``fmt``, ``-`` for None."""
    return "-" if v is None else format(v, fmt)


_f = fmt_number  # the short name the check lines below use


def compare(baseline: dict[str, Any], current: dict[str, Any], tol: Tolerances, cross: CrossClass | None = None
            ) -> list[Check]:
    """All checks of ``current`` against ``baseline`` (both as returned by
    :func:`harness.regress.cells.summarize_cells`); ``cross`` when the run's machine class is not the
    baseline's (:mod:`harness.regress.classes` decides).

    Raises:
        ValueError: when a cell was measured on a different sample set, budget or task version.
    """
    checks: list[Check] = []
    base_cells, cur_cells = baseline["cells"], current["cells"]
    threads = (baseline.get("meta", {}).get("torch_num_threads"), current.get("meta", {}).get("torch_num_threads"))
    for name, b in base_cells.items():
        c = cur_cells.get(name)
        if c is None:
            checks.append(Check(name, "present", "yes", "missing", "-", "note" if tol.allow_missing else "REGRESSION"))
            continue
        for k in SETTINGS:
            if k in b and _setting(c, k) != _setting(b, k):
                raise ValueError(f"{name}: {k} is {_setting(c, k)} in the run but {_setting(b, k)} in the baseline; "
                                 f"the numbers are not comparable (rerun with the baseline's settings or write a "
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
        checks += _speed(name, b, c, tol, threads, cross)
    for name in cur_cells.keys() - base_cells.keys():
        checks.append(Check(name, "present", "no", "yes", "-", "new"))
    return checks


def _setting(cell: dict, key: str) -> Any:
    """A cell's setting, with the greedy default for sampling settings a cell (or an older baseline) lacks."""
    if key not in cell and key in columns.SAMPLING_DEFAULTS:
        return columns.fmt_value(columns.SAMPLING_DEFAULTS[key])
    return cell.get(key)


def _equality(name: str, b: dict, c: dict, fp32: bool, tol: Tolerances) -> list[Check]:
    if b["decoder"] == "vanilla":
        return []
    if columns.EQUALITY_SAMPLED in (b.get("equality_check"), c.get("equality_check")):
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


def contended(c: dict) -> str | None:
    """Why a cell's timed pairs met too much contention to judge its speed (fewer than
    :data:`harness.regress.noise.MIN_CLEAN_SHARE` of them uncontended), or None; None where contention was not
    measured."""
    con = c.get("contention") or {}
    if not con.get("measured"):
        return None
    clean = con["timed"] - con["over"]
    if clean > 0 and clean >= MIN_CLEAN_SHARE * con["timed"]:
        return None
    return (f"contended: {con['over']} of {con['timed']} timed pairs waited > {con['limit']:.0%} of their wall "
            f"time for a CPU (median {con['median']:.0%}); re-measure on a quieter machine")


def _busy(c: dict, tol: Tolerances) -> str | None:
    """Why the run's rows of a cell ran on too busy a machine to judge speed, or None: measured contention
    (:func:`contended`), else (rows that did not measure it) the 1-minute load average."""
    if (c.get("contention") or {}).get("measured"):
        return contended(c)
    load = c.get("load") or {}
    peak, cores = load.get("peak"), load.get("cores")
    if peak is not None and cores and peak > tol.max_load_per_core * cores:
        return (f"machine busy: load {peak:.1f} on {cores:g} usable cores > {tol.max_load_per_core:g} x cores; "
                f"re-measure on a quieter machine")
    return None


def contention_text(con: dict | None) -> str:
    """The rows' measured contention in words (``contention not measured`` for older rows)."""
    if not con or not con.get("measured"):
        return "contention not measured"
    return (f"run delay median {con['median']:.1%} of wall, {con['over']} of {con['timed']} timed calls over "
            f"{con['limit']:.0%}")


def _load_text(c: dict) -> str:
    """The conditions a cell was timed in: its measured contention, else its 1-minute load."""
    con = c.get("contention") or {}
    if con.get("measured"):
        return (f"contention: median run delay {con['median']:.1%} of wall, {con['over']} of {con['timed']} "
                f"pairs over {con['limit']:.0%}")
    load = c.get("load") or {}
    return (f"load {load['peak']:.1f} on {load['cores']:g} cores" if load.get("peak") is not None and load.get("cores")
            else "load not recorded")


def _speed(name: str, b: dict, c: dict, tol: Tolerances, threads: tuple[Any, Any] = (None, None),
           cross: CrossClass | None = None) -> list[Check]:
    """The speed checks of a cell: its speedup over paired timings, gated unless contention (or, for rows
    that did not measure it, the load) says it cannot be judged, its margin widened by ``cross.spread`` on
    another machine class (not judged without one); its tokens/s, reported and not gated (absolute speed
    differs between processes and with load in ways no paired ratio does)."""
    out = []
    other = None
    if b.get("device_name") != c.get("device_name"):
        other = f"other machine ({c.get('device_name')} vs {b.get('device_name')})"
    elif None not in threads and threads[0] != threads[1]:
        other = f"other torch thread count ({threads[1]} vs {threads[0]})"
    if b.get("tokens_per_s") is not None:
        out.append(Check(name, "tokens_per_s", _f(b["tokens_per_s"]), _f(c.get("tokens_per_s")),
                         f"not gated: {other or 'absolute speed differs between processes and with load'}; "
                         f"speed is gated as paired speedups", "note"))
    base, cur = b.get("speedup"), c.get("speedup")
    if base is None or b["decoder"] == "vanilla":
        return out
    busy = _busy(c, tol)
    if busy:
        return out + [Check(name, "speedup", _f(base), _f(cur), busy, "UNGATED", busy.split("; ")[0])]
    if cur is None:
        return out + [Check(name, "speedup", _f(base), "-", "no figure: no timed (paired) rows", "REGRESSION")]
    bv, cv = b.get("speedup_values") or {}, c.get("speedup_values") or {}
    bs = {"noise": b.get("speedup_noise"), "counts": [len(v) for v in bv.values()], "replicates": b.get("replicates")}
    cs = {"noise": c.get("speedup_noise"), "counts": [len(v) for v in cv.values()], "replicates": c.get("replicates")}
    moved, n = shift(bv, cv)
    if moved is not None:  # the run's figure on the baseline's footing (see shift)
        cur = base * math.exp(moved)
    con = c.get("contention") or {}
    if not con.get("measured") and (c.get("load") or {}).get("rows_over") and cs["noise"] is None:
        why = f"machine loaded ({_load_text(c)}) and the run has no repeats to measure its noise"
        return out + [Check(name, "speedup", _f(base), _f(cur), f"{why}: re-measure with runner.repeats>=3 or on "
                            f"a quiet machine", "UNGATED", why)]
    margin, how = speed_margin(bs, cs, tol)
    if moved is not None:
        how = f"run = baseline x exp(median shift over {n} timings); " + how
    if con.get("over"):
        how += f"; {con['over']} of {con['timed']} pairs left out (waited > {con['limit']:.0%} for a CPU)"
    if margin is None:
        return out + [Check(name, "speedup", _f(base), _f(cur), f"{how} ({_load_text(c)})", "UNGATED",
                            f"timing noise too large, {_load_text(c)}")]
    if cross is not None:
        spread = cross.spread.get(name)
        machine_shift = cross.shift.get(name)
        if machine_shift:  # the run on the class's footing: its shift against that machine (other cells) removed
            cur *= math.exp(-machine_shift)
            how = (f"run x {math.exp(-machine_shift):.3f} (this machine's shift against {cross.against}, other "
                   f"cells); {how}")
        if spread is None:
            why = (f"other machine class (baseline: {cross.against}) and no spread between recorded classes to "
                   f"widen the margin by: record this machine's baseline (bash benchmarks/ci_regress.sh --update)")
            return out + [Check(name, "speedup", _f(base), _f(cur), why, "UNGATED",
                                "no baseline for this machine class")]
        margin = 1.0 - (1.0 - margin) * math.exp(-spread)
        how = (f"vs {cross.against}: {how}; widened by {1.0 - math.exp(-spread):.1%}, the spread between recorded "
               f"machine classes")
        if margin > tol.max_margin:
            return out + [Check(name, "speedup", _f(base), _f(cur), f"{how}; margin {margin:.0%} > max "
                                f"{tol.max_margin:.0%}", "UNGATED", "machine classes differ too much")]
    limit = base * (1.0 - margin)
    better = cur > base * (1.0 + margin)
    return out + [Check(name, "speedup", _f(base), _f(cur), f">= {limit:.3f} (margin {margin:.1%}: {how})",
                        "REGRESSION" if cur < limit else ("improved" if better else "ok"))]


def format_checks(checks: Sequence[Check]) -> str:
    """A readable table, regressions first, then unjudged speed checks."""
    order = {"REGRESSION": 0, "UNGATED": 1, "improved": 2, "new": 3, "note": 4, "ok": 5}
    checks = sorted(checks, key=lambda c: (order.get(c.verdict, 6), c.cell, c.metric))
    head = ("cell", "metric", "baseline", "current", "verdict", "limit")
    table = [head] + [(c.cell, c.metric, c.baseline, c.current, c.verdict, c.limit) for c in checks]
    widths = [max(len(r[i]) for r in table) for i in range(len(head) - 1)]
    lines = ["  ".join([*(v.ljust(w) for v, w in zip(r[:-1], widths)), r[-1]]).rstrip() for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths) + "  -----")
    return "\n".join(lines)


def verdict(checks: Sequence[Check]) -> tuple[int, str]:
    """The gate's exit status and its last line: 1 on any regression, else 3 (:data:`EXIT_UNJUDGED`) when a
    speed check could not be judged, else 0."""
    failed = [c for c in checks if c.failed]
    unjudged = [c for c in checks if c.unjudged]
    why = ""
    if unjudged:
        reasons = list(dict.fromkeys(c.reason or c.limit for c in unjudged))
        why = (f"{len(unjudged)} speed check(s) NOT JUDGED ({'; '.join(reasons[:2])}"
               f"{'; ...' if len(reasons) > 2 else ''})")
    if failed:
        return 1, f"{len(failed)} regression(s) in {len(checks)} checks" + (f"; {why}" if why else "")
    if unjudged:
        return EXIT_UNJUDGED, (f"NOT A PASS: {why}; no regression in the {len(checks) - len(unjudged)} checks "
                               f"that could be judged. Re-measure on a quieter machine (exit {EXIT_UNJUDGED})")
    return 0, f"no regression ({len(checks)} checks)"
