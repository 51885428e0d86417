#!/usr/bin/env python3
"""Time the Markdown renderer on the example reports (docs/examples/*.report.json) or given ones.

    python scripts/bench_render.py [REPORT.json ...] [--repeat 20] [--check]

Prints, per report and format, the first call (templates compiled on first use in a process) and the
median and best of the repeats, in milliseconds, with the output size. The renderer's budget is
BUDGET_MS per report and format (best of the repeats, templates warm): `gate comment` and the job
summary run on every pull request. --check exits 1 where a report is over it; run it on a quiet
machine (a loaded CI runner measures the load, not the renderer).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gate.render.markdown import render_comment, render_full, render_summary  # noqa: E402
from gate.report_model import Report, load_report  # noqa: E402

FORMATS: dict[str, Callable[[Report], str]] = {
    "comment": lambda r: render_comment(r).text,
    "summary": render_summary,
    "full": render_full,
}
# 50 ms a format (issue 16): a fraction of a comment step's start-up; the largest example (the merged
# report, three real runs) takes about 15 ms here.
BUDGET_MS = {"comment": 50.0, "summary": 50.0, "full": 50.0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="*", type=Path)
    parser.add_argument(
        "--repeat", type=int, default=20, help="timed calls per report and format (default 20)"
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 where a best time is over BUDGET_MS"
    )
    args = parser.parse_args(argv)
    paths = args.reports or sorted((REPO / "docs" / "examples").glob("*.report.json"))
    print(
        f"{'report':<22} {'format':<8} {'first ms':>9} {'median ms':>10} {'best ms':>8} {'budget ms':>10} {'chars':>8}"
    )
    over = []
    for path in paths:
        report, _ = load_report(path)  # parsed and checked once, as the commands do: not timed
        for name, fn in FORMATS.items():
            t = time.perf_counter()
            text = fn(report)
            first = time.perf_counter() - t
            times = []
            for _ in range(args.repeat):
                t = time.perf_counter()
                fn(report)
                times.append(time.perf_counter() - t)
            best_ms = min(times) * 1e3
            print(f"{path.name:<22} {name:<8} {first * 1e3:>9.1f} {statistics.median(times) * 1e3:>10.1f} {best_ms:>8.1f} "
                  f"{BUDGET_MS[name]:>10.0f} {len(text):>8,}")  # fmt: skip
            if best_ms > BUDGET_MS[name]:
                over.append(f"{path.name} {name}: {best_ms:.0f} ms > {BUDGET_MS[name]:.0f} ms")
    for line in over:
        print(f"over budget: {line}", file=sys.stderr)
    return 1 if args.check and over else 0


if __name__ == "__main__":
    sys.exit(main())
