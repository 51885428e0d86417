"""forward-drift's bounds scale with the calibrated noise of each pair; hand-computed cases.

Every teacher-forced logprob of the new engine is shifted by ``shift``, so mean and max drift both
equal it (to float32 rounding). Default bounds: mean warn max(4x noise, 5e-4), fail max(10x noise,
2e-3); max warn max(4x noise, 1e-2), fail max(10x noise, 5e-2).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from gate.baseline import Baseline
from gate.checks import parse_settings, run_checks
from gate.checks.context import Context
from gate.checks.forward_drift import NOISY_AA
from gate.verdict import Status

from ..factory import RUN, make_evidence

# The noisy baseline (sigma=0.01 emulation): mean drift 2.9e-3, max 0.06.
NOISY = {"mean_abs_drift": 2.9e-3, "max_abs_drift": 0.06}


def _drift(tmp_path: Path, shift: float, noise: dict | None = None, comparable: bool = True,
           device: str = "cpu"):  # fmt: skip
    old = make_evidence(tmp_path / "old", seed=1)
    new = make_evidence(tmp_path / "new", seed=2, tf_offset=shift)
    new.engine["identity"]["device_kind"] = device
    baseline = None
    if noise is not None:
        baseline = Baseline(
            path=tmp_path, manifest={"engine": old.engine}, evidence=old, noise=noise
        )
    ctx = Context(
        new=new, old=old, run=copy.deepcopy(RUN), baseline=baseline, baseline_comparable=comparable
    )
    r = next(r for r in run_checks(ctx, parse_settings({}, "gate.yaml")) if r.id == "forward-drift")
    return {(m.name, m.engine): m for m in r.measurements}, r


def _bounds(m):
    return m.status, pytest.approx(m.warn), pytest.approx(m.fail)


def test_uncalibrated_cpu_uses_the_absolute_floors(tmp_path):
    ms, _ = _drift(tmp_path, 2.9e-3)
    assert _bounds(ms[("mean_abs_drift", "vs old")]) == (Status.FAIL, 5e-4, 2e-3)
    assert _bounds(ms[("max_abs_drift", "vs old")]) == (Status.PASS, 1e-2, 5e-2)
    assert "absolute floors" in ms[("mean_abs_drift", "vs old")].note


def test_vs_old_scales_with_the_calibrated_noise_like_vs_baseline(tmp_path):
    # The run: a noisy calibration, then a clean upgrade reading the A/A level vs old.
    ms, r = _drift(tmp_path, 2.9e-3, NOISY)
    for label in ("vs old", "vs baseline"):
        assert _bounds(ms[("mean_abs_drift", label)]) == (Status.PASS, 4 * 2.9e-3, 10 * 2.9e-3)
        assert _bounds(ms[("max_abs_drift", label)]) == (Status.PASS, 4 * 0.06, 10 * 0.06)
    assert r.status == Status.PASS
    assert "calibrated A/A" in ms[("mean_abs_drift", "vs old")].note


def test_a_drift_ten_times_the_noise_still_fails(tmp_path):
    ms, _ = _drift(tmp_path, 0.035, NOISY)
    assert ms[("mean_abs_drift", "vs old")].status == Status.FAIL  # 0.035 > 2.9e-2
    assert ms[("max_abs_drift", "vs old")].status == Status.PASS  # 0.035 < 0.24


def test_tiny_noise_never_goes_below_the_floors(tmp_path):
    ms, _ = _drift(tmp_path, 1e-3, {"mean_abs_drift": 1e-6, "max_abs_drift": 1e-5})
    assert _bounds(ms[("mean_abs_drift", "vs old")]) == (Status.WARN, 5e-4, 2e-3)


def test_a_baseline_of_another_setup_does_not_calibrate(tmp_path):
    ms, _ = _drift(tmp_path, 2.9e-3, NOISY, comparable=False)
    assert ("mean_abs_drift", "vs baseline") not in ms
    assert _bounds(ms[("mean_abs_drift", "vs old")]) == (Status.FAIL, 5e-4, 2e-3)


def test_uncalibrated_off_the_cpu_assumes_a_noisy_a_a(tmp_path):
    ms, _ = _drift(tmp_path, 2.9e-3, device="cuda")
    m = ms[("mean_abs_drift", "vs old")]
    assert _bounds(m) == (
        Status.PASS,
        4 * NOISY_AA["mean_abs_drift"],
        10 * NOISY_AA["mean_abs_drift"],
    )
    assert "run gate calibrate" in m.note
    ms, _ = _drift(tmp_path / "b", 0.05, device="cuda")
    assert ms[("mean_abs_drift", "vs old")].status == Status.FAIL  # 0.05 > 10 x 3.0e-3
