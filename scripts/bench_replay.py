"""Benchmark one `gate run`: per engine, where the replay's wall time goes.

Runs the gate (default: the built-in CPU default; venvs should already be built, e.g. by
`gate prepare`) and splits each engine's replay wall time, as the orchestrator measured it, into
vLLM start-up (imports + engine construction + engine shutdown), generation (sampled + greedy + teacher-forced
passes), the RL passes (weight-sync probe and mini GRPO run: workloads of their own, reported
apart) and the gate's own overhead (everything else: process start, tokenization, the reference
model, evidence writing and validation). Prints a table; --json writes the figures too.

Then the weight pushes, each timed in the worker: the weight-sync probe's one push and the GRPO run's
push after every step (first seed). A push must stay under PUSH_BUDGET_S: an RL trainer pushes after
every step, and a slow path (a copy through the host, a full re-load) is a regression users pay each
step. --check exits 1 where a GRPO push of the new engine is over it.

And the weight-sync probe's in-flight phase (weights pushed while requests generate), which must
stay under INFLIGHT_BUDGET_PCT of an engine's replay; --check exits 1 where it is over.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PUSH_BUDGET_S = 5.0
INFLIGHT_BUDGET_PCT = 25.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--config", help="gate.yaml (default: the built-in CPU default)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument(
        "--check",
        action="store_true",
        help=f"exit 1 where a GRPO push takes over {PUSH_BUDGET_S:.0f} s",
    )
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "gate", "run", "--out", str(out)] + (
            ["-c", args.config] if args.config else []
        )
        start = time.perf_counter()
        proc = subprocess.run(cmd, stderr=subprocess.PIPE, text=True)
        total = time.perf_counter() - start
        if proc.returncode != 0:
            print(proc.stderr[-4000:], file=sys.stderr)
            return proc.returncode
        figures: dict[str, Any] = {"gate_run_wall_s": round(total, 2), "engines": {}}
        run = json.loads((out / "run.json").read_text())
        grpo_push = (
            json.loads((out / "report.json").read_text())
            .get("grpo", {})
            .get("metrics", {})
            .get("push_s", {})
        )
        for name, entry in run["engines"].items():
            meta = json.loads((out / "engines" / name / "engine.json").read_text())
            figures["engines"][name] = breakdown(entry["worker_s"], meta) | pushes(
                meta, grpo_push.get(name)
            )

    print(f"gate run: {figures['gate_run_wall_s']:.1f} s wall (both engines, venvs warm)")
    header = (
        f"{'engine':<6} {'vllm':<8} {'replay s':>9} {'start-up s':>11} {'generate s':>11} {'RL passes s':>12} "
        f"{'overhead s':>11} {'overhead %':>11} {'gen tok/s':>10} {'ref tok/s':>10}"
    )
    print(header)
    for name, f in figures["engines"].items():
        print(
            f"{name:<6} {f['vllm']:<8} {f['replay_s']:>9.1f} {f['startup_s']:>11.1f} {f['generate_s']:>11.2f} "
            f"{f['rl_passes_s']:>12.1f} {f['overhead_s']:>11.2f} {f['overhead_pct']:>10.1f}% "
            f"{f['generated_tokens_per_s']:>10.0f} {f['reference_tokens_per_s']:>10.0f}"
        )
    print(
        "overhead % = overhead / (replay - RL passes): the replay's wall time without the RL passes"
    )
    print(
        f"{'engine':<6} {'probe push s':>13} {'GRPO pushes':>12} {'GRPO max push s':>16}  budget {PUSH_BUDGET_S:.0f} s a push"
    )
    for name, f in figures["engines"].items():
        probe = "-" if f["probe_push_s"] is None else f"{f['probe_push_s']:.2f}"
        grpo = f["grpo_push_s"]
        print(f"{name:<6} {probe:>13} {len(grpo):>12} {max(grpo, default=float('nan')):>16.2f}")
    for name, f in figures["engines"].items():
        print(f"{name:<6} in-flight phase {f['inflight_s']:.2f} s = {f['inflight_pct']:.1f}% of the replay "
              f"(budget {INFLIGHT_BUDGET_PCT:.0f}%)")  # fmt: skip
    heavy = [n for n, f in figures["engines"].items() if f["inflight_pct"] > INFLIGHT_BUDGET_PCT]
    if heavy:
        print(
            f"over budget: the in-flight phase of {heavy} above {INFLIGHT_BUDGET_PCT:.0f}%",
            file=sys.stderr,
        )
    slow = [
        s for s in figures["engines"].get("new", {}).get("grpo_push_s", []) if s > PUSH_BUDGET_S
    ]
    if slow:
        print(
            f"over budget: {len(slow)} GRPO push(es) of the new engine over {PUSH_BUDGET_S:.0f} s",
            file=sys.stderr,
        )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 1 if args.check and (slow or heavy) else 0


def pushes(meta: dict, grpo_push: list[float] | None) -> dict:
    """The weight-sync probe's push (engine.json) and the GRPO run's per-step pushes (report.json)."""
    probe = (meta.get("weight_sync") or {}).get("push_s")
    return {"probe_push_s": probe, "grpo_push_s": list(grpo_push or [])}


def breakdown(replay_s: float, meta: dict) -> dict:
    t, c = meta["timings"], meta["counts"]
    startup = (
        t["import_s"] + t["engine_start_s"] + t.get("engine_shutdown_s", 0.0)
    )  # vLLM's life cycle
    generate = t["sample_s"] + t.get("greedy_s", 0.0) + t.get("teacher_forced_s", 0.0)
    inflight = t.get("weight_sync_inflight_s", 0.0)
    rl_passes = t.get("weight_sync_s", 0.0) + inflight + t.get("grpo_s", 0.0)
    overhead = replay_s - startup - generate - rl_passes
    generated = c["sampled_tokens"] + c["greedy_tokens"] + c["teacher_forced_tokens"]
    return {
        "vllm": meta["identity"]["vllm"],
        "replay_s": replay_s,
        "startup_s": startup,
        "generate_s": generate,
        "overhead_s": overhead,
        "rl_passes_s": rl_passes,
        "inflight_s": inflight,
        "inflight_pct": 100.0 * inflight / replay_s,
        "overhead_pct": 100.0 * overhead / (replay_s - rl_passes),
        "timings": t,
        "reference_s": t["reference_load_s"] + t["reference_score_s"],
        "reference_tokens_per_s": t["reference_tokens_per_s"],
        "generated_tokens_per_s": generated / max(generate, 1e-9),
        "counts": c,
    }


if __name__ == "__main__":
    sys.exit(main())
