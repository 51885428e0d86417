#!/usr/bin/env python3
"""Time the Markdown renderer on the example reports (docs/examples/*.report.json) or given ones.

    python scripts/bench_render.py [REPORT.json ...] [--repeat 20]

Prints, per report and format, the first call (templates compiled on first use in a process) and the
median and best of the repeats, in milliseconds, with the output size.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gate.render.markdown import render_comment, render_full, render_summary  # noqa: E402

FORMATS = {
    "comment": lambda r: render_comment(r).text,
    "summary": render_summary,
    "full": render_full,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="*", type=Path)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args(argv)
    paths = args.reports or sorted((REPO / "docs" / "examples").glob("*.report.json"))
    print(f"{'report':<22} {'format':<8} {'first ms':>9} {'median ms':>10} {'best ms':>8} {'chars':>8}")
    for path in paths:
        report = json.loads(path.read_text(encoding="utf-8"))
        for name, fn in FORMATS.items():
            t = time.perf_counter()
            text = fn(report)
            first = time.perf_counter() - t
            times = []
            for _ in range(args.repeat):
                t = time.perf_counter()
                fn(report)
                times.append(time.perf_counter() - t)
            print(f"{path.name:<22} {name:<8} {first * 1e3:>9.1f} {statistics.median(times) * 1e3:>10.1f} {min(times) * 1e3:>8.1f} {len(text):>8,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
