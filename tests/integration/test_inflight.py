"""The in-flight phase of the weight-sync probe on real engines: the stacks' paths and their faults.

One engine run holds every update in turn (each from the old weights), so the four built-in paths,
five faulty hooks and one that lands late once cost one engine start; a hook that never resumes needs its own run, since
its timeout ends the phase. Server mode's updates run in tests/integration/test_server_mode.py,
tensor parallel's in tests/integration/test_tensor_parallel.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ..faults.matrix import verify
from .conftest import replay, variant_config

pytestmark = pytest.mark.engine

HOOKS = Path(__file__).resolve().parent.parent / "hooks" / "inflight_update.py"
FAULTS = (
    "per_layer_without_pause",
    "abort_without_resubmit",
    "pause_without_push",
    "half_the_layers_paused",
    "label_before_push",
    "slow_first_time",
)
UPDATES = ["keep", "keep_clear", "abort_resubmit", "no_pause", *(f"{HOOKS}:{h}" for h in FAULTS)]


def _config(tmp: Path, updates: list[str], **inflight) -> Path:
    return variant_config(tmp, None, grpo={"enabled": False},
                          weight_sync={"inflight": {"updates": updates, **inflight}})  # fmt: skip


@pytest.fixture(scope="module")
def inflight_replay(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("inflight")
    return replay(tmp / "run", "-c", str(_config(tmp, UPDATES)), "--only", "new")


def test_the_default_run_keeps_the_kv_on_both_engines(default_replay):
    check = default_replay.check("inflight-update")
    assert check["status"] == "PASS", check
    keep = check["details"]["updates"]["keep"]
    assert keep["behaviour"] == keep["behaviour_old_engine"] == "STALE"
    assert keep["counts"]["NEITHER"] == 0 and keep["pre_not_old"] == 0
    # The switch is where the update ran: after every request had switch_after (16) tokens.
    assert all(16 <= s == e for s, e in zip(keep["switch_start"], keep["switch_end"], strict=True))
    assert (
        keep["switch_lower"] == keep["switch_upper"] == keep["switch_start"]
        and keep["steps_inside"] == 0
    )
    for engine in ("old", "new"):
        meta = default_replay.evidence(engine).engine.weight_sync_inflight
        assert meta["updates"][0]["calls"][0] == "pause(keep, clear_cache=False)"
        assert meta["updates"][0]["switch_exact"] is True
    # 0.32 returns its weight-version spans: its label changes exactly where the update ran; 0.31 returns none.
    assert keep["version_switch"] == keep["switch_start"] and keep["versions_agree"] is True
    assert keep["behaviour_old_engine"] == "STALE"
    old = default_replay.evidence("old").engine.weight_sync_inflight
    assert old["weight_versions"].startswith("this release returns no weight-version spans")


def test_the_built_in_paths_are_told_apart(inflight_replay):
    updates = inflight_replay.check("inflight-update")["details"]["updates"]
    behaviour = {
        name: updates[name]["behaviour"]
        for name in ("keep", "keep_clear", "abort_resubmit", "no_pause")
    }
    assert behaviour == {
        "keep": "STALE",
        "keep_clear": "REC",
        "abort_resubmit": "REC",
        "no_pause": "STALE",
    }
    for name in behaviour:
        assert updates[name]["counts"]["NEITHER"] == 0 and not updates[name]["lost"], updates[name]
        assert updates[name]["stale_after_update"] == 0
    # Resubmitted requests ran to full length: nothing lost.
    assert all(len(labels) == 48 for labels in updates["abort_resubmit"]["labels"])


def test_per_layer_rpcs_without_a_pause_are_torn(inflight_replay):
    check = inflight_replay.check("inflight-update")
    torn = check["details"]["updates"][f"{HOOKS}:per_layer_without_pause"]
    assert check["status"] == "FAIL"
    assert torn["counts"]["NEITHER"] > 0.05 * sum(torn["counts"].values())
    # Steps ran between the calls: the update spans tokens.
    assert all(e > s for s, e in zip(torn["switch_start"], torn["switch_end"], strict=True))
    verify("30a", inflight_replay.report)


def test_an_abort_without_resubmission_loses_the_requests(inflight_replay):
    lost = inflight_replay.check("inflight-update")["details"]["updates"][
        f"{HOOKS}:abort_without_resubmit"
    ]
    assert len(lost["lost"]) == 4 and all("aborted after" in why for why in lost["lost"])
    verify("30b", inflight_replay.report)


def test_an_update_that_never_pushes_leaves_old_weights(inflight_replay):
    stale = inflight_replay.check("inflight-update")["details"]["updates"][
        f"{HOOKS}:pause_without_push"
    ]
    assert stale["stale_after_update"] > 0 and stale["counts"]["STALE"] == 0
    verify("30c", inflight_replay.report)


def test_a_paused_push_of_half_the_layers_is_partial(inflight_replay):
    check = inflight_replay.check("inflight-update")
    partial = check["details"]["updates"][f"{HOOKS}:half_the_layers_paused"]
    assert partial["steps_inside"] == 0 and partial["switch_start"] == partial["switch_end"]
    assert "inflight_update.py:half_the_layers_paused: partial" in check["summary"], check[
        "summary"
    ]
    verify("30f", inflight_replay.report)


def test_a_version_label_set_before_the_push_disagrees_with_the_tokens(inflight_replay):
    """0.32's weight-version spans are labels the caller sets: announced while the old weights still
    run, they start before the tokens the new weights computed, and the check says by how much."""
    check = inflight_replay.check("inflight-update")
    early = check["details"]["updates"][f"{HOOKS}:label_before_push"]
    assert (
        early["behaviour"] == "STALE" and early["counts"]["NEITHER"] == 0
    )  # the weights themselves are fine
    assert early["versions_agree"] is False
    assert all(
        0 <= v < s for v, s in zip(early["version_switch"], early["switch_start"], strict=True)
    )
    verify("30g", inflight_replay.report)


def test_an_update_that_lands_after_every_request_runs_again_earlier(inflight_replay):
    """A hook whose work before its first call outlasts the requests the first time: that run has
    nothing after its switch to attribute, so the phase pushes the old weights back and runs it
    again, started earlier by the lag it saw: it landed at token 48, 32 past the switch at 16, so
    the second run starts it at the first token."""
    meta = inflight_replay.evidence("new").engine.weight_sync_inflight
    [late] = [u for u in meta["updates"] if u["name"].endswith(":slow_first_time")]
    assert (late["attempts"], late["switch_after"]) == (2, 1), late
    found = inflight_replay.check("inflight-update")["details"]["updates"][
        f"{HOOKS}:slow_first_time"
    ]
    assert (
        found["behaviour"] == "STALE" and found["counts"]["NEITHER"] == 0 and not found["lost"]
    ), found
    assert all(s < 16 for s in found["switch_start"])  # the judged run is the earlier one


def test_a_hook_that_never_resumes_is_an_error_bounded_by_the_timeout(tmp_path):
    config = _config(tmp_path, [f"{HOOKS}:never_resume"], timeout_s=5)
    run = replay(
        tmp_path / "run", "-c", str(config), "--only", "new", expect=(3,)
    )  # ERROR's exit code
    check = run.check("inflight-update")
    assert check["status"] == "ERROR", check
    assert "still paused" in check["summary"] and "timeout_s" in check["summary"]
    # The replay's evidence stands: every other check is judged.
    assert run.check("weight-sync")["status"] == "PASS"
    assert (
        run.evidence("new")
        .engine.weight_sync_inflight["error"]["message"]
        .startswith("InflightTimeout")
    )
    verify("30d", run.report)
