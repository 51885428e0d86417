"""Decode against prefill inside one engine (issue 26, class 5): the worker's alignment of the
rescored greedy sequences, and logprob-integrity's comparison, against hand-computed values."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

from gate.analysis.prefill_decode import compare
from gate.checks.context import Context
from gate.config.checks_section import parse_settings
from gate.contract import evidence as ev
from gate.judge import run_checks
from gate.verdict import Status
from gate.worker.prefill import decode_positions, rescoring_input
from gate.worker.replay import Completions, PromptScores

from ..factory import RUN, make_evidence, with_engine


def _greedy(tokens: list[list[int]]) -> Completions:
    lengths = [len(t) for t in tokens]
    flat = np.asarray([x for t in tokens for x in t], dtype=np.int32)
    n = len(tokens)
    return Completions(prompt_index=np.arange(n, dtype=np.int32), sample_index=np.zeros(n, np.int32),
                       offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), token_ids=flat,
                       logprob=np.zeros(len(flat), np.float32), rank=np.ones(len(flat), np.int32),
                       topk_ids=np.zeros((len(flat), 0), np.int32), topk_logprobs=np.zeros((len(flat), 0), np.float32),
                       finish=np.zeros(n, np.int8), texts=[""] * n)  # fmt: skip


def test_greedy_sequences_become_prompts_cut_to_leave_room_for_one_token():
    prompts = [[1, 2, 3], [4, 5]]
    seqs, starts = rescoring_input(prompts, _greedy([[7, 8], [9, 10, 11, 12]]), max_model_len=6)
    assert seqs == [[1, 2, 3, 7, 8], [4, 5, 9, 10, 11]]  # 5 = max_model_len - 1: token 12 is cut
    assert starts == [3, 2]


def test_each_greedy_token_gets_its_own_prefill_logprob_and_cut_tokens_nan():
    greedy = _greedy([[7, 8], [9, 10, 11, 12], []])
    # Prompt logprobs of positions 1..L-1: [1,2,3,7,8] -> 4 values, [4,5,9,10,11] -> 4, [6] -> 0.
    scores = PromptScores(offsets=np.array([0, 4, 8, 8]),
                          logprob=np.array([-9, -9, -0.7, -0.8, -9, -0.9, -1.0, -1.1], np.float32))  # fmt: skip
    out = decode_positions(scores, [3, 2, 1], greedy)
    np.testing.assert_allclose(out[:5], [-0.7, -0.8, -0.9, -1.0, -1.1], rtol=1e-6)
    assert math.isnan(out[5]) and len(out) == 6  # token 12 was past the cut


def _with_prefill(e: ev.Evidence, prefill: np.ndarray) -> ev.Evidence:
    np.savez(
        e.path / ev.EVIDENCE_FILE,
        **{**e.arrays, "greedy_prefill_logprob": prefill.astype(np.float32)},
    )
    return ev.load(e.path, allow_nonfinite_engine=True)


@pytest.fixture
def pair(tmp_path):
    old, new = make_evidence(tmp_path / "old", seed=1), make_evidence(tmp_path / "new", seed=2)
    return _with_prefill(old, old["greedy_engine_logprob"]), new  # 20 greedy sequences of 4 tokens


def test_a_sequence_disagrees_when_its_mean_error_passes_nemo_rls_bar(pair):
    _, new = pair
    prefill = new["greedy_engine_logprob"].astype(np.float64).copy()
    prefill[0:4] += [0.04, -0.06, 0.05, 0.05]  # mean |Δ| 0.05: exp(0.05) = 1.0513 > 1.05
    prefill[4:8] += 0.048  # exp(0.048) = 1.0492: inside
    prefill[8] = np.nan  # not rescored: left out, the rest of the sequence still compared
    pd = compare(_with_prefill(new, prefill))
    assert pd is not None and pd.sequences == 20 and pd.disagreeing.tolist() == [0]
    assert pd.tokens == 79 and pd.not_compared == 1
    assert pd.max_abs == pytest.approx(0.06, abs=1e-6)
    assert pd.mean_abs == pytest.approx((0.2 + 0.048 * 4) / 79, rel=1e-5)
    assert pd.sequence_error[0] == pytest.approx(math.exp(0.05), rel=1e-5)


def test_no_rescored_pass_or_logits_mode_is_not_compared(pair):
    old, new = pair
    assert compare(new) is None  # evidence from before the pass
    e = copy.copy(old)
    with_engine(e, effective={**old.engine.effective, "logprobs_mode": "raw_logits"})
    assert compare(e) is None


def _integrity(new: ev.Evidence, old: ev.Evidence):
    ctx = Context(new=new, old=old, run=copy.deepcopy(RUN))
    return {r.id: r for r in run_checks(ctx, parse_settings(None, "gate.yaml"))}[
        "logprob-integrity"
    ]


def test_one_disagreeing_sequence_warns_and_more_than_five_percent_fail(pair):
    old, new = pair
    prefill = new["greedy_engine_logprob"].astype(np.float64).copy()
    prefill[0:4] += 0.3
    result = _integrity(_with_prefill(new, prefill), old)
    assert result.status == Status.WARN  # 1 of 20 = 5%: the fail bound is "above 0.05"
    assert result.summary.endswith("decode off prefill in 1 of 20 greedy sequences")
    assert "disagrees with itself: in 1 of 20 greedy sequences (e.g. p0)" in result.diagnosis
    prefill[4:8] -= 0.3
    result = _integrity(_with_prefill(new, prefill), old)
    assert result.status == Status.FAIL
    assert result.details["new"]["prefill_decode"]["examples"] == ["p0", "p1"]
    assert result.details["old"]["prefill_decode"]["disagreeing"] == 0
    assert (
        "NeMo-RL #2100" in result.diagnosis and "The old engine disagrees" not in result.diagnosis
    )
