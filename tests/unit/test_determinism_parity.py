"""determinism-parity on hand-made batch-invariance records (engine.json ``batch_invariance``)."""

from __future__ import annotations

import copy

from gate.checks import determinism
from gate.checks.context import Context
from gate.config.checks_section import parse_settings
from gate.verdict import Status

from ..factory import RUN, make_evidence, with_engine


def _check(tmp_path, old: float | None, new: float | None, with_old: bool = True):
    ctx = Context(
        new=make_evidence(tmp_path / "new", seed=2, batch_variance=new),
        old=make_evidence(tmp_path / "old", seed=1, batch_variance=old) if with_old else None,
        run=copy.deepcopy(RUN),
    )
    return determinism.run(ctx, parse_settings({}, "gate.yaml")[determinism.ID])


def test_bitwise_in_both_engines_passes(tmp_path):
    r = _check(tmp_path, 0.0, 0.0)
    assert r.status == Status.PASS
    assert r.summary == "bitwise in both engines over 20 sequences in 3 batch compositions"
    assert [m.value for m in r.measurements] == [0.0, 0.0]


def test_losing_bitwise_determinism_fails_with_the_fix(tmp_path):
    r = _check(tmp_path, 0.0, 3e-7)
    assert r.status == Status.FAIL
    assert "max |Δ| 3e-07, one at a time" in r.summary
    assert "VLLM_BATCH_INVARIANT=1" in r.diagnosis and "mode: warn" in r.diagnosis
    assert [m.status for m in r.measurements] == [Status.PASS, Status.FAIL]


def test_an_old_engine_that_was_not_bitwise_has_nothing_to_keep(tmp_path):
    r = _check(tmp_path, 2e-3, 5e-3)
    assert r.status == Status.PASS
    assert "old engine was not bitwise either (max |Δ| 0.002)" in r.summary


def test_not_measured_is_a_skip_with_the_reason(tmp_path):
    assert "teacher_forced.batch_invariance is off" in _check(tmp_path, None, None).summary
    assert _check(tmp_path / "a", None, None).status == Status.SKIP
    one_sided = _check(tmp_path / "b", 0.0, None)
    assert one_sided.status == Status.SKIP and "on the new engine" in one_sided.summary
    assert _check(tmp_path / "c", None, 0.0, with_old=False).status == Status.SKIP


def test_a_pass_that_could_not_run_skips_with_its_reason_not_as_turned_off(tmp_path):
    """Server mode cannot choose batch compositions: the worker records why, and the SKIP says so
    instead of claiming teacher_forced.batch_invariance is off."""
    ctx = Context(
        new=with_engine(
            make_evidence(tmp_path / "new", seed=2), batch_invariance={"not_run": "server mode: no"}
        ),
        old=make_evidence(tmp_path / "old", seed=1, batch_variance=0.0),
        run=copy.deepcopy(RUN),
    )
    r = determinism.run(ctx, parse_settings({}, "gate.yaml")[determinism.ID])
    assert r.status == Status.SKIP and r.summary == "not measured on new: server mode: no"
