"""What the mini GRPO run's paired design costs per engine: the GRPO phase before and after (issue 50).

Before: one seed, the whole run's prompts sharing each step's sampling seed, no eval set (the design
that ran through gate 0.1 until issue 50; here one seed of today's run stands in for it: the same
steps, rollouts and pushes). After: the config's ``grpo.seeds`` seeds, each evaluated on the eval
set, plus the checkpoint's eval. Both through the new engine in one invocation, the other passes
off, so the figures are the GRPO phase's own: training steps (rollout, trainer step, push), the
eval's sampling, and the worker's wall time.

    python scripts/bench_grpo_phase.py                                  # the CPU default
    python scripts/bench_grpo_phase.py -c examples/smollm2-cpu.yaml     # SmolLM2 (bf16)

Prints a table; --json writes the figures too.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gate.config import BUILTIN_CONFIG, GateConfig, load_config  # noqa: E402
from gate.contract import evidence as ev  # noqa: E402
from gate.engine_jobs import EngineJob  # noqa: E402
from gate.replay import run_gate  # noqa: E402
from gate.runners.base import stderr_log  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--config", type=Path, default=BUILTIN_CONFIG)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    cfg = _grpo_only(load_config(args.config))
    figures = {}
    with tempfile.TemporaryDirectory(prefix="bench-grpo-") as tmp:
        figures["before (1 seed, no eval)"] = _phase(
            cfg, (0,), Path(tmp) / "before", evaluate=False
        )
        figures[f"after ({cfg.grpo.seeds} seeds + eval)"] = _phase(
            cfg, tuple(range(cfg.grpo.seeds)), Path(tmp) / "after", evaluate=True
        )
    print("| design | GRPO phase s | training s | eval s | worker wall s |")
    print("| --- | --: | --: | --: | --: |")
    for label, f in figures.items():
        print(
            f"| {label} | {f['grpo_s']:.1f} | {f['train_s']:.1f} | {f['eval_s']:.1f} | {f['worker_s']:.1f} |"
        )
    if args.json:
        args.json.write_text(json.dumps({"config": str(args.config), **figures}, indent=2) + "\n")
    return 0


def _grpo_only(cfg: GateConfig) -> GateConfig:
    """The config with every pass but the sample pass and GRPO off: the worker's time is GRPO's."""
    return dataclasses.replace(
        cfg,
        greedy=dataclasses.replace(cfg.greedy, enabled=False),
        teacher_forced=dataclasses.replace(cfg.teacher_forced, enabled=False),
        weight_sync=dataclasses.replace(cfg.weight_sync, enabled=False),
    )


def _phase(cfg: GateConfig, seeds: tuple[int, ...], out: Path, evaluate: bool) -> dict[str, float]:
    job = EngineJob("new", cfg.engines["new"], grpo_seeds=seeds)
    started = time.perf_counter()
    result = run_gate(cfg, out, stderr_log, [job])
    if result.status != "ok":
        raise SystemExit(f"{out}: the engine failed; see its worker.log")
    e = ev.load(result.run_dir / "engines" / "new")
    train = float(np.atleast_2d(e["grpo_step_s"]).sum())
    # "before" had no eval set: its one seed's steps are the phase
    eval_s = float(e.engine.grpo.get("eval_s") or 0.0) if evaluate else 0.0
    return {
        "train_s": round(train, 2),
        "eval_s": round(eval_s, 2),
        "grpo_s": round(train + eval_s, 2),
        "worker_s": round(result.engines[0].worker_s, 1),
        "wall_s": round(time.perf_counter() - started, 1),
    }


if __name__ == "__main__":
    raise SystemExit(main())
