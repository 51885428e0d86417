"""logprob-integrity against hand-built top lists and synthetic evidence whose faults are known."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from gate.checks.context import Context
from gate.checks.logprob_integrity import top_list_findings
from gate.config.checks_section import parse_settings
from gate.contract import evidence as ev
from gate.judge import run_checks
from gate.verdict import Status

from ..factory import RUN, make_evidence

NAN, NEG = float("nan"), float("-inf")
# (ids, values, sampled token, its logprob, its rank, the faults expected at that position)
ROWS = [
    ([5, 7, 9], [-0.1, -0.5, -2.0], 5, -0.1, 1, set()),  # sound, sampled first
    ([5, 5, 9], [-0.1, -0.1, -2.0], 5, -0.1, 1, {"duplicate_ids"}),  # MRV2's repeated sampled token
    ([4, 5, 9], [-0.9, -0.1, -2.0], 5, -0.1, 1, {"out_of_order"}),
    ([5, 12, 1], [-0.1, -0.5, -2.0], 5, -0.1, 1, {"out_of_vocabulary"}),  # vocabulary 10
    ([5, 7, 9], [-0.2, -0.5, -2.0], 5, -0.1, 1, {"sampled_entry_differs", "rank_inconsistent"}),
    ([5, 7, 9], [-0.1, -0.5, -2.0], 7, -0.5, 1, {"rank_inconsistent"}),  # listed second, ranked 1
    ([5, 7, 9], [-0.1, -0.5, -2.0], 3, -3.0, 4, set()),  # unlisted, ranked below the list
    (
        [5, 7, 9],
        [-0.1, -0.5, -2.0],
        3,
        -3.0,
        2,
        {"rank_inconsistent"},
    ),  # unlisted, ranked inside it
    ([5, 7, 9], [-0.5, -0.5, -2.0], 7, -0.5, 1, set()),  # a tie: rank 1 or 2 both allowed
    ([5, -1, -1], [-0.1, NEG, NEG], 5, -0.1, 1, set()),  # a list the engine cut short
    ([5, 7, 9], [-0.1, NEG, NEG], 5, -0.1, 1, set()),  # tokens top-p removed: -inf, not a fault
    (
        [5, 7, 9],
        [NAN, NAN, NAN],
        5,
        NAN,
        1,
        set(),
    ),  # non-finite: reported as such, not as structure
]


def test_top_list_faults_position_by_position():
    ids, values, token, logprob, rank, expected = (list(c) for c in zip(*ROWS, strict=True))
    found = top_list_findings(np.array(ids), np.array(values), np.array(token), np.array(logprob),
                              np.array(rank), vocab=10)  # fmt: skip
    for i, want in enumerate(expected):
        got = {kind for kind, mask in found.faults.items() if mask[i]}
        assert got == want, (i, ROWS[i])
    assert found.malformed.tolist() == [bool(w) for w in expected]
    assert np.flatnonzero(found.nonfinite_values).tolist() == [len(ROWS) - 1]


def test_without_ranks_or_vocabulary_the_rest_is_still_checked():
    found = top_list_findings(np.array([[5, 5], [5, 10**6]]), np.array([[-0.1, -0.1], [-0.1, -0.2]]),
                              np.array([5, 5]), np.array([-0.1, -0.1]), None, None)  # fmt: skip
    assert "rank_inconsistent" not in found.faults
    assert found.faults["duplicate_ids"].tolist() == [True, False]
    assert not found.faults["out_of_vocabulary"].any()  # unknown vocabulary: only ids < 0 are out


def _rewrite(e: ev.Evidence, **arrays) -> ev.Evidence:
    np.savez(e.path / ev.EVIDENCE_FILE, **{**e.arrays, **arrays})
    return ev.load(e.path, allow_nonfinite_engine=True)


def _checks(new: ev.Evidence, old: ev.Evidence) -> dict:
    ctx = Context(new=new, old=old, run=copy.deepcopy(RUN))
    return {r.id: r for r in run_checks(ctx, parse_settings(None, "gate.yaml"))}


@pytest.fixture
def pair(tmp_path):
    return make_evidence(tmp_path / "old", seed=1), make_evidence(tmp_path / "new", seed=2)


def test_a_sound_engine_passes(pair):
    old, new = pair
    result = _checks(new, old)["logprob-integrity"]
    assert result.status == Status.PASS, result.summary
    assert result.details["new"]["malformed_top_lists"] == {
        "count": 0,
        "positions": 320,
        "kinds": {},
        "examples": [],
    }
    assert (
        result.summary
        == "old: 0 non-finite logprob(s), 0 of 320 top lists malformed; new: 0 non-finite logprob(s), 0 of 320 top lists malformed"
    )


def test_nan_logprobs_fail_with_their_positions_and_the_comparisons_stand_down(pair):
    old, new = pair
    lp = new["sample_engine_logprob"].copy()
    lp[[3, 17]] = np.nan  # sequence 0 token 3; sequence 2 (prompt p1, sample 0) token 1
    top = new["sample_topk_logprobs"].copy()
    top[[3, 17]] = np.nan
    with pytest.raises(ev.EvidenceError, match="sample_engine_logprob: 2 non-finite value"):
        np.savez(new.path / ev.EVIDENCE_FILE, **{**new.arrays, "sample_engine_logprob": lp})
        ev.load(new.path)  # a baseline or a calibration never reads it
    new = _rewrite(new, sample_engine_logprob=lp, sample_topk_logprobs=top)
    results = _checks(new, old)
    integrity = results["logprob-integrity"]
    assert integrity.status == Status.FAIL
    found = integrity.details["new"]["nonfinite"]
    assert found["sampled"]["count"] == 2 and found["sample top-list values"]["count"] == 2
    assert found["sampled"]["positions"] == [
        "prompt p0 sample 0 token 3",
        "prompt p1 sample 0 token 1",
    ]
    assert integrity.details["new"]["malformed_top_lists"]["count"] == 0  # NaN is not a shape fault
    assert "prime-rl #2497" in integrity.diagnosis
    assert integrity.details["old"]["nonfinite"] == {}
    for skipped in (
        "logprob-semantics",
        "train-inference-mismatch",
        "forward-drift",
        "precision",
        "weight-sync",
    ):
        assert results[skipped].status == Status.SKIP, skipped
        assert "new engine's logprobs hold NaN/inf" in results[skipped].summary
    assert results["tokenization"].status == Status.PASS  # checks that read no logprobs still judge


def test_a_second_push_that_leaves_nan_fails_and_weight_sync_stands_down(pair):
    """NaN after the same weights are pushed again (row 26g's worse cousin) would read as a mean of
    NaN, never past a limit: logprob-integrity names it, and weight-sync does not judge it."""
    old, new = pair
    again = new["ws_again_engine_logprob"].copy()
    again[5] = np.nan
    results = _checks(_rewrite(new, ws_again_engine_logprob=again), old)
    integrity = results["logprob-integrity"]
    assert integrity.status == Status.FAIL
    assert integrity.details["new"]["nonfinite"]["weight-sync (pushed again)"]["positions"] == [
        "token 5"
    ]
    assert results["weight-sync"].status == Status.SKIP


def test_a_top_list_that_repeats_the_sampled_token_fails(pair):
    old, new = pair
    ids, values = new["sample_topk_ids"].copy(), new["sample_topk_logprobs"].copy()
    # MRV2 (vLLM #36746): the sampled token rides in the list twice; every tenth position.
    ids[::10, 1], values[::10, 1] = ids[::10, 0], values[::10, 0]
    new = _rewrite(new, sample_topk_ids=ids, sample_topk_logprobs=values)
    integrity = _checks(new, old)["logprob-integrity"]
    assert integrity.status == Status.FAIL
    lists = integrity.details["new"]["malformed_top_lists"]
    assert lists["count"] == 32 and lists["kinds"] == {"duplicate_ids": 32}
    assert lists["examples"][0] == "sample prompt p0 sample 0 token 0"
    assert "NeMo-RL #3297" in integrity.diagnosis and "by its id" in integrity.diagnosis
    measured = {m.name: m.value for m in integrity.measurements if m.engine == "new"}
    assert measured["malformed_top_list_fraction"] == pytest.approx(32 / 320)


def test_ids_past_the_vocabulary_fail_where_the_reference_recorded_it(pair):
    old, new = pair
    ids = new["sample_topk_ids"].copy()
    ids[5, 4] = 128
    new = _rewrite(new, sample_topk_ids=ids)
    assert (
        _checks(new, old)["logprob-integrity"].status == Status.PASS
    )  # no vocabulary recorded: unknown
    meta = json.loads((new.path / ev.ENGINE_FILE).read_text())
    (new.path / ev.ENGINE_FILE).write_text(json.dumps({**meta, "reference": {"vocab_size": 100}}))
    result = _checks(ev.load(new.path), old)["logprob-integrity"]
    assert result.status == Status.FAIL  # 1 of 320 positions: past 1e-3
    assert result.details["new"]["malformed_top_lists"]["kinds"] == {"out_of_vocabulary": 1}
