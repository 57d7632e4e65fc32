"""Rebuild every figure from result files: ``python -m plots.make_all RUN_DIR [RUN_DIR ...] [--out DIR]``.

RUN_DIR may be a run folder, a multirun sweep folder (searched recursively for ``results.jsonl``) or a
file; the default is ``results/``. Each figure of :data:`plots.FIGURES` is written as PNG and PDF to
``--out`` (default ``<first RUN_DIR>/figures``); figures the rows cannot support are skipped with a logged
note. Never imports torch or the decoders.
"""

from __future__ import annotations

import argparse
import inspect
import logging
import sys
from pathlib import Path
from typing import Sequence

from harness.report import aggregate, load_rows
from plots import FIGURES, save

log = logging.getLogger(__name__)


def make_all(paths: Sequence[str | Path], out_dir: str | Path | None = None,
             only: Sequence[str] | None = None) -> dict[str, list[Path]]:
    """Draw every figure (or those named in ``only``) from the rows under ``paths``.

    Returns:
        figure name -> written paths (skipped figures are absent).
    """
    rows = load_rows(paths)
    out = Path(out_dir) if out_dir else Path(paths[0]) / "figures"
    if rows.empty:
        log.warning("no result rows under %s: no figures", ", ".join(map(str, paths)))
        return {}
    agg = aggregate(rows)
    written: dict[str, list[Path]] = {}
    for name, fn in FIGURES.items():
        if only and name not in only:
            continue
        try:
            fig = fn(rows, agg=agg) if "agg" in inspect.signature(fn).parameters else fn(rows)
        except Exception:  # one broken figure must not cost the others
            log.exception("figure %s failed", name)
            continue
        if fig is None:
            continue
        written[name] = save(fig, out, name)
        log.info("wrote %s", written[name][0])
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m plots.make_all", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="*", default=["results"], help="run / sweep folders or results files")
    parser.add_argument("--out", default=None, help="output folder (default: <first RUN_DIR>/figures)")
    parser.add_argument("--only", nargs="*", default=None, choices=sorted(FIGURES), help="figures to draw")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        written = make_all(args.run_dirs, args.out, args.only)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for name, paths in written.items():
        print(f"{name}: {', '.join(map(str, paths))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
