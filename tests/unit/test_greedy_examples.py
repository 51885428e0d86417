"""greedy-and-length keeps a few changed greedy completions, decoded, for the comment's side-by-side table."""

from __future__ import annotations

import copy

import numpy as np

from gate.checks.context import Context
from gate.config.checks_section import parse_settings
from gate.judge import run_checks

from ..factory import RUN, make_evidence

TEXT = {0: "0", 1: "1", 2: "2", 3: "3", 77: "<x|"}


def test_changed_completions_are_decoded_beside_the_reference(tmp_path):
    old = make_evidence(tmp_path / "old", seed=1, token_text=TEXT)
    tokens = np.tile(np.arange(4, dtype=np.int32), 20)
    tokens[4 * 5 + 2] = 77  # prompt 5 diverges at position 2
    tokens[4 * 9 + 0] = 77  # prompt 9 at position 0
    new = make_evidence(tmp_path / "new", seed=2, greedy_tokens=tokens, token_text=TEXT)
    ctx = Context(new=new, old=old, run=copy.deepcopy(RUN))
    result = next(
        r for r in run_checks(ctx, parse_settings({}, "gate.yaml")) if r.id == "greedy-and-length"
    )
    assert result.details["old"]["examples"] == [
        {"prompt_id": "p5", "first_divergence": 2, "reference": "0123", "new": "01<x|3"},
        {"prompt_id": "p9", "first_divergence": 0, "reference": "0123", "new": "<x|123"},
    ]


def test_identical_completions_keep_no_examples(tmp_path):
    old = make_evidence(tmp_path / "old", seed=1, token_text=TEXT)
    new = make_evidence(tmp_path / "new", seed=2, token_text=TEXT)
    ctx = Context(new=new, old=old, run=copy.deepcopy(RUN))
    result = next(
        r for r in run_checks(ctx, parse_settings({}, "gate.yaml")) if r.id == "greedy-and-length"
    )
    assert "examples" not in result.details["old"]
