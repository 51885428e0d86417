"""The trainer's side of in-flight attribution: OLD, REC and STALE logprobs on the tiny model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from gate.worker.inflight import (  # noqa: E402
    attribution_scores,
    departure,
    inflight_prompts,
    switch_points,
)
from gate.worker.policy_weights import clone_state_dict, perturbed  # noqa: E402

TINY = Path(__file__).resolve().parents[2] / "gate" / "assets" / "models" / "tiny-arith"
PROMPT, GEN = [1, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15, 16]


@pytest.fixture(scope="module")
def model():
    return transformers.AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def weights(model):
    old = clone_state_dict(model.state_dict())
    return old, perturbed(old, 0.2, 0)


def _logprob_of(model, ids, target, past=None):
    out = model(torch.tensor([ids]), past_key_values=past, use_cache=True)
    return float(torch.log_softmax(out.logits[0, -1].float(), -1)[target]), out.past_key_values


def _scores(*args, **kwargs):
    found = attribution_scores(*args, **kwargs)
    return found.old, found.rec, found.stale


def test_same_weights_give_one_answer(model, weights):
    old, _ = weights
    o, r, s = _scores(model, old, old, [(PROMPT, GEN)], [3], "cpu")
    np.testing.assert_allclose(r, o, atol=1e-5)
    np.testing.assert_allclose(s, o, atol=1e-5)


def test_stale_is_the_new_weights_over_the_old_kv(model, weights):
    old, new = weights
    c = 3
    o, r, s = _scores(model, old, new, [(PROMPT, GEN)], [c], "cpu")
    assert len(o) == len(r) == len(s) == len(GEN)
    np.testing.assert_array_equal(s[:c], o[:c])  # before the switch STALE is OLD
    # By hand: the old model's cache over prompt + GEN[:c-1], then the new weights take GEN[c-1].
    model.load_state_dict(old)
    _, cache = _logprob_of(model, PROMPT + GEN[: c - 1], GEN[c - 1])
    model.load_state_dict(new)
    first, cache = _logprob_of(model, [GEN[c - 1]], GEN[c], cache)
    second, _ = _logprob_of(model, [GEN[c]], GEN[c + 1], cache)
    np.testing.assert_allclose(s[c : c + 2], [first, second], atol=1e-5)
    # And it is neither of the others: the three candidates are apart after the switch.
    assert np.abs(s[c:] - r[c:]).min() > 1e-3 and np.abs(s[c:] - o[c:]).min() > 1e-3


def test_a_switch_at_the_end_is_old_throughout(model, weights):
    old, new = weights
    o, _, s = _scores(model, old, new, [(PROMPT, GEN), (PROMPT[:3], GEN[:4])], [8, 4], "cpu")
    np.testing.assert_array_equal(s, o)


def test_a_switch_known_within_bounds_is_fitted_to_the_engine(model, weights):
    """Server mode knows a call's position within the tokens that arrived while it ran: STALE is
    computed at each switch the bounds allow and the one the engine's logprobs match is kept."""
    old, new = weights
    seqs = [(PROMPT, GEN)]
    for true_switch in (2, 4, 6):
        exact = attribution_scores(model, old, new, seqs, [true_switch], "cpu")
        fitted = attribution_scores(
            model, old, new, seqs, [1], "cpu", upper=[7], engine=[exact.stale]
        )
        assert fitted.switch.tolist() == [true_switch]
        np.testing.assert_array_equal(fitted.stale, exact.stale)
    # Never outside the bounds: an engine that switched at 6 seen within [2, 4] is fitted at 4.
    at_six = attribution_scores(model, old, new, seqs, [6], "cpu").stale
    assert attribution_scores(
        model, old, new, seqs, [2], "cpu", upper=[4], engine=[at_six]
    ).switch.tolist() == [4]
    # Without the engine's logprobs the lower bound stands.
    assert attribution_scores(model, old, new, seqs, [2], "cpu", upper=[4]).switch.tolist() == [2]


def test_a_live_streams_late_count_is_extended_to_where_the_engine_left_the_old_weights(
    model, weights
):
    """Server mode without a pause: the client counted the tokens that had reached it when the
    call returned, and a loaded server streams behind its engine. The engine's own logprobs say
    where it left the old weights; the fit reaches that far, and no further."""
    old, new = weights
    seqs = [(PROMPT, GEN)]
    at_six = attribution_scores(model, old, new, seqs, [6], "cpu").stale
    fitted = attribution_scores(
        model, old, new, seqs, [2], "cpu", upper=[4], engine=[at_six], upper_may_lag=True
    )
    assert fitted.switch.tolist() == [6] and fitted.upper.tolist() == [6]
    np.testing.assert_array_equal(fitted.stale, at_six)
    # An engine that kept to the old weights throughout: the bound stays what the client saw.
    still_old = attribution_scores(model, old, old, seqs, [2], "cpu").old
    kept = attribution_scores(
        model, old, new, seqs, [2], "cpu", upper=[4], engine=[still_old], upper_may_lag=True
    )
    assert kept.upper.tolist() == [4]


def test_departure_is_the_first_token_past_the_engines_own_spread():
    old = np.zeros(8)
    engine = np.array([1e-7, -2e-7, 1e-7, 3e-7, 5e-7, 0.3, 0.2, np.nan])
    # before token 2: a largest miss of 2e-7, so 4x it (8e-7) or 1e-5, whichever is larger
    assert departure(engine, old, 2) == 5
    assert departure(np.array([0.0, 0.01, 0.03, 0.05]), old[:4], 2) == 3  # 4 x 0.01 = 0.04
    assert departure(np.full(4, np.nan), old[:4], 1) is None
    assert departure(engine[:5], old[:5], 0) is None  # nothing before: the 1e-5 floor


def test_probe_prompts_are_distinct_and_leave_room():
    prompts = [[1, 2], [1, 2], [], [3] * 220, [4, 5, 6]]
    assert inflight_prompts(prompts, 4, 48, 256) == [[1, 2], [4, 5, 6]]
    with pytest.raises(ValueError, match=r"lower weight_sync\.inflight\.max_tokens"):
        inflight_prompts([[3] * 250], 4, 48, 256)


def test_an_update_without_calls_switches_nothing():
    from gate.worker.inflight import CallRecord, Stream, UpdateRun

    streams = [Stream("a", [1], 4, token_ids=[5, 6, 7, 8]), Stream("b", [1], 4, token_ids=[5, 6])]
    points = switch_points(UpdateRun("noop", streams, [], 4, 0.0, 0.1))
    assert points.lower.tolist() == points.upper.tolist() == points.end.tolist() == [4, 2]
    records = [
        CallRecord("pause", [2, 1], 0.0),
        CallRecord("push", [2, 1], 0.1),
        CallRecord("resume", [2, 1], 0.2),
    ]
    points = switch_points(UpdateRun("keep", streams, records, 4, 0.2, 0.3))
    assert points.lower.tolist() == points.upper.tolist() == points.end.tolist() == [2, 1]
    # A call known only within bounds (server mode, no pause): its bounds.
    records = [CallRecord("push", [3, 2], 0.0, earliest=[2, 1])]
    points = switch_points(UpdateRun("no_pause", streams, records, 0, 0.1, 0.2))
    assert points.lower.tolist() == [2, 1] and points.upper.tolist() == points.end.tolist() == [
        3,
        2,
    ]
    assert points.upper_may_lag  # what the client had read of a live stream
    # Several calls with steps between them: anywhere from the first call to the last.
    records = [
        CallRecord("label", [2, 1], 0.0),
        CallRecord("pause", [4, 3], 0.1),
        CallRecord("resume", [4, 3], 0.2),
    ]
    points = switch_points(UpdateRun("late", streams, records, 4, 0.2, 0.3))
    assert points.lower.tolist() == [2, 1] and points.upper.tolist() == points.end.tolist() == [
        4,
        3,
    ]
