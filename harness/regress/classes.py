"""One gate baseline per machine class, and how a run is judged on a class that has none of its own.

A tiny model's paired speedups depend on the CPU, not only on the code: its steps are host overhead, and how a
decoder's extra Python and small ops weigh against vanilla's differs between microarchitectures. Measured with
the CI job (3 quiet runs x 70 repeats each, same commit, identical counters): speculative 0.816 / 0.801, prompt
lookup 1.692 / 1.639, Lookahead 1.257 / 1.203, Ouroboros 1.101 / 1.050 on a 2-core AMD EPYC (Zen 3, AVX2) / a
2-core Intel Xeon (AVX-512, AMX): every decoder 2-5 % lower on the Xeon. Judged against the EPYC's baseline, a
quiet Xeon run of unchanged code read Ouroboros 1.043 against a limit of 1.046: a false alarm.

So a baseline is a folder of JSON files, one per machine class (:func:`class_of`: the CPU as ``device_name``
names it, and the torch thread count), and a run is judged:

* on a class with a baseline of its own: against that one alone, with the noise model's margin;
* on a class without one, where two or more classes are recorded: each cell against the recorded class that the
  run's OTHER speed cells resemble most (least squares of their ``ln`` ratios once the shift is removed; the
  cell's own value cannot choose a class that excuses it), its speedup first divided by the run's *common
  shift* against that class estimated from the other cells (:func:`common_shift`: the median of
  ``ln(run / class)`` over them, the factor by which every decoder's speedup sits higher or lower on this
  machine), the margin of its speed check widened by the cell's spread between the recorded classes after their
  own shifts (:func:`spreads`). Measured: every decoder sits 2-5 % lower on the Xeon and 5-13 % lower on a Zen 5
  EPYC than on the Zen 3, mostly a common shift (what is left: at most ~6 %, Ouroboros). Widening by the raw
  spread, cell by cell against its most favourable class (the rule first built), let a 1.2x slowdown of one
  decoder pass once three classes were recorded. With fewer than three other shared speed cells there is no shift
  to estimate: the run is judged unshifted against the raw spread. Counters and equality are exact as always
  (float32), against that class;
* on a class without one, where one class is recorded: counters and equality are gated, speed is not judged
  (exit 3, never a pass): one machine says nothing about how far another one's speedups may sit.

``benchmarks/ci_regress.sh --update`` writes the current machine's file (:func:`file_name`). Reads JSON only.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from harness.regress.cells import BASELINE_VERSION
from harness.regress.checks import CrossClass, Check, Tolerances, compare


@dataclass(frozen=True)
class Baseline:
    """One machine class's baseline: where it was read from and its JSON (``{"meta": ..., "cells": ...}``)."""

    path: Path
    data: dict[str, Any]

    @property
    def machine(self) -> tuple[Any, Any]:
        return class_of(self.data)


def class_of(summary: dict[str, Any]) -> tuple[Any, Any]:
    """The machine class of a baseline or run summary: ``(device_name, torch_num_threads)`` from its meta (a
    list of thread counts, from runs that differ, as a tuple)."""
    meta = summary.get("meta") or {}
    threads = meta.get("torch_num_threads")
    return meta.get("device_name"), tuple(threads) if isinstance(threads, list) else threads


def same_class(a: tuple[Any, Any], b: tuple[Any, Any]) -> bool:
    """Whether two machine classes are one: the same ``device_name``, and the same thread count where both
    recorded one (rows and baselines written before thread counts were recorded match on the device)."""
    return a[0] == b[0] and (a[1] == b[1] or None in (a[1], b[1]))


def describe(machine: tuple[Any, Any]) -> str:
    """A machine class in words: ``AMD EPYC [25/1] (2 cores, avx2), 1 torch thread(s)``."""
    return f"{machine[0]}, {machine[1] if machine[1] is not None else '?'} torch thread(s)"


def file_name(summary: dict[str, Any]) -> str:
    """The file a machine class's baseline is written to inside a baseline folder: its ``device_name`` and
    thread count as a slug, ``amd-epyc-25-1-2-cores-avx2-t1.json``."""
    device, threads = class_of(summary)
    slug = re.sub(r"[^a-z0-9]+", "-", re.sub(r"\((r|tm)\)", "", str(device or "unknown").lower())).strip("-")
    return f"{slug}-t{threads if threads is not None else 'x'}.json"


def load(paths: Sequence[str | Path]) -> list[Baseline]:
    """The baselines named by ``paths``: JSON files, or folders whose ``*.json`` files are read (sorted).

    Raises:
        ValueError: no baseline found, a file of another baseline version, or two files of one machine class.
        FileNotFoundError: a path that does not exist.
        json.JSONDecodeError: a file that is not JSON.
    """
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(p.glob("*.json"))
        elif p.exists():
            files.append(p)
        else:
            raise FileNotFoundError(f"{p}: no such baseline file or folder")
    if not files:
        raise ValueError(f"no baseline JSON under {', '.join(map(str, paths))}; write one on this machine "
                         f"(bash benchmarks/ci_regress.sh --update)")
    out: list[Baseline] = []
    for f in files:
        data = json.loads(f.read_text())
        version = (data.get("meta") or {}).get("version")
        if version != BASELINE_VERSION:
            raise ValueError(f"{f}: baseline version {version} != {BASELINE_VERSION}; write a new baseline "
                             f"(--write-baseline)")
        b = Baseline(f, data)
        twin = next((o for o in out if o.machine == b.machine), None)
        if twin is not None:
            raise ValueError(f"{twin.path} and {f} are both baselines of {describe(b.machine)}; keep one per "
                             f"machine class")
        out.append(b)
    return out


#: Speed cells a run and a class must share for a common shift to be estimated (fewer: none, see the docstring).
MIN_SHIFT_CELLS = 3


def _speedups(summary: dict[str, Any]) -> dict[str, float]:
    return {name: float(cell["speedup"]) for name, cell in summary["cells"].items()
            if cell.get("speedup") and cell["speedup"] > 0}


def common_shift(current: dict[str, Any], baseline: dict[str, Any], leave_out: str | None = None) -> float | None:
    """The median over the speed cells both have (but ``leave_out``) of ``ln(current speedup / baseline speedup)``:
    how far every decoder's speedup sits above (> 0) or below that class's on this machine. ``None`` below
    :data:`MIN_SHIFT_CELLS` such cells (a median of one or two cells would absorb a regression). A cell is judged
    with the shift of the others (``leave_out`` = the cell), so its own slowdown cannot move its footing."""
    a, b = _speedups(current), _speedups(baseline)
    logs = [math.log(a[n] / b[n]) for n in a.keys() & b.keys() if n != leave_out]
    return statistics.median(logs) if len(logs) >= MIN_SHIFT_CELLS else None


def spreads(baselines: Sequence[Baseline], shifted: bool = True) -> dict[str, float]:
    """Per cell, ``ln(max / min)`` of its speedup over the recorded classes that have one, each class's speedup of
    the cell first divided by that class's common shift against the first class over the other cells
    (``shifted``; none where too few are shared), or as recorded (``shifted=False``); only cells that two or more
    classes measured."""
    values: dict[str, list[float]] = {}
    for b in baselines:
        for name, speedup in _speedups(b.data).items():
            shift = (common_shift(b.data, baselines[0].data, leave_out=name) or 0.0) if shifted else 0.0
            values.setdefault(name, []).append(math.log(speedup) - shift)
    return {name: max(v) - min(v) for name, v in values.items() if len(v) >= 2}


def judge(baselines: Sequence[Baseline], current: dict[str, Any], tol: Tolerances
          ) -> tuple[list[Check], list[Baseline], str]:
    """The checks of ``current`` against the baselines as the module docstring says, the baselines used, and
    a line saying how the machine class was matched.

    Raises:
        ValueError: from :func:`harness.regress.checks.compare` (runs over other samples or settings).
    """
    machine = class_of(current)
    own = [b for b in baselines if same_class(b.machine, machine)]
    if own:
        return compare(own[0].data, current, tol), own, f"machine class recorded: {describe(machine)}"
    recorded = "; ".join(describe(b.machine) for b in baselines)
    spread, raw = spreads(baselines), spreads(baselines, shifted=False)
    if len(baselines) < 2 or not spread:
        cross = CrossClass({}, describe(baselines[0].machine))
        return (compare(baselines[0].data, current, tol, cross), list(baselines[:1]),
                f"machine class NOT recorded ({describe(machine)}): speed not judged against another machine; "
                f"record this one (bash benchmarks/ci_regress.sh --update)")
    speed = _speedups(current)
    per_class = []
    for b in baselines:
        shifts = {name: common_shift(current, b.data, leave_out=name) for name in speed}
        if speed and all(v is not None for v in shifts.values()):
            cross = CrossClass(spread, describe(b.machine), shifts)
        else:
            cross = CrossClass(raw, describe(b.machine))
        per_class.append((b, shifts, compare(b.data, current, tol, cross)))

    def misfit(b: Baseline, shifts: dict[str, float | None], name: str) -> float:
        """How unlike class ``b`` the run's OTHER speed cells are, once their shift is removed (sum of squares)."""
        theirs, shift = _speedups(b.data), shifts.get(name) or 0.0
        return sum((math.log(speed[n] / theirs[n]) - shift) ** 2 for n in speed.keys() & theirs.keys() if n != name)

    names = list(dict.fromkeys(c.cell for _, _, checks in per_class for c in checks))
    out: list[Check] = []
    used: dict[Path, Baseline] = {}
    for name in names:  # each cell against the class the other cells resemble most: its own value cannot choose
        i, (b, _, checks) = min(enumerate(per_class), key=lambda x: (misfit(x[1][0], x[1][1], name), x[0]))
        used[b.path] = b
        out += [c for c in checks if c.cell == name]
    return out, list(used.values()), (
        f"machine class NOT recorded ({describe(machine)}): each cell judged against the recorded class the run's "
        f"other cells resemble most ({recorded}), its speedup divided by the run's shift against that class over "
        f"the other cells, speed margins widened by the cell's spread between the recorded classes")
