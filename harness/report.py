"""Paper-style tables from result files: ``python -m harness.report RUN_DIR [RUN_DIR ...] [--out DIR]``.

Reads ``results.jsonl`` files only (a run folder, a multirun sweep folder -- searched recursively -- or a
file), with pandas; it never imports torch or the decoders, so it runs anywhere the results are.

Writes to ``--out`` (default ``<first RUN_DIR>/report``):

* ``main.{md,tex,csv}``: rows task x model pair, columns the decoders (one column group per decoder
  configuration), each with tokens/s, speedup vs vanilla (mean of paired per-sample ratios, 95 % bootstrap
  CI over samples), accept length tau and the equality rate with vanilla.
* ``theory.{md,tex,csv}``: one row per task x model pair x decoder: measured acceptance rate alpha, draft
  length gamma, cost ratio c, Leviathan et al. 2023 eq. 1 predictions (E[tau], speedup) beside the
  measured ones, and efficiency = speedup / tau (tau is the ceiling of speedup, ALGORITHMS.md section 6).
* ``detail.csv``: every aggregate of :func:`aggregate` (one row per task x model pair x decoder config).
* ``report.md``: all tables with the definitions.

Definitions (those of :mod:`harness.metrics`): ``speedup`` = mean over samples of
``tokens_per_s(decoder) / tokens_per_s(vanilla)`` on the same sample in the same run; ``accept_length`` =
total new tokens / total target forwards (prefill included); ``acceptance_rate`` = accepted / drafted tokens.

Cost ratio c (draft forward time / target forward time), in order of preference:

1. ``--cost-ratio C`` (given by the user; e.g. measured from a vanilla run of the draft model);
2. rows with ``draft_time_s`` and ``verify_time_s`` (per-phase timers recorded by a decoder):
   ``c = (draft_time_s / draft_forwards) / (verify_time_s / num_steps)``;
3. a wall-time fit under the theory's own assumption that one verification costs one vanilla step:
   ``c = (wall_time_s - num_steps * t_ar) / (draft_forwards * t_ar)``, with ``t_ar`` vanilla's seconds per
   token on the same sample (summed over samples, clipped at 0). It is rough (prefill and host overhead
   land in c); the ``cost_ratio_source`` column says which one was used.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import sys
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from harness.metrics import paired_speedups
from harness.resume import CONFIG_FIELDS, config_key, latest_rows
from harness.results import read_results

log = logging.getLogger(__name__)

#: One aggregate per (task, model pair, decoder configuration label).
ROW_KEYS = ["task", "model_pair", "label"]


# --------------------------------------------------------------------------------------------------
# Loading
def find_result_files(paths: Iterable[str | Path]) -> list[Path]:
    """``results.jsonl`` files named by ``paths``: files as given, folders searched recursively (a
    multirun sweep folder holds one per job). Raises FileNotFoundError when nothing is found."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_file():
            found.append(p)
        elif p.is_dir():
            found.extend(sorted(p.rglob("results.jsonl"), key=lambda q: (len(q.parts), str(q))))
        else:
            raise FileNotFoundError(f"{p} does not exist")
    found = list(dict.fromkeys(f.resolve() for f in found))
    if not found:
        raise FileNotFoundError(f"no results.jsonl under {', '.join(map(str, paths))}")
    return found


def load_rows(paths: Iterable[str | Path]) -> pd.DataFrame:
    """All rows of the result files under ``paths``, one row per cell (:func:`harness.resume.latest_rows`),
    with ``run_dir`` (the folder of each file) and ``model_pair`` columns added, and ``run_id`` replaced by
    a key of (run folder, configuration) so that a decoder is paired with vanilla of the same folder and
    configuration -- whichever process (of a resumed run) wrote the rows."""
    frames = []
    for f in find_result_files(paths):
        rows = read_results([f])
        if rows.empty:
            continue
        rows["run_dir"] = str(f.parent)
        frames.append(rows)
    if not frames:
        return pd.DataFrame()
    rows = pd.concat(frames, ignore_index=True)
    rows = latest_rows(rows, extra_keys=("run_dir",))
    for c in CONFIG_FIELDS + ("status", "decoder", "decoder_params", "sample_id"):
        if c not in rows:
            rows[c] = None
    # One id per (run folder, configuration), keyed as resume keys it (missing values and pre-sampling rows
    # normalised by config_key; pandas 3's astype(str) would keep NaN).
    cfg = [repr((r["run_dir"], *config_key(r))) for r in rows.to_dict("records")]
    rows["run_id"] = [hashlib.sha1(k.encode()).hexdigest()[:12] for k in cfg]
    rows["model_pair"] = _model_pair(rows)
    rows["label"] = config_labels(rows)
    return rows


#: Configuration columns named in the row label when they differ between rows of the report.
SETTING_FIELDS = ("dtype", "max_new_tokens", "device_name")


def _model_pair(rows: pd.DataFrame) -> pd.Series:
    """Row label ``target / draft``, plus ``(dtype=..., max_new_tokens=...)`` for the settings that vary."""
    target = rows["target_model"].fillna(rows["model"]).astype(str)
    draft = rows["draft_model"].where(rows["draft_model"].notna(), None)
    pair = pd.Series([t if d is None else f"{t} / {d}" for t, d in zip(target, draft)], index=rows.index)
    varying = [f for f in SETTING_FIELDS if f in rows and rows[f].astype(str).nunique() > 1]
    if varying:
        pair = pair + [" (" + ", ".join(f"{f}={r[f]}" for f in varying) + ")" for _, r in rows.iterrows()]
    return pair


def decoder_param_columns(rows: pd.DataFrame) -> list[str]:
    """Hyper-parameter names found in the rows' ``decoder_params`` JSON, in first-seen order."""
    names: dict[str, None] = {}
    for s in rows["decoder_params"].dropna().unique():
        try:
            names.update(dict.fromkeys(json.loads(s)))
        except (TypeError, json.JSONDecodeError):
            continue
    return list(names)


def swept_params(rows: pd.DataFrame) -> dict[str, list[str]]:
    """decoder -> the hyper-parameters that take more than one value among its rows."""
    out: dict[str, list[str]] = {}
    for decoder, g in rows.groupby("decoder", sort=False):
        params = [json.loads(s) for s in g["decoder_params"].dropna().unique()]
        keys = dict.fromkeys(k for p in params for k in p)
        out[decoder] = [k for k in keys if len({json.dumps(p.get(k)) for p in params}) > 1]
    return out


def config_labels(rows: pd.DataFrame) -> pd.Series:
    """Column label of each row: the decoder name, plus ``(k=v, ...)`` for its hyper-parameters that vary
    among the rows (a gamma sweep gives ``speculative (gamma=2)``, ``speculative (gamma=4)``, ...)."""
    varying = swept_params(rows)
    labels = []
    for dec, ps in zip(rows["decoder"], rows["decoder_params"]):
        keys = varying.get(dec) or []
        if not keys:
            labels.append(str(dec))
            continue
        p = json.loads(ps) if isinstance(ps, str) else {}
        labels.append(f"{dec} (" + ", ".join(f"{k}={p.get(k)}" for k in keys) + ")")
    return pd.Series(labels, index=rows.index)


# --------------------------------------------------------------------------------------------------
# Statistics
def _natural(v: Any) -> tuple:
    n = pd.to_numeric(pd.Series([v]), errors="coerce").iloc[0]
    return (0, float(n), "") if not pd.isna(n) else (1, 0.0, str(v))


def ordered_labels(agg: pd.DataFrame) -> list[str]:
    """Configuration labels in table order: vanilla, then each decoder in first-seen order, its
    configurations sorted by hyper-parameter values (numbers numerically)."""
    dec_order = list(dict.fromkeys(["vanilla", *agg["decoder"]]))
    params = [c for c in decoder_param_columns(agg) if c in agg] if "decoder_params" in agg else []
    seen = agg.drop_duplicates("label")

    def key(r: pd.Series) -> tuple:
        return (dec_order.index(r["decoder"]), *[_natural(r.get(p)) for p in params])

    return [r["label"] for _, r in sorted(seen.iterrows(), key=lambda kv: key(kv[1]))]


def bootstrap_mean_ci(values: Sequence[float], n_boot: int = 2000, level: float = 0.95,
                      seed: int = 0) -> dict[str, float]:
    """Mean of ``values`` with a percentile bootstrap confidence interval (resampling the values).

    Args:
        values: per-sample numbers (NaNs dropped).
        n_boot: bootstrap resamples.
        level: coverage of the interval.
        seed: seed of the resampling (the interval is reproducible).

    Returns:
        ``{"mean", "low", "high", "std"}``; ``std`` is the bootstrap standard error of the mean. With
        fewer than two values the interval and std are NaN.
    """
    x = np.asarray([v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))],
                   dtype=float)
    if len(x) == 0:
        return {"mean": math.nan, "low": math.nan, "high": math.nan, "std": math.nan}
    mean = float(x.mean())
    if len(x) < 2:
        return {"mean": mean, "low": math.nan, "high": math.nan, "std": math.nan}
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(n_boot, len(x)))].mean(axis=1)
    a = (1.0 - level) / 2.0
    return {"mean": mean, "low": float(np.quantile(means, a)), "high": float(np.quantile(means, 1.0 - a)),
            "std": float(means.std(ddof=1))}


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


def _num(s: pd.Series) -> pd.Series:
    return pd.to_numeric(s, errors="coerce")


def _cost_ratio(g: pd.DataFrame, override: float | None) -> tuple[float, str]:
    """Cost ratio c of a group of paired rows and how it was obtained (see the module docstring)."""
    if override is not None:
        return float(override), "option"
    draft_fwd = _num(g["draft_forwards"]).sum() if "draft_forwards" in g else 0.0
    if not draft_fwd:
        return 0.0, "no draft forwards"
    if {"draft_time_s", "verify_time_s"} <= set(g.columns):
        d, v = _num(g["draft_time_s"]), _num(g["verify_time_s"])
        if d.notna().all() and v.notna().all() and v.sum() > 0:
            return float((d.sum() / draft_fwd) / (v.sum() / _num(g["num_steps"]).sum())), "timers"
    t_ar = _num(g["vanilla_wall_time_s"]) / _num(g["vanilla_new_tokens"])
    ok = t_ar.notna() & _num(g["wall_time_s"]).notna()
    if not ok.any():
        return math.nan, "unmeasured"
    spare = (_num(g["wall_time_s"]) - _num(g["num_steps"]) * t_ar)[ok].sum()
    return max(0.0, float(spare / (_num(g["draft_forwards"]) * t_ar)[ok].sum())), "wall-time fit"


def aggregate(rows: pd.DataFrame, cost_ratio: float | None = None, n_boot: int = 2000, level: float = 0.95,
              seed: int = 0, quality_columns: Sequence[str] = ("pass@1",)) -> pd.DataFrame:
    """One row per (task, model pair, decoder configuration) with every reported number.

    Args:
        rows: rows from :func:`load_rows` (``label`` and ``model_pair`` columns present; added if not).
        cost_ratio: c for every theory prediction; None = measure it (module docstring).
        n_boot, level, seed: bootstrap of the speedup CI.
        quality_columns: task quality columns averaged when present.

    Returns:
        Columns: task, model_pair, label, decoder, the hyper-parameters, samples, failed, tokens_per_s,
        speedup, speedup_low/high/std, speedup_total, accept_length, acceptance_rate, equal_to_vanilla,
        gamma (configured, else drafted tokens per decode step), cost_ratio, cost_ratio_source,
        theory_accept_length, theory_speedup, efficiency, the quality means.
    """
    if rows.empty:
        return pd.DataFrame()
    if "label" not in rows:
        rows = rows.assign(label=config_labels(rows))
    if "model_pair" not in rows:
        rows = rows.assign(model_pair=_model_pair(rows))
    params = decoder_param_columns(rows)
    merged = paired_speedups(rows)
    paired = {k: g for k, g in merged.groupby(ROW_KEYS, sort=False, dropna=False)}
    out = []
    for key, all_g in rows.groupby(ROW_KEYS, sort=False, dropna=False):
        g = paired.get(key, merged.iloc[0:0])
        rec: dict[str, Any] = dict(zip(ROW_KEYS, key))
        rec["decoder"] = all_g["decoder"].iloc[0]
        rec["decoder_params"] = all_g["decoder_params"].iloc[0]
        first = json.loads(all_g["decoder_params"].iloc[0]) if isinstance(all_g["decoder_params"].iloc[0], str) else {}
        for p in params:
            rec[p] = first.get(p)
        rec["samples"] = len(g)
        rec["failed"] = int((all_g["status"] != "ok").sum())
        if g.empty:
            out.append(rec)
            continue
        ci = bootstrap_mean_ci(g["speedup"].tolist(), n_boot=n_boot, level=level, seed=seed)
        drafted = _num(g["num_drafted"]).sum()
        decode_steps = (_num(g["num_steps"]) - 1).clip(lower=0).sum()
        alpha = _num(g["num_accepted"]).sum() / drafted if drafted else math.nan
        gamma = _num(pd.Series([first.get("gamma")])).iloc[0]
        if pd.isna(gamma):
            gamma = drafted / decode_steps if drafted and decode_steps else math.nan
        accept_length = _num(g["new_tokens"]).sum() / _num(g["num_steps"]).sum()
        chain = "gamma" in first or _num(g["draft_forwards"]).sum() > 0  # Leviathan's model: a drafter + gamma
        c, c_src = _cost_ratio(g, cost_ratio) if drafted and chain else (math.nan, "n/a (no chain draft)")
        rec.update({
            "tokens_per_s": _num(g["tokens_per_s"]).mean(),
            "speedup": ci["mean"], "speedup_low": ci["low"], "speedup_high": ci["high"], "speedup_std": ci["std"],
            "speedup_total": (_num(g["vanilla_wall_time_s"]).sum() / _num(g["vanilla_new_tokens"]).sum())
            / (_num(g["wall_time_s"]).sum() / _num(g["new_tokens"]).sum()),
            "accept_length": accept_length,
            "acceptance_rate": alpha,
            "equal_to_vanilla": g["matches_vanilla"].astype(float).mean(),
            "divergent_samples": sorted(map(str, g.loc[~g["matches_vanilla"].astype(bool), "sample_id"])),
            "gamma_used": gamma,
            "cost_ratio": c,
            "cost_ratio_source": c_src,
            "theory_accept_length": expected_accept_length(alpha, gamma) if drafted and chain else math.nan,
            "theory_speedup": theory_speedup(alpha, gamma, c) if drafted and chain else math.nan,
        })
        rec["efficiency"] = rec["speedup"] / accept_length if accept_length else math.nan
        for q in quality_columns:
            if q in g:
                rec[q] = _num(g[q]).mean()
        out.append(rec)
    agg = pd.DataFrame(out)
    order = {lab: i for i, lab in enumerate(ordered_labels(agg))}
    tasks = {t: i for i, t in enumerate(dict.fromkeys(agg["task"]))}
    pairs = {m: i for i, m in enumerate(dict.fromkeys(agg["model_pair"]))}
    rank = [(tasks[t], pairs[m], order[lab]) for t, m, lab in zip(agg["task"], agg["model_pair"], agg["label"])]
    return agg.iloc[sorted(range(len(agg)), key=rank.__getitem__)].reset_index(drop=True)


# --------------------------------------------------------------------------------------------------
# Tables
MAIN_METRICS = [("tokens_per_s", "tok/s"), ("speedup", "speedup"), ("accept_length", "tau"),
                ("equal_to_vanilla", "eq.")]
THEORY_COLUMNS = [("task", "task"), ("model_pair", "models"), ("label", "decoder"), ("acceptance_rate", "alpha"),
                  ("gamma_used", "gamma"), ("cost_ratio", "c"), ("cost_ratio_source", "c from"),
                  ("theory_accept_length", "E[tau] theory"), ("accept_length", "tau measured"),
                  ("theory_speedup", "speedup theory"), ("speedup", "speedup measured"),
                  ("efficiency", "efficiency")]


def _fmt(v: Any, fmt: str = ".2f") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, (float, np.floating)):
        return format(float(v), fmt)
    return str(v)


def _speedup_cell(r: pd.Series) -> str:
    if pd.isna(r.get("speedup")):
        return "-"
    if pd.isna(r.get("speedup_low")):
        return f"{r['speedup']:.2f}"
    return f"{r['speedup']:.2f} [{r['speedup_low']:.2f}, {r['speedup_high']:.2f}]"


def main_table(agg: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The paper layout: rows (task, model pair), column groups the decoder configurations.

    Returns:
        ``(numeric, text)``: ``numeric`` has flat ``<label>|<metric>`` columns (CI bounds included) for CSV;
        ``text`` has ``(label, metric)`` MultiIndex columns with formatted cells for markdown / LaTeX.
    """
    labels = ordered_labels(agg)
    index = list(dict.fromkeys(zip(agg["task"], agg["model_pair"])))
    numeric = pd.DataFrame(index=pd.MultiIndex.from_tuples(index, names=["task", "models"]))
    text = pd.DataFrame(index=numeric.index, columns=pd.MultiIndex.from_tuples(
        [(lab, name) for lab in labels for _, name in MAIN_METRICS]), dtype=object)
    for _, r in agg.iterrows():
        idx = (r["task"], r["model_pair"])
        for col, name in MAIN_METRICS:
            numeric.loc[idx, f"{r['label']}|{col}"] = r.get(col)
            text.loc[idx, (r["label"], name)] = _speedup_cell(r) if col == "speedup" else _fmt(r.get(col))
        for col in ("speedup_low", "speedup_high"):
            numeric.loc[idx, f"{r['label']}|{col}"] = r.get(col)
    return numeric.reset_index(), text.fillna("-").reset_index()


def theory_table(agg: pd.DataFrame) -> pd.DataFrame:
    """Formatted theory-vs-measurement table (decoders that draft only)."""
    sub = agg[agg["acceptance_rate"].notna()] if "acceptance_rate" in agg else agg.iloc[0:0]
    out = {}
    for col, name in THEORY_COLUMNS:
        values = sub[col] if col in sub else pd.Series([None] * len(sub), dtype=object)
        out[name] = [_fmt(v, ".3f" if col in ("acceptance_rate", "cost_ratio") else ".2f") for v in values]
    return pd.DataFrame(out, columns=[name for _, name in THEORY_COLUMNS])


def to_markdown(df: pd.DataFrame) -> str:
    """Markdown table (MultiIndex columns are joined as ``group / metric``)."""
    cols = [" / ".join(c for c in col if c) if isinstance(col, tuple) else str(col) for col in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join(_fmt(v) for v in row) + " |")
    return "\n".join(lines)


_TEX_ESCAPES = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\^{}"}


def _tex(s: Any) -> str:
    """LaTeX-escape a cell."""
    return "".join(_TEX_ESCAPES.get(ch, ch) for ch in str(s))


def to_latex(df: pd.DataFrame, caption: str = "", label: str = "") -> str:
    """booktabs LaTeX table; two-level columns become ``\\multicolumn`` groups with ``\\cmidrule``s."""
    cols = list(df.columns)
    two_level = all(isinstance(c, tuple) for c in cols)
    lines = [r"\begin{table}[t]", r"\centering", r"\small", r"\begin{tabular}{" + "l" * len(cols) + "}",
             r"\toprule"]
    if two_level:
        groups: list[tuple[str, int, int]] = []
        for i, (g, _) in enumerate(cols):
            if groups and groups[-1][0] == g:
                groups[-1] = (g, groups[-1][1], i)
            else:
                groups.append((g, i, i))
        head, rules = [], []
        for g, a, b in groups:
            if all(not m for _, m in cols[a:b + 1]):  # index columns: name on the second header row
                head.extend([""] * (b - a + 1))
            else:
                head.append(rf"\multicolumn{{{b - a + 1}}}{{c}}{{{_tex(g)}}}")
                rules.append(rf"\cmidrule(lr){{{a + 1}-{b + 1}}}")
        lines.append(" & ".join(head) + r" \\")
        lines.append(" ".join(rules))
        lines.append(" & ".join(_tex(m or g) for g, m in cols) + r" \\")
    else:
        lines.append(" & ".join(_tex(c) for c in cols) + r" \\")
    lines.append(r"\midrule")
    for row in df.itertuples(index=False):
        lines.append(" & ".join(_tex(_fmt(v)) for v in row) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    if caption:
        lines.append(rf"\caption{{{_tex(caption)}}}")
    if label:
        lines.append(rf"\label{{{label}}}")
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"


MAIN_CAPTION = ("tok/s: mean new tokens per second of the whole generate call (prefill included). speedup: mean "
                "over samples of the paired ratio tok/s(decoder) / tok/s(vanilla) in the same run, with a 95% "
                "bootstrap CI over samples. tau: new tokens per target forward (prefill included; vanilla = 1). "
                "eq.: fraction of samples whose tokens equal vanilla's.")
THEORY_CAPTION = ("alpha: accepted / drafted tokens. gamma: configured draft length (else drafted tokens per "
                  "step). c: draft / target forward cost (source in 'c from'). Theory: Leviathan et al. 2023 eq. 1, "
                  "E[tau] = (1 - alpha^(gamma+1)) / (1 - alpha), speedup = E[tau] / (gamma c + 1); meaningful "
                  "for linear-chain drafting. efficiency = measured speedup / measured tau.")


def write_report(paths: Sequence[str | Path], out_dir: str | Path | None = None, cost_ratio: float | None = None,
                 n_boot: int = 2000, seed: int = 0) -> dict[str, Path]:
    """Build every table from the result files under ``paths`` into ``out_dir``.

    Returns:
        name -> written path.
    """
    rows = load_rows(paths)
    out = Path(out_dir) if out_dir else Path(paths[0]) / "report"
    out.mkdir(parents=True, exist_ok=True)
    if rows.empty:
        raise ValueError(f"no result rows under {', '.join(map(str, paths))}")
    agg = aggregate(rows, cost_ratio=cost_ratio, n_boot=n_boot, seed=seed)
    written: dict[str, Path] = {}

    def put(name: str, text: str) -> None:
        (out / name).write_text(text)
        written[name] = out / name

    numeric, text = main_table(agg)
    numeric.to_csv(out / "main.csv", index=False)
    written["main.csv"] = out / "main.csv"
    put("main.md", to_markdown(text) + "\n")
    put("main.tex", to_latex(text, MAIN_CAPTION, "tab:main"))
    theory = theory_table(agg)
    agg[[c for c, _ in THEORY_COLUMNS if c in agg]].to_csv(out / "theory.csv", index=False)
    written["theory.csv"] = out / "theory.csv"
    put("theory.md", to_markdown(theory) + "\n")
    put("theory.tex", to_latex(theory, THEORY_CAPTION, "tab:theory"))
    agg.to_csv(out / "detail.csv", index=False)
    written["detail.csv"] = out / "detail.csv"
    sources = ", ".join(sorted(set(agg.get("cost_ratio_source", pd.Series(dtype=str)).dropna())))
    put("report.md", "\n\n".join([
        f"# Report\n\nSources: {', '.join(map(str, find_result_files(paths)))}",
        "## Main results\n\n" + MAIN_CAPTION + "\n\n" + to_markdown(text),
        "## Theory vs measurement\n\n" + THEORY_CAPTION + (f" Cost ratio from: {sources}." if sources else "")
        + "\n\n" + to_markdown(theory),
    ]) + "\n")
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="+", help="run folders, multirun sweep folders or results.jsonl files")
    parser.add_argument("--out", default=None, help="output folder (default: <first RUN_DIR>/report)")
    parser.add_argument("--cost-ratio", type=float, default=None,
                        help="draft/target forward cost ratio c for the theory column (default: measured from "
                             "per-phase timers if recorded, else a wall-time fit; see --help of the module)")
    parser.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples for the speedup CI")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    parser.add_argument("--plots", action="store_true", help="also draw every figure (plots.make_all)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        written = write_report(args.run_dirs, args.out, args.cost_ratio, args.bootstrap, args.seed)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = next(iter(written.values())).parent
    print((out / "main.md").read_text())
    print(f"tables written to {out}: {', '.join(written)}")
    if args.plots:
        from plots.make_all import make_all

        figs = make_all(args.run_dirs, out / "figures")
        print(f"figures written to {out / 'figures'}: {', '.join(figs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
