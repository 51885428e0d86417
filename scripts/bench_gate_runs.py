"""Benchmark the three `gate run`s a user meets: first on a fresh machine, warm full, and a pull request's.

1. cold: empty gate cache (engine venvs, uv's wheel cache, evidence cache) and empty vLLM compile
   cache, as on a fresh machine or an ephemeral runner: both environments are installed (in
   parallel; the old engine replays as soon as its own is ready) and both engines replay.
2. reuse: the same command again: the old engine's evidence comes from the cache, only the new
   engine replays. Its floor is one engine's worker time (start-up, generation, reference, RL
   passes), printed beside it.
3. warm full: `--no-reuse`: both engines replay with every cache warm.

All three use their own temporary caches, so nothing on the machine is reused or disturbed.
Prints a table; --json writes the figures too.

    python scripts/bench_gate_runs.py [-c gate.yaml] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run(label: str, out: Path, env: dict[str, str], extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "gate", "run", "--out", str(out), *extra]
    print(f"[bench] {label}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        sys.exit(f"[bench] {label}: gate run exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    manifest = json.loads((out / "run.json").read_text())
    engines = manifest["engines"]
    return {
        "wall_s": round(wall, 1),
        "verdict": json.loads((out / "report.json").read_text())["verdict"],
        "engines": {
            n: {
                "prepare_s": e["prepare_s"],
                "worker_s": e["worker_s"],
                "reused": bool(e.get("reused")),
            }
            for n, e in engines.items()
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--config", help="gate.yaml (default: the built-in CPU default)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="gate-bench-") as tmp:
        root = Path(tmp)
        config = Path(args.config).resolve() if args.config else None
        env = {
            k: v for k, v in os.environ.items() if k not in ("GATE_EVIDENCE_DIR", "UV_CACHE_DIR")
        }
        env |= {
            "GATE_CACHE_DIR": str(root / "cache"),
            "VLLM_CACHE_ROOT": str(root / "vllm-cache"),
            "PYTHONUNBUFFERED": "1",
        }
        extra = ["-c", str(config)] if config else []
        figures = {
            "cold": run("cold (fresh caches)", root / "cold", env, extra),
            "reuse": run("pull request (old evidence reused)", root / "reuse", env, extra),
            "warm_full": run(
                "warm full run (--no-reuse)", root / "warm", env, [*extra, "--no-reuse"]
            ),
        }
    reuse, warm = figures["reuse"], figures["warm_full"]
    floor = reuse["engines"]["new"]["worker_s"]
    figures["reuse_over_warm_full"] = round(reuse["wall_s"] / warm["wall_s"], 2)
    figures["reuse_floor_s"] = floor

    print(
        f"{'run':<28} {'wall s':>7} {'old prep s':>11} {'old worker s':>13} {'new prep s':>11} {'new worker s':>13}  verdict"
    )
    for label, key in (
        ("cold (fresh machine)", "cold"),
        ("pull request (reuse old)", "reuse"),
        ("warm full (--no-reuse)", "warm_full"),
    ):
        f = figures[key]
        old, new = f["engines"]["old"], f["engines"]["new"]
        old_worker = "reused" if old["reused"] else f"{old['worker_s']:.1f}"
        print(f"{label:<28} {f['wall_s']:>7.1f} {old['prepare_s']:>11.1f} {old_worker:>13} {new['prepare_s']:>11.1f} "
              f"{new['worker_s']:>13.1f}  {f['verdict']}")  # fmt: skip
    print(
        f"pull request / warm full: {figures['reuse_over_warm_full']:.2f}x; "
        f"its floor, the new engine's worker alone: {floor:.1f} s ({reuse['wall_s'] - floor:.1f} s above it)"
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
