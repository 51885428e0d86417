"""The worker's pass table: order, when each pass runs, what it records, timed one way.

The engine calls (gate.worker.replay, the weight-sync and GRPO modules) are replaced by fakes that
record their arguments: this pins the table's wiring; the engine tests run the real calls.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest

from gate.contract.request import (
    GrpoRequest,
    InflightRequest,
    PromptItem,
    ReferenceRequest,
    SamplingRequest,
    WeightSyncRequest,
    WorkerRequest,
)
from gate.worker import replay
from gate.worker.engine_handle import OfflineEngine
from gate.worker.passes import (
    ENGINE_PASSES,
    PHASE_TIMEOUT_ENV,
    EnginePass,
    PassInput,
    PassResults,
    PhaseTimeout,
    Timings,
    Tokenized,
    failed_ranks,
    run_passes,
)

WS = WeightSyncRequest(perturbation=0.2, seed=0, probes=8, max_tokens=16)
WS_INFLIGHT = dataclasses.replace(
    WS,
    inflight=InflightRequest(
        updates=["keep"], requests=4, max_tokens=48, switch_after=16, timeout_s=60
    ),
)
GRPO = GrpoRequest(
    steps=2,
    prompts_per_step=2,
    group_size=2,
    max_tokens=8,
    temperature=0.7,
    lr=1e-5,
    clip_eps=0.2,
    seeds=[0, 1],
)
TOKENS = Tokenized(prompt_ids=[[1, 2], [1, 3], [1, 4]], reference_ids=[[7], None, [8, 9]])


def _request(**changes) -> WorkerRequest:
    req = WorkerRequest(
        engine_name="new", model="/m", tokenizer=None, engine_args={}, optional_engine_args=[],
        prompts=[PromptItem(id=i, prompt=i, answer="2") for i in ("a", "b", "c")],
        sampling=SamplingRequest(n=2, temperature=0.7, top_p=1.0, top_k=0, max_tokens=8, seed=1, logprobs=5),
        greedy_max_tokens=8, teacher_forced=True,
        reference=ReferenceRequest(dtype="float32", lm_head_fp32=False, batch_tokens=1024), output_dir="/out",
    )  # fmt: skip
    return dataclasses.replace(req, **changes)


def _input(said: list[str], **changes) -> PassInput:
    return PassInput(
        engine=OfflineEngine("LLM"),
        request=_request(**changes),
        tokenized=TOKENS,
        say=said.append,
        hf_kwargs={"revision": "r"},
    )


def _completions(tag: int) -> replay.Completions:
    z = np.zeros(0)
    return replay.Completions(
        np.array([tag]), z, np.array([0, 0]), z, z, z, z, z, z, [f"text {tag}"]
    )


@pytest.fixture
def engine(monkeypatch):
    """Fake engine calls; ``calls`` records (name, arguments) in call order."""
    calls: list[tuple] = []
    monkeypatch.setattr(
        replay,
        "sample",
        lambda llm, ids, s, order, lora_request=None: (
            calls.append(("sample", llm, ids, s.n, order)) or _completions(1)
        ),
    )
    monkeypatch.setattr(
        replay,
        "greedy",
        lambda llm, ids, m, k, order, lora_request=None: (
            calls.append(("greedy", m, k, order)) or _completions(2)
        ),
    )

    def score_sequences(llm, seqs, order, one_per_call=False, lora_request=None):
        calls.append(("tf", seqs, order))
        counts = [len(s) - 1 for s in seqs]
        return replay.PromptScores(
            np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), np.zeros(sum(counts))
        )

    monkeypatch.setattr(replay, "score_sequences", score_sequences)

    ws = ModuleType("gate.worker.weight_sync")

    class UnsupportedEngine(RuntimeError):
        pass

    def offline_target(llm, adapter):
        return SimpleNamespace(target=llm, adapter=adapter)

    def probe(target, model, prompt_ids, reference_ids, request, say, hf_kwargs):
        calls.append(("weight_sync", target.target, request, hf_kwargs))
        if request.hook == "raises":
            raise RuntimeError("the hook broke")
        return {"ws_x": np.ones(2)}, {"adapter": "fake"}

    def choose_adapter(llm, hook, scratch_dir):
        calls.append(("adapter", hook))
        if hook == "none":
            raise UnsupportedEngine("no push path")
        return SimpleNamespace(name="fake push", push="push-fn")

    def push_naming_failures(adapter, llm, state_dict):
        raise AssertionError("the fake GRPO run never pushes")

    ws.probe, ws.offline_target = probe, offline_target
    grpo = ModuleType("gate.worker.grpo")

    def run_grpo(llm, model, prompt_ids, answers, request, push, say, hf_kwargs, rollout, dtype):
        calls.append(("grpo", answers, push, llm, rollout, dtype))
        return SimpleNamespace(
            arrays={"grpo_reward": np.zeros((2, 2))}, trainer={"trainable": "all"}, eval_s=0.5
        )

    grpo.run_grpo = run_grpo
    monkeypatch.setitem(sys.modules, "gate.worker.weight_sync", ws)
    push_layer = ModuleType("gate.worker.weight_push")
    push_layer.UnsupportedEngine, push_layer.choose_adapter = UnsupportedEngine, choose_adapter
    push_layer.push_naming_failures = push_naming_failures
    monkeypatch.setitem(sys.modules, "gate.worker.weight_push", push_layer)
    monkeypatch.setitem(sys.modules, "gate.worker.grpo", grpo)
    return calls


def test_the_table_runs_the_passes_in_this_order():
    # The weight-changing passes last: everything before them samples the checkpoint's weights.
    assert [p.name for p in ENGINE_PASSES] == [
        "sample",
        "greedy",
        "prefill_decode",
        "teacher_forced",
        "batch_invariance",
        "weight_sync",
        "weight_sync_inflight",
        "grpo",
    ]


@pytest.mark.parametrize(
    "changes, enabled",
    [
        ({}, ["sample", "greedy", "prefill_decode", "teacher_forced"]),
        ({"greedy_max_tokens": 0}, ["sample", "teacher_forced"]),
        ({"teacher_forced": False}, ["sample", "greedy", "prefill_decode"]),
        (
            {"weight_sync": WS, "grpo": GRPO},
            ["sample", "greedy", "prefill_decode", "teacher_forced", "weight_sync", "grpo"],
        ),
        (
            {"weight_sync": WS_INFLIGHT},
            [
                "sample",
                "greedy",
                "prefill_decode",
                "teacher_forced",
                "weight_sync",
                "weight_sync_inflight",
            ],
        ),
        ({"grpo": GRPO}, ["sample", "greedy", "prefill_decode", "teacher_forced", "grpo"]),
        (
            {"batch_invariance": True},
            ["sample", "greedy", "prefill_decode", "teacher_forced", "batch_invariance"],
        ),
        (
            {"mode": True},
            ["sample", "greedy", "prefill_decode", "teacher_forced", "batch_invariance"],
        ),
        (
            {"batch_invariance": True, "teacher_forced": False},
            ["sample", "greedy", "prefill_decode"],
        ),
    ],
)
def test_which_passes_a_request_enables(changes, enabled):
    # "mode": the engine runs in vLLM's batch-invariant mode, which turns the measurement on by itself
    mode = changes.pop("mode", None)
    inp = dataclasses.replace(_input([], **changes), batch_invariant_mode=mode)
    assert [p.name for p in ENGINE_PASSES if p.enabled(inp)] == enabled


@pytest.mark.parametrize("varies", [False, True])
def test_the_batch_invariance_pass_scores_again_reversed_and_one_at_a_time(
    engine, monkeypatch, varies
):
    calls = []

    def score(llm, seqs, order, one_per_call=False, lora_request=None):
        # logprobs that depend only on the tokens, plus (varies) on how many sequences share the call
        calls.append((len(seqs), None if order is None else order.tolist()))
        parts = [
            np.asarray(s[1:], dtype=np.float32) * -0.1 - (len(seqs) > 1) * varies * 1e-6
            for s in seqs
        ]
        logprob = np.concatenate(parts).astype(np.float32)
        return replay.PromptScores(
            np.concatenate([[0], np.cumsum([len(p) for p in parts])]), logprob
        )

    monkeypatch.setattr(replay, "score_sequences", score)
    said: list[str] = []
    out = run_passes(ENGINE_PASSES, _input(said, batch_invariance=True), Timings())
    # the greedy sequence rescored (prefill against decode), then as given, reversed, one at a time
    assert calls == [(1, None), (2, None), (2, [1, 0]), (1, None), (1, None)]
    record = out.batch_invariance
    assert record["bitwise"] is (not varies) and record["sequences"] == 2 and record["tokens"] == 5
    assert record["max_abs_diff"]["reversed"] == 0.0
    assert record["max_abs_diff"]["one at a time"] == pytest.approx(
        1e-6 if varies else 0.0, abs=1e-7
    )
    assert said[-1] == "batch-invariance pass: 2 fixed sequences again, reversed and one at a time"


def test_no_reference_continuation_means_no_teacher_forced_pass():
    inp = dataclasses.replace(_input([]), tokenized=Tokenized(TOKENS.prompt_ids, [None, [], None]))
    assert not next(p for p in ENGINE_PASSES if p.name == "teacher_forced").enabled(inp)


def test_run_passes_times_each_enabled_pass_and_skips_the_rest():
    ran: list[str] = []

    def step(name: str, seconds: float):
        def run(inp: PassInput, out: PassResults) -> None:
            ran.append(name)
            time.sleep(seconds)

        return run

    table = (
        EnginePass("first", lambda inp: True, step("first", 0.02)),
        EnginePass("off", lambda inp: False, step("off", 0.0)),
        EnginePass("second", lambda inp: True, step("second", 0.0)),
    )
    timings = Timings({"import_s": 1.0})
    run_passes(table, _input([]), timings)
    assert ran == ["first", "second"]
    assert list(timings.values) == ["import_s", "first_s", "second_s"]
    assert timings.values["first_s"] >= 0.02 > timings.values["second_s"] >= 0.0


def test_the_real_table_wires_each_pass(engine):
    said: list[str] = []
    timings = Timings()
    out = run_passes(ENGINE_PASSES, _input(said, order_seed=3, weight_sync=WS, grpo=GRPO), timings)
    order = replay.submission_order(3, 3)
    assert [c[0] for c in engine] == [
        "sample",
        "greedy",
        "tf",
        "tf",
        "adapter",
        "weight_sync",
        "adapter",
        "grpo",
    ]
    assert engine[0][1:4] == ("LLM", TOKENS.prompt_ids, 2) and np.array_equal(engine[0][4], order)
    assert engine[1][1:3] == (8, 5) and np.array_equal(engine[1][3], order)
    # Prefill against decode: the greedy sequence (prompt 2, no tokens here) scored again as a prompt.
    assert engine[2][1] == [[1, 4]] and np.array_equal(engine[2][2], replay.submission_order(1, 3))
    # Teacher-forced: prompt + reference for the prompts that have one, in their own permuted order.
    assert engine[3][1] == [[1, 2, 7], [1, 4, 8, 9]] and np.array_equal(
        engine[3][2], replay.submission_order(2, 3)
    )
    assert engine[5][1:] == ("LLM", WS, {"revision": "r"})
    assert engine[7][1] == ["2", "2", "2"] and engine[7][2].args[0].push == "push-fn"
    assert engine[7][3:] == ("LLM", None, None)  # offline: the LLM's own rollout and dtype

    assert out.sampled.texts == ["text 1"] and out.greedy.texts == ["text 2"]
    assert out.teacher_forced.rows == [0, 2] and out.teacher_forced.seqs == [
        [1, 2, 7],
        [1, 4, 8, 9],
    ]
    assert out.weight_sync == {"adapter": "fake"}
    assert out.grpo == {
        "adapter": "fake push",
        "seeds": [0, 1],
        "steps": 2,
        "eval_s": 0.5,
        "trainer": {"trainable": "all"},
    }
    assert sorted(out.arrays) == ["greedy_prefill_logprob", "grpo_reward", "ws_x"]
    assert list(timings.values) == [
        "sample_s",
        "greedy_s",
        "prefill_decode_s",
        "teacher_forced_s",
        "weight_sync_s",
        "grpo_s",
    ]
    assert said[0] == "submitting prompts in a permuted order (order_seed=3)"
    assert said[1:4] == [
        "sampling 3 prompts x 2 (T=0.7, top_p=1.0, top_k=0, seed=1)",
        "greedy pass",
        "prefill-decode pass: 1 greedy sequence(s) scored again by prefill",
    ]
    assert said[4] == "teacher-forced pass over 2 fixed sequences"
    assert said[5] == "mini GRPO: 2 seed(s) x 2 steps of 2 prompts x 2"


def test_grpo_without_a_push_path_records_why_and_keeps_the_rest(engine):
    said: list[str] = []
    ws = dataclasses.replace(WS, hook="none")
    out = run_passes(
        ENGINE_PASSES,
        _input(said, greedy_max_tokens=0, teacher_forced=False, weight_sync=ws, grpo=GRPO),
        Timings(),
    )
    assert out.grpo == {"adapter": None, "unsupported": "no push path", "seeds": [0, 1], "steps": 2}
    assert out.weight_sync == {"adapter": None, "unsupported": "no push path"}
    assert out.not_run == []
    assert {"grpo", "weight_sync"}.isdisjoint(c[0] for c in engine) and out.arrays == {}
    assert out.greedy is None and out.teacher_forced is None
    assert said[-2:] == [
        "weight-sync probe not run: no push path",
        "mini GRPO not run: no push path",
    ]


def test_a_failing_push_costs_only_the_rl_passes(engine):
    """The replay's results stay; weight-sync records the error, GRPO is recorded as not run."""
    said: list[str] = []
    ws = dataclasses.replace(WS, hook="raises")
    log = [
        "(Worker_TP0 pid=11) INFO ready",
        "(Worker_TP1 pid=12) ERROR 11-30 WorkerProc hit an exception.",
    ]
    inp = dataclasses.replace(_input(said, weight_sync=ws, grpo=GRPO), log_tail=lambda: log)
    timings = Timings()
    out = run_passes(ENGINE_PASSES, inp, timings)
    assert out.sampled is not None and out.greedy is not None and out.teacher_forced is not None
    error = out.weight_sync["error"]
    assert error["message"] == "RuntimeError: the hook broke" and error["hook"] == "raises"
    assert "the hook broke" in error["traceback_tail"] and error["failed_ranks"] == ["Worker_TP1"]
    assert error["log_tail"].endswith("WorkerProc hit an exception.")
    assert out.grpo == {"not_run": "the weight_sync pass failed before it"} and out.not_run == [
        "grpo"
    ]
    assert "grpo" not in [c[0] for c in engine] and "grpo_s" not in timings.values
    assert said[-1] == "weight_sync failed: RuntimeError: the hook broke"


def test_a_failing_replay_pass_still_ends_the_run(engine, monkeypatch):
    def broken(*args):
        raise ValueError("sampling broke")

    monkeypatch.setattr(replay, "sample", broken)
    with pytest.raises(ValueError, match="sampling broke"):
        run_passes(ENGINE_PASSES, _input([]), Timings())


def test_failed_ranks_are_read_from_vllm_worker_prefixes():
    lines = [
        "(Worker_TP0 pid=1) INFO loading",
        "(Worker_PP1_TP1 pid=2) ERROR boom",
        "(Worker_TP1 pid=3) Traceback (most recent call last):",
        "(EngineCore pid=4) ERROR not a worker",
    ]
    assert failed_ranks(lines) == ["Worker_PP1_TP1", "Worker_TP1"]


def test_a_phase_that_outlives_its_bound_ends_naming_itself(monkeypatch):
    monkeypatch.setenv(PHASE_TIMEOUT_ENV, "0.2")
    table = (EnginePass("sample", lambda inp: True, lambda inp, out: time.sleep(5)),)
    start = time.perf_counter()
    with pytest.raises(PhaseTimeout, match=r"the sample pass ran past its 0\.2s limit"):
        run_passes(table, _input([]), Timings())
    assert time.perf_counter() - start < 2


def test_the_table_imports_without_an_engine():
    # vllm, torch and transformers load inside the passes: the orchestrator's side imports the table.
    code = "import sys, gate.worker.main; print(sorted({'vllm', 'torch', 'transformers'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_an_engine_that_cannot_choose_batch_compositions_records_why(engine):
    """One table for both modes: the batch-invariance pass runs wherever it is asked for, and an
    engine that cannot be given batch compositions (a server) says why instead of the pass being
    left out of its table."""

    class Served(OfflineEngine):
        def batch_invariance_unavailable(self) -> str | None:
            return "server mode: no chosen batches"

    inp = dataclasses.replace(_input([], batch_invariance=True), engine=Served("LLM"))
    out = run_passes(ENGINE_PASSES, inp, Timings())
    assert out.batch_invariance == {"not_run": "server mode: no chosen batches"}
    assert out.teacher_forced is not None  # the passes before it ran as usual
