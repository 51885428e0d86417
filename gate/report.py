"""report.json: the machine-readable verdict, everything a renderer needs (schema in docs/report.md).

The schema is versioned (``schema``) and declared in :mod:`gate.report_model`, which every reader
loads a report through; a reader refuses a major version it does not know.
"""

from __future__ import annotations

import json
import math
import shlex
from collections import Counter
from pathlib import Path
from typing import Any

from gate import __version__
from gate.config import BUILTIN_CONFIG, GateConfig
from gate.files import REPORT_FILE, write_json
from gate.host import repository_root
from gate.judge import Judgment
from gate.report_model import SCHEMA
from gate.run_record import read_run_manifest
from gate.verdict import Status


def build(run_dir: Path, cfg: GateConfig, judgment: Judgment) -> dict[str, Any]:
    run = read_run_manifest(run_dir)
    counts = Counter(c.status.value for c in judgment.checks)
    root = _paths_root(cfg.source)
    baseline = judgment.baseline.to_dict()
    if isinstance(baseline.get("path"), str):
        baseline["path"] = shown_path(baseline["path"], root)
    return {
        "schema": SCHEMA,
        "gate_version": __version__,
        "gate_id": cfg.gate_id,
        "verdict": judgment.verdict.value,
        "exit_code": judgment.exit_code(cfg.fail_on),
        "fail_on": cfg.fail_on,
        "counts": {s.value: counts.get(s.value, 0) for s in Status},
        "errors": judgment.errors,
        "run": {
            k: run.get(k)
            for k in (
                "started",
                "finished",
                "config",
                "model",
                "prompt_sets",
                "sampling",
                "greedy",
                "teacher_forced",
                "reference",
            )
        }
        | {"dir": shown_path(str(run_dir), root), "config": shown_path(cfg.source, root)},
        "engines": {name: _engine(run_dir, name, entry) for name, entry in run["engines"].items()},
        "baseline": baseline,
        "checks": [c.to_dict() for c in judgment.checks],
        "commands": commands(cfg),
        **_grpo(judgment),
        **_memory_plan(run_dir, run),
    }


def _memory_plan(run_dir: Path, run: dict[str, Any]) -> dict[str, Any]:
    """The plan run.json holds, with each engine's measured peak RSS when the worker recorded one."""
    plan = run.get("memory_plan")
    if not isinstance(plan, dict):
        return {}
    measured = {}
    for name in run.get("engines", {}):
        meta_path = run_dir / "engines" / name / "engine.json"
        if meta_path.is_file():
            peaks = json.loads(meta_path.read_text(encoding="utf-8")).get("memory_peaks") or {}
            if isinstance(peaks.get("rss_peak_bytes"), int):
                measured[name] = peaks["rss_peak_bytes"]
    return {"memory_plan": plan | ({"measured_peak_bytes": measured} if measured else {})}


def _grpo(judgment: Judgment) -> dict[str, Any]:
    """The trajectories for the renderer's charts, when the GRPO check ran."""
    check = next(
        (c for c in judgment.checks if c.id == "grpo-trajectory" and "metrics" in c.details), None
    )
    if check is None:
        return {}
    d = check.details
    return {
        "grpo": {
            "steps": d["steps"],
            "compared_with": d["compared_with"],
            "metrics": d["metrics"],
            "first_exit": d["first_exit"],
            "seeds": d.get("seeds", []),
            "null_seeds": d.get("null_seeds"),
            "statistics": d.get("statistics", {}),
            "eval": d.get("eval"),
            "summary": check.summary,
        }
    }


def _engine(run_dir: Path, name: str, entry: dict) -> dict[str, Any]:
    out = {k: entry.get(k) for k in ("spec", "runner", "status", "error", "log_tail", "reused")}
    meta_path = run_dir / "engines" / name / "engine.json"
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        out |= {
            k: meta.get(k)
            for k in (
                "identity",
                "effective",
                "numerics",
                "default_sampling_params",
                "dropped_engine_args",
                "timings",
                "counts",
            )
        }
    return out


def commands(cfg: GateConfig) -> dict[str, str]:
    """The commands that reproduce the run, as typed at the repository's root (the built-in default:
    no ``-c``); a report never shows the runner's absolute paths."""
    source = cfg.source
    builtin = not source or Path(source).resolve() == BUILTIN_CONFIG.resolve()
    root = _paths_root(source)
    config = "" if builtin else f" -c {shlex.quote(shown_path(source, root))}"
    return {
        "reproduce": f"gate run{config}",
        "regenerate_baseline": f"gate baseline update{config}",
    }


def _paths_root(source: str) -> Path:
    """What report paths are relative to: the checkout holding the config, else the working directory."""
    return repository_root(Path(source).parent if source else Path.cwd()) or Path.cwd().resolve()


def shown_path(path: str, root: Path) -> str:
    """``path`` relative to the repository when inside it; elsewhere only its name (a runner's
    absolute path means nothing to a reader and tells where the runner keeps its files)."""
    if not path:
        return path
    p = Path(path)
    resolved = (root / p).resolve() if not p.is_absolute() else p.resolve()
    try:
        return resolved.relative_to(root).as_posix() or "."
    except ValueError:
        return resolved.name


def write(run_dir: Path, report: dict[str, Any]) -> Path:
    path = run_dir / REPORT_FILE
    write_json(path, _finite(report))
    return path


def _finite(value: Any) -> Any:
    """JSON has no NaN/inf: undefined statistics (e.g. Pearson of a constant) become null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
