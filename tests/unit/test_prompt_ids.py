"""The prompts an engine ran on other ids than the trainer holds (issue 26, class 8): the worker's
record, the server's reported ids, the token-in path and the tokenization check's judgement."""

from __future__ import annotations

import copy

import pytest

from gate.checks import tokenization
from gate.checks.context import Context
from gate.config.checks_section import parse_settings
from gate.contract.evidence import EvidenceError
from gate.contract.request import PromptItem
from gate.verdict import Status
from gate.worker.replay import prompt_ids_record, tokenize_prompts
from gate.worker.server_replay import SampledOverHttp, _completion_prompt_ids
from tests.factory import RUN, make_evidence, with_engine


def test_the_record_counts_checked_prompts_and_says_where_the_first_departs():
    trainer = [[1, 5, 6], [1, 7], [1, 8, 9], [2]]
    engine = [[1, 5, 6], [1, 7, 4, 4], None, [1, 2]]
    record = prompt_ids_record(trainer, engine, ["a", "b", "c", "d"], "test")
    # b: the engine's ids run on past the trainer's two (departs at 2); c: unknown; d: departs at 0
    assert record == {
        "source": "test",
        "checked": 3,
        "unlike_trainer": {
            "count": 2,
            "ids": ["b", "d"],
            "first": {"id": "b", "at": 2, "trainer_tokens": 2, "engine_tokens": 4},
        },
    }
    same = prompt_ids_record([[1]], [[1]], ["a"], "test")
    assert same["unlike_trainer"] == {"count": 0, "ids": [], "first": None}


def test_a_completion_reports_the_ids_it_ran_or_the_ids_sent_stand():
    said = {
        "choices": [
            {"index": 0, "prompt_token_ids": [1, 2]},
            {"index": 1, "prompt_token_ids": [1, 2]},
        ]
    }
    assert _completion_prompt_ids(said, [2]) == ([1, 2], "response.choices.prompt_token_ids")
    assert _completion_prompt_ids({"choices": [{"index": 0}]}, [2]) == ([2], "sent")


def test_ids_the_server_did_not_report_are_not_checked():
    result = SampledOverHttp(None, [[1], [2], [3]], ["sent", "response.prompt_token_ids", "sent"])  # type: ignore[arg-type]
    assert result.engine_prompt_ids == [None, [2], None]
    assert result.prompt_ids_source == {"sent": 2, "response.prompt_token_ids": 1}


class _Chars:
    """A tokenizer of 10 ids: what tokenize_prompts asks of one for pre-tokenized prompts."""

    def __len__(self) -> int:
        return 10


def test_token_ids_go_as_given_and_ids_outside_the_vocabulary_are_refused():
    assert tokenize_prompts(_Chars(), [PromptItem("a", prompt_token_ids=[9, 0, 3])]) == [[9, 0, 3]]
    with pytest.raises(
        ValueError,
        match=r"prompt b: prompt_token_ids: 2 id\(s\) outside the tokenizer's 10 \(first: 10\)",
    ):
        tokenize_prompts(_Chars(), [PromptItem("b", prompt_token_ids=[1, 10, 12])])


def _with_record(e, count: int, ids: list[str], first: dict | None):
    with_engine(e, prompt_ids={"source": "server: 4 from response.prompt_token_ids", "checked": 8,
                               "unlike_trainer": {"count": count, "ids": ids, "first": first}})  # fmt: skip
    return e


def _tokenization(ctx):
    return tokenization.run(ctx, parse_settings({}, "gate.yaml")[tokenization.ID])


FIRST = {"id": "p1", "at": 27, "trainer_tokens": 38, "engine_tokens": 68}


def test_the_new_engine_fails_and_the_old_one_warns_on_prompts_unlike_the_trainers(tmp_path):
    old = _with_record(make_evidence(tmp_path / "old", seed=1), 1, ["p1"], FIRST)
    new = _with_record(make_evidence(tmp_path / "new", seed=2), 2, ["p1", "p3"], FIRST)
    result = _tokenization(Context(new=new, old=old, run=copy.deepcopy(RUN)))
    by = {(m.name, m.engine): m for m in result.measurements}
    assert (
        by[("prompts_unlike_trainer", "new")].value,
        by[("prompts_unlike_trainer", "new")].status,
    ) == (2, Status.FAIL)
    assert (
        by[("prompts_unlike_trainer", "old")].value,
        by[("prompts_unlike_trainer", "old")].status,
    ) == (1, Status.WARN)
    assert result.status == Status.FAIL
    assert "new: 2 of 8 prompt(s) run on other ids than the trainer's" in result.summary
    assert (
        "The new engine ran 2 of 8 prompt(s) on other token ids than the trainer holds for them (e.g. p1, p3; "
        "p1 departs at token 27, 38 tokens in the trainer's rendering against 68 in the engine's)"
    ) in result.diagnosis
    assert (
        "vLLM #33616" in result.diagnosis and "Prompts tokenize differently" not in result.diagnosis
    )


def test_only_the_old_engine_unlike_the_trainer_is_a_warning_and_a_clean_record_passes(tmp_path):
    old = _with_record(make_evidence(tmp_path / "old", seed=1), 1, ["p1"], FIRST)
    new = _with_record(make_evidence(tmp_path / "new", seed=2), 0, [], None)
    assert _tokenization(Context(new=new, old=old, run=copy.deepcopy(RUN))).status == Status.WARN
    alone = _tokenization(Context(new=new, old=None, run=copy.deepcopy(RUN)))
    assert alone.status == Status.PASS and alone.details["unlike_trainer"]["new"]["checked"] == 8


@pytest.mark.parametrize("broken", [
    {"source": "x", "checked": "8", "unlike_trainer": {"count": 0, "ids": [], "first": None}},
    {"source": "x", "checked": 8, "unlike_trainer": {"count": 1, "ids": [3], "first": None}},
    {"source": "x", "checked": 8, "unlike_trainer": {"count": 1, "ids": ["p"], "first": {"id": "p", "at": -1,
                                                                                         "trainer_tokens": 1, "engine_tokens": 1}}},
    ["not", "a", "record"],
])  # fmt: skip
def test_a_malformed_record_is_refused_naming_the_file_and_field(tmp_path, broken):
    e = make_evidence(tmp_path / "new")
    with_engine(e, prompt_ids=broken)
    with pytest.raises(EvidenceError, match=r"engine\.json: prompt_ids: expected source, checked"):
        tokenization.prompt_ids_record(e)
