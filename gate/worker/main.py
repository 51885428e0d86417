"""Worker entry: requests in, evidence out. Runs inside an engine environment.

``python -m gate.worker REQ [REQ ...]`` starts the engine once, replays every request in order,
shuts the engine down, loads the trainer-side reference once and writes each request's own
output_dir. Requests of one call must share the engine construction (:func:`validate_batch`): an
engine start costs tens of seconds, one replay of a small prompt set a few.

Imports only vllm, torch, transformers, numpy and the standard library (plus gate's own
stdlib/numpy-only seam modules). Progress goes to stderr as ``[gate-worker] ...`` lines.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib
import json
import os
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gate.contract import evidence as ev
from gate.contract import keys
from gate.contract.engine_record import EngineRecord
from gate.contract.request import (
    ENGINE_FILE,
    EVIDENCE_FILE,
    PROGRESS_PREFIX,
    TEXTS_FILE,
    WorkerRequest,
)
from gate.files import atomic_write_bytes
from gate.worker import hub, layout, replay, vllm_cache
from gate.worker.engine_failure import ENGINE_ERROR_LINE, EngineFailed, error_line
from gate.worker.engine_handle import OfflineEngine
from gate.worker.log_tail import OutputTail
from gate.worker.memory import PeakMemory, cuda_device_used
from gate.worker.passes import (
    ENGINE_PASSES,
    PassInput,
    PassResults,
    Say,
    TeacherForced,
    Timings,
    Tokenized,
    batch_invariant_mode,
    no_log_tail,
    run_passes,
)
from gate.worker.replay import Completions

if TYPE_CHECKING:
    from gate.worker.layout import GateSetting
    from gate.worker.reference import ReferenceModel, ScoredTokens
    from gate.worker.server import Server
    from gate.worker.server_engine import ServedEngine


def progress(message: str) -> None:
    print(f"{PROGRESS_PREFIX}{message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class EngineOutputs:
    """What the engine produced for one request, before it is shut down and the reference takes over."""

    sampled: Completions
    greedy: Completions | None
    teacher_forced: TeacherForced | None
    meta: dict[str, Any]  # engine.json, less what is known only after the engine (timings, counts)
    rl_arrays: dict[str, np.ndarray]  # ws_* and grpo_* evidence arrays


@dataclass(frozen=True)
class EngineRun:
    """Every request's engine outputs and own timings, and the memory in use before shutdown."""

    outputs: list[EngineOutputs]
    timings: list[Timings]
    memory_running: dict[str, Any]
    # LoRA mode: (version 1's tensors, scaling): the reference scores with them merged.
    adapter: tuple[dict[str, Any], float] | None = None


# One engine process serves one engine construction: these request fields must agree.
SHARED_ENGINE_FIELDS = (
    "model",
    "tokenizer",
    "engine_args",
    "optional_engine_args",
    "mode",
    "server",
    "lora",  # the adapter every request's replay runs through is made once per engine
)


def validate_batch(requests: Sequence[WorkerRequest]) -> None:
    """Refuse a batch one engine process cannot serve faithfully; raises ValueError saying why.

    Every request must build the same engine (a request with other engine arguments would silently
    run on the wrong engine), write to its own folder, and only the last may push new weights
    (weight_sync / grpo), because every request after it would sample from the changed weights.
    """
    if not requests:
        raise ValueError("no request given")
    first = requests[0]
    for i, req in enumerate(requests[1:], start=2):
        for name in SHARED_ENGINE_FIELDS:
            if getattr(req, name) != getattr(first, name):
                raise ValueError(
                    f"request {i} ({req.output_dir}): {name} differs from request 1's; requests sharing one "
                    "engine process must share the engine construction (model, tokenizer, engine_args)"
                )
    for i, req in enumerate(requests[:-1], start=1):
        if req.weight_sync is not None or req.grpo is not None:
            raise ValueError(
                f"request {i} ({req.output_dir}): weight_sync/grpo change the engine's weights; "
                "only the last request of a batch may carry them"
            )
    dirs = [str(Path(r.output_dir).resolve()) for r in requests]
    if len(set(dirs)) != len(dirs):
        raise ValueError("two requests write to the same output_dir")


def run(request: WorkerRequest) -> None:
    run_batch([request])


def run_batch(requests: Sequence[WorkerRequest]) -> None:
    """Start the engine once, replay every request in order, then score and write each one.

    Timings shared by the batch (imports, engine start and shutdown, reference load) are reported
    in every request's engine.json; ``total_s`` is the worker's wall time until that request's
    outputs were written. In server mode the server starts first, in its own process, and this
    one imports vLLM and tokenizes while it does (:mod:`gate.worker.serve`).
    """
    validate_batch(requests)
    batch = len(requests)
    shared = Timings()
    started = time.perf_counter()
    first = requests[0]
    cache_root = vllm_cache.apply(os.environ)  # before vLLM is imported, here or in a server
    # One commit of a hub model for the tokenizer, the engine and the reference (None: a local folder).
    revision = hub.resolve_model_revision(first.model, first.engine_args, progress)
    requested_args = {**first.engine_args, **({"revision": revision} if revision else {})}
    server_start = (
        _launch_server(first, requested_args)
        if first.mode == "server"
        else contextlib.nullcontext()
    )
    with server_start as launched:
        with shared.measure("import_s"):
            from gate.worker import engine as eng

            eng.prepare_process()  # before torch/vllm start any threads
            import vllm  # noqa: F401 - imported here so start-up cost is attributed honestly
            from transformers import AutoTokenizer

        peaks = PeakMemory(device=cuda_device_used())  # engine.json memory_peaks
        with shared.measure("tokenize_s"):
            tokenizer = AutoTokenizer.from_pretrained(
                first.tokenizer or first.model,
                **hub.hf_load_kwargs(requested_args, for_tokenizer=True),
            )
            tokenized = [
                Tokenized(
                    replay.tokenize_prompts(tokenizer, r.prompts),
                    replay.tokenize_references(tokenizer, r.prompts),
                )
                for r in requests
            ]
        if launched is not None:
            engine_run = _run_server(
                launched, requests, tokenized, requested_args, tokenizer, shared, peaks
            )
        else:
            engine_run = _run_offline(requests, tokenized, requested_args, shared, peaks)

    outputs, own = engine_run.outputs, engine_run.timings
    memory = {"engine_running": engine_run.memory_running, "engine_released": eng.memory_in_use()}
    progress(f"engine released: {_memory_note(memory)}")
    for out in outputs:
        out.meta["memory"] = memory
        out.meta["vllm_cache_root"] = None if cache_root is None else dataclasses.asdict(cache_root)

    references = _ReferenceCache(hub.hf_load_kwargs(requested_args))
    for i, (req, tok, out) in enumerate(zip(requests, tokenized, outputs, strict=True)):
        out.meta["model_revision"] = revision
        with peaks.phase("reference"):
            ref, load_s = references.get(req, engine_run.adapter)
            own[i].values["reference_load_s"] = load_s
            arrays, n_scored = _reference_arrays(ref, req, tok.prompt_ids, out, own[i])
        if (trip := replay.text_round_trip(tokenizer, out.sampled)) is not None:
            arrays[f"{keys.SAMPLE}_{keys.TEXT_MISMATCH}"] = trip.text_mismatch
            arrays[f"{keys.SAMPLE}_{keys.RETOKENIZED_AT}"] = trip.retokenized_at
        out.meta["reference"] = ref.placement_record()
        out.meta["memory_peaks"] = peaks.as_dict()
        arrays.update(out.rl_arrays)
        timings = {**shared.values, **own[i].values}
        timings["reference_tokens_per_s"] = n_scored / max(timings["reference_score_s"], 1e-9)
        timings["total_s"] = time.perf_counter() - started
        seen = np.concatenate([_flat(tok.prompt_ids), out.sampled.token_ids])
        texts = _texts(req, out, replay.token_texts(tokenizer, seen))
        _write_outputs(req, tok.prompt_ids, out, arrays, texts, n_scored, timings)
        _prefixed(i, batch)(
            f"done in {timings['total_s']:.1f}s (engine start {timings['engine_start_s']:.1f}s, "
            f"reference {timings['reference_tokens_per_s']:.0f} tok/s)"
        )


def _run_offline(
    requests: Sequence[WorkerRequest],
    tokenized: list[Tokenized],
    requested_args: dict[str, Any],
    shared: Timings,
    peaks: PeakMemory,
) -> EngineRun:
    """Offline: decide the engine arguments and environment here, then start ``vllm.LLM`` in this process."""
    from gate.worker import engine as eng

    known = eng.supported_engine_args()
    engine_args, dropped = eng.split_engine_args(
        requested_args, requests[0].optional_engine_args, known
    )
    if dropped:
        progress(f"this release has no {dropped}; running without them (recorded in engine.json)")
    on_cpu = eng.on_cpu_platform()
    gate_settings = layout.engine_environment(
        engine_args, on_cpu, os.environ, sorted(os.sched_getaffinity(0))
    )
    gate_settings += layout.one_step_prefill(engine_args, on_cpu, known)
    gate_settings += layout.prompt_logprobs_per_call(engine_args, on_cpu)
    engine_args = layout.with_engine_args(engine_args, gate_settings)
    for setting in gate_settings:
        progress(
            f"setting {setting.name}={setting.value}: {setting.reason} (recorded in engine.json)"
        )
    layout.apply_environment(gate_settings)
    # Worker processes' own logs pass through this process's stdout/stderr: keep their last
    # lines, so a failure on one rank can be reported with that rank's words.
    tail = (
        OutputTail(watch=ENGINE_ERROR_LINE)
        if layout.runs_workers_in_processes(engine_args)
        else None
    )
    try:
        return _run_engine(
            requests,
            tokenized,
            requested_args,
            engine_args,
            dropped,
            gate_settings,
            tail,
            shared,
            peaks,
        )
    except Exception as exc:
        if tail is None:  # one process: the exception is the engine's own
            raise
        # A rank's error comes back as a wrapper or a string; its own words are in the tail.
        raise EngineFailed(f"{type(exc).__name__}: {exc}", tail.lines()) from exc
    finally:
        if tail is not None:
            tail.close()


def _run_engine(
    requests: Sequence[WorkerRequest],
    tokenized: list[Tokenized],
    requested_args: dict[str, Any],
    engine_args: dict[str, Any],
    dropped: list[str],
    gate_settings: list[GateSetting],
    tail: OutputTail | None,
    shared: Timings,
    peaks: PeakMemory,
) -> EngineRun:
    """Start the engine, run every request's passes, shut it down."""
    from gate.worker import engine as eng

    batch = len(requests)
    first = requests[0]
    progress(
        f"starting engine ({len(first.prompts)} prompts"
        + (f", {batch} requests)" if batch > 1 else ")")
    )
    with shared.measure("engine_start_s"), peaks.phase("engine_start"):
        llm = eng.start_engine(first.model, first.tokenizer, engine_args)
    policy = None
    if first.lora is not None:
        with shared.measure("lora_setup_s"):
            policy = _policy_adapter(llm, first, hub.hf_load_kwargs(requested_args))

    own = [Timings() for _ in requests]
    log_tail = tail.lines if tail is not None else no_log_tail
    try:
        outputs = [
            _engine_passes(
                llm,
                PassInput(
                    OfflineEngine(
                        llm,
                        one_sequence_per_call=any(
                            g.name == layout.PROMPT_LOGPROBS_PER_CALL for g in gate_settings
                        ),
                        policy=policy,
                    ),
                    req,
                    tok,
                    _prefixed(i, batch),
                    hub.hf_load_kwargs(requested_args),
                    log_tail,
                    memory=peaks,
                    batch_invariant_mode=batch_invariant_mode(),
                ),
                dropped,
                gate_settings,
                own[i],
            )
            for i, (req, tok) in enumerate(zip(requests, tokenized, strict=True))
        ]
    finally:
        if policy is not None:
            policy.close()  # the adapter folders: the engine has read every version by now

    # The engine's memory (weights, KV cache, compiled graphs) goes back before the reference loads.
    memory_running = eng.memory_in_use()
    with shared.measure("engine_shutdown_s"), peaks.phase("engine_shutdown"):
        eng.shutdown(llm)
        del llm
        eng.release_memory()
    adapter = None
    if policy is not None:
        adapter = (policy.versions[0], policy.lora.scaling)
        for out in outputs:
            out.meta["lora"] = policy.record()
    return EngineRun(outputs, own, memory_running, adapter)


def _policy_adapter(llm, request: WorkerRequest, hf_kwargs: dict[str, Any]):
    """LoRA mode: the adapter versions, made from the model's own weights, version 1 pushed.

    The model is read on the host in the engine's dtype (what the weight-sync probe's trainer
    copy costs too) for its module shapes and weights' spread, and released at once."""
    from transformers import AutoModelForCausalLM

    from gate.worker.lora import PolicyAdapter
    from gate.worker.weight_sync import _load_trainer, engine_dtype

    assert request.lora is not None
    model = _load_trainer(AutoModelForCausalLM, request.model, "cpu", hf_kwargs, engine_dtype(llm))
    policy = PolicyAdapter(request.lora, model, Path(request.output_dir).resolve().parent)
    del model
    policy.push(llm, policy.versions[0], request.model)
    progress(
        f"LoRA mode: adapter version 1 (rank {request.lora.rank}, {policy.record()['modules_adapted']} "
        f"modules) loaded via {policy.path_name}; every pass generates through it"
    )
    return policy


@dataclass
class _LaunchedServer:
    """A server process started at the top of :func:`run_batch`, not yet known to be healthy."""

    server: Server
    facts_path: Path


@contextlib.contextmanager
def _launch_server(
    first: WorkerRequest, requested_args: dict[str, Any]
) -> Iterator[_LaunchedServer]:
    """Start the server process now (gate.worker.serve decides its flags inside it); it is always
    stopped when the ``with`` ends: on success, on an error, on SIGTERM (gate.worker.server)."""
    from gate.worker import serve
    from gate.worker import server as srv

    settings = first.server
    if settings is None:
        raise ValueError("mode is server but the request has no server section")
    progress(f"starting server ({len(first.prompts)} prompts)")
    with tempfile.TemporaryDirectory(prefix="gate-serve-") as tmp:
        port = srv.free_port()
        plan = serve.LaunchPlan(
            first.model,
            first.tokenizer,
            requested_args,
            list(first.optional_engine_args),
            port,
            list(settings.args),
            str(Path(tmp) / "facts.json"),
        )
        plan.write(Path(tmp) / "plan.json")
        command = [sys.executable, "-m", serve.__name__, str(Path(tmp) / "plan.json")]
        env = srv.server_environment(os.environ, settings.dev_mode)
        log_path = Path(first.output_dir) / "server.log"
        with srv.started_server(command, port, env, log_path, progress) as server:
            yield _LaunchedServer(server, Path(plan.facts))


def _run_server(
    launched: _LaunchedServer,
    requests: Sequence[WorkerRequest],
    tokenized: list[Tokenized],
    requested_args: dict[str, Any],
    tokenizer: Any,
    shared: Timings,
    peaks: PeakMemory,
) -> EngineRun:
    """Server mode: wait until the server is healthy, run every request's passes over HTTP."""
    from gate.worker import engine as eng
    from gate.worker import serve
    from gate.worker import server as srv
    from gate.worker import server_engine as se

    first, server = requests[0], launched.server
    settings = first.server
    assert settings is not None  # _launch_server refused a request without one
    # The server's start keeps one core busy; meanwhile this process imports what the weight-sync
    # probe reads later (the vLLM worker class), instead of after the passes begin.
    worker_module = (
        "vllm.v1.worker.cpu_worker" if eng.on_cpu_platform() else "vllm.v1.worker.gpu_worker"
    )
    threading.Thread(
        target=_import_quietly, args=(worker_module,), name="gate-warm-import", daemon=True
    ).start()
    try:
        server.wait_healthy(settings.startup_timeout_s)
    except srv.ServerError as exc:
        decided = serve.read_facts(launched.facts_path)
        if isinstance(decided, str):  # a bad engine argument: the same error as offline
            raise ValueError(decided) from None
        if isinstance(decided, serve.LaunchFacts):  # name the command vLLM ran, not the launcher
            raise srv.ServerError(
                f"{exc.reason}; vLLM's command: {' '.join(decided.command)}", exc.log_tail
            ) from None
        raise
    shared.values["engine_start_s"] = server.started_s
    progress(f"server healthy at {server.base_url} after {server.started_s:.1f}s")
    facts = serve.read_facts(launched.facts_path)
    if not isinstance(facts, serve.LaunchFacts):
        raise srv.ServerError(
            "the server is healthy but its launcher recorded no command", server.lines()
        )
    if facts.dropped_engine_args:
        progress(
            f"this release has no {facts.dropped_engine_args}; running without them "
            "(recorded in engine.json)"
        )
    for setting in facts.gate_settings:
        progress(f"server: setting {setting.name}={setting.value}: {setting.reason}")
    progress(f"server command: {' '.join(facts.command)}")
    served = se.connect(server, facts.command, settings, getattr(tokenizer, "bos_token_id", None))
    own = [Timings() for _ in requests]
    outputs = []
    for i, (req, tok) in enumerate(zip(requests, tokenized, strict=True)):
        inp = PassInput(
            served,
            req,
            tok,
            _prefixed(i, len(requests)),
            hub.hf_load_kwargs(requested_args),
            server.lines,
            memory=peaks,
        )
        outputs.append(
            _server_passes(inp, served, facts.dropped_engine_args, facts.gate_settings, own[i])
        )
    served.client.close()
    memory_running = eng.memory_in_use()
    stopping = time.perf_counter()
    server.stop()
    shared.values["engine_shutdown_s"] = time.perf_counter() - stopping
    return EngineRun(outputs, own, memory_running)


def _import_quietly(module: str) -> None:
    """Import ``module`` now; a failure is left to the code that imports it when it needs it."""
    with contextlib.suppress(Exception):
        importlib.import_module(module)


def _server_passes(
    inp: PassInput,
    served: ServedEngine,
    dropped: list[str],
    gate_settings: list[GateSetting],
    timings: Timings,
) -> EngineOutputs:
    """The passes over one request through the server (the one table, ENGINE_PASSES), and what the server
    says about itself; engine.json has the offline keys plus ``mode`` and ``server``."""
    from gate.worker import engine as eng
    from gate.worker import model_runner
    from gate.worker import server_engine as se

    served.facts = {}
    request = inp.request
    about = {
        "identity": se.identity(served),
        "effective": se.effective_settings(served, eng._SETTINGS)
        | {"model_runner": model_runner.by_release()}
        | {f"env.{g.name}": g.value for g in layout.env_settings(gate_settings)},
        "numerics": {
            "runtime_probe_error": "server mode: the engine runs in the server's processes"
        },
        "default_sampling_params": se.default_sampling(served),
        "generation_config_overrides": served.defaults,
    }
    results = run_passes(ENGINE_PASSES, inp, timings)
    extra = {"flat_logprobs": False, "mode": "server", "server": se.server_record(served)}
    return _engine_outputs(request, results, dropped, gate_settings, extra | about)


def _memory_note(memory: dict[str, dict[str, Any]]) -> str:
    running, released = memory["engine_running"], memory["engine_released"]
    key = "device_used_bytes" if "device_used_bytes" in running else "rss_bytes"
    if running.get(key) is None or released.get(key) is None:
        return "memory not measurable here"
    what = "device memory in use" if key == "device_used_bytes" else "process RSS"
    return f"{what} {running[key] / 2**30:.2f} -> {released[key] / 2**30:.2f} GiB"


def _prefixed(i: int, batch: int) -> Say:
    """progress() with a "[request i/n]" prefix in a batch; a single request's lines stay as they were."""
    if batch == 1:
        return progress
    return lambda message: progress(f"[request {i + 1}/{batch}] {message}")


class _ReferenceCache:
    """The trainer-side reference, loaded once for every run of requests with the same settings.

    Only one model is held at a time: a request with other reference settings releases the
    previous one first (a large model twice would not fit beside itself on an accelerator).
    """

    def __init__(self, hf_kwargs: dict[str, Any]) -> None:
        self.hf_kwargs = hf_kwargs  # the engine's remote-code and revision choices (one per batch)
        self.key: tuple[str, str, bool, str] | None = None
        self.model: ReferenceModel | None = None
        self.load_s = 0.0

    def get(
        self, request: WorkerRequest, adapter: tuple[dict[str, Any], float] | None = None
    ) -> tuple[ReferenceModel, float]:
        """The reference for ``request`` and the seconds its load took (once per settings); in
        LoRA mode with ``adapter`` (its tensors and scaling) merged as PEFT applies it."""
        import torch

        from gate.worker.reference import ReferenceModel

        r = request.reference
        key = (
            request.model,
            r.dtype,
            r.lm_head_fp32,
            json.dumps([r.device_map, r.max_memory], sort_keys=True),
        )
        if self.model is None or key != self.key:
            self.model = None
            gc.collect()
            progress(f"trainer-side reference ({r.dtype}, lm_head_fp32={r.lm_head_fp32})")
            start = time.perf_counter()
            device = "cuda" if torch.cuda.is_available() else "cpu"
            self.model = ReferenceModel(
                request.model,
                r.dtype,
                r.lm_head_fp32,
                device,
                self.hf_kwargs,
                device_map=r.device_map,
                max_memory=r.max_memory,
            )
            if adapter is not None:
                from gate.worker.lora import apply_to

                merged = apply_to(self.model.trunk, *adapter)
                progress(f"LoRA mode: the reference applies the adapter ({merged} modules merged)")
            self.key, self.load_s = key, time.perf_counter() - start
        return self.model, self.load_s


def _texts(
    request: WorkerRequest, out: EngineOutputs, token_text: dict[str, str]
) -> dict[str, Any]:
    """texts.json: decoded text for humans and reports (untrusted: the renderer escapes it)."""
    return {
        "prompt_ids": [p.id for p in request.prompts],
        "sample_text": out.sampled.texts,
        "greedy_text": [] if out.greedy is None else out.greedy.texts,
        # Every distinct prompt and sampled token id's own text, so the orchestrator (which has no
        # tokenizer) can show any token with its context: bounded by the vocabulary, not the run.
        ev.TOKEN_TEXT: token_text,
    }


def _write_outputs(
    request: WorkerRequest,
    prompt_ids: list[list[int]],
    out: EngineOutputs,
    arrays: dict[str, np.ndarray],
    texts: dict[str, Any],
    n_scored: int,
    timings: dict[str, float],
) -> None:
    meta = {
        **out.meta,
        "timings": timings,
        "counts": {
            "prompts": len(prompt_ids),
            "samples": len(out.sampled.finish),
            "sampled_tokens": len(out.sampled.token_ids),
            "greedy_tokens": 0 if out.greedy is None else len(out.greedy.token_ids),
            "teacher_forced_tokens": 0
            if out.teacher_forced is None
            else len(out.teacher_forced.scores.logprob),
            "reference_scored_tokens": n_scored,
        },
    }
    # Both through the contract: an array or an engine.json key it does not declare fails here,
    # in the worker, rather than reaching a check that reads another name.
    record = EngineRecord.from_worker(meta)
    out_dir = Path(request.output_dir)
    ev.check_layout(arrays, out_dir / EVIDENCE_FILE)
    out_dir.mkdir(parents=True, exist_ok=True)
    named: dict[str, Any] = dict(arrays)  # numpy's stub would match the names against savez's flags
    atomic_write_bytes(out_dir / EVIDENCE_FILE, lambda fh: np.savez(fh, **named))
    atomic_write_bytes(
        out_dir / TEXTS_FILE, lambda fh: fh.write(json.dumps(texts, ensure_ascii=False).encode())
    )
    # engine.json last: its presence marks the output complete.
    atomic_write_bytes(
        out_dir / ENGINE_FILE,
        lambda fh: fh.write(json.dumps(record.to_json(), indent=2, sort_keys=True).encode()),
    )


def _engine_passes(
    llm: Any,
    inp: PassInput,
    dropped: list[str],
    gate_settings: list[GateSetting],
    timings: Timings,
) -> EngineOutputs:
    """The engine's passes over one request (:data:`~gate.worker.passes.ENGINE_PASSES`), and what
    the live engine says about itself."""
    from gate.worker import engine as eng

    request = inp.request
    # What the engine says about itself is read as it was started, before any pass: a weight push
    # from a folder (``reload_weights(weights_path=...)``) repoints the in-process engine's
    # model_config.model at that folder, which is gone by the time the passes end.
    about = {
        "identity": eng.identity(llm),
        "effective": eng.effective_settings(llm, gate_settings),
        "numerics": eng.numerics(llm),
        "default_sampling_params": eng.default_sampling(llm),
        "generation_config_overrides": eng.generation_config_overrides(llm),
    }
    results = run_passes(ENGINE_PASSES, inp, timings)
    extra = {"flat_logprobs": replay.flat_logprobs_supported()}
    return _engine_outputs(request, results, dropped, gate_settings, extra | about)


def _engine_outputs(
    request: WorkerRequest,
    results: PassResults,
    dropped: list[str],
    gate_settings: list[GateSetting],
    about: dict[str, Any],
) -> EngineOutputs:
    """The passes' results and engine.json's metadata, the same keys offline and in server mode
    (``about``: what the engine says about itself, plus what only one mode records)."""
    if results.sampled is None:
        raise RuntimeError("the sample pass did not run")  # both pass tables always enable it
    meta = {
        "engine_name": request.engine_name,
        "order_seed": request.order_seed,
        "batch_invariance": results.batch_invariance,
        "weight_sync": results.weight_sync,
        "weight_sync_inflight": results.weight_sync_inflight,
        "grpo": results.grpo,
        "prompt_ids": results.prompt_ids,
        "requested_engine_args": request.engine_args,
        "dropped_engine_args": dropped,
        # Environment the gate set for the engine, with why (the values are in "effective" too).
        "gate_settings": [dataclasses.asdict(g) for g in gate_settings],
        "passes_not_run": results.not_run,
        **about,
    }
    return EngineOutputs(
        results.sampled, results.greedy, results.teacher_forced, meta, results.arrays
    )


def _reference_arrays(
    ref: ReferenceModel,
    request: WorkerRequest,
    prompt_ids: list[list[int]],
    out: EngineOutputs,
    timings: Timings,
) -> tuple[dict[str, np.ndarray], int]:
    """Score every engine token with the trainer-side reference; returns (arrays, tokens scored)."""
    from gate.worker.reference import SamplingTransform

    r, s = request.reference, request.sampling
    rollout = SamplingTransform(
        temperature=s.temperature,
        top_k=s.top_k,
        top_p=s.top_p,
        mask_dtype=_logits_dtype(out.meta, request.engine_args),
        penalties=s.penalties(),
    )
    untransformed = SamplingTransform(temperature=0.0, top_k=0, top_p=1.0)

    arrays = {
        keys.PROMPT_OFFSETS: _offsets([len(p) for p in prompt_ids]),
        keys.PROMPT_TOKEN_IDS: _flat(prompt_ids),
    }
    n_scored = 0
    with timings.measure("reference_score_s"):
        for prefix, comp, transform in (
            (keys.SAMPLE, out.sampled, rollout),
            (keys.GREEDY, out.greedy, untransformed),
        ):
            if comp is None:
                continue
            # The effective-temperature fit (and the nucleus edge's logit noise) reads logit
            # differences before temperature at the engine's top-k. Penalties move them per token,
            # so with penalties on they are the penalised ones, and the sampled token's own joins
            # them as a last column (its raw logprob is before the penalties).
            fit = prefix == keys.SAMPLE and comp.topk_ids.shape[1]
            also = None
            if fit:
                also = comp.topk_ids
                if transform.penalised:
                    also = np.hstack([also, comp.token_ids[:, None].astype(also.dtype)])
            scored = ref.score(
                *_continuations(prompt_ids, comp), transform, r.batch_tokens, also_ids=also
            )
            arrays.update(_completion_arrays(prefix, comp, scored, transform.penalised))
            n_scored += len(scored.raw)
        tf = out.teacher_forced
        if tf is not None:
            scored = ref.score(tf.seqs, [1] * len(tf.seqs), untransformed, r.batch_tokens)
            prompt_lens = [len(prompt_ids[i]) for i in tf.rows]
            arrays.update(_teacher_forced_arrays(tf, prompt_lens, scored))
            n_scored += len(scored.raw)
    return arrays, n_scored


def _logits_dtype(meta: dict[str, Any], engine_args: dict[str, Any]) -> str | None:
    """The dtype of the engine's logits: its lm_head's (``hf_overrides.head_dtype``), else the model's."""
    head = (
        (engine_args.get("hf_overrides") or {}).get("head_dtype")
        if isinstance(engine_args.get("hf_overrides"), dict)
        else None
    )
    dtype = str(head or meta["effective"].get("dtype") or "float32").removeprefix("torch.")
    return dtype if dtype in ("bfloat16", "float16") else None


def _offsets(lengths: list[int]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)


def _flat(seqs: list[list[int]]) -> np.ndarray:
    return (
        np.concatenate([np.asarray(s, dtype=np.int32) for s in seqs])
        if seqs
        else np.zeros(0, np.int32)
    )


def _continuations(
    prompt_ids: list[list[int]], comp: Completions
) -> tuple[list[list[int]], list[int]]:
    """Prompt + completion sequences and where their completion starts, for the reference."""
    seqs, starts = [], []
    for i, p in enumerate(comp.prompt_index.tolist()):
        tokens = comp.token_ids[comp.offsets[i] : comp.offsets[i + 1]].tolist()
        seqs.append(prompt_ids[p] + tokens)
        starts.append(len(prompt_ids[p]))
    return seqs, starts


def _completion_arrays(
    prefix: str, comp: Completions, scored: ScoredTokens, penalised: bool = False
) -> dict[str, np.ndarray]:
    arrays = {
        f"{prefix}_{keys.PROMPT_INDEX}": comp.prompt_index,
        f"{prefix}_{keys.SAMPLE_INDEX}": comp.sample_index,
        f"{prefix}_{keys.OFFSETS}": comp.offsets,
        f"{prefix}_{keys.TOKEN_IDS}": comp.token_ids,
        f"{prefix}_{keys.ENGINE_LOGPROB}": comp.logprob,
        f"{prefix}_{keys.ENGINE_RANK}": comp.rank,
        f"{prefix}_{keys.TOPK_IDS}": comp.topk_ids,
        f"{prefix}_{keys.TOPK_LOGPROBS}": comp.topk_logprobs,
        f"{prefix}_{keys.FINISH}": comp.finish,
        f"{prefix}_{keys.TRAINER_RAW}": scored.raw,
        f"{prefix}_{keys.TRAINER_PROCESSED}": scored.processed,
        f"{prefix}_{keys.TRAINER_RAW_BF16_HEAD}": scored.raw_bf16_head,
        f"{prefix}_{keys.TRAINER_AT_BOUNDARY}": scored.at_boundary,
    }
    if scored.also_raw is not None and penalised:
        arrays[f"{prefix}_{keys.TRAINER_TOPK_PENALISED}"] = scored.also_raw[:, :-1]
        arrays[f"{prefix}_{keys.TRAINER_PENALISED}"] = scored.also_raw[:, -1]
    elif scored.also_raw is not None:
        arrays[f"{prefix}_{keys.TRAINER_TOPK_RAW}"] = scored.also_raw
    if scored.boundary_gap is not None:
        arrays[f"{prefix}_{keys.TRAINER_BOUNDARY_GAP}"] = scored.boundary_gap
    if scored.mass_above is not None:
        arrays[f"{prefix}_{keys.TRAINER_MASS_ABOVE}"] = scored.mass_above
    if scored.tempered is not None:
        arrays[f"{prefix}_{keys.TRAINER_TEMPERED}"] = scored.tempered
    return arrays


def _teacher_forced_arrays(
    tf: TeacherForced, prompt_lens: list[int], scored: ScoredTokens
) -> dict[str, np.ndarray]:
    # Target position t (1-based in the sequence) belongs to the reference when t >= prompt length.
    is_reference = np.concatenate(
        [np.arange(1, len(s)) >= pl for s, pl in zip(tf.seqs, prompt_lens, strict=True)]
    )
    return {
        f"{keys.TF}_{keys.PROMPT_INDEX}": np.asarray(tf.rows, dtype=np.int32),
        f"{keys.TF}_input_offsets": _offsets([len(s) for s in tf.seqs]),
        f"{keys.TF}_input_ids": _flat(tf.seqs),
        f"{keys.TF}_{keys.OFFSETS}": _offsets([len(s) - 1 for s in tf.seqs]),
        f"{keys.TF}_{keys.ENGINE_LOGPROB}": tf.scores.logprob,
        f"{keys.TF}_{keys.TRAINER_RAW}": scored.raw,
        f"{keys.TF}_{keys.TRAINER_RAW_BF16_HEAD}": scored.raw_bf16_head,
        f"{keys.TF}_is_reference": is_reference,
    }


def read_requests(paths: Sequence[str]) -> list[WorkerRequest]:
    """Read and validate a batch; ValueError names the bad file or the rule a batch breaks."""
    requests = []
    for path in paths:
        try:
            requests.append(WorkerRequest.read(Path(path)))
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"bad request {path}: {exc}") from None
    validate_batch(requests)
    return requests


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m gate.worker <request.json> [<request.json> ...]", file=sys.stderr)
        return 2
    try:
        requests = read_requests(argv)
    except ValueError as exc:
        progress(f"error: {exc}")
        return 2
    try:
        run_batch(requests)
    except Exception as exc:
        traceback.print_exc()
        progress(f"error: {error_line(exc)}")
        return 1
    return 0
