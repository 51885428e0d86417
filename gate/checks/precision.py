"""precision: does the engine's final projection behave like an fp32 or a bf16 lm_head?

On the teacher-forced tokens, the engine's raw logprobs are compared with the reference computed
with an fp32 projection and with a bf16 one. Logits from a bf16 lm_head move policy ratios enough
to matter (MiniMax-M1, ScaleRL, PipelineRL all moved to an fp32 head on both sides). FAIL when the
config declares ``expect_lm_head: fp32`` and the engine is clearly closer to bf16.

That emulation matches vLLM's rounding only for identical hidden states: behind a bf16 trunk (every
GPU run) both distances are large and it reads "inconclusive". The logits then speak for
themselves: bf16 values lie on a grid, so the gaps between an engine's top-k logprobs on the greedy
pass (raw logits, shifted by one log-sum-exp) are multiples of 2^-7 wherever the logits are at
least 1 in magnitude; fp32 logits land on that grid by chance only (about 0.3% of gaps within the
tolerance). :func:`logit_grid` decides then.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gate.checks.base import CheckResult, CheckSettings, CheckSpec, Measurement
from gate.checks.context import Context
from gate.contract import keys
from gate.verdict import Status

ID = "precision"
TITLE = "lm_head precision"


def classify(d_fp32: float, d_bf16: float, decisive_ratio: float) -> str:
    if d_fp32 * decisive_ratio <= d_bf16:
        return "fp32"
    if d_bf16 * decisive_ratio <= d_fp32:
        return "bf16"
    return "inconclusive"


BF16_GRID = (
    2.0**-7
)  # bf16 keeps 8 significant bits: in [1, 2) its values are 2^-7 apart, coarser above
GRID_TOLERANCE = 2e-5  # fp32 rounding of a log-softmax of magnitude up to ~30, with room
GRID_MIN_GAPS = 200  # below this many non-zero gaps the fraction says nothing
GRID_BF16, GRID_FP32 = 0.9, 0.1  # fractions on the grid that decide; in between is inconclusive


@dataclass(frozen=True)
class LogitGrid:
    on_grid: float | None  # fraction of non-zero top-k gaps that are multiples of 2^-7
    gaps: int
    verdict: str  # "bf16" | "fp32" | "inconclusive"


def logit_grid(topk_logprobs: np.ndarray | None) -> LogitGrid:
    """How many gaps between neighbouring top-k logprobs lie on bf16's 2^-7 grid (greedy pass: raw logits)."""
    if topk_logprobs is None or topk_logprobs.ndim != 2 or topk_logprobs.shape[1] < 2:
        return LogitGrid(None, 0, "inconclusive")
    lp = np.sort(topk_logprobs.astype(np.float64), axis=1)
    gaps = np.diff(lp, axis=1).ravel()
    gaps = gaps[
        np.isfinite(gaps) & (gaps > GRID_TOLERANCE)
    ]  # ties are on every grid: they prove nothing
    if len(gaps) < GRID_MIN_GAPS:
        return LogitGrid(None, len(gaps), "inconclusive")
    steps = gaps / BF16_GRID
    on_grid = float(np.mean(np.abs(steps - np.round(steps)) * BF16_GRID <= GRID_TOLERANCE))
    verdict = "bf16" if on_grid >= GRID_BF16 else "fp32" if on_grid <= GRID_FP32 else "inconclusive"
    return LogitGrid(on_grid, len(gaps), verdict)


def run(ctx: Context, settings: CheckSettings) -> CheckResult:
    opts = settings.options
    expect = opts["expect_lm_head"]
    found, measurements, grids = {}, [], {}
    for name, e in ctx.engines():
        engine = e[f"{keys.TF}_{keys.ENGINE_LOGPROB}"].astype(np.float64)
        d_fp32 = float(np.abs(engine - e[f"{keys.TF}_{keys.TRAINER_RAW}"]).mean())
        d_bf16 = float(np.abs(engine - e[f"{keys.TF}_{keys.TRAINER_RAW_BF16_HEAD}"]).mean())
        grid = logit_grid(e.arrays.get(f"{keys.GREEDY}_{keys.TOPK_LOGPROBS}"))
        emulated = classify(d_fp32, d_bf16, opts["decisive_ratio"])
        found[name] = emulated if emulated != "inconclusive" else grid.verdict
        grids[name] = {
            "fraction_on_bf16_grid": grid.on_grid,
            "gaps": grid.gaps,
            "verdict": grid.verdict,
            "emulation": emulated,
        }
        measurements += [
            Measurement("mean_abs_diff_fp32_head", d_fp32, Status.PASS, engine=name),
            Measurement("mean_abs_diff_bf16_head", d_bf16, Status.PASS, engine=name),
        ]
        if grid.on_grid is not None:
            measurements.append(
                Measurement("top_k_gaps_on_bf16_grid", grid.on_grid, Status.PASS, engine=name)
            )
    summary = ", ".join(_behaviour(n, v, grids[n]) for n, v in found.items())
    details = {"behaves_like": found, "expect_lm_head": expect, "logit_grid": grids}
    if expect != "any" and found["new"] != expect and found["new"] != "inconclusive":
        diagnosis = (
            f"The config declares an {expect} lm_head but the new engine's logprobs match a {found['new']} projection "
            "better. Run the final projection in fp32 in the engine (and the trainer), e.g. keep lm_head weights and "
            "logits in fp32, or change expect_lm_head if bf16 is intended."
        )
        return CheckResult(ID, TITLE, Status.FAIL, summary, diagnosis, measurements, details)
    if "old" in found and found["old"] != found["new"] and "inconclusive" not in found.values():
        return CheckResult(
            ID,
            TITLE,
            Status.WARN,
            summary,
            "The lm_head precision changed between the engines.",
            measurements,
            details,
        )
    return CheckResult(ID, TITLE, Status.PASS, summary, "", measurements, details)


def _behaviour(name: str, verdict: str, grid: dict) -> str:
    """``new behaves like bf16``, plus the grid's figure when it, not the emulation, decided."""
    if grid["emulation"] != "inconclusive" or grid["fraction_on_bf16_grid"] is None:
        return f"{name} behaves like {verdict}"
    return f"{name} behaves like {verdict} ({grid['fraction_on_bf16_grid']:.0%} of top-k gaps on the bf16 grid)"


SPEC = CheckSpec(
    id=ID,
    title=TITLE,
    run=run,
    options={"expect_lm_head": "any", "decisive_ratio": 3.0},
    compares_engine_logprobs=True,
    requires=(f"{keys.TF}_{keys.ENGINE_LOGPROB}", "teacher_forced.enabled: false"),
)
