"""Two runs compared cell by cell (``harness.report.build --compare``): every setting in which they differ
(:func:`settings_diff`), each figure of both sides on the samples they share and the paired bootstrap of their
ratios (one draw of samples for both sides, :func:`compare_runs`), written as ``compare.{md,csv}`` and a figure
(:func:`write_compare`).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from harness.rows import cells as coverage
from harness.rows.columns import SAMPLING, compared_columns, fmt_value, norm, num
from harness.rows.grouping import config_labels, prepare, quality_columns, settings_label
from harness.rows.metrics import paired_speedups
from harness.rows.results import load_rows
from harness.rows.stats import MIN_INTERVAL_SAMPLES, interval
from harness.report.tables import fmt_cell, interval_cell, markdown

log = logging.getLogger(__name__)


def compare_runs(rows_a: pd.DataFrame, rows_b: pd.DataFrame, n_boot: int = 2000, level: float = 0.95,
                 seed: int = 0) -> pd.DataFrame:
    """Side-by-side comparison of two runs, per (task, model pair, decoder configuration).

    For tokens/s, speedup and accept length: the figure in A, in B, the ratio B / A and a bootstrap interval
    for the ratio. Each side's figures are over its figure rows (:mod:`harness.rows.cells`: ok rows paired with
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
        else:  # each side's own figures, on its own samples: a configuration of one run only still shows them
            ga, gb = sides["A"].get(cell, empty), sides["B"].get(cell, empty)
            for side, g in (("a", ga), ("b", gb)):
                if len(g):
                    rec.update({f"{k}_{side}": float(v[0]) for k, v in _side_draws(g, np.ones((1, len(g)))).items()})
        for side, g in (("a", ga), ("b", gb)):  # equality and quality over the same rows as the figures
            rec.update({f"{k}_{side}": v for k, v in _side_extras(g).items()})
        out.append(rec)
    cmp = pd.DataFrame(out)
    cmp.attrs["warnings"] = warnings
    cmp.attrs["quality"] = [q for q in dict.fromkeys([*quality_columns(rows_a), *quality_columns(rows_b)])
                            if f"{q}_a" in cmp or f"{q}_b" in cmp]
    return cmp


def _side_extras(g: pd.DataFrame) -> dict[str, float]:
    """Equality with vanilla (greedy rows) and each quality column's mean, of one side's compared rows."""
    out: dict[str, float] = {}
    mv = g["matches_vanilla"].map(norm).dropna() if "matches_vanilla" in g else pd.Series(dtype=object)
    out["equal_to_vanilla"] = float(mv.astype(bool).mean()) if len(mv) else math.nan
    for q in quality_columns(g):
        out[q] = float(num(g[q]).mean())
    return out


#: Run settings :func:`settings_diff` compares (row columns; the first value of each side is shown).
DIFF_FIELDS = ("task", "task_version", "target_model", "draft_model", "dtype", "device_name", "git_commit",
               "git_dirty", "max_new_tokens", *SAMPLING, "sampling_seed")


def settings_diff(rows_a: pd.DataFrame, rows_b: pd.DataFrame) -> list[str]:
    """Every run setting in which A and B differ, one line each, for the head of a comparison: dtype, machine,
    commit, budget, sampling and seeds, the problems (how many, and whether one side's are a subset of the
    other's), repeats and the decoders present on one side only. Empty when nothing differs.

    Example: ``["dtype: A bfloat16, B float32", "problems: A 20, B 3 (B's are a subset of A's)"]``.
    """
    out = []

    def values(rows: pd.DataFrame, col: str) -> str:
        vals = sorted({fmt_value(v) for v in rows[col]}) if col in rows else ["(not recorded)"]
        if col == "git_commit":
            vals = [v[:7] for v in vals]
        return ", ".join(vals)

    for col in DIFF_FIELDS:
        if col not in rows_a and col not in rows_b:
            continue
        va, vb = values(rows_a, col), values(rows_b, col)
        if va != vb:
            out.append(f"{col}: A {va}, B {vb}")
    sa = set(zip(rows_a["task"].astype(str), rows_a["sample_id"].astype(str)))
    sb = set(zip(rows_b["task"].astype(str), rows_b["sample_id"].astype(str)))
    if sa != sb:
        rel = ("B's are a subset of A's" if sb < sa else "A's are a subset of B's" if sa < sb
               else f"{len(sa & sb)} shared")
        how = ("figures compared on the shared ones" if sa & sb else
               "no problem in common: each run's figures on its own problems, no ratio")
        out.append(f"problems: A {len(sa)}, B {len(sb)} ({rel}; {how})")
    ra, rb = (int(num(r["repeat"]).nunique()) if "repeat" in r else 1 for r in (rows_a, rows_b))
    if ra != rb:
        out.append(f"repeats: A {ra}, B {rb}")
    if not out and "group_identity" in rows_a and "group_identity" in rows_b and \
            set(rows_a["group_identity"].astype(str)) != set(rows_b["group_identity"].astype(str)):
        out.append("run identity: the runs differ in a setting rows do not record (compare their meta.json)")
    sa_, sb_ = (_settings_by_decoder(r) for r in (rows_a, rows_b))
    for dec in (d for d in sa_ if d in sb_ and sa_[d] != sb_[d]):
        out.append(f"settings of {dec}: A {sa_[dec] or '(none)'}, B {sb_[dec] or '(none)'}")
    da, db = set(rows_a["decoder"].astype(str)), set(rows_b["decoder"].astype(str))
    if da != db:
        only = [f"only in {s}: {', '.join(sorted(d))}" for s, d in (("A", da - db), ("B", db - da)) if d]
        out.append("decoders: " + "; ".join(only))
    return out


def _settings_by_decoder(rows: pd.DataFrame) -> dict[str, str]:
    """decoder -> its settings (:func:`harness.rows.grouping.settings_label`; several configurations joined)."""
    if "decoder_params" not in rows:
        return {}
    out: dict[str, str] = {}
    for dec, g in rows.groupby(rows["decoder"].astype(str), sort=False):
        cls = str(g["decoder_class"].iloc[0]) if "decoder_class" in g else None
        out[dec] = " | ".join(dict.fromkeys(settings_label(p, decoder_class=cls) for p in g["decoder_params"].dropna()))
    return out


def _side_draws(g: pd.DataFrame, weights: np.ndarray) -> dict[str, np.ndarray]:
    """The producer of the compared figures (:func:`harness.rows.columns.compared_columns`): each figure of one
    side's rows ``g`` under each weighting of them (``weights``: draws x rows; one row of ones for the figure
    itself), as an array over draws."""
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
    for k in (c.name for c in compared_columns()):
        a, b = float(pa[k][0]), float(pb[k][0])
        rec[f"{k}_a"], rec[f"{k}_b"] = a, b
        rec[f"{k}_ratio"] = b / a if a else math.nan
        with np.errstate(invalid="ignore", divide="ignore"):
            lo, hi, _ = interval(db[k] / da[k], level)
        if len(samples) < MIN_INTERVAL_SAMPLES:
            lo = hi = math.nan
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


# --------------------------------------------------------------------------------------------- the comparison as text
def compare_table(cmp: pd.DataFrame) -> pd.DataFrame:
    """Formatted comparison: per decoder, A, B, B/A [95% CI] for each compared figure (tokens/s, speedup and tau:
    :func:`harness.rows.columns.compared_columns`, in their declared header and format), the samples compared
    (:func:`_compare_samples`) and, when any row has one, a note (different samples, failed cells, unpaired rows,
    a decoder in one run only)."""
    index = pd.MultiIndex.from_arrays([(cmp["task"] + ": " + cmp["model_pair"]).tolist(), cmp["label"].tolist()]) \
        if (cmp["task"] + cmp["model_pair"]).nunique() > 1 else pd.Index(cmp["label"].tolist())
    text = pd.DataFrame(index=index)
    for c in compared_columns():  # headers and formats from their declarations
        col, name = c.name, c.display or c.name
        text[f"{name} A"] = [c.cell(v) for v in cmp.get(f"{col}_a", [math.nan] * len(cmp))]
        text[f"{name} B"] = [c.cell(v) for v in cmp.get(f"{col}_b", [math.nan] * len(cmp))]
        text[f"{name} B/A [95% CI]"] = [
            interval_cell(pd.Series({"x": r.get(f"{col}_ratio"), "samples": r.get("common_samples"),
                                     "x_low": r.get(f"{col}_ratio_low"),
                                      "x_high": r.get(f"{col}_ratio_high")}), "x", ".3f")
            if f"{col}_ratio" in r else "-" for _, r in cmp.iterrows()]
    if "equal_to_vanilla_a" in cmp and cmp[["equal_to_vanilla_a", "equal_to_vanilla_b"]].notna().any().any():
        text["eq. A"] = [fmt_cell(v) for v in cmp["equal_to_vanilla_a"]]
        text["eq. B"] = [fmt_cell(v) for v in cmp["equal_to_vanilla_b"]]
    for q in cmp.attrs.get("quality", []):
        text[f"{q} A"] = [fmt_cell(v) for v in cmp.get(f"{q}_a", [math.nan] * len(cmp))]
        text[f"{q} B"] = [fmt_cell(v) for v in cmp.get(f"{q}_b", [math.nan] * len(cmp))]
    text["samples"] = [_compare_samples(r) for _, r in cmp.iterrows()]
    if "note" in cmp and cmp["note"].fillna("").astype(str).str.len().any():
        text["note"] = [str(n) if isinstance(n, str) and n else "-" for n in cmp["note"]]
    text.columns.name = "decoder"
    return text


def _compare_samples(r: pd.Series) -> str:
    """``8`` (both runs cover the same 8 samples) or ``3 (A 5, B 3)``: the samples compared, and each side's."""
    n, a, b = (int(x) if not pd.isna(x) else 0 for x in
               num(pd.Series([r.get("common_samples"), r.get("samples_a"), r.get("samples_b")])))
    return f"{n}" if n == a == b else f"{n} (A {a}, B {b})"


def compare_warnings(cmp: pd.DataFrame, loaded: Sequence[str] = ()) -> list[str]:
    """The comparison's warnings: ``loaded`` (copies folded as the rows were read), duplicate cells, and one line
    per configuration whose two runs cover different samples or lost cells."""
    out = [*loaded, *cmp.attrs.get("warnings", [])]
    for _, r in cmp.iterrows():
        note = r.get("note")
        if isinstance(note, str) and note and not note.startswith("only in"):
            out.append(f"{r['label']} ({r['task']}: {r['model_pair']}): {note}")
    return list(dict.fromkeys(out))


def write_compare(path_a: str | Path, path_b: str | Path, out_dir: str | Path | None = None, n_boot: int = 2000,
                  seed: int = 0) -> tuple[pd.DataFrame, str]:
    """Compare run A with run B (see :func:`harness.report.compare.compare_runs`); writes ``compare.{md,csv}`` into
    ``out_dir`` when given. Returns the numeric frame and the markdown."""
    a, b = load_rows([path_a]), load_rows([path_b])
    if a.empty or b.empty:
        raise ValueError(f"no result rows under {path_a if a.empty else path_b}")
    cmp = compare_runs(a, b, n_boot=n_boot, seed=seed)

    def ident(rows: pd.DataFrame) -> str:
        return "; ".join(dict.fromkeys(rows["group"]))

    diff = settings_diff(a, b)
    head = ("Differences between the runs:\n" + "\n".join(f"- {d}" for d in diff) if diff
            else "The runs do not differ in any recorded setting.") + "\n\n"
    head += (f"A: {path_a} ({ident(a)})\nB: {path_b} ({ident(b)})\n\nratio = B / A, on the samples both runs cover "
             f"(samples: how many; A and B: each run's own when they differ); 95% bootstrap CI over those samples, "
             f"paired by sample (no interval below {MIN_INTERVAL_SAMPLES} samples).\n\n")
    warns = compare_warnings(cmp, [*a.attrs.get("warnings", []), *b.attrs.get("warnings", [])])
    for w in warns:
        log.warning("%s", w)
    md = head + ("Warnings:\n" + "\n".join(f"- {w}" for w in warns) + "\n\n" if warns else "") + \
        markdown(compare_table(cmp)) + "\n"
    if out_dir:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        cmp.to_csv(out / "compare.csv", index=False)
        (out / "compare.md").write_text(md)
        import plots  # matplotlib only when a figure is drawn
        plots.save(plots.compare_speedups(cmp, "; ".join(diff) or "same settings"), out / "figures", "compare")
    return cmp, md
