"""Benchmark LoRA mode against the full-weight mode on the same model, prompts and passes.

Runs the new engine alone (``gate run --only new --no-reuse``) twice from one config: as written
but with the mini GRPO run and the in-flight phase off (LoRA mode refuses them), and the same with
``lora`` on. Prints, per pass, the seconds of each (engine.json ``timings``), the weight pushes
(the full-weight probe's push, the adapter versions' pushes) and the whole run's wall time.

    python scripts/bench_lora.py [-c examples/smollm2-cpu.yaml] [--rank 16] [--json out.json]

Figures in docs/performance.md ("LoRA mode").
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
ALL_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PASSES = ("engine_start_s", "sample_s", "greedy_s", "prefill_decode_s", "teacher_forced_s",
          "weight_sync_s", "reference_score_s", "total_s")  # fmt: skip


def variant(source: Path, out: Path, lora: dict | None) -> Path:
    raw = yaml.safe_load(source.read_text())
    base = source.parent
    if raw["model"].get("path"):
        raw["model"]["path"] = str((base / raw["model"]["path"]).resolve())
    raw["prompts"] = [str((base / p).resolve()) for p in raw["prompts"]]
    raw.pop("baseline", None)
    raw["grpo"] = {"enabled": False}
    raw["weight_sync"] = {**(raw.get("weight_sync") or {}), "inflight": {"enabled": False}}
    if lora is not None:
        raw["lora"] = lora
    path = out / ("lora.yaml" if lora else "full.yaml")
    path.write_text(yaml.safe_dump(raw))
    return path


def measure(config: Path, out: Path) -> dict:
    cmd = [sys.executable, "-m", "gate", "run", "-c", str(config), "--out", str(out),
           "--only", "new", "--no-reuse"]  # fmt: skip
    print(f"[bench] {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    proc = subprocess.run(cmd, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        sys.exit(f"[bench] gate run exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    engine = json.loads((out / "engines" / "new" / "engine.json").read_text())
    ws = engine["weight_sync"]
    return {
        "wall_s": round(wall, 1),
        **{k: round(engine["timings"].get(k, float("nan")), 2) for k in PASSES},
        "push_s": round(ws["push_s"], 4),
        "push_again_s": round(ws["push_again_s"], 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-c", "--config", type=Path, default=REPO / "examples" / "smollm2-cpu.yaml")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    lora = {
        "enabled": True,
        "rank": args.rank,
        "alpha": 2 * args.rank,
        "target_modules": ALL_MODULES,
    }
    with tempfile.TemporaryDirectory(prefix="bench-lora-") as tmp:
        root = Path(tmp)
        full = measure(variant(args.config, root, None), root / "full")
        adapter = measure(variant(args.config, root, lora), root / "lora")
    rows = [("", "full weights", f"LoRA rank {args.rank}", "ratio")]
    for k in full:
        ratio = adapter[k] / full[k] if full[k] else float("nan")
        rows.append((k, f"{full[k]}", f"{adapter[k]}", f"{ratio:.2f}x"))
    for row in rows:
        print(f"| {' | '.join(row)} |")
    if args.json:
        args.json.write_text(
            json.dumps({"full": full, "lora": adapter, "rank": args.rank}, indent=2)
        )


if __name__ == "__main__":
    main()
