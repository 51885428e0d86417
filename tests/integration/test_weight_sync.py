"""The in-place weight-update probe on a real engine: correct path, stale weights, partial load, stale cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from ..faults.matrix import verify
from .conftest import replay, variant_config

pytestmark = pytest.mark.engine

HOOKS = Path(__file__).resolve().parent.parent / "hooks" / "weight_update.py"


def _probe(tmp_path_factory, name: str, hook: str | None, engine_args: dict | None = None):
    tmp = tmp_path_factory.mktemp(name)
    extra = {"weight_update": {"hook": f"{HOOKS}:{hook}"}, "grpo": {"enabled": False}} if hook else {}
    config = variant_config(tmp, engine_args, **extra)
    run = replay(tmp / "run", "-c", str(config), "--only", "new")
    return run, run.check("weight-sync")


def test_probe_runs_with_the_default_run(default_replay):
    for engine in ("old", "new"):
        meta = default_replay.evidence(engine).engine["weight_sync"]
        assert meta["adapter"] == "collective_rpc reload_weights + reset_prefix_cache"
        assert meta["prefix_tokens"] >= meta["block_size"]  # the shared prefix fills at least one KV block
    check = default_replay.check("weight-sync")
    assert check["status"] == "PASS", check
    assert check["details"]["control_vs_new"] < 1e-4 < check["details"]["control_vs_old"]


def test_hook_that_skips_the_load_is_stale_weights(tmp_path_factory):
    run, check = _probe(tmp_path_factory, "stale", "skip_load")
    assert check["status"] == "FAIL" and check["details"]["verdict"] == "stale-weights"
    assert "never reached the engine" in check["diagnosis"]
    assert run.returncode == 1
    verify("5a", run.report)


def test_partial_load_is_flagged(tmp_path_factory):
    run, check = _probe(tmp_path_factory, "partial", "load_first_layer_only")
    # One of two layers loaded: closer to the old weights than to the new, equal to neither.
    assert check["status"] == "FAIL" and check["details"]["verdict"] == "partial-update", check
    assert check["details"]["control_vs_old"] > check["details"]["limit"]
    verify("5b", run.report)


def test_load_without_cache_reset_is_flagged_when_prefix_caching_is_on(tmp_path_factory):
    run, check = _probe(tmp_path_factory, "cache", "load_without_cache_reset", {"enable_prefix_caching": True})
    assert check["status"] == "FAIL" and check["details"]["verdict"] == "stale-cache", check
    assert "reset_prefix_cache" in check["diagnosis"]
    verify("5c", run.report)
