"""forward-drift's bounds scale with the calibrated noise of each pair; hand-computed cases.

Every teacher-forced logprob of the new engine is shifted by ``shift``, so mean and max drift both
equal it (to float32 rounding). Default bounds: mean warn max(4x noise, 5e-4), fail max(10x noise,
2e-3); max warn max(4x noise, 1e-2), fail max(10x noise, 5e-2).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from gate.baseline import Baseline, comparable, noise_applies
from gate.calibrate import noise_floors
from gate.checks.context import Context
from gate.checks.forward_drift import NOISY_AA
from gate.checks.greedy import THRESHOLDS, match_threshold
from gate.config.checks_section import parse_settings
from gate.judge import run_checks
from gate.verdict import Status

from ..factory import RUN, make_evidence, with_identity

# The noisy baseline (sigma=0.01 emulation): mean drift 2.9e-3, max 0.06.
NOISY = {"mean_abs_drift": 2.9e-3, "max_abs_drift": 0.06}


def _drift(tmp_path: Path, shift: float, noise: dict | None = None, comparable: bool = True,
           device: str = "cpu"):  # fmt: skip
    old = make_evidence(tmp_path / "old", seed=1)
    new = make_evidence(tmp_path / "new", seed=2, tf_offset=shift)
    with_identity(new, device_kind=device)
    baseline = None
    if noise is not None:
        baseline = Baseline(
            path=tmp_path, manifest={"engine": old.engine.to_json()}, evidence=old, noise=noise
        )
    ctx = Context(
        new=new,
        old=old,
        run=copy.deepcopy(RUN),
        baseline=baseline,
        baseline_comparable=comparable,
        noise_applicable=comparable,
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


def _manifest(run: dict, device: str = "cpu") -> dict:
    return {
        k: copy.deepcopy(run[k])
        for k in ("model", "prompt_sets", "sampling", "greedy", "reference")
        if k in run
    } | {"engine": {"identity": {"device_kind": device}}}


def test_the_calibration_applies_to_another_sampling_seed_but_not_another_setup(tmp_path):
    # `gate repeat` samples with other seeds: its samples are not the baseline's, its noise is.
    new = make_evidence(tmp_path / "new", seed=2)
    run = copy.deepcopy(RUN) | {
        "model": {"sha256": "m"},
        "prompt_sets": [{"name": "p", "sha256": "s"}],
    }
    base = Baseline(path=tmp_path, manifest=_manifest(run, new.engine.device_kind),
                    evidence=new, noise=NOISY)  # fmt: skip
    other_seed = run | {"sampling": run["sampling"] | {"seed": run["sampling"]["seed"] + 80}}
    assert noise_applies(base, other_seed, new) and not comparable(base, other_seed)
    other_temperature = run | {"sampling": run["sampling"] | {"temperature": 1.0}}
    assert not noise_applies(base, other_temperature, new)
    assert not noise_applies(base, run | {"model": {"sha256": "other"}}, new)
    with_identity(new, device_kind="cuda")  # a CPU calibration says nothing of a GPU's noise
    assert not noise_applies(base, run, new)


def test_greedy_bounds_scale_with_the_calibrated_a_a_mismatch(tmp_path):
    # 20 prompts, 4 greedy tokens each; the new engine's first 2 completions end differently: 90% match
    old = make_evidence(tmp_path / "old", seed=1)
    tokens = old["greedy_token_ids"].copy()
    tokens[[3, 7]] += 1
    new = make_evidence(tmp_path / "new", seed=2, greedy_tokens=tokens)

    def greedy(noise):
        base = Baseline(
            path=tmp_path, manifest={"engine": old.engine.to_json()}, evidence=old, noise=noise
        )
        ctx = Context(
            new=new, old=old, run=copy.deepcopy(RUN), baseline=base, noise_applicable=True
        )
        r = next(
            r
            for r in run_checks(ctx, parse_settings({}, "gate.yaml"))
            if r.id == "greedy-and-length"
        )
        return next(m for m in r.measurements if m.name == "greedy_exact_match_rate")

    exact = greedy({})  # an exact A/A (CPU): the absolute bounds
    assert (exact.value, exact.status, exact.warn, exact.fail) == (0.9, Status.WARN, 0.95, 0.8)
    # A/A mismatch 7% (sigma 0.03 emulation: 6-7.5%): warn below 1 - 2 x 0.07, fail below 1 - 4 x 0.07
    noisy = greedy({"greedy_mismatch_rate": 0.07})
    assert noisy.status == Status.PASS
    assert (noisy.warn, noisy.fail) == (pytest.approx(0.86), pytest.approx(0.72))
    assert "A/A greedy mismatch 0.07" in noisy.note
    assert (
        match_threshold(THRESHOLDS["greedy_exact_match_rate"], 0.01).warn.value == 0.95
    )  # never looser than set


def test_calibration_reads_greedy_flips_and_length_spread(tmp_path):
    a = make_evidence(tmp_path / "a", seed=1)
    tokens = a["greedy_token_ids"].copy()
    tokens[[3]] += 1
    b = make_evidence(tmp_path / "b", seed=1, greedy_tokens=tokens)
    floors = noise_floors(a, b)
    assert floors["greedy_mismatch_rate"] == pytest.approx(1 / 20)
    assert floors["length_ratio_deviation"] == 0.0  # the same sampled lengths


def test_calibration_leaves_out_tokens_outside_the_transform_as_the_checks_do(tmp_path):
    """A bf16 reference engine samples a few tokens on the nucleus edge (processed -inf): the
    A/A floors are read on the other tokens, like train-inference-mismatch reads them."""
    import numpy as np

    a = make_evidence(tmp_path / "a", seed=1)
    b = make_evidence(tmp_path / "b", seed=1)
    clean = noise_floors(a, b)
    for e in (a, b):
        processed = e.arrays["sample_trainer_logprob_processed"].copy()
        processed[[0, 40, 80]] = -np.inf
        e.arrays["sample_trainer_logprob_processed"] = processed
    floors = noise_floors(a, b)
    assert all(np.isfinite(v) for v in floors.values()), floors
    assert floors["k3_kl"] == pytest.approx(clean["k3_kl"], abs=1e-6)
