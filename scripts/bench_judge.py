#!/usr/bin/env python3
"""Time ``gate check``'s judgment (gate.judge.judge: evidence, baseline, every check) on one run.

Give one config per variant to compare, e.g. the same run judged against a baseline calibrated
under noise (noise-relative thresholds) and against one without floors (absolute thresholds): the
difference is what the threshold math costs. Each variant is judged ``--repeat`` times; the best
and the median are printed (the best is the figure to compare, the median shows the noise).

    python scripts/bench_judge.py RUN_DIR -c calibrated.yaml -c uncalibrated.yaml [--repeat 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gate.config import load_config
from gate.judge import judge


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("-c", "--config", type=Path, action="append", required=True)
    p.add_argument("--repeat", type=int, default=20)
    args = p.parse_args(argv)
    print("| config | noise floors | best (ms) | median (ms) |\n| --- | --- | --- | --- |")
    for path in args.config:
        cfg = load_config(path)
        judge(args.run_dir, cfg)  # warm: imports, file cache
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            judgment = judge(args.run_dir, cfg)
            times.append(time.perf_counter() - t)
        floors = judgment.baseline.noise_floors or "no baseline"
        print(
            f"| {path.name} | {floors[:60]} | {min(times) * 1e3:.1f} | {statistics.median(times) * 1e3:.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
