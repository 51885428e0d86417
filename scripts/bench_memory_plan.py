#!/usr/bin/env python3
"""Check the memory plan against the worker's measured peak memory, on the mid-size model.

Makes the mid-size Llama (scripts/make_mid_model.py) if it is not there yet, writes a copy of
scripts/mid-llama.yaml pointing at it, runs ``gate run`` on it and compares, per phase of the
worker (engine, weight_sync, grpo, reference), the plan's bytes with the measured peak:

- engine.json ``memory_peaks`` (gate.worker.memory, sampled inside the worker) when the worker
  records them;
- else the RSS of the worker's process tree sampled from outside every ``--interval`` seconds,
  with phases told apart by the worker's progress lines on stderr.

Prints one row per engine and phase, the per-phase timings of engine.json, and exits 1 when a
phase's plan is off the measured peak by more than ``--tolerance`` (0.25: within +-25%).
Engine venvs come from ``$GATE_CACHE_DIR`` as for ``gate run``::

    python scripts/bench_memory_plan.py
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

import make_mid_model  # noqa: E402

from gate.worker.memory import process_tree, rss_bytes  # noqa: E402

TEMPLATE = REPO / "scripts" / "mid-llama.yaml"
GiB = 2**30
WORKER_MODULE = "gate.worker"
# The worker's progress lines (gate.worker.main / passes) that open each planned phase.
PHASE_STARTS = (
    ("starting engine", "engine"),
    ("weight-sync probe", "weight_sync"),
    ("mini GRPO", "grpo"),
    ("engine released", "reference"),
    ("done in", "done"),
)
_ENGINE_LINE = re.compile(r"^\[(old|new)\] (.*)$")


def write_config(model: Path, out_dir: Path, template: Path = TEMPLATE,
                 overrides: Sequence[str] = ()) -> Path:  # fmt: skip
    """scripts/mid-llama.yaml with absolute paths, ``model`` as model.path and ``section.key=value``
    overrides (values in YAML: ``grpo.trainable=all``, ``reference.dtype=bfloat16``)."""
    data = yaml.safe_load(template.read_text())
    data["model"]["path"] = str(model)
    for item in overrides:
        dotted, _, value = item.partition("=")
        *parents, key = dotted.split(".")
        node = data
        for parent in parents:
            node = node.setdefault(parent, {})
        node[key] = yaml.safe_load(value)
    data["prompts"] = [str((template.parent / p).resolve()) for p in data["prompts"]]
    path = out_dir / "mid-llama.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@dataclass
class OutsideSampler:
    """Peak RSS of the gate's worker process tree per (engine, phase), sampled from outside."""

    gate_pid: int
    interval_s: float
    phase: tuple[str, str] = ("", "")
    peaks: dict[str, dict[str, int]] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def on_line(self, line: str) -> None:
        m = _ENGINE_LINE.match(line.strip())
        if not m:
            return
        engine, message = m.groups()
        for start, phase in PHASE_STARTS:
            if message.startswith(start) or message.startswith(f"[request 1/1] {start}"):
                self.phase = (engine, phase)

    def run(self) -> None:
        while not self.stop.wait(self.interval_s):
            engine, phase = self.phase
            if not engine or phase == "done":
                continue
            rss = sum(sum(rss_bytes(p) for p in process_tree(w)) for w in self._workers())
            slot = self.peaks.setdefault(engine, {})
            slot[phase] = max(slot.get(phase, 0), rss)

    def _workers(self) -> list[int]:
        found = []
        for pid in process_tree(self.gate_pid):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if WORKER_MODULE.encode() in cmd and b"-m" in cmd:
                found.append(pid)
        return found


def run_gate(
    config: Path, run_dir: Path, interval_s: float, extra: list[str]
) -> tuple[int, OutsideSampler, float]:
    cmd = [sys.executable, "-m", "gate", "run", "-c", str(config), "--out", str(run_dir), *extra]
    print("$ " + " ".join(cmd), file=sys.stderr)
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, cwd=REPO)
    sampler = OutsideSampler(proc.pid, interval_s)
    thread = threading.Thread(target=sampler.run, daemon=True)
    thread.start()
    assert proc.stderr is not None
    for line in proc.stderr:
        sys.stderr.write(line)
        sampler.on_line(line)
    code = proc.wait()
    sampler.stop.set()
    thread.join()
    return code, sampler, time.perf_counter() - started


def planned(run_dir: Path) -> dict[str, dict[str, int]]:
    """Per engine and phase, the plan's bytes on the first device (run.json ``memory_plan``)."""
    run = json.loads((run_dir / "run.json").read_text())
    plan = run.get("memory_plan") or {}
    out: dict[str, dict[str, int]] = {}
    for group in plan.get("engines", []):
        device = group["devices"][0]["name"]
        phases = {
            name: per[device]["total_bytes"]
            for name, per in group["phases"].items()
            if device in per
        }
        for engine in group["engines"]:
            out[engine] = phases
    return out


def measured_inside(run_dir: Path, engine: str) -> tuple[dict[str, int] | None, dict]:
    """engine.json's memory_peaks per planned phase (None when the worker did not record them), timings."""
    meta = json.loads((run_dir / "engines" / engine / "engine.json").read_text())
    peaks = meta.get("memory_peaks")
    timings = meta.get("timings", {})
    if not peaks:
        return None, timings
    phases = peaks.get("phases", {})
    out: dict[str, int] = {}
    for name, values in phases.items():
        # The worker's own names: engine start and the replay passes make up "engine".
        plan_phase = {"engine_start": "engine", "sample": "engine", "greedy": "engine",
                      "teacher_forced": "engine"}.get(name, name)  # fmt: skip
        out[plan_phase] = max(out.get(plan_phase, 0), int(values["rss_peak_bytes"]))
    return out, timings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="default: make_mid_model's default folder")
    parser.add_argument("--out", type=Path, help="run directory (default: a temporary one)")
    parser.add_argument("--interval", type=float, default=0.2)
    parser.add_argument("--tolerance", type=float, default=0.25)
    parser.add_argument("--json", type=Path, help="write the comparison here")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="change the template config, e.g. --set grpo.trainable=all")  # fmt: skip
    parser.add_argument("gate_args", nargs="*", help="more `gate run` arguments (after --)")
    args = parser.parse_args(argv)
    model = args.model or make_mid_model.default_out()
    make_mid_model.main(["--out", str(model)])
    tmp = Path(tempfile.mkdtemp(prefix="bench-memory-"))
    run_dir = args.out or tmp / "run"
    code, sampler, wall = run_gate(
        write_config(model, tmp, overrides=args.set), run_dir, args.interval, args.gate_args
    )
    if not (run_dir / "run.json").is_file():
        print(f"gate run exited {code} and left no run directory", file=sys.stderr)
        return 2
    if code not in (0, 1):  # e.g. --only without a baseline cannot be judged: memory still can
        print(f"gate run exited {code}; comparing the memory it measured anyway", file=sys.stderr)
    plan = planned(run_dir)
    rows, worst = [], 0.0
    for engine in sorted(plan):
        inside, timings = measured_inside(run_dir, engine)
        outside = sampler.peaks.get(engine, {})
        measured = inside or outside
        for phase, want in plan[engine].items():
            got = measured.get(phase)
            ratio = None if not got else want / got - 1
            worst = max(worst, abs(ratio or 0))
            rows.append({"engine": engine, "phase": phase, "plan_bytes": want, "measured_bytes": got,
                         "outside_bytes": outside.get(phase), "error": ratio,
                         "measured_by": "engine.json memory_peaks" if inside else "outside sampler"})  # fmt: skip
            seen = f"{got / GiB:6.2f} GiB  {ratio:+.0%}" if got and ratio is not None else "   n/a"
            also = (
                f"  (outside: {outside[phase] / GiB:.2f} GiB)"
                if inside and outside.get(phase)
                else ""
            )
            print(f"{engine:<4} {phase:<12} plan {want / GiB:6.2f} GiB  measured {seen}{also}")
        print(f"{engine:<4} measured by {'engine.json memory_peaks' if inside else 'the outside sampler'}; "
              "timings: " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(timings.items()) if k.endswith("_s")))  # fmt: skip
    result = {"wall_s": wall, "rows": rows, "worst_error": worst, "tolerance": args.tolerance,
              "run_dir": str(run_dir)}  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    print(
        f"gate run {wall:.0f}s; worst plan-vs-measured {worst:.0%} (tolerance {args.tolerance:.0%})"
    )
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    raise SystemExit(main())
