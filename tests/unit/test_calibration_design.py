"""`gate calibrate --runs K`: every pair of starts read, floors as prediction bounds, stored with sizes.

Hand-computed: readings [1, 2, 3] from 3 starts: mean 2, sd 1, t(0.95, df 2) = 2.920,
sqrt(1 + 1/3) = 1.1547, so the floor is 2 + 2.920 * 1.1547 = 5.3717.
"""

from __future__ import annotations

import itertools
import json
import math

import pytest

from gate import baseline as bl
from gate.calibrate import (
    ALPHA,
    REPLICA,
    calibration_jobs,
    design,
    noise_floors,
    prediction_bound,
    replica_names,
    t95,
)
from gate.config import BUILTIN_CONFIG, load_config
from gate.engine_jobs import EngineJob

from ..factory import make_evidence
from .test_baseline_and_judge import _run_dir


def test_prediction_bound_by_hand():
    assert prediction_bound([1.0, 2.0, 3.0], runs=3) == pytest.approx(2 + 2.920 * math.sqrt(4 / 3))
    assert prediction_bound([0.0, 0.0, 0.0], runs=3) == 0.0  # exact CPU: zero stays zero
    assert prediction_bound([0.004], runs=2) == 0.004  # one pair: its reading, as before --runs
    assert t95(1) == 6.314 and t95(30) == 1.697 and t95(200) == 1.645


def test_design_records_samples_sizes_and_the_rate():
    readings = [{"m": 1.0}, {"m": 2.0}, {"m": 3.0}]
    d = design(readings, runs=3)
    assert (d["runs"], d["pairs"], d["df"], d["false_alarm_rate"]) == (3, 3, 2, ALPHA)
    assert d["metrics"]["m"] == {"samples": [1.0, 2.0, 3.0], "mean": 2.0, "sd": 1.0,
                                 "floor": pytest.approx(5.3717, abs=1e-4)}  # fmt: skip
    assert "95% upper prediction bound from 3 engine starts (3 pairs, df 2)" in bl.design_statement(
        d
    )
    one = design([{"m": 1.0}], runs=2)
    assert one["false_alarm_rate"] is None and one["metrics"]["m"]["floor"] == 1.0
    assert "not designed" in bl.design_statement(one) and "not designed" in bl.design_statement(
        None
    )


def test_jobs_permute_every_start_after_the_first():
    cfg = load_config(BUILTIN_CONFIG)
    jobs = calibration_jobs(cfg, 4)
    assert [j.name for j in jobs] == ["old", REPLICA, f"{REPLICA}-2", f"{REPLICA}-3"]
    assert [j.order_seed for j in jobs] == [None] + [cfg.sampling.seed + i for i in (1, 2, 3)]
    assert jobs[0].grpo_seeds == tuple(range(cfg.grpo.baseline_seeds)) and all(
        j.grpo_seeds == ()
        for j in jobs[1:]  # replicas train no GRPO seed
    )
    with pytest.raises(ValueError, match="at least 2"):
        replica_names(1)


def test_pairs_of_identical_starts_read_zero(tmp_path):
    runs = [make_evidence(tmp_path / str(i), seed=1) for i in range(3)]
    readings = [noise_floors(a, b) for a, b in itertools.combinations(runs, 2)]
    assert len(readings) == 3
    assert all(r["mean_abs_drift"] == 0.0 and r["max_abs_drift"] == 0.0 for r in readings)


def test_the_baseline_keeps_the_design(tmp_path):
    run = _run_dir(tmp_path)
    d = design(
        [{"mean_abs_drift": 1e-3}, {"mean_abs_drift": 2e-3}, {"mean_abs_drift": 3e-3}], runs=3
    )
    (run / bl.NOISE_DESIGN).write_text(json.dumps(d))
    out = tmp_path / "baseline"
    bl.write(
        out,
        run,
        "old",
        {"mean_abs_drift": d["metrics"]["mean_abs_drift"]["floor"]},
        overwrite=False,
        log=print,
    )
    base = bl.load(out)
    assert base.noise_design == d
    (out / bl.NOISE_DESIGN).write_text('{"runs": "three"}')
    with pytest.raises(bl.BaselineError, match=r"noise_design\.json: runs: expected an integer"):
        bl.load(out)


def test_a_baseline_without_design_still_loads(tmp_path):
    out = tmp_path / "baseline"
    bl.write(out, _run_dir(tmp_path), "old", {"mean_abs_drift": 0.0}, overwrite=False, log=print)
    assert bl.load(out).noise_design is None


def test_runs_flag():
    from gate.cli import _parser

    parser = _parser()
    args = parser.parse_args(["calibrate", "--runs", "3"])
    assert args.runs == 3
    with pytest.raises(SystemExit):
        parser.parse_args(["calibrate", "--runs", "1"])


def test_recording_a_baseline_gets_a_timeout_for_its_grpo_seeds():
    """timeout_s is sized for a gate run: the calibration's replay trains baseline_seeds (32), four
    times the CPU default's 8, and gets four allowances (SmolLM2's 16 seeds outran one)."""
    from gate.replay import grpo_allowance

    cfg = load_config(BUILTIN_CONFIG)
    first, replica = calibration_jobs(cfg, 2)
    assert grpo_allowance(cfg, first) == cfg.grpo.baseline_seeds / cfg.grpo.seeds == 4.0
    assert grpo_allowance(cfg, replica) == 1.0  # trains none
    canary = EngineJob("old", cfg.engines["old"], grpo_seeds=(0,))
    assert grpo_allowance(cfg, canary) == 1.0  # never less than a gate run's
