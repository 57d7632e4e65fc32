"""CI checks of the README's first command run for real (``.ci/run``): the reduced main job produced
measured rows for every decoder with the equality columns filled and a summary, and a second run on the
same model cache fetched and converted nothing.

    python benchmarks/check_main_job.py run RUN_DIR [--decoders vanilla,speculative,hf_assisted]
    python benchmarks/check_main_job.py snapshot CACHE_DIR OUT.json
    python benchmarks/check_main_job.py cached LOG --cache CACHE_DIR --snapshot OUT.json

``run``: every decoder has at least one row with status ``ok``, every ``ok`` row has ``matches_vanilla``
filled (true or false, not null), and ``summary.csv`` / ``summary.md`` exist with a row per decoder.
``cached``: the second run's log has no line matching ``fetching|converting`` (case-insensitive), has the
``using cached converted model`` line of :mod:`harness.job.models`, and no file under the cache was created,
removed or modified since ``snapshot`` (sizes and modification times).

Exit status 0 when every check holds, 1 otherwise (each failed check printed on its own line).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from any folder

#: Log lines that mean the models were fetched or converted (harness/job/models.py).
FETCH_OR_CONVERT = re.compile(r"fetching|converting", re.IGNORECASE)
#: Log line that means a converted model was loaded from the cache (harness/job/models.py).
CACHED = re.compile(r"using cached converted model", re.IGNORECASE)


def check_run(run_dir: Path, decoders: list[str]) -> list[str]:
    """Problems with a run folder's rows and summary (empty when fine)."""
    import pandas as pd

    from harness.rows.results import read_results

    problems = []
    if not (run_dir / "results.jsonl").exists():
        return [f"{run_dir}/results.jsonl does not exist"]
    rows = read_results([run_dir])
    for d in decoders:
        mine = rows[rows["decoder"] == d] if "decoder" in rows else rows.iloc[0:0]
        ok = mine[mine["status"] == "ok"]
        if ok.empty:
            statuses = ", ".join(f"{s}: {r}" for s, r in zip(mine.get("status", []), mine.get("reason", []))) or "no rows"
            problems.append(f"{d}: no row with status ok ({statuses})")
        elif ok["matches_vanilla"].isna().any():
            problems.append(f"{d}: {int(ok['matches_vanilla'].isna().sum())} ok rows without matches_vanilla")
        else:
            print(f"[check] {d}: {len(ok)} ok rows, matches_vanilla={list(ok['matches_vanilla'])}")
    for name in ("summary.csv", "summary.md"):
        if not (run_dir / name).exists():
            problems.append(f"{run_dir}/{name} does not exist")
    if (run_dir / "summary.csv").exists():
        summary = pd.read_csv(run_dir / "summary.csv")
        missing = [d for d in decoders if d not in set(summary.get("decoder", []))]
        if missing:
            problems.append(f"summary.csv has no row for {missing}")
    return problems


def snapshot(cache: Path) -> dict[str, list[int]]:
    """``relative path -> [size, mtime_ns]`` of every file under ``cache``."""
    return {str(p.relative_to(cache)): [p.stat().st_size, p.stat().st_mtime_ns]
            for p in sorted(cache.rglob("*")) if p.is_file()}


def check_cached(log: Path, cache: Path, before: dict[str, list[int]]) -> list[str]:
    """Problems showing the second run fetched or converted something (empty when fine)."""
    problems = []
    text = log.read_text(errors="replace").splitlines()
    hits = [line for line in text if FETCH_OR_CONVERT.search(line)]
    if hits:
        problems.append("the second run fetched or converted: " + " | ".join(h.strip()[:200] for h in hits[:5]))
    cached = [line for line in text if CACHED.search(line)]
    if not cached:
        problems.append(f"no 'using cached converted model' line in {log}")
    else:
        print(f"[check] {len(cached)} cached-model lines, e.g. {cached[0].strip()[:200]}")
    after = snapshot(cache)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    if changed:
        problems.append(f"{len(changed)} files under the model cache changed in the second run: {changed[:5]}")
    else:
        print(f"[check] model cache unchanged by the second run ({len(after)} files)")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run", help="rows with status ok, equality filled, a summary")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--decoders", default="vanilla,speculative,hf_assisted")
    p = sub.add_parser("snapshot", help="record the model cache's files")
    p.add_argument("cache", type=Path)
    p.add_argument("out", type=Path)
    p = sub.add_parser("cached", help="the second run fetched and converted nothing")
    p.add_argument("log", type=Path)
    p.add_argument("--cache", type=Path, required=True)
    p.add_argument("--snapshot", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.cmd == "snapshot":
        files = snapshot(args.cache)
        args.out.write_text(json.dumps(files))
        print(f"[check] model cache: {len(files)} files, {sum(s for s, _ in files.values()) / 1e9:.2f} GB")
        return 0
    if args.cmd == "run":
        problems = check_run(args.run_dir, [d for d in args.decoders.split(",") if d])
    else:
        problems = check_cached(args.log, args.cache, json.loads(args.snapshot.read_text()))
    for line in problems:
        print(f"[check] FAILED: {line}")
    print("[check] " + ("ok" if not problems else f"{len(problems)} check(s) failed"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
