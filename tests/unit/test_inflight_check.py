"""inflight-update: token labels, the failure kinds and the comparison, on hand-built evidence."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gate.checks import inflight
from gate.checks.context import Context
from gate.config.checks_section import default_settings
from gate.contract.engine_record import EngineRecord
from gate.contract.evidence import Evidence
from gate.verdict import Status

from ..factory import RUN

SPEC = inflight.SPEC
TOL = 1e-3
# Two requests of 6 tokens, the switch after 2: OLD, STALE and REC apart by 0.1 after it.
OLD = np.array([-1.0, -1.1, -1.2, -1.3, -1.4, -1.5] * 2, dtype=np.float32)
REC = OLD - 0.2
STALE = np.where(np.tile(np.arange(6), 2) < 2, OLD, OLD - 0.1).astype(np.float32)


def arrays(
    engine: np.ndarray, start=(2, 2), end=(2, 2), finish=(1, 1), updates=1
) -> dict[str, np.ndarray]:
    reps = updates
    return {
        "wsi_offsets": np.arange(0, 12 * reps + 1, 6, dtype=np.int64),
        "wsi_update_index": np.repeat(np.arange(reps), 2).astype(np.int64),
        "wsi_token_ids": np.zeros(12 * reps, dtype=np.int64),
        "wsi_engine_logprob": np.tile(engine, reps).astype(np.float32),
        "wsi_old_logprob": np.tile(OLD, reps),
        "wsi_rec_logprob": np.tile(REC, reps),
        "wsi_stale_logprob": np.tile(STALE, reps),
        "wsi_switch_start": np.tile(start, reps).astype(np.int64),
        "wsi_switch_end": np.tile(end, reps).astype(np.int64),
        "wsi_finish": np.tile(finish, reps).astype(np.int64),
        "wsi_aborted_at": np.full(2 * reps, -1, dtype=np.int64),
        "wsi_resubmitted_at": np.full(2 * reps, -1, dtype=np.int64),
    }


def test_a_kept_kv_reads_as_stale_after_the_switch_and_old_before():
    [a] = inflight.attribute(arrays(STALE), ["keep"], TOL, max_tokens=6)
    assert a.labels == ["OOSSSS", "OOSSSS"]
    assert a.counts == {"OLD": 0, "STALE": 8, "REC": 0, "NEITHER": 0, "ambiguous": 0}
    assert (a.pre_tokens, a.pre_not_old, a.post_tokens) == (4, 0, 8)
    assert a.behaviour == "STALE" and inflight.findings(a, 0.05) == []


def test_recomputed_requests_read_as_rec():
    engine = np.where(np.tile(np.arange(6), 2) < 2, OLD, REC)
    [a] = inflight.attribute(arrays(engine), ["keep_clear"], TOL, max_tokens=6)
    assert a.labels == ["OORRRR", "OORRRR"] and a.behaviour == "REC"


def test_tokens_that_fit_no_weights_are_torn():
    engine = STALE.copy()
    engine[[2, 3, 8]] -= 0.05  # halfway between candidates: none within TOL
    [a] = inflight.attribute(arrays(engine, end=(3, 3)), ["hook"], TOL, max_tokens=6)
    assert a.labels == ["OOxxSS", "OOxSSS"] and a.counts["NEITHER"] == 3
    assert inflight.findings(a, 0.05) == ["torn"]  # a step ran inside the update
    [b] = inflight.attribute(arrays(engine), ["hook"], TOL, max_tokens=6)
    assert inflight.findings(b, 0.05) == ["partial"]  # none did: what arrived was incomplete
    assert inflight.findings(a, 0.5) == []  # 3 of 8 is under a 50% share


def test_tokens_between_the_first_call_and_a_fitted_switch_count_after_the_update_began():
    """An update of many calls with steps between them (row 30a on SmolLM2: 30 per-layer calls):
    its STALE switch is fitted inside [first call, last call]. Tokens between the first call and
    that fit ran on weights the update had begun to change: they are judged with the tokens after
    it (here torn), not held against the old weights as if before the switch (inconclusive)."""
    stale_at_4 = np.where(np.tile(np.arange(6), 2) < 4, OLD, OLD - 0.1).astype(np.float32)
    engine = stale_at_4.copy()
    engine[[2, 3, 8, 9]] -= 0.05  # tokens 2-3 of each request, after the first call: fit no weights
    a_arrays = arrays(engine, start=(4, 4), end=(5, 5)) | {"wsi_stale_logprob": stale_at_4,
                                                            "wsi_switch_lower": np.array([2, 2], dtype=np.int64)}  # fmt: skip
    [a] = inflight.attribute(a_arrays, ["hook"], TOL, max_tokens=6)
    assert (a.pre_tokens, a.pre_not_old, a.post_tokens) == (4, 0, 8)
    assert a.counts["NEITHER"] == 4 and inflight.inconclusive(a, 0.05, 2) is None
    assert inflight.findings(a, 0.05) == ["torn"]
    del a_arrays[
        "wsi_switch_lower"
    ]  # evidence without the first call's place: the fitted switch, as before
    [b] = inflight.attribute(a_arrays, ["hook"], TOL, max_tokens=6)
    assert (b.pre_tokens, b.pre_not_old) == (8, 4)


def test_one_odd_token_is_not_torn():
    engine = STALE.copy()
    engine[4] -= 0.05
    [a] = inflight.attribute(arrays(engine), ["keep"], TOL, max_tokens=6)
    assert a.counts["NEITHER"] == 1 and inflight.findings(a, 0.05) == []


def test_aborted_short_and_nan_requests_are_lost():
    engine = STALE.copy()
    engine[7] = np.nan
    (a_abort,) = inflight.attribute(arrays(engine, finish=(2, 1)), ["abort"], TOL, max_tokens=6)
    assert a_abort.lost == [
        "request 0: aborted after 6 tokens and not resubmitted",
        "request 1: returned without logprobs for some tokens",
    ]
    (short,) = inflight.attribute(arrays(STALE), ["x"], TOL, max_tokens=8)
    assert short.lost == ["request 0: 6 of 8 tokens", "request 1: 6 of 8 tokens"]
    assert inflight.findings(short, 0.05) == ["lost"]


def test_old_weights_after_the_update_returned_are_stale():
    [a] = inflight.attribute(arrays(OLD), ["pause only"], TOL, max_tokens=6)
    # After the last call (token 2 on) OLD alone fits: the push never happened.
    assert a.labels == ["OOOOOO", "OOOOOO"] and a.stale_after_update == 6
    assert inflight.findings(a, 0.05) == ["stale"]


def test_candidates_within_the_tolerance_are_inconclusive():
    [a] = inflight.attribute(arrays(STALE), ["keep"], 0.5, max_tokens=6)
    assert set("".join(a.labels)) == {"?"}
    assert "only 0 of 8 tokens after the switch" in inflight.inconclusive(a, 0.05, 8)
    [ok] = inflight.attribute(arrays(STALE), ["keep"], TOL, max_tokens=6)
    assert (
        inflight.inconclusive(ok, 0.05, 8) is None
        and inflight.inconclusive(ok, 0.05, 9) is not None
    )
    engine = OLD - 0.05  # nothing before the switch is OLD: the tolerance does not hold here
    [b] = inflight.attribute(arrays(engine), ["keep"], TOL, max_tokens=6)
    assert "before the switch do not match the old weights" in inflight.inconclusive(b, 0.05, 8)


def test_the_torn_limit_grows_with_the_engines_own_misses_before_the_switch():
    engine = STALE.copy()
    engine[[2, 3, 8]] -= 0.05  # 3 of 8 after the switch fit nothing
    [a] = inflight.attribute(arrays(engine), ["hook"], TOL, max_tokens=6)
    assert inflight.torn_limit(a, 0.05) == 1.0  # no miss before the switch: 5% of 8, at least 1
    engine[0] -= 0.05  # one of the 4 tokens before the switch misses too: 3 x 25% of 8 = 6
    [b] = inflight.attribute(arrays(engine), ["hook"], TOL, max_tokens=6)
    assert inflight.torn_limit(b, 0.05) == 6.0 and inflight.findings(b, 0.05) == []


def test_the_tolerance_is_the_idle_probes_q99_gap_times_the_factor():
    gaps = np.linspace(0, 1e-3, 101)
    e = _evidence({"ws_before_engine_logprob": gaps.astype(np.float32), "ws_before_trainer_logprob": np.zeros(101),
                   "ws_engine_logprob": np.zeros(1, np.float32), "ws_trainer_new_logprob": np.zeros(1)}, {})  # fmt: skip
    assert inflight.tolerance(e, 4.0, 1e-5) == pytest.approx(
        4 * np.quantile(np.append(gaps, 0), 0.99), rel=1e-5
    )
    assert inflight.tolerance(e, 4.0, 1.0) == 1.0
    assert inflight.tolerance(_evidence({}, {}), 4.0, 1e-4) is None


def test_an_idle_push_that_missed_the_new_weights_does_not_widen_the_tolerance():
    """Row 27a: a half-written checkpoint left the engine nearer the old weights (0.05) than the new
    (0.2) after the idle push; that gap is the miss, not noise, and stays out of the tolerance."""
    before = {
        "ws_before_engine_logprob": np.full(10, 1e-4, np.float32),
        "ws_before_trainer_logprob": np.zeros(10),
    }
    after = {"ws_engine_logprob": np.zeros(10, np.float32), "ws_trainer_new_logprob": np.full(10, 0.2),
             "ws_trainer_old_logprob": np.full(10, 0.05)}  # fmt: skip
    missed = Evidence(Path("."), {**before, **after}, {}, {})
    assert not inflight.idle_push_took(missed)
    assert inflight.tolerance(missed, 4.0, 1e-6) == pytest.approx(4e-4, rel=1e-3)
    took = Evidence(
        Path("."), {**before, **after, "ws_trainer_old_logprob": np.full(10, 0.5)}, {}, {}
    )
    assert inflight.idle_push_took(took) and inflight.tolerance(took, 4.0, 1e-6) == pytest.approx(
        0.8, rel=1e-3
    )


def _evidence(a: dict[str, np.ndarray], section: dict | None, idle_gap: float = 1e-5) -> Evidence:
    idle = {"ws_before_engine_logprob": np.full(10, idle_gap, np.float32), "ws_before_trainer_logprob": np.zeros(10),
            "ws_engine_logprob": np.zeros(10, np.float32), "ws_trainer_new_logprob": np.zeros(10)}  # fmt: skip
    engine = EngineRecord(weight_sync_inflight=section or {})
    return Evidence(Path("."), {**idle, **a} if a else {}, engine, {})


def _section(*names: str) -> dict:
    return {"max_tokens": 6, "updates": [{"name": n, "error": None} for n in names]}


def _run(new: Evidence, old: Evidence | None = None):
    return inflight.run(Context(new=new, old=old, run=RUN), default_settings(SPEC))


def test_the_check_passes_a_correct_update_and_names_its_behaviour():
    result = _run(
        _evidence(arrays(STALE), _section("keep")), _evidence(arrays(STALE), _section("keep"))
    )
    assert result.status == Status.PASS, result
    assert result.summary.startswith("keep: STALE")
    assert result.details["updates"]["keep"]["behaviour_old_engine"] == "STALE"


def test_a_behaviour_the_release_changed_is_a_warning():
    rec = np.where(np.tile(np.arange(6), 2) < 2, OLD, REC)
    result = _run(
        _evidence(arrays(rec), _section("hook.py:f")),
        _evidence(arrays(STALE), _section("hook.py:f")),
    )
    assert result.status == Status.WARN
    assert "the release changed what this update does" in result.diagnosis
    # A built-in path that does not do what it asks for warns without an old engine.
    result = _run(_evidence(arrays(STALE), _section("keep_clear")))
    assert result.status == Status.WARN and "asks for requests that recomputed" in result.diagnosis


def test_every_update_of_a_run_is_judged_and_the_worst_wins():
    torn = STALE.copy()
    torn[[2, 3, 4]] -= 0.05
    both = arrays(np.concatenate([STALE, torn]), updates=2)
    both["wsi_engine_logprob"] = np.concatenate([STALE, torn]).astype(np.float32)
    both["wsi_switch_end"][2:] = 3  # the second update spans a step
    result = _run(_evidence(both, _section("keep", "per_layer.py:f")))
    assert result.status == Status.FAIL
    assert (
        "per_layer.py:f: torn (3 of 8 tokens" in result.summary and "keep: STALE" in result.summary
    )
    assert "Pause first" in result.diagnosis


def test_not_run_unsupported_and_raising_updates():
    assert _run(_evidence({}, None)).status == Status.SKIP
    skipped = _run(_evidence({}, {"not_covered": "server mode"}))
    assert skipped.status == Status.SKIP and "not covered: server mode" in skipped.summary
    raised = {"max_tokens": 6, "updates": [{"name": "hook.py:f", "error": "ValueError: boom"}]}
    assert _run(_evidence(arrays(STALE), raised)).status == Status.ERROR
    timed_out = {
        "error": {"message": "InflightTimeout: the update never returned", "adapter": None}
    }
    result = _run(_evidence({}, timed_out))
    assert result.status == Status.ERROR and "InflightTimeout" in result.summary


def test_steps_counted_inside_the_update_tell_torn_from_partial():
    """The driver's count of steps between the first and last call decides, not the switch bounds:
    a server-mode call known only within bounds has end > start with no step inside."""
    engine = STALE.copy()
    engine[[2, 3, 8]] -= 0.05
    [a] = inflight.attribute(
        arrays(engine, end=(3, 3)), ["hook"], TOL, max_tokens=6, steps_inside=[0]
    )
    assert a.steps_inside == 0 and inflight.findings(a, 0.05) == ["partial"]
    [b] = inflight.attribute(arrays(engine), ["hook"], TOL, max_tokens=6, steps_inside=[2])
    assert inflight.findings(b, 0.05) == ["torn"]


def test_old_looking_tokens_over_torn_kv_are_not_also_stale():
    engine = STALE.copy()
    engine[[2, 3, 4, 8, 9]] -= 0.05  # torn ...
    engine[5] = OLD[5]  # ... and one token after the update that fits the old weights by chance
    [a] = inflight.attribute(arrays(engine, end=(3, 3)), ["hook"], TOL, max_tokens=6)
    assert a.stale_after_update == 1 and inflight.findings(a, 0.05) == ["torn"]


def test_an_update_after_every_request_finished_is_inconclusive():
    [a] = inflight.attribute(arrays(OLD, start=(6, 6), end=(6, 6)), ["late"], TOL, max_tokens=6)
    assert a.post_tokens == 0 and inflight.findings(a, 0.05) == []
    assert "no request generated a token after the update's first call" in inflight.inconclusive(
        a, 0.05, 8
    )
    result = _run(_evidence(arrays(OLD, start=(6, 6), end=(6, 6)), _section("late")))
    assert result.status == Status.SKIP and result.summary.startswith("inconclusive")


def test_the_engines_version_labels_are_compared_with_the_switch():
    agree = {**arrays(STALE), "wsi_version_switch": np.array([2, 2], dtype=np.int64)}
    [a] = inflight.attribute(agree, ["keep"], TOL, max_tokens=6)
    assert a.version_switch == [2, 2] and a.versions_agree is True
    assert _run(_evidence(agree, _section("keep"))).status == Status.PASS
    early = {
        **agree,
        "wsi_version_switch": np.array([1, -1], dtype=np.int64),
    }  # request 1: no label
    result = _run(_evidence(early, _section("keep")))
    assert result.status == Status.WARN, result
    assert (
        "label tokens from 1 on as the new version (request 0), but the weights changed at token 2"
        in result.diagnosis
    )
    assert result.details["updates"]["keep"]["versions_agree"] is False
    # Evidence without labels (vLLM < 0.32, server mode, older evidence) compares nothing.
    [none] = inflight.attribute(arrays(STALE), ["keep"], TOL, max_tokens=6)
    assert none.version_switch == [-1, -1] and none.versions_agree is None
    assert none.switch_lower == none.switch_upper == [2, 2]  # older evidence: the switch itself


def _paused(abort: str, keep: str = "queued", after: str = "served") -> dict:
    """A pause contract as the server-mode probe records it (gate.worker.inflight_server)."""
    row = lambda outcome: {"while_paused": outcome, "after_resume": after}  # noqa: E731
    return {"abort": row(abort), "wait": row(abort), "keep": row(keep)}


def test_requests_turned_away_during_a_pause_are_a_warning_where_the_old_engine_queued_them():
    """vLLM 0.33 answers a request sent during an abort/wait pause with a retryable 503
    (EngineCore._reject_add_while_paused; held to the source in tests/compat); 0.32 queued it."""
    new = _section("abort_resubmit") | {"pause_contract": _paused("rejected")}
    old = _section("abort_resubmit") | {"pause_contract": _paused("queued")}
    rec = np.where(np.tile(np.arange(6), 2) < 2, OLD, REC)
    result = _run(_evidence(arrays(rec), new), _evidence(arrays(rec), old))
    assert result.status == Status.WARN, result
    rows = {m.name: (m.status, m.note) for m in result.measurements if m.name.startswith("pause(")}
    assert rows == {
        "pause(abort): a request sent meanwhile": (Status.WARN, "new: rejected, old: queued"),
        "pause(wait): a request sent meanwhile": (Status.WARN, "new: rejected, old: queued"),
        "pause(keep): a request sent meanwhile": (Status.PASS, "new: queued, old: queued"),
    }
    assert "abort: queued -> rejected; wait: queued -> rejected" in result.diagnosis
    assert "HTTP 503 (engine_paused, retryable)" in result.diagnosis
    assert "pause: abort rejected, wait rejected, keep queued" in result.summary
    # the same contract on both engines: nothing to say
    same = _run(_evidence(arrays(rec), old), _evidence(arrays(rec), old))
    assert same.status == Status.PASS and "pause: abort queued" in same.summary


def test_a_request_not_served_even_after_resume_is_lost():
    lost = _section("abort_resubmit") | {"pause_contract": _paused("rejected", after="HTTP 500")}
    rec = np.where(np.tile(np.arange(6), 2) < 2, OLD, REC)
    result = _run(_evidence(arrays(rec), lost))
    assert result.status == Status.FAIL
    assert "not served after /resume either (HTTP 500)" in result.diagnosis
    # a server whose /pause takes no mode: said, not judged
    older = _section("abort_resubmit") | {"pause_contract": {"error": "ServerError: HTTP 422"}}
    result = _run(_evidence(arrays(rec), older))
    assert result.status == Status.PASS
    assert [m.note for m in result.measurements if m.name == "pause contract"] == [
        "not probed: ServerError: HTTP 422"
    ]
    # a record the pull request's worker wrote wrongly is refused by name, never crashes the check
    odd = _section("abort_resubmit") | {"pause_contract": {"abort": {"while_paused": ["x"]}}}
    result = _run(_evidence(arrays(rec), odd))
    assert result.status == Status.PASS
    assert [m.note for m in result.measurements if m.name == "pause contract"] == [
        "not probed: a malformed record for pause(abort)"
    ]
