"""Summary statistics over result rows (pure functions of DataFrames; no torch).

Definitions (stated once, used everywhere):

* ``tokens_per_s`` of a sample: new tokens / wall seconds of the whole ``generate`` call (prefill included).
* ``speedup`` of a decoder: the mean over samples of the paired ratio
  ``tokens_per_s(decoder, sample) / tokens_per_s(vanilla, sample)`` (same process, same sample); the ratio of
  totals (sum of vanilla time / sum of decoder time, per token) is given beside it as ``speedup_total``.
* ``accept_length``: total new tokens / total target forwards (prefill included; vanilla = 1.0).
* ``acceptance_rate``: total accepted draft tokens / total drafted tokens.
"""

from __future__ import annotations

import pandas as pd

SUMMARY_COLUMNS = [
    "decoder", "samples", "tokens_per_s", "tokens_per_s_total", "speedup", "speedup_total", "accept_length",
    "acceptance_rate", "target_tokens_fed_per_step", "draft_forwards_per_step", "equal_to_vanilla",
]


def paired_speedups(rows: pd.DataFrame) -> pd.DataFrame:
    """Per-sample speedup of every decoder against vanilla in the same run.

    Args:
        rows: result rows with ``run_id, task, sample_id, decoder, tokens_per_s, status``.

    Returns:
        ``rows`` (status ``ok`` only) with a ``speedup`` column; NaN where vanilla has no row.
    """
    ok = rows[rows["status"] == "ok"].copy()
    keys = [k for k in ("run_id", "task", "sample_id", "turn", "repeat") if k in ok.columns]
    vanilla = ok[ok["decoder"] == "vanilla"][keys + ["tokens_per_s", "wall_time_s", "new_tokens"]]
    vanilla = vanilla.rename(columns={"tokens_per_s": "vanilla_tokens_per_s", "wall_time_s": "vanilla_wall_time_s",
                                      "new_tokens": "vanilla_new_tokens"})
    merged = ok.merge(vanilla, on=keys, how="left")
    merged["speedup"] = merged["tokens_per_s"] / merged["vanilla_tokens_per_s"]
    return merged


def summarize(rows: pd.DataFrame, quality_columns: list[str] | None = None) -> pd.DataFrame:
    """One row per decoder (in first-seen order) with the columns of :data:`SUMMARY_COLUMNS` plus the mean
    of each quality column and counts of failed rows."""
    if rows.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    if not (rows["status"] == "ok").any():
        return pd.DataFrame([{"decoder": d, "samples": 0, "failed": int((rows["decoder"] == d).sum())}
                             for d in dict.fromkeys(rows["decoder"])])
    merged = paired_speedups(rows)
    quality_columns = quality_columns or []
    out = []
    for decoder in dict.fromkeys(rows["decoder"]):
        g = merged[merged["decoder"] == decoder]
        failed = int(((rows["decoder"] == decoder) & (rows["status"] != "ok")).sum())
        if g.empty:
            out.append({"decoder": decoder, "samples": 0, "failed": failed})
            continue
        drafted = g["num_drafted"].sum()
        rec = {
            "decoder": decoder,
            "samples": len(g),
            "failed": failed,
            "tokens_per_s": g["tokens_per_s"].mean(),
            "tokens_per_s_total": g["new_tokens"].sum() / g["wall_time_s"].sum(),
            "speedup": g["speedup"].mean(),
            "speedup_total": (g["vanilla_wall_time_s"].sum() / g["vanilla_new_tokens"].sum())
            / (g["wall_time_s"].sum() / g["new_tokens"].sum()),
            "accept_length": g["new_tokens"].sum() / g["num_steps"].sum(),
            "acceptance_rate": g["num_accepted"].sum() / drafted if drafted else float("nan"),
            "target_tokens_fed_per_step": g["target_tokens_fed_per_step"].mean(),
            "draft_forwards_per_step": g["draft_forwards_per_step"].mean(),
            "equal_to_vanilla": g["matches_vanilla"].astype(float).mean(),
        }
        for q in quality_columns:
            if q in g.columns:
                rec[q] = pd.to_numeric(g[q], errors="coerce").mean()
        out.append(rec)
    return pd.DataFrame(out)


def to_markdown(summary: pd.DataFrame, floatfmt: str = ".3f") -> str:
    """Markdown table of a summary (pandas ``to_markdown`` needs tabulate; this does not)."""
    cols = list(summary.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, r in summary.iterrows():
        cells = []
        for c in cols:
            v = r[c]
            if isinstance(v, float):
                cells.append("" if pd.isna(v) else format(v, floatfmt))
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
