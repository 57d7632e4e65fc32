"""The cost table ``run.py`` prices a command by before it starts (:mod:`harness.config.estimate`), from measured
runs::

    .venv/bin/python benchmarks/costs.py RUN [RUN ...]           # the entries these runs give, printed
    .venv/bin/python benchmarks/costs.py RUN [RUN ...] --write   # merged into benchmarks/baselines/costs.json

A run gives one entry per machine class of its rows (the model pair's config name, the dtype, the CPU's
instruction sets ``cpu_isa``): vanilla's tokens/s and mean time to the first token, per task and over all tasks,
and per task how long its answers ran at the budget measured (:func:`lengths`);
every decoder configuration's speedup (the report's: the mean of per-sample speedups, paired with vanilla in the
same run) and each decoder class's mean speedup. An entry written again replaces the old one of its class, so the
table follows the latest measurement; ``source`` names the runs it came from. Rows of another machine class never
mix. Exit 2 with one line when a run has no usable rows.

Rows that name their CPU's family/model numbers (``device_name``: ``AMD EPYC [26/2] (...)``) give an entry of that CPU
generation (key ``model|dtype|isa|26/2``), and the same entry becomes its instruction-set class's (``model|dtype|isa``),
which prices a CPU of the class without an entry of its own: a Zen 4 and a Zen 5 share one class and differ ~2x in
speed, so each generation is priced by its own runs where it has them.

Static batches (rows with ``batch_size`` > 1, ``experiment=batch_sweep``) give the entry's ``batch`` block, one item
per batch size (:func:`batch_costs`): vanilla's batch throughput as a multiple of its batch-1 tokens/s in the same
runs, and each decoder's speedup over vanilla at that batch size. The other fields come from batch-1 rows only. With
``--batch-only`` only the ``batch`` block is merged into the class's existing entry (its batch-1 costs stay those of
their own runs); an entry written without batch rows keeps the old entry's ``batch`` block.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.config.estimate import COSTS_FILE, cpu_of, load_costs, machine_key  # noqa: E402


def lengths(vanilla) -> dict[str, float]:
    """How long a task's answers ran at the budget they were measured at (vanilla's rows: every decoder emits
    the same tokens): ``budget`` (the rows' largest ``max_new_tokens``), ``mean_new_tokens`` and ``capped_share``
    (the share of rows that reached the budget); empty where the rows lack the columns. The estimate prices a
    call by them instead of by the whole budget (:func:`harness.config.estimate.expected_tokens`)."""
    from harness.rows.values import num

    if "max_new_tokens" not in vanilla or "new_tokens" not in vanilla:
        return {}
    budget, new = num(vanilla["max_new_tokens"]), num(vanilla["new_tokens"])
    if budget.dropna().empty or new.dropna().empty:
        return {}
    top = float(budget.max())
    return {"budget": int(top), "mean_new_tokens": round(float(new.mean()), 2),
            "capped_share": round(float((new >= top).mean()), 4)}


def batch_costs(rows) -> dict[str, dict]:
    """The ``batch`` block of one machine class's ok rows: ``{"<B>": {"throughput_ratio", "base_tokens_per_s",
    "speedup", "class_speedup", "budget"}}`` for each ``batch_size`` B > 1 measured with vanilla:
    ``base_tokens_per_s`` = vanilla's mean tokens/s at batch size 1 in the same rows (prefill included; none without
    batch-1 vanilla rows), ``throughput_ratio`` = vanilla's batch throughput at B (``batch_tokens_per_s`` as the report
    totals it) / ``base_tokens_per_s``; ``speedup`` the report's paired speedup at B per decoder configuration,
    ``class_speedup`` its mean per decoder class; ``budget`` the largest ``max_new_tokens``."""
    import pandas as pd

    from harness.rows import metrics
    from harness.rows.values import num

    if "batch_size" not in rows:
        return {}
    size = num(rows["batch_size"]).fillna(1)
    single = rows[(size == 1) & (rows["decoder"] == "vanilla")]
    base = float(num(single["tokens_per_s"]).mean()) if not single.empty else float("nan")
    out: dict[str, dict] = {}
    for b, g in rows[size > 1].groupby(size[size > 1]):
        if not (g["decoder"] == "vanilla").any() or not base > 0:
            continue
        agg = metrics.aggregate(g)
        vanilla = agg[agg["decoder"] == "vanilla"]
        ratio = float(num(vanilla["batch_tokens_per_s"]).mean()) / base
        if not ratio > 0:
            continue
        speedup = {str(d): round(float(v), 4) for d, v in agg.groupby("decoder")["speedup"].mean().items()
                   if d != "vanilla" and pd.notna(v)}
        classes = agg.assign(cls=agg["decoder_class"].astype(str).str.rsplit(".", n=1).str[-1])
        out[str(int(b))] = {"throughput_ratio": round(ratio, 4), "base_tokens_per_s": round(base, 4),
                            "speedup": speedup,
                            "class_speedup": {str(c): round(float(v), 4) for c, v in
                                              classes.groupby("cls")["speedup"].mean().items() if pd.notna(v)},
                            "budget": int(num(g["max_new_tokens"]).max())}
    return out


def entries(run_dirs: list[str]) -> dict[str, dict]:
    """Cost entries by machine-class key from the runs' rows (ok rows paired with vanilla, as the report counts)."""
    import pandas as pd

    from harness.rows import metrics
    from harness.rows.results import load_rows
    from harness.rows.values import num

    rows = load_rows(run_dirs)
    if rows.empty or "cpu_isa" not in rows:
        return {}
    ok = rows[rows["status"] == "ok"]
    ok = ok.assign(_cpu=ok["device_name"].map(lambda d: cpu_of(d) or "") if "device_name" in ok else "")
    out: dict[str, dict] = {}
    for (model, dtype, isa, cpu), both in ok.groupby(["model", "dtype", "cpu_isa", "_cpu"], dropna=True):
        batches = batch_costs(both)
        g = both[num(both["batch_size"]).fillna(1) == 1] if "batch_size" in both else both
        agg = metrics.aggregate(g)
        vanilla = g[g["decoder"] == "vanilla"]
        if vanilla.empty:
            continue
        tasks = {str(t): {"vanilla_tokens_per_s": round(float(num(v["tokens_per_s"]).mean()), 4),
                          "prefill_s": round(float(num(v["ttft_s"]).mean()), 4), **lengths(v)}
                 for t, v in vanilla.groupby("task")} if "ttft_s" in vanilla else {}
        speedup = {str(d): round(float(s), 4) for d, s in agg.groupby("decoder")["speedup"].mean().items()
                   if d != "vanilla" and pd.notna(s)}
        classes = agg.assign(cls=agg["decoder_class"].astype(str).str.rsplit(".", n=1).str[-1])
        class_speedup = {str(c): round(float(s), 4) for c, s in classes.groupby("cls")["speedup"].mean().items()
                         if pd.notna(s)}
        out[machine_key(str(model), str(dtype), str(isa), cpu or None)] = {
            "model": str(model), "dtype": str(dtype), "cpu_isa": str(isa), **({"cpu": cpu} if cpu else {}),
            "device_name": str(vanilla["device_name"].iloc[0]) if "device_name" in vanilla else str(isa),
            "vanilla_tokens_per_s": round(float(num(vanilla["tokens_per_s"]).mean()), 4),
            "prefill_s": round(float(num(vanilla["ttft_s"]).mean()), 4) if "ttft_s" in vanilla else 0.0,
            "tasks": tasks, "speedup": speedup, "class_speedup": class_speedup,
            "samples": int(vanilla["sample_id"].nunique()),
            "source": [str(Path(r)) for r in run_dirs
                       if any(Path(d).resolve().is_relative_to(Path(r).resolve()) for d in g["run_dir"].unique())],
            **({"batch": batches} if batches else {}),
        }
    return out


def with_classes(found: dict[str, dict]) -> dict[str, dict]:
    """``found`` plus, for each CPU generation's entry, the same entry under its instruction-set class's key."""
    return {**found, **{machine_key(e["model"], e["dtype"], e["cpu_isa"]): e for e in found.values() if e.get("cpu")}}


def merge(table: dict, found: dict[str, dict], batch_only: bool) -> list[str]:
    """Write ``found`` entries into ``table`` (the module docstring's rules); the keys it could not write
    (``batch_only`` for a class without an entry, or runs without batch rows)."""
    refused = []
    for key, entry in with_classes(found).items():
        old = table["entries"].get(key)
        if batch_only:
            if old is None or not entry.get("batch"):
                refused.append(key)
                continue
            old["batch"] = {**old.get("batch", {}), **entry["batch"]}
            old["batch_source"] = entry["source"]
        else:
            if old is not None and "batch" not in entry and "batch" in old:
                entry = {**entry, "batch": old["batch"], "batch_source": old.get("batch_source", old["source"])}
            table["entries"][key] = entry
    return refused


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The cost table run.py prices a command by before it starts, from "
                                     "measured runs: print the entries these runs give, or merge them (--write).")
    parser.add_argument("runs", nargs="+", help="run folders, sweep folders or results.jsonl files")
    parser.add_argument("--write", action="store_true", help=f"merge the entries into {COSTS_FILE.name}")
    parser.add_argument("--table", type=Path, default=COSTS_FILE, help="the cost table (default: %(default)s)")
    parser.add_argument("--batch-only", action="store_true",
                        help="with --write: merge only the batch block (batch sizes > 1) into existing entries")
    args = parser.parse_args(argv)
    missing = [r for r in args.runs if not Path(r).exists()]
    if missing:
        print(f"error: no such run folder or file: {', '.join(missing)}", file=sys.stderr)
        return 2
    found = entries(args.runs)
    if not found:
        print("error: no ok rows with a vanilla row and the machine's cpu_isa in these runs; give run folders "
              "written by run.py (with vanilla among the decoders)", file=sys.stderr)
        return 2
    print(json.dumps(found, indent=1, sort_keys=True))
    if args.write:
        table = load_costs(args.table)
        refused = merge(table, found, args.batch_only)
        if refused:
            print(f"error: --batch-only needs batch rows and an existing entry of the class: none for "
                  f"{', '.join(refused)}; write the whole entry first (without --batch-only)", file=sys.stderr)
            return 2
        args.table.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
        keys = with_classes(found)
        print(f"wrote {len(keys)} entr{'y' if len(keys) == 1 else 'ies'} ({', '.join(sorted(keys))}) into {args.table}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
