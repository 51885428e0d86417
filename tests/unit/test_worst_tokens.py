"""Worst tokens: the sampled tokens with the largest |d|, with context, against hand-computed rows."""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import pytest

from gate.checks import mismatch
from gate.checks.base import CheckSettings
from gate.checks.context import Context
from gate.contract import evidence as ev
from gate.contract import keys
from gate.metrics import largest_abs_diff

from ..factory import RUN, make_evidence

# Markdown, HTML and a comment opener in one token: carried verbatim, the renderer escapes it.
SPECIAL = "<b>*x*</b>|`<!--"
TEXT = {i: f"t{i}" for i in range(30, 46)} | {
    35: SPECIAL,
    1: "<s>",
    10: "a",
    20: "=",
    11: "b",
    21: "+",
}


def _evidence(folder, token_text=TEXT, shift=0.0):
    """2 prompts x 2 samples x 4 tokens (ids 30..45); trainer -1 everywhere, the engine off at a few.

    Sequences: 0 = tokens 0..3 (p0, sample 0), 1 = 4..7 (p0, sample 1), 2 = 8..11 (p1, 0), 3 = 12..15
    (p1, 1). Prompts: p0 = [1, 10, 20], p1 = [1, 11, 21]. d = trainer - engine: +0.9 at 5, +0.7 at 0,
    -0.5 at 12, +0.5 at 15 (tied with 12: the earlier first); token 3 is outside the transform
    (trainer -inf), so it has no d and is never listed although its engine logprob is far off.
    """
    e = make_evidence(folder, n_prompts=2, n=2, length=4, token_text=token_text)
    trainer = np.full(16, -1.0, dtype=np.float32)
    engine = np.full(16, -1.0, dtype=np.float32)
    engine[[5, 0, 12, 15, 3]] = [-1.9, -1.7, -0.5, -1.5, -9.0]
    trainer[3] = -np.inf
    e.arrays[f"{keys.SAMPLE}_{keys.TOKEN_IDS}"] = np.arange(30, 46, dtype=np.int32)
    e.arrays[f"{keys.SAMPLE}_{keys.TRAINER_PROCESSED}"] = trainer
    e.arrays[f"{keys.SAMPLE}_{keys.ENGINE_LOGPROB}"] = (engine + shift).astype(np.float32)
    return e


def _row(rank, prompt_id, sample, position, token_id, token, context, after, engine_lp):
    return mismatch.WorstToken(
        engine="new", rank=rank, prompt_id=prompt_id, sample=sample, position=position, token_id=token_id,
        token=token, context=context, context_after=after, engine_logprob=pytest.approx(engine_lp), trainer_logprob=-1.0,
    )  # fmt: skip


def test_largest_abs_diff_is_ordered_deterministic_and_skips_non_finite():
    trainer = np.array([0.0, 0.0, 0.0, -np.inf, 0.0, np.nan, 0.0])
    engine = np.array([-1.0, -3.0, -1.0, -9.0, -2.0, 0.0, -1.0])
    assert largest_abs_diff(trainer, engine, 3).tolist() == [1, 4, 0]  # 0, 2, 6 tie: the first wins
    assert largest_abs_diff(trainer, engine, 5).tolist() == [1, 4, 0, 2, 6]
    assert largest_abs_diff(trainer, engine, 99).tolist() == [1, 4, 0, 2, 6]  # only tokens with a d
    assert largest_abs_diff(trainer, engine, 0).tolist() == []
    with pytest.raises(ValueError, match="7 tokens"):
        largest_abs_diff(trainer, engine[:2], 1)


def test_worst_tokens_against_hand_computed_rows(tmp_path):
    rows = mismatch.worst_tokens(_evidence(tmp_path), "new", keys.TRAINER_PROCESSED, 4)
    assert rows == [
        # token 35: position 1 of sequence 1; context = p0's prompt, then token 34
        _row(1, "p0", 1, 1, 35, SPECIAL, "<s>a=t34", "t36t37", -1.9),
        _row(2, "p0", 0, 0, 30, "t30", "<s>a=", "t31t32t33", -1.7),
        _row(3, "p1", 1, 0, 42, "t42", "<s>b+", "t43t44t45", -0.5),
        _row(4, "p1", 1, 3, 45, "t45", "<s>b+t42t43t44", "", -1.5),
    ]
    # The delta the renderer shows (trainer - engine) is the signed d.
    assert [round(r.trainer_logprob - r.engine_logprob, 6) for r in rows] == [
        0.9,
        0.7,
        -0.5,
        0.5,
    ]
    json.dumps([dataclasses.asdict(r) for r in rows])  # report-ready: plain JSON types


def test_context_is_a_few_tokens_before_and_after(tmp_path):
    e = make_evidence(
        tmp_path, n_prompts=1, n=1, length=20, token_text={i: f"<{i}>" for i in range(100)}
    )
    trainer = np.zeros(20, dtype=np.float32)
    engine = np.zeros(20, dtype=np.float32)
    engine[10] = -2.0
    e.arrays[f"{keys.SAMPLE}_{keys.TOKEN_IDS}"] = np.arange(20, dtype=np.int32) + 50
    e.arrays[f"{keys.SAMPLE}_{keys.TRAINER_PROCESSED}"] = trainer
    e.arrays[f"{keys.SAMPLE}_{keys.ENGINE_LOGPROB}"] = engine
    (row,) = mismatch.worst_tokens(e, "new", keys.TRAINER_PROCESSED, 1)
    assert row.context == "".join(f"<{i}>" for i in range(52, 60))  # CONTEXT_BEFORE tokens
    assert row.context_after == "".join(f"<{i}>" for i in range(61, 65))  # CONTEXT_AFTER tokens
    assert row.token == "<60>" and row.position == 10


def test_evidence_without_token_text_shows_ids(tmp_path):
    rows = mismatch.worst_tokens(
        _evidence(tmp_path, token_text=None), "new", keys.TRAINER_PROCESSED, 1
    )
    assert rows[0].token == "⟨id 35⟩"
    assert rows[0].context == "⟨id 1⟩⟨id 10⟩⟨id 20⟩⟨id 34⟩"


def test_malformed_token_text_is_refused_at_load(tmp_path):
    _evidence(tmp_path)
    texts = json.loads((tmp_path / "texts.json").read_text())
    texts[ev.TOKEN_TEXT] = {"x": "a"}
    (tmp_path / "texts.json").write_text(json.dumps(texts))
    with pytest.raises(ev.EvidenceError, match=r"texts\.json: token_text: a key is not a token id"):
        ev.load(tmp_path)


def _settings(**options):
    return CheckSettings(
        mode="fail",
        thresholds=dict(mismatch.THRESHOLDS),
        options={**mismatch.SPEC.options, **options},
    )


def test_the_check_lists_the_new_engine_first_then_the_old(tmp_path):
    new = _evidence(tmp_path / "new")
    old = _evidence(tmp_path / "old", shift=-0.1)  # every old token 0.1 further off
    ctx = Context(new=new, old=old, run=copy.deepcopy(RUN))
    result = mismatch.run(ctx, _settings(worst_tokens=2))
    rows = result.details["worst_tokens"]
    assert [(r["engine"], r["rank"], r["token_id"]) for r in rows] == [
        ("new", 1, 35),
        ("new", 2, 30),
        ("old", 1, 35),
        ("old", 2, 30),
    ]
    assert rows[2]["engine_logprob"] == pytest.approx(-2.0)


@pytest.mark.parametrize(
    "options, expected", [({"worst_tokens": 0}, 0), ({}, 10), ({"worst_tokens": 3}, 3)]
)
def test_the_worst_tokens_option(tmp_path, options, expected):
    e = make_evidence(tmp_path, n_prompts=4, n=2, length=8)
    ctx = Context(new=e, old=None, run=copy.deepcopy(RUN))
    opts = {k: v for k, v in mismatch.SPEC.options.items() if k != "worst_tokens"} | options
    result = mismatch.run(ctx, CheckSettings("fail", dict(mismatch.THRESHOLDS), opts))
    assert len(result.details.get("worst_tokens", [])) == expected
    assert mismatch.SPEC.options["worst_tokens"] == mismatch.WORST_TOKENS == 10


def test_the_option_is_accepted_in_gate_yaml():
    from gate.config.checks_section import parse_settings

    settings = parse_settings({"train-inference-mismatch": {"worst_tokens": 5}}, "gate.yaml")
    assert settings["train-inference-mismatch"].options["worst_tokens"] == 5
