"""Each check against synthetic evidence whose right answer is known by construction."""

from __future__ import annotations

import copy
import re

import numpy as np
import pytest

from gate.checks.base import Limit, Threshold
from gate.checks.context import Context
from gate.config.checks_section import parse_settings
from gate.contract import keys
from gate.errors import ConfigError
from gate.judge import run_checks
from gate.verdict import Status, worst

from ..factory import RUN, make_evidence, with_engine, with_identity


def _settings(**raw):
    return parse_settings(raw, "gate.yaml")


def _results(ctx, **raw):
    return {r.id: r for r in run_checks(ctx, _settings(**raw))}


@pytest.fixture
def clean(tmp_path):
    old = make_evidence(tmp_path / "old", seed=1)
    new = make_evidence(tmp_path / "new", seed=2)
    return Context(new=new, old=old, run=copy.deepcopy(RUN))


def test_clean_pair_passes_every_check(clean):
    results = _results(clean)
    assert {k: r.status for k, r in results.items() if r.status != Status.PASS} == {}
    assert worst(r.status for r in results.values()) == Status.PASS


# --- thresholds ------------------------------------------------------------------------------


def test_limits_absolute_relative_and_floor():
    assert Limit.parse(0.5, "x") == Limit(0.5)
    rel = Limit.parse("6x noise", "x")
    assert rel.relative and rel.value == 6
    assert Limit(6, True, floor=1e-3).resolve(1e-2) == pytest.approx(6e-2)
    assert Limit(6, True, floor=1e-3).resolve(1e-6) == 1e-3  # never below the floor
    assert Limit(6, True, floor=1e-3).resolve(None) == 1e-3  # uncalibrated: the floor
    with pytest.raises(ConfigError, match="expected a number or 'N x noise'"):
        Limit.parse("lots", "x")


def test_threshold_directions():
    up = Threshold(Limit(1.0), Limit(2.0))
    assert [up.evaluate(v)[0] for v in (0.5, 1.5, 2.5)] == [Status.PASS, Status.WARN, Status.FAIL]
    down = Threshold(Limit(0.5), Limit(0.3), higher_is_worse=False)
    assert [down.evaluate(v)[0] for v in (0.9, 0.4, 0.1)] == [Status.PASS, Status.WARN, Status.FAIL]


def test_checks_config_is_validated_by_path():
    with pytest.raises(ConfigError, match=r"checks\.nope: unknown check"):
        _settings(nope={})
    with pytest.raises(
        ConfigError, match=r"checks.train-inference-mismatch.thresholds.kl: unknown metric"
    ):
        _settings(**{"train-inference-mismatch": {"thresholds": {"kl": {"fail": 1}}}})
    with pytest.raises(ConfigError, match=r"checks.precision.expect_lm_heads: unknown key"):
        _settings(precision={"expect_lm_heads": "fp32"})
    with pytest.raises(ConfigError, match=r"checks.precision.mode: 'maybe'"):
        _settings(precision={"mode": "maybe"})
    s = _settings(**{"train-inference-mismatch": {"thresholds": {"k3_kl": {"fail": "6x noise"}}}})
    k3 = s["train-inference-mismatch"].thresholds["k3_kl"]
    assert k3.fail.relative and k3.warn == Limit(1e-3)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"precision": 3}, "checks.precision: expected a mapping"),
        (
            {"precision": {"expect_lm_head": 3}},
            "checks.precision.expect_lm_head: expected str, got 3",
        ),
        ({"config-parity": {"policy": "warn"}}, "checks.config-parity.policy: expected a mapping"),
        (
            {"train-inference-mismatch": {"thresholds": {"k3_kl": 3}}},
            "thresholds.k3_kl: expected a mapping with warn/fail",
        ),
        (
            {"train-inference-mismatch": {"thresholds": {"k3_kl": {"fial": 1}}}},
            "thresholds.k3_kl.fial: unknown key (expected warn, fail, floor)",
        ),
        (
            {"train-inference-mismatch": {"thresholds": {"k3_kl": {"floor": "x"}}}},
            "thresholds.k3_kl.floor: expected a number, got 'x'",
        ),
        (
            {"train-inference-mismatch": {"thresholds": {"k3_kl": {"warn": True}}}},
            "thresholds.k3_kl.warn: expected a number or 'N x noise', got True",
        ),
        (
            {"train-inference-mismatch": {"thresholds": {"k3_kl": {"warn": "lots"}}}},
            "thresholds.k3_kl.warn: expected a number or 'N x noise', got 'lots'",
        ),
    ],
)
def test_bad_check_settings_name_the_key(raw, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_settings(raw, "gate.yaml")


def test_threshold_overrides_keep_what_they_do_not_set():
    s = _settings(
        **{
            "train-inference-mismatch": {
                "thresholds": {"k3_kl": {"warn": None, "fail": "6x noise", "floor": 1}}
            }
        }
    )
    k3 = s["train-inference-mismatch"].thresholds["k3_kl"]
    assert k3.warn is None  # null removes a bound
    assert k3.fail == Limit(6.0, relative=True, floor=1.0) and k3.source == "config"
    default = _settings()["train-inference-mismatch"].thresholds["k3_kl"]
    assert default.source != "config" and default.warn == Limit(1e-3)
    policy = _settings(**{"config-parity": {"policy": {"dtype": "warn"}}})["config-parity"]
    assert policy.options["policy"]["kv_cache_dtype"] == "fail"  # merged under the default policy


def test_mode_warn_caps_and_off_skips(tmp_path, clean):
    clean.new = make_evidence(tmp_path / "raw", seed=2, engine_equals="raw")
    results = _results(
        clean, **{"logprob-semantics": {"mode": "warn"}, "precision": {"mode": "off"}}
    )
    assert results["logprob-semantics"].status == Status.WARN
    assert results["precision"].status == Status.SKIP


# --- logprob-semantics -----------------------------------------------------------------------


def test_raw_logprobs_fail_and_name_logprobs_mode(tmp_path, clean):
    clean.new = make_evidence(tmp_path / "raw", seed=2, engine_equals="raw")
    r = _results(clean)["logprob-semantics"]
    assert r.status == Status.FAIL
    assert r.details["semantics"] == {"old": "processed", "new": "raw"}
    assert "logprobs_mode='processed_logprobs'" in r.diagnosis


def test_semantics_neither_when_far_from_both(tmp_path, clean):
    clean.new = make_evidence(tmp_path / "off", seed=2, engine_offset=0.5)
    r = _results(clean)["logprob-semantics"]
    assert r.details["semantics"]["new"] == "neither" and r.status == Status.FAIL


def test_semantics_fixed_by_upgrade_warns(tmp_path, clean):
    clean.old = make_evidence(tmp_path / "oldraw", seed=1, engine_equals="raw")
    assert _results(clean)["logprob-semantics"].status == Status.WARN


def test_semantics_skip_when_transform_is_identity(clean):
    clean.run["sampling"] = {**clean.run["sampling"], "temperature": 1.0}
    assert _results(clean)["logprob-semantics"].status == Status.SKIP


# --- train-inference-mismatch ----------------------------------------------------------------


def test_mismatch_values_and_thresholds(tmp_path, clean):
    r = _results(clean)["train-inference-mismatch"]
    k3 = {m.engine: m.value for m in r.measurements if m.name == "k3_kl"}
    assert k3 == {"old": 0.0, "new": 0.0}
    # a constant offset c gives k3 = exp(-c) + c - 1 for every token
    clean.new = make_evidence(tmp_path / "off", seed=2, engine_offset=0.05)
    r = _results(clean)["train-inference-mismatch"]
    k3_new = next(m for m in r.measurements if m.name == "k3_kl" and m.engine == "new")
    assert k3_new.value == pytest.approx(np.exp(-0.05) + 0.05 - 1, rel=1e-3)
    assert k3_new.status == Status.WARN  # 1.2e-3: above NeMo-RL's 1e-3, below 1e-2
    tmpe = next(
        m for m in r.measurements if m.name == "token_mult_prob_error" and m.engine == "new"
    )
    assert (
        tmpe.value == pytest.approx(np.exp(0.05), rel=1e-5) and tmpe.status == Status.WARN
    )  # 1.0513 > 1.05


def test_mismatch_names_each_statistic_as_the_stacks_dashboards_do(tmp_path, clean):
    clean.new = make_evidence(tmp_path / "off", seed=2, engine_offset=0.05)
    r = _results(clean)["train-inference-mismatch"]
    notes = {(m.name, m.engine): m.note for m in r.measurements}
    assert (
        notes[("k3_kl", "new")]
        == "as PipelineRL kl_new_old, prime-rl mismatch_kl, verl rollout_corr/k3_kl"
    )
    assert (
        notes[("k3_kl", "old")]
        == "old engine: for comparison; as PipelineRL kl_new_old, prime-rl mismatch_kl, verl rollout_corr/k3_kl"
    )
    assert "NeMo-RL train/token_mult_prob_error" in notes[("token_mult_prob_error", "new")]
    prob = next(m for m in r.measurements if m.name == "prob_abs_diff_mean" and m.engine == "new")
    assert "verl training/rollout_probs_diff_mean" in prob.note and prob.value > 0


def test_regression_needs_more_than_noise(tmp_path, clean):
    clean.old = make_evidence(tmp_path / "o", seed=1, engine_noise=0.01)
    clean.new = make_evidence(tmp_path / "n", seed=2, engine_noise=0.01)
    reg = next(
        m
        for m in _results(clean)["train-inference-mismatch"].measurements
        if m.name == "regression_mean_abs_diff"
    )
    assert (
        reg.status == Status.PASS
    )  # same noise on both sides: the CI's lower bound stays below the floor
    clean.new = make_evidence(tmp_path / "n2", seed=2, engine_noise=0.05)
    reg = next(
        m
        for m in _results(clean)["train-inference-mismatch"].measurements
        if m.name == "regression_mean_abs_diff"
    )
    assert (
        reg.status == Status.FAIL and reg.value > 0.01
    )  # mean |N(0, .05)| - mean |N(0, .01)| ~ 0.032


# --- forward-drift ---------------------------------------------------------------------------


def test_forward_drift_fails_on_a_shift(tmp_path, clean):
    assert _results(clean)["forward-drift"].status == Status.PASS
    clean.new = make_evidence(tmp_path / "s", seed=2, tf_offset=0.01)
    r = _results(clean)["forward-drift"]
    assert r.status == Status.FAIL
    assert r.details["old"]["mean_abs_drift"] == pytest.approx(0.01, rel=1e-3)


def test_forward_drift_skips_sequences_with_other_tokens(tmp_path, clean):
    prompts = [[1, 10 + p % 7, 20 + p % 5] for p in range(20)]
    prompts[3] = [1, 99, 98]
    clean.new = make_evidence(tmp_path / "t", seed=2, prompt_tokens=prompts)
    r = _results(clean)
    assert r["forward-drift"].details["old"]["skipped_sequences"] == 1
    assert r["tokenization"].status == Status.FAIL
    assert r["tokenization"].details["old"]["differing"] == ["p3"]


# --- greedy-and-length -----------------------------------------------------------------------


def test_greedy_divergence_and_length(tmp_path, clean):
    tokens = np.tile(np.arange(4, dtype=np.int32), 20)
    tokens[4 * 5 + 2] = 77  # prompt 5 diverges at position 2
    clean.new = make_evidence(tmp_path / "g", seed=2, greedy_tokens=tokens)
    r = _results(clean)["greedy-and-length"]
    match = next(m for m in r.measurements if m.name == "greedy_exact_match_rate")
    assert (
        match.value == pytest.approx(19 / 20) and match.status == Status.PASS
    )  # 0.95 is the warn bound
    assert r.details["old"]["greedy"]["diverging_prompts"] == [5]
    clean.new = make_evidence(tmp_path / "l", seed=2, length=9)
    dev = next(
        m
        for m in _results(clean)["greedy-and-length"].measurements
        if m.name == "length_ratio_deviation"
    )
    assert dev.value == pytest.approx(1 / 8) and dev.status == Status.FAIL


# --- config-parity ---------------------------------------------------------------------------


def test_config_parity_reads_skip_special_tokens_among_the_defaults(tmp_path, clean):
    # vLLM 0.33 takes skip_special_tokens from the model's generation_config.json: the text a
    # reward reads then keeps <|im_end|> and the like
    dsp = {"temperature": 1.0, "skip_special_tokens": True}
    clean.old = with_engine(make_evidence(tmp_path / "o", seed=1), default_sampling_params=dsp)
    clean.new = with_engine(
        make_evidence(tmp_path / "n", seed=2),
        default_sampling_params={**dsp, "skip_special_tokens": False},
    )
    r = _results(clean)["config-parity"]
    row = next(m for m in r.measurements if m.name == "default_sampling_params.skip_special_tokens")
    assert (row.status, r.status) == (Status.WARN, Status.WARN)
    assert "generation_config='vllm'" in r.diagnosis
    # a baseline from a gate that did not read it: not compared (SamplingParams' default is True)
    with_engine(clean.old, default_sampling_params={"temperature": 1.0})
    names = {m.name for m in _results(clean)["config-parity"].measurements}
    assert "default_sampling_params.skip_special_tokens" not in names


def test_config_parity_warns_when_the_rollouts_move_to_another_model_runner(tmp_path, clean):
    # vLLM 0.33 on a GPU chose V1 for this engine; 0.34 has only Model Runner V2
    clean.new = make_evidence(tmp_path / "v2", seed=2, effective={"model_runner": "V2"})
    r = _results(clean)["config-parity"]
    row = next(m for m in r.measurements if m.name == "model_runner")
    assert (r.status, row.status) == (Status.WARN, Status.WARN)
    assert row.note == "'V1' -> 'V2' (policy: warn)"
    assert "moved off Model Runner V1" in r.diagnosis
    assert "VLLM_USE_V2_MODEL_RUNNER" in r.diagnosis
    assert r.details["model_runner"] == {"old": "V1", "new": "V2"}
    clean.acknowledge = frozenset({"model_runner"})
    assert _results(clean)["config-parity"].status == Status.PASS
    # a baseline recorded by a gate before the runner was: nothing to compare, named as such
    no_runner = make_evidence(tmp_path / "old-gate", seed=1)
    effective = {k: v for k, v in no_runner.engine.effective.items() if k != "model_runner"}
    clean.old = with_engine(no_runner, effective=effective)
    r = _results(clean)["config-parity"]
    assert r.status == Status.PASS
    assert r.details["model_runner"]["old"].startswith("not recorded")
    clean.old = make_evidence(tmp_path / "old", seed=1)
    # a 0.32/0.33 server with Triton decides at start: not readable, so not comparable (WARN)
    clean.acknowledge = frozenset()
    clean.new = make_evidence(tmp_path / "srv", seed=2, effective={"model_runner": None})
    r = _results(clean)["config-parity"]
    assert r.status == Status.WARN
    assert r.details["model_runner"]["new"] == "decided by vLLM at start (not readable here)"


def test_config_parity_policy_and_acknowledge(tmp_path, clean):
    clean.new = make_evidence(
        tmp_path / "c",
        seed=2,
        effective={
            "enable_prefix_caching": True,
            "async_scheduling": True,
            "compilation_mode": "NONE",
        },
    )
    r = _results(clean)["config-parity"]
    status = {m.name: m.status for m in r.measurements}
    assert status == {
        "async_scheduling": Status.FAIL,
        "compilation_mode": Status.PASS,
        "enable_prefix_caching": Status.FAIL,
        "model_runner": Status.PASS,  # named for both engines, also when it did not change
    }
    runner = next(m for m in r.measurements if m.name == "model_runner")
    assert runner.note == "old V1, new V1"
    assert r.details["model_runner"] == {"old": "V1", "new": "V1"}
    assert "enable_prefix_caching=False" in r.diagnosis
    clean.acknowledge = frozenset({"enable_prefix_caching", "async_scheduling"})
    assert _results(clean)["config-parity"].status == Status.PASS
    r = _results(clean, **{"config-parity": {"policy": {"compilation_mode": "fail"}}})[
        "config-parity"
    ]
    assert r.status == Status.FAIL


def test_generation_defaults_are_compared(tmp_path, clean):
    folder = tmp_path / "gen"
    make_evidence(folder, seed=2)
    import json

    meta = json.loads((folder / "engine.json").read_text())
    meta["default_sampling_params"]["repetition_penalty"] = 1.1
    (folder / "engine.json").write_text(json.dumps(meta))
    from gate.contract import evidence as ev

    clean.new = ev.load(folder)
    r = _results(clean)["config-parity"]
    assert r.status == Status.FAIL and "default_sampling_params.repetition_penalty" in r.diagnosis


# --- precision -------------------------------------------------------------------------------


def test_precision_detects_bf16_head(tmp_path, clean):
    clean.new = make_evidence(
        tmp_path / "b", seed=2, tf_offset=0.02
    )  # engine == the bf16-head reference
    assert _results(clean)["precision"].details["behaves_like"]["new"] == "bf16"
    assert _results(clean, precision={"expect_lm_head": "fp32"})["precision"].status == Status.FAIL
    assert _results(clean, precision={"expect_lm_head": "bf16"})["precision"].status != Status.FAIL


def _greedy_topk(logits: np.ndarray, k: int = 5) -> np.ndarray:
    """What vLLM reports on a greedy pass: log_softmax in fp32 of the logits, the k largest."""
    lp = (
        logits
        - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True))
        - logits.max(1, keepdims=True)
    )
    return np.sort(lp.astype(np.float32), axis=1)[:, ::-1][:, :k]


def _bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 (nearest even) and back, as a bf16 lm_head's output."""
    bits = x.astype(np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def test_logit_grid_tells_bf16_logits_from_fp32_ones():
    from gate.checks.precision import logit_grid

    rng = np.random.default_rng(0)
    logits = (
        rng.normal(0, 4, (600, 64)).astype(np.float32) + 8
    )  # magnitudes like an LM's top logits
    bf16 = logit_grid(_greedy_topk(_bf16(logits)))
    fp32 = logit_grid(_greedy_topk(logits))
    assert bf16.verdict == "bf16" and bf16.on_grid > 0.95, bf16
    assert fp32.verdict == "fp32" and fp32.on_grid < 0.02, fp32
    assert (
        logit_grid(_greedy_topk(_bf16(logits))[:20]).verdict == "inconclusive"
    )  # too few gaps to say
    assert logit_grid(None).verdict == "inconclusive"


def test_precision_falls_back_to_the_logit_grid_when_the_emulation_cannot_decide(tmp_path, clean):
    # Behind a bf16 trunk the engine is far from both emulated heads: only the grid can tell.
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 4, (400, 64)).astype(np.float32) + 8
    tf = clean.new.arrays["tf_engine_logprob"]
    clean.new.arrays["tf_engine_logprob"] = tf + rng.normal(0, 0.5, tf.shape).astype(np.float32)
    clean.new.arrays["greedy_topk_logprobs"] = _greedy_topk(_bf16(logits))
    r = _results(clean, precision={"expect_lm_head": "fp32"})["precision"]
    assert r.details["logit_grid"]["new"]["emulation"] == "inconclusive"
    assert r.details["behaves_like"]["new"] == "bf16" and r.status == Status.FAIL
    assert "of top-k gaps on the bf16 grid" in r.summary
    clean.new.arrays["greedy_topk_logprobs"] = _greedy_topk(logits)
    r = _results(clean, precision={"expect_lm_head": "fp32"})["precision"]
    assert r.details["behaves_like"]["new"] == "fp32" and r.status == Status.PASS


def test_a_crashing_check_is_an_error_not_a_crash(clean):
    del clean.new.arrays["tf_trainer_logprob_raw"]
    r = _results(clean)
    assert r["precision"].status == Status.ERROR and "KeyError" in r["precision"].summary
    assert r["config-parity"].status == Status.PASS


def test_checks_of_a_pass_that_did_not_run_skip_with_the_switch_that_turned_it_off(clean):
    for e in (clean.old, clean.new):
        for name in [k for k in e.arrays if k.startswith("tf_")]:
            del e.arrays[name]
    r = _results(clean)
    for check in ("forward-drift", "precision"):
        assert r[check].status == Status.SKIP, r[check]
        assert r[check].summary == ("not judged: the old and new engine's evidence has no tf_engine_logprob "
                                    "(teacher_forced.enabled: false)")  # fmt: skip


# --- weight-sync -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "verdict", "fix"),
    [("stale", "stale-weights", "never reached the engine"), ("partial", "partial-update", "only part of the state dict"),
     ("stale-cache", "stale-cache", "reset_prefix_cache"),
     ("second-update", "second-update", "SkyRL #1680")],
)  # fmt: skip
def test_weight_sync_diagnoses(tmp_path, clean, mode, verdict, fix):
    assert _results(clean)["weight-sync"].status == Status.PASS
    caching = {"enable_prefix_caching": mode == "stale-cache"}
    clean.new = make_evidence(tmp_path / mode, seed=2, weight_sync=mode, effective=caching)
    r = _results(clean)["weight-sync"]
    assert r.status == Status.FAIL and r.details["verdict"] == verdict
    assert fix in r.diagnosis


def test_prefix_prompts_off_with_caching_off_are_a_partial_update_not_a_stale_cache(
    tmp_path, clean
):
    """No cache entry outlives a request with prefix caching off: the longer prompts show a
    partial update sooner (measured: the norms left behind at perturbation 0.05 put the prefix
    prompts 2.2e-3 off, the control ones 1.8e-4, limit 1e-3)."""
    clean.new = make_evidence(tmp_path / "off", seed=2, weight_sync="stale-cache")
    r = _results(clean)["weight-sync"]
    assert r.status == Status.FAIL and r.details["verdict"] == "partial-update"


def _digests(not_moved=(), mismatch=(), second=(), unchanged=None, readable=7):
    names = lambda keys: {"count": len(keys), "names": sorted(keys)}  # noqa: E731
    return {"source": "vLLM compute_weight_checksums", "tensors": 15, "readable": readable, "ranks": 1,
            "comparable": readable, "unreadable": names(["tp0:model.layers.0.mlp.down_proj.weight"]),
            "not_moved": names(list(not_moved)), "round_trip_mismatch": names(list(mismatch)),
            "unchanged": names(list(not_moved if unchanged is None else unchanged)),
            "second_push_changed": names(list(second))}  # fmt: skip


def test_weight_sync_names_the_tensors_a_push_left_behind_when_the_outputs_pass(clean):
    norms = [f"tp0:model.layers.{i}.input_layernorm.weight" for i in range(2)]
    clean.new.engine.weight_sync["digests"] = _digests(not_moved=norms, mismatch=norms)
    r = _results(clean)["weight-sync"]
    assert r.status == Status.FAIL and r.details["verdict"] == "bytes-not-moved"
    assert r.summary.startswith("tensors the push did not move")
    assert (
        "2 tensor(s) still hold the bytes they had before the push (tp0:model.layers.0.input_layernorm.weight"
        in r.diagnosis
    )
    assert "vLLM #57022" in r.diagnosis and "1 tensor(s) could not be read" in r.diagnosis
    by_name = {m.name: m for m in r.measurements}
    assert (
        by_name["tensors_not_moved"].value == 2
        and by_name["tensors_not_moved"].status == Status.FAIL
    )
    assert by_name["tensors_second_push_changed"].status == Status.PASS


def test_weight_sync_bytes_changed_by_a_second_push_are_a_second_update(clean):
    clean.new.engine.weight_sync["digests"] = _digests(second=["tp0:model.embed_tokens.weight"])
    r = _results(clean)["weight-sync"]
    assert r.status == Status.FAIL and r.details["verdict"] == "second-update"
    assert (
        "changed when the same weights were pushed again (tp0:model.embed_tokens.weight)"
        in r.diagnosis
    )


def test_a_stale_cache_the_bytes_contradict_is_tensors_left_behind_and_a_partial_update_stays(
    tmp_path, clean
):
    norms = ["tp0:model.norm.weight"]
    clean.new = make_evidence(
        tmp_path / "cache",
        seed=2,
        weight_sync="stale-cache",
        effective={"enable_prefix_caching": True},
    )
    clean.new.engine.weight_sync["digests"] = _digests(not_moved=norms, mismatch=norms)
    assert _results(clean)["weight-sync"].details["verdict"] == "bytes-not-moved"
    clean.new = make_evidence(tmp_path / "partial", seed=2, weight_sync="partial")
    clean.new.engine.weight_sync["digests"] = _digests(not_moved=norms, mismatch=norms)
    r = _results(clean)["weight-sync"]
    assert r.details["verdict"] == "partial-update" and "(tp0:model.norm.weight)" in r.diagnosis


def test_stale_weights_keep_their_verdict_and_gain_the_frozen_bytes(tmp_path, clean):
    clean.new = make_evidence(tmp_path / "stale", seed=2, weight_sync="stale")
    every = [f"tp0:t{i}" for i in range(7)]
    clean.new.engine.weight_sync["digests"] = _digests(not_moved=every, mismatch=every)
    r = _results(clean)["weight-sync"]
    assert r.details["verdict"] == "stale-weights"
    assert "all 7 readable tensors hold the bytes they had before the push" in r.diagnosis


def test_outputs_near_the_old_weights_with_some_bytes_moved_are_a_partial_update(tmp_path, clean):
    """Row 5b on SmolLM2: one decoder layer of 30 pushed leaves the outputs within the limit of the
    old weights, but the bytes show part of the push landed: not "never reached the engine"."""
    clean.new = make_evidence(tmp_path / "stale", seed=2, weight_sync="stale")
    left = [f"tp0:t{i}" for i in range(5)]  # 2 of 7 readable tensors moved
    clean.new.engine.weight_sync["digests"] = _digests(not_moved=left, mismatch=left)
    r = _results(clean)["weight-sync"]
    assert r.details["verdict"] == "partial-update" and "only part of the state dict" in r.diagnosis
    assert "never reached the engine" not in r.diagnosis


TIED = ["lm_head.weight", "model.embed_tokens.weight"]


def test_a_tied_tensor_the_push_left_stale_is_named_as_the_tie(tmp_path, clean):
    clean.new = make_evidence(tmp_path / "tied", seed=2, weight_sync="partial")
    clean.new.engine.weight_sync["tied_names"] = [TIED]
    embedding = ["model.embed_tokens.weight"]
    clean.new.engine.weight_sync["digests"] = _digests(not_moved=embedding, mismatch=embedding)
    r = _results(clean)["weight-sync"]
    assert r.details["verdict"] == "partial-update" and r.details["tied_tensor_missed"] == TIED
    assert ("lm_head.weight and model.embed_tokens.weight are one tensor in the trainer's model "
            "(tie_word_embeddings)") in r.diagnosis  # fmt: skip
    assert (
        "untied view" in r.diagnosis
        and "Push the trainer's one tensor under both names" in r.diagnosis
    )
    # The same finding on a rank-prefixed name (several ranks) names the same tensor.
    clean.new.engine.weight_sync["digests"] = _digests(mismatch=["tp0:model.embed_tokens.weight"])
    assert _results(clean)["weight-sync"].details["tied_tensor_missed"] == TIED


@pytest.mark.parametrize(
    ("tied_names", "missed", "unchanged"),
    [([TIED], ["model.norm.weight"], None),  # the tied tensor moved: the tie is not the story
     ([TIED], ["model.embed_tokens.weight"], [f"t{i}" for i in range(7)]),  # nothing moved: stale says it
     ([], ["model.embed_tokens.weight"], None),  # an untied model
     ("lm_head.weight", ["model.embed_tokens.weight"], None),  # a malformed engine.json: no names
     ([[TIED[0], 7]], ["lm_head.weight"], None)],
    ids=["other-tensor", "frozen-policy", "untied", "not-a-list", "not-names"],
)  # fmt: skip
def test_the_tie_is_named_only_where_a_tied_tensor_alone_was_missed(
    tmp_path, clean, tied_names, missed, unchanged
):
    clean.new = make_evidence(tmp_path / "tied", seed=2, weight_sync="partial")
    clean.new.engine.weight_sync["tied_names"] = tied_names
    clean.new.engine.weight_sync["digests"] = _digests(
        not_moved=missed, mismatch=missed, unchanged=unchanged
    )
    r = _results(clean)["weight-sync"]
    assert r.status == Status.FAIL and "tied_tensor_missed" not in r.details
    assert "tie_word_embeddings" not in r.diagnosis


def test_a_tied_model_whose_compared_bytes_are_right_and_outputs_wrong_points_at_the_heads_copy(
    tmp_path, clean
):
    """Row 25b's shape: every compared tensor the trainer's new one, the outputs a partial update."""
    clean.new = make_evidence(tmp_path / "tied", seed=2, weight_sync="partial")
    clean.new.engine.weight_sync["digests"] = _digests(unchanged=[])
    r = _results(clean)["weight-sync"]
    assert (
        "tie_word_embeddings" not in r.diagnosis and "repacked" not in r.diagnosis
    )  # untied: no such copy
    clean.new.engine.weight_sync["tied_names"] = [TIED]
    r = _results(clean)["weight-sync"]
    assert r.details["verdict"] == "partial-update" and "tied_tensor_missed" not in r.details
    assert "The digests compared 7 tensors and found each the trainer's new one" in r.diagnosis
    assert "repacked (oneDNN) copy of the embedding" in r.diagnosis
    assert (
        "under model.embed_tokens.weight alone moves the embedding and leaves the head behind"
        in r.diagnosis
    )
    with_identity(clean.new, device_kind="cuda")  # a GPU head reads the parameter: no such copy
    assert "repacked" not in _results(clean)["weight-sync"].diagnosis


def test_weight_sync_passes_with_clean_bytes_and_says_what_it_compared(clean):
    clean.new.engine.weight_sync["digests"] = _digests(unchanged=[])
    r = _results(clean)["weight-sync"]
    assert r.status == Status.PASS
    assert (
        "bytes: 7 of 15 tensors compared with the trainer's, 0 of 7 readable unchanged" in r.summary
    )
    clean.new.engine.weight_sync["digests"] = {
        "source": None,
        "reason": "the server offers no /weight_checker",
    }
    r = _results(clean)["weight-sync"]
    assert r.status == Status.PASS and r.summary.endswith("; weight digests not read")
    assert not [m for m in r.measurements if m.name.startswith("tensors_")]


def test_a_second_push_is_judged_against_the_new_weights_and_older_evidence_without_it(
    tmp_path, clean
):
    r = _results(clean)["weight-sync"]
    second = next(m for m in r.measurements if m.name == "second_push_vs_new")
    assert second.value == pytest.approx(0.0) and second.fail == r.details["limit"]
    assert "pushed again" in r.summary
    clean.new = make_evidence(tmp_path / "older", seed=2, weight_sync="no-second")
    r = _results(clean)["weight-sync"]
    assert r.status == Status.PASS and all(m.name != "second_push_vs_new" for m in r.measurements)


def _sleep_cycle(evidence, off: float) -> None:
    a = evidence.arrays
    a["ws_wake_is_prefix"] = a["ws_is_prefix"]
    a["ws_wake_trainer_new_logprob"] = a["ws_trainer_new_logprob"]
    a["ws_wake_engine_logprob"] = (a["ws_trainer_new_logprob"] + off).astype(np.float32)
    evidence.engine.weight_sync["sleep"] = {"level": 2, "sleep_s": 0.1, "wake_and_push_s": 0.2}


def test_weights_lost_across_sleep_and_wake_are_their_own_verdict(clean):
    _sleep_cycle(clean.new, 0.0)
    r = _results(clean)["weight-sync"]
    assert r.status == Status.PASS and "after sleep and wake: 0.00e+00 vs new" in r.summary
    _sleep_cycle(clean.new, 0.5)  # every control token 0.5 nats off after the cycle
    clean.new.engine.weight_sync["digests"] = _digests(unchanged=[])
    r = _results(clean)["weight-sync"]
    assert r.status == Status.FAIL and r.details["verdict"] == "sleep-wake"
    assert r.diagnosis.startswith(
        "After sleep level 2, wake and the push the engine serves other weights"
    )
    assert "TRL #5312" in r.diagnosis
    assert {m.name: m.value for m in r.measurements}["after_wake_vs_new"] == pytest.approx(0.5)
    # with the wake reading in the digests and no tensor changed, the loss is named as outside them
    clean.new.engine.weight_sync["digests"]["wake_changed"] = {"count": 0, "names": []}
    r = _results(clean)["weight-sync"]
    assert "what was lost lies outside the parameters the checker reads" in r.diagnosis


def test_bytes_changed_across_sleep_and_wake_are_named(clean):
    _sleep_cycle(clean.new, 0.0)
    digests = _digests(unchanged=[])
    digests["wake_changed"] = {"count": 1, "names": ["model.norm.weight"]}
    clean.new.engine.weight_sync["digests"] = digests
    r = _results(clean)["weight-sync"]
    assert r.status == Status.FAIL and r.details["verdict"] == "sleep-wake"
    assert (
        "1 tensor(s) are not what the first push left after sleep, wake and the same push (model.norm.weight)"
        in r.diagnosis
    )


def test_a_sleep_cycle_not_run_says_why(clean):
    clean.new.engine.weight_sync["sleep"] = {
        "level": 2,
        "not_run": "server mode: gate drives the sleep/wake cycle offline only",
    }
    r = _results(clean)["weight-sync"]
    assert r.status == Status.PASS and r.summary.endswith(
        "; sleep/wake not run (server mode: gate drives the sleep/wake cycle offline only)"
    )


def test_weight_sync_skips_without_probe(tmp_path, clean):
    clean.new = make_evidence(tmp_path / "none", seed=2, weight_sync=None)
    assert _results(clean)["weight-sync"].status == Status.SKIP


# --- grpo-trajectory -------------------------------------------------------------------------


def test_grpo_clean_pair_is_judged_against_the_old_engines_seeds(clean):
    r = _results(clean)["grpo-trajectory"]
    assert r.status == Status.PASS, r.summary
    assert r.details["compared_with"] == "old" and r.details["null_seeds"] == 16
    stats = r.details["statistics"]
    assert set(stats) == {"eval_reward", "k3_growth", "identical_groups", "entropy_drift"}
    # four statistics share the 1% family rate
    assert all(s["alpha"] == pytest.approx(0.01 / 4) for s in stats.values())
    # bitwise-agreeing engine and trainer (k3 1e-13): every seed's slope is 0 under the floor
    assert stats["k3_growth"]["effect"] == 0 and stats["k3_growth"]["p_value"] == 1
    assert "detects" in r.summary and stats["eval_reward"]["delta90"] > 0


def test_grpo_eval_reward_paired_by_seed_hand_computed(tmp_path, clean):
    """D_s = new_s - null_s over the new engine's seeds; se = sqrt(2) * SD(null) / sqrt(n)."""
    from gate.analysis.paired import t_sf

    null = clean.old[keys.GRPO_EVAL_SUCCESS].mean(axis=1)
    new = clean.new[keys.GRPO_EVAL_SUCCESS].mean(axis=1)
    r = _results(clean)["grpo-trajectory"]
    stat = r.details["statistics"]["eval_reward"]
    effect = float(np.mean(new - null))
    se = np.sqrt(2) * null.std(ddof=1) / np.sqrt(len(new))
    assert stat["effect"] == pytest.approx(effect)
    assert stat["se"] == pytest.approx(se)
    assert stat["p_value"] == pytest.approx(1 - t_sf(effect / se, len(null) - 1))


@pytest.mark.parametrize(
    ("mode", "statistic"),
    [("learn_less", "eval_reward"), ("drift", "k3_growth"), ("identical", "identical_groups")],
)
def test_grpo_faults_fail_their_statistic_and_only_it(tmp_path, clean, mode, statistic):
    clean.new = make_evidence(tmp_path / mode, seed=2, grpo=mode)
    r = _results(clean)["grpo-trajectory"]
    failed = {k for k, s in r.details["statistics"].items() if s["status"] != "PASS"}
    assert r.status == Status.FAIL and failed == {statistic}, r.summary
    assert statistic in r.summary and r.diagnosis


def test_grpo_a_significant_loss_under_the_practical_size_passes(tmp_path, clean):
    clean.new = make_evidence(tmp_path / "less", seed=2, grpo="learn_less")
    clean.run["grpo"] = {"alpha": 0.01, "min_effect": 0.2}
    r = _results(clean)["grpo-trajectory"]
    stat = r.details["statistics"]["eval_reward"]
    assert stat["significant"] and stat["effect"] > -0.2 and stat["status"] == "PASS"


def test_grpo_too_few_null_seeds_skips_with_no_power(tmp_path, clean):
    for key in [k for k in clean.old.arrays if k.startswith("grpo_")]:
        clean.old.arrays[key] = (
            np.atleast_2d(clean.old.arrays[key])[:15]
            if clean.old.arrays[key].ndim == 2
            else clean.old.arrays[key]
        )
    r = _results(clean)["grpo-trajectory"]
    assert r.status == Status.SKIP and r.summary.startswith(
        "no power: the old holds 15 GRPO seed(s)"
    )


def test_grpo_a_run_without_an_eval_set_skips(clean):
    for key in (keys.GRPO_EVAL_SUCCESS, keys.GRPO_EVAL0_SUCCESS, keys.GRPO_EVAL_PROMPT_INDEX):
        del clean.new.arrays[key]
    r = _results(clean)["grpo-trajectory"]
    assert r.status == Status.SKIP and "no eval set" in r.summary
    assert r.details["metrics"]["reward"]["new"]  # the charts stay


def test_grpo_eval_split_into_before_and_during_the_run(tmp_path, clean):
    r = _results(clean)["grpo-trajectory"]
    split = r.details["eval"]
    assert split["immediate"] == pytest.approx(0.0)  # one checkpoint eval in both (factory)
    assert split["learned"] == pytest.approx(r.details["statistics"]["eval_reward"]["effect"])
    # p(1-p)/(m-1) per prompt over E prompts, both engines: m = the run's eval_samples
    clean.run["grpo"] = {"eval_samples": 16}
    p0 = clean.new[keys.GRPO_EVAL0_SUCCESS]
    se = np.sqrt(2 * np.sum(p0 * (1 - p0) / 15) / len(p0) ** 2)
    assert _results(clean)["grpo-trajectory"].details["eval"]["immediate_se"] == pytest.approx(se)


def test_a_grpo_run_without_a_weight_push_is_an_error_with_the_reason(clean):
    # The worker found no push for this engine: GRPO asked for but not run is not a SKIP.
    for key in [k for k in clean.new.arrays if k.startswith("grpo_")]:
        del clean.new.arrays[key]
    with_engine(
        clean.new,
        grpo={"adapter": None, "unsupported": "no reload_weights and no model runner load_weights"},
    )
    r = _results(clean)["grpo-trajectory"]
    assert (
        r.status == Status.ERROR
        and r.diagnosis == "No reload_weights and no model runner load_weights."
    )
    with_engine(clean.new, grpo={})
    assert _results(clean)["grpo-trajectory"].status == Status.SKIP


def test_a_yaml_number_without_a_dot_is_a_number():
    """PyYAML reads `1e-3` as the string "1e-3" (YAML 1.1); as a threshold it is the number."""
    import yaml

    raw = yaml.safe_load("warn: 1e-3")["warn"]
    assert raw == "1e-3"
    assert Limit.parse(raw, "x") == Limit(1e-3)
    assert Limit.parse(" -2E+1 ", "x") == Limit(-20.0)
    with pytest.raises(ConfigError):
        Limit.parse("1e", "x")
