"""Benchmark server mode against offline: `gate run --no-reuse` on the CPU default, both ways.

Each round runs the built-in default offline, then `examples/server-cpu.yaml` (the same model,
prompts, passes and engines through vLLM's OpenAI server), one after the other, with the caches as
they are (engine environments, vLLM's compile and model-info caches: warm after the first round,
which is run and left out unless --no-warmup). Prints the whole run's wall time and, per engine,
where the worker's time went; the figure the server-mode issue sets is the ratio of wall times.

    python scripts/bench_server_mode.py [--rounds 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODES = {"offline": [], "server": ["-c", str(REPO / "examples" / "server-cpu.yaml")]}
PASSES = ("sample_s", "greedy_s", "teacher_forced_s", "weight_sync_s", "grpo_s")


def run(mode: str, out: Path) -> dict:
    cmd = [sys.executable, "-m", "gate", "run", "--no-reuse", "--out", str(out), *MODES[mode]]
    print(f"[bench] {mode}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        sys.exit(f"[bench] {mode}: gate run exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    engines = {}
    for name in ("old", "new"):
        t = json.loads((out / "engines" / name / "engine.json").read_text())["timings"]
        engines[name] = {
            "worker_s": round(t["total_s"], 1),
            "import_s": round(t["import_s"], 1),
            "engine_start_s": round(t["engine_start_s"], 1),
            "passes_s": round(sum(t.get(k, 0.0) for k in PASSES), 1),
        }
    return {"wall_s": round(wall, 1), "engines": engines}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="measured rounds (default 2)")
    parser.add_argument("--no-warmup", action="store_true", help="measure the first round too")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()

    rounds: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="gate-bench-server-") as tmp:
        for i in range(args.rounds + (0 if args.no_warmup else 1)):
            figures = {mode: run(mode, Path(tmp) / f"{mode}-{i}") for mode in MODES}
            if i or args.no_warmup:
                rounds.append(figures)

    # In server mode the server starts while the worker imports: the three do not add up there.
    print(
        f"{'round':<6} {'mode':<8} {'wall s':>7}  per engine: worker s (import, engine start, passes)"
    )
    for i, figures in enumerate(rounds, start=1):
        for mode, f in figures.items():
            parts = "   ".join(
                f"{n} {e['worker_s']:.1f} ({e['import_s']:.1f}, {e['engine_start_s']:.1f}, {e['passes_s']:.1f})"
                for n, e in f["engines"].items()
            )
            print(f"{i:<6} {mode:<8} {f['wall_s']:>7.1f}  {parts}")
    medians = {m: statistics.median(r[m]["wall_s"] for r in rounds) for m in MODES}
    ratio = medians["server"] / medians["offline"]
    print(f"median wall: offline {medians['offline']:.1f} s, server {medians['server']:.1f} s: "
          f"server / offline {ratio:.2f}x")  # fmt: skip
    if args.json:
        doc = {"rounds": rounds, "median_wall_s": medians, "ratio": round(ratio, 2)}
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
