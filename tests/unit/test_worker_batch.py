"""The worker's batch rules: several requests share one engine start only when that is faithful."""

from __future__ import annotations

import dataclasses

import pytest

from gate.contract.request import (
    GrpoRequest,
    PromptItem,
    ReferenceRequest,
    SamplingRequest,
    WeightSyncRequest,
    WorkerRequest,
)
from gate.worker.main import main, read_requests, validate_batch


def _request(out: str, **changes) -> WorkerRequest:
    req = WorkerRequest(
        engine_name="new",
        model="/m",
        tokenizer=None,
        engine_args={"dtype": "float32", "seed": 0},
        optional_engine_args=["logprobs_mode"],
        prompts=[PromptItem(id="a", prompt="1+1=", reference="2")],
        sampling=SamplingRequest(
            n=2, temperature=0.7, top_p=1.0, top_k=0, max_tokens=8, seed=1, logprobs=5
        ),
        greedy_max_tokens=8,
        teacher_forced=True,
        reference=ReferenceRequest(dtype="float32", lm_head_fp32=False, batch_tokens=1024),
        output_dir=out,
    )
    return dataclasses.replace(req, **changes)


WS = WeightSyncRequest(perturbation=0.2, seed=0, probes=8, max_tokens=16)
GRPO = GrpoRequest(
    steps=2,
    prompts_per_step=2,
    group_size=2,
    max_tokens=8,
    temperature=0.7,
    lr=1e-5,
    clip_eps=0.2,
    seeds=[0],
)


def test_requests_that_differ_only_per_request_share_an_engine():
    sampling = dataclasses.replace(_request("/a").sampling, seed=99, top_p=0.8)
    validate_batch([
        _request("/a"),
        _request("/b", sampling=sampling, order_seed=3, prompts=[PromptItem(id="z", prompt="2+2=")]),
        _request("/c", weight_sync=WS, grpo=GRPO),  # the RL passes on the last request
    ])  # fmt: skip


@pytest.mark.parametrize(
    "field,value",
    [
        ("model", "/other"),
        ("tokenizer", "/tok"),
        ("engine_args", {"dtype": "bfloat16", "seed": 0}),
        ("optional_engine_args", []),
    ],
)
def test_another_engine_construction_is_refused(field, value):
    with pytest.raises(ValueError, match=f"request 2 \\(/b\\): {field} differs from request 1's"):
        validate_batch([_request("/a"), _request("/b", **{field: value})])


@pytest.mark.parametrize("rl", [{"weight_sync": WS}, {"grpo": GRPO}])
def test_weight_changing_passes_only_on_the_last_request(rl):
    with pytest.raises(
        ValueError, match="request 1 \\(/a\\): weight_sync/grpo change the engine's weights"
    ):
        validate_batch([_request("/a", **rl), _request("/b")])


def test_two_requests_may_not_share_an_output_dir():
    with pytest.raises(ValueError, match="same output_dir"):
        validate_batch([_request("/a"), _request("/a/")])
    with pytest.raises(ValueError, match="no request"):
        validate_batch([])


def test_main_refuses_a_bad_batch_before_starting_anything(tmp_path, capsys):
    first, second = tmp_path / "1.json", tmp_path / "2.json"
    _request(str(tmp_path / "a")).write(first)
    _request(str(tmp_path / "b"), engine_args={"dtype": "bfloat16"}).write(second)
    assert main([str(first), str(second)]) == 2
    assert "error: request 2" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()  # no engine, no output


def test_read_requests_names_the_unreadable_file(tmp_path, capsys):
    good = tmp_path / "1.json"
    _request(str(tmp_path / "a")).write(good)
    (tmp_path / "2.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"bad request .*2\.json"):
        read_requests([str(good), str(tmp_path / "2.json")])
    assert [r.output_dir for r in read_requests([str(good)])] == [str(tmp_path / "a")]
    assert main([]) == 2 and "usage" in capsys.readouterr().err
