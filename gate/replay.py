"""``gate run``: replay the frozen prompt set through the old and the new engine.

Builds one worker request per engine, runs it through the engine's runner, validates the evidence
and writes the run directory. An engine that cannot produce evidence (install error, crash,
timeout, NaN in its output) becomes an ERROR entry with its log tail; the other engine still runs,
so the user sees every problem at once. :func:`run_engine` also serves several run directories
from one worker process (``gate repeat``: one engine start for many sampling seeds).

Every engine's environment is prepared in a background thread from the start, and the old engine
replays as soon as its own is ready, while the new one may still be installing. With
``reuse_old`` the old engine's evidence comes from :mod:`gate.evidence_cache` when everything that
shapes it is unchanged; the run is then judged exactly as a full one.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gate import __version__, evidence_cache
from gate.config import (
    OPTIONAL_ENGINE_ARGS,
    SERVER_PENALTY_FIELDS,
    SERVER_REQUEST_FIELDS,
    DockerConfig,
    EngineConfig,
    GateConfig,
)
from gate.contract import evidence
from gate.contract.request import (
    GrpoRequest,
    InflightRequest,
    PromptItem,
    ReferenceRequest,
    SamplingRequest,
    ServerRequest,
    WeightSyncRequest,
    WorkerRequest,
)
from gate.device import bf16_emulation_note, cpu_isa, host_record, visible_gpus
from gate.errors import ConfigError, EngineError, GateError
from gate.fingerprint import model_fingerprint
from gate.promptset import PromptSet, load_prompt_set
from gate.rundir import RunDirectory
from gate.runners import get_runner
from gate.runners.base import Runner


@dataclass(frozen=True)
class EngineJob:
    """One worker run: ``name`` is its folder under engines/ (old, new, or an A/A replica)."""

    name: str
    engine: EngineConfig
    order_seed: int | None = None
    grpo_seeds: tuple[int, ...] | None = None  # None: the config's single run seed


def default_jobs(cfg: GateConfig, only: str | None = None) -> list[EngineJob]:
    names = (only,) if only else ("old", "new")
    return [EngineJob(name, cfg.engines[name]) for name in names]


@dataclass
class EngineRun:
    name: str
    spec: str
    runner: str
    status: str  # "ok" | "error"
    output_dir: str
    error: str | None = None
    log_tail: str | None = None
    prepare_s: float = 0.0
    worker_s: float = 0.0
    reused: dict | None = (
        None  # evidence taken from the cache: its key, when and by which run it was made
    )


@dataclass
class RunResult:
    run_dir: Path
    status: str  # "ok" | "error"
    engines: list[EngineRun]


def load_prompts(cfg: GateConfig) -> tuple[list[PromptSet], list[PromptItem]]:
    sets = [load_prompt_set(m) for m in cfg.prompts]
    items: list[PromptItem] = []
    seen: dict[str, str] = {}
    for ps in sets:
        for item in ps.items:
            if item.id in seen:
                raise ConfigError(
                    f"{ps.path}: id: '{item.id}' also appears in prompt set '{seen[item.id]}'"
                )
            seen[item.id] = ps.name
            items.append(item)
    return sets, items


def build_request(
    cfg: GateConfig,
    engine: EngineConfig,
    prompts: list[PromptItem],
    output_dir: Path,
    order_seed: int | None = None,
    grpo_seeds: tuple[int, ...] | None = None,
) -> WorkerRequest:
    s, r = cfg.sampling, cfg.reference
    return WorkerRequest(
        engine_name=engine.name,
        model=cfg.model.path,
        tokenizer=cfg.model.tokenizer,
        engine_args=dict(engine.engine_args),
        optional_engine_args=list(OPTIONAL_ENGINE_ARGS),
        prompts=list(prompts),
        sampling=SamplingRequest(
            n=s.n,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            max_tokens=s.max_tokens,
            seed=s.seed,
            logprobs=s.logprobs,
            repetition_penalty=s.repetition_penalty,
            presence_penalty=s.presence_penalty,
            frequency_penalty=s.frequency_penalty,
        ),
        greedy_max_tokens=cfg.greedy.max_tokens if cfg.greedy.enabled else 0,
        teacher_forced=cfg.teacher_forced.enabled,
        batch_invariance=cfg.teacher_forced.enabled and cfg.teacher_forced.batch_invariance,
        reference=ReferenceRequest(
            dtype=r.dtype,
            lm_head_fp32=r.lm_head_fp32,
            batch_tokens=r.batch_tokens,
            device_map=r.device_map,
            max_memory=r.max_memory,
        ),
        output_dir=str(output_dir),
        order_seed=order_seed,
        weight_sync=_weight_sync_request(cfg, engine),
        grpo=_grpo_request(cfg, grpo_seeds),
        mode=engine.mode,
        server=_server_request(engine, cfg.sampling.record()),
    )


def _server_request(engine: EngineConfig, sampling: dict[str, Any]) -> ServerRequest | None:
    if engine.mode != "server":
        return None
    s = engine.server
    fields = s.request_fields
    if fields is None:  # all the usual fields, and the penalties the sampling section turns on
        fields = SERVER_REQUEST_FIELDS + tuple(p for p in SERVER_PENALTY_FIELDS if p in sampling)
    return ServerRequest(
        request_fields=list(fields),
        args=list(s.args),
        startup_timeout_s=s.startup_timeout_s,
        request_timeout_s=s.request_timeout_s,
        max_in_flight=s.max_in_flight,
        dev_mode=s.dev_mode,
    )


def _grpo_request(cfg: GateConfig, seeds: tuple[int, ...] | None) -> GrpoRequest | None:
    g = cfg.grpo
    if not g.enabled:
        return None
    eps_low, eps_high = g.clip_band()
    return GrpoRequest(
        steps=g.steps,
        prompts_per_step=g.prompts_per_step,
        group_size=g.group_size,
        max_tokens=g.max_tokens,
        temperature=g.temperature,
        lr=g.lr,
        clip_eps=eps_low,
        seeds=list(seeds if seeds is not None else (g.seed,)),
        trainable=g.trainable,
        optimizer=g.optimizer,
        loss=g.loss,
        clip_eps_high=eps_high,
    )


def _weight_sync_request(cfg: GateConfig, engine: EngineConfig) -> WeightSyncRequest | None:
    w = cfg.weight_sync
    if not w.enabled:
        return None
    i = w.inflight
    inflight = None
    if i.enabled:
        inflight = InflightRequest(
            updates=list(i.updates),
            requests=i.requests,
            max_tokens=i.max_tokens,
            switch_after=i.switch_after,
            timeout_s=i.timeout_s,
            perturbation=w.perturbation if i.perturbation is None else i.perturbation,
        )
    return WeightSyncRequest(
        perturbation=w.perturbation,
        seed=w.seed,
        probes=w.probes,
        max_tokens=w.max_tokens,
        hook=cfg.weight_update.hook,
        inflight=inflight,
        sleep_level=w.sleep_level_for(engine.engine_args),
    )


@dataclass(frozen=True)
class Target:
    """One request of a worker call: the config it replays (e.g. its sampling seed) and the run it fills."""

    cfg: GateConfig
    run_dir: RunDirectory


def run_gate(
    cfg: GateConfig,
    out: Path | None,
    log: Callable[[str], None],
    jobs: list[EngineJob] | None = None,
    reuse_old: bool | None = None,
    memory_plan: dict | None = None,
) -> RunResult:
    """Replay ``jobs`` (default: old and new) into a new run directory.

    ``memory_plan``: the plan made before the run (gate.memory_plan), kept in run.json.

    ``reuse_old``: None leaves the evidence cache alone; True takes the old engine's evidence from
    it when its key matches; False replays the old engine in full. Either bool keeps the old
    engine's fresh evidence in the cache for later runs.
    """
    prompt_sets, prompts = load_prompts(cfg)
    fingerprint = model_fingerprint(cfg.model.path)
    run_dir = RunDirectory.create(out, cfg.gate_id)
    log(f"run directory: {run_dir.final_path}")
    started = time.time()
    target = Target(cfg, run_dir)
    jobs = jobs or default_jobs(cfg)
    dtypes = [cfg.reference.dtype, *(str(job.engine.engine_args.get("dtype", "")) for job in jobs)]
    slow = bf16_emulation_note(dtypes, cpu_isa(), visible_gpus())
    if slow:
        log(slow)
    environments = [PreparedEngine(job, cfg.docker, log).start() for job in jobs]
    try:
        results = []
        for job, env in zip(jobs, environments, strict=True):
            if reuse_old is not None and job.name == "old":
                cache = OldEvidenceCache(cfg, job, prompt_sets, fingerprint, prompts, log)
                results.append(cache.replay(target, env, use_stored=reuse_old))
            else:
                results.append(run_engine(job, [target], prompts, log, prepared=env)[0])
    finally:
        for env in environments:
            env.cancel()
    status = "ok" if all(r.status == "ok" for r in results) else "error"
    final = run_dir.finish(
        run_manifest(cfg, prompt_sets, fingerprint, started, results, memory_plan),
        complete=status == "ok",
    )
    return RunResult(run_dir=final, status=status, engines=results)


class PreparedEngine:
    """A job's engine environment, prepared in a background thread; :meth:`wait` gives its runner."""

    def __init__(self, job: EngineJob, docker: DockerConfig, log: Callable[[str], None]) -> None:
        self.engine = dataclasses.replace(
            job.engine, name=job.name
        )  # log prefixes and errors name the job
        self.runner: Runner = get_runner(self.engine, docker)
        self.prepare_s = 0.0
        self._log = log
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._prepare, name=f"prepare-{job.name}", daemon=True
        )

    def start(self) -> PreparedEngine:
        self._thread.start()
        return self

    def _prepare(self) -> None:
        t0 = time.perf_counter()
        try:
            self.runner.prepare(self.engine, self._log)
        except BaseException as exc:  # re-raised in the thread that waits
            self._error = exc
        finally:
            self.prepare_s = round(time.perf_counter() - t0, 2)

    def wait(self) -> Runner:
        while self._thread.is_alive():
            self._thread.join(timeout=0.5)  # short joins keep Ctrl-C responsive
        if self._error is not None:
            raise self._error
        return self.runner

    def cancel(self) -> None:
        """Stop an install still running (the run ended early); a no-op once prepared."""
        if self._thread.is_alive():
            self.runner.cancelled.set()
            self._thread.join(timeout=30)


def evidence_key_groups(
    cfg: GateConfig,
    job: EngineJob,
    prompt_sets: list[PromptSet],
    prompts: list[PromptItem],
    fingerprint: dict,
) -> dict:
    """The evidence-cache key groups of ``job`` known before its environment is prepared."""
    request = build_request(
        cfg,
        dataclasses.replace(job.engine, name=job.name),
        prompts,
        Path(),
        job.order_seed,
        job.grpo_seeds,
    )
    return evidence_cache.config_groups(
        cfg, job.engine, json.loads(request.to_json()), prompt_sets, fingerprint
    )


class OldEvidenceCache:
    """The old engine of one ``gate run``: evidence from the cache when its key matches, else a replay that refills it."""

    def __init__(
        self,
        cfg: GateConfig,
        job: EngineJob,
        prompt_sets: list[PromptSet],
        fingerprint: dict,
        prompts: list[PromptItem],
        log: Callable[[str], None],
    ) -> None:
        self.job, self.prompts, self.log = job, prompts, log
        self.config = evidence_key_groups(cfg, job, prompt_sets, prompts, fingerprint)

    def replay(self, target: Target, env: PreparedEngine, use_stored: bool) -> EngineRun:
        key = self._key(env)
        cached = evidence_cache.lookup(key, self.log) if key is not None and use_stored else None
        if cached is not None:
            restored = self._restore(cached, target, env)
            if restored is not None:
                return restored
        result = run_engine(self.job, [target], self.prompts, self.log, prepared=env)[0]
        if key is not None and result.status == "ok":
            entry = dataclasses.asdict(result)
            evidence_cache.store(
                key,
                target.run_dir.engine_dir(self.job.name),
                entry,
                target.run_dir.final_path,
                self.log,
            )
        return result

    def _key(self, env: PreparedEngine) -> evidence_cache.EvidenceKey | None:
        """None when the environment cannot be identified (its preparation failed): no reuse, no store."""
        try:
            runner = env.wait()
            return evidence_cache.engine_key(self.config, runner.environment(env.engine))
        except (GateError, OSError, ValueError, KeyError) as exc:
            self.log(f"[{self.job.name}] evidence cache not used: {exc}")
            return None

    def _restore(
        self, cached: evidence_cache.CachedEvidence, target: Target, env: PreparedEngine
    ) -> EngineRun | None:
        """The run entry of the restored evidence; None (folder emptied, replay instead) when it fails validation."""
        out_dir = target.run_dir.engine_dir(self.job.name)
        build_request(
            target.cfg, env.engine, self.prompts, out_dir, self.job.order_seed, self.job.grpo_seeds
        ).write(out_dir / "request.json")
        evidence_cache.restore(cached, out_dir)
        stored = cached.run_entry
        result = EngineRun(
            self.job.name,
            env.engine.spec,
            env.engine.runner,
            "ok",
            str(target.run_dir.relative(out_dir)),
            prepare_s=env.prepare_s,
            reused=cached.provenance() | {"worker_s": stored.get("worker_s")},
        )
        try:
            evidence.load(out_dir, allow_nonfinite_engine=True)
        except evidence.EvidenceError as exc:
            self.log(
                f"[{self.job.name}] warning: cached evidence {cached.path} fails validation ({exc}); replaying"
            )
            shutil.rmtree(out_dir)
            return None
        self.log(
            f"[{self.job.name}] reusing its evidence from {cached.created} (run {cached.source_run}, key {cached.digest[:12]}); "
            "--no-reuse replays it"
        )
        return result


def run_manifest(
    cfg: GateConfig,
    prompt_sets: list[PromptSet],
    fingerprint: dict,
    started: float,
    results: list[EngineRun],
    memory_plan: dict | None = None,
) -> dict:
    """run.json: what ran, with which inputs and settings, and each engine's outcome."""
    status = "ok" if all(r.status == "ok" for r in results) else "error"
    manifest = {
        "gate_version": __version__,
        "gate_id": cfg.gate_id,
        "status": status,
        "config": cfg.source,
        "started": _iso(started),
        "finished": _iso(time.time()),
        "model": {"path": cfg.model.path, **fingerprint},
        "device": host_record(),  # a baseline recorded from this run keeps it (gate.device)
        "prompt_sets": [
            {"name": p.name, "file": str(p.path), "sha256": p.sha256, "records": len(p.items)}
            for p in prompt_sets
        ],
        "sampling": cfg.sampling.record(),
        "greedy": dataclasses.asdict(cfg.greedy),
        "teacher_forced": dataclasses.asdict(cfg.teacher_forced),
        "reference": cfg.reference.scoring(),  # baselines compare it: placement stays out
        "reference_placement": cfg.reference.placement(),
        "weight_sync": dataclasses.asdict(cfg.weight_sync) | {"hook": cfg.weight_update.hook},
        "grpo": dataclasses.asdict(cfg.grpo),
        "engines": {r.name: dataclasses.asdict(r) for r in results},
    }
    if memory_plan is not None:
        manifest["memory_plan"] = memory_plan
    return manifest


def run_engine(
    job: EngineJob,
    targets: Sequence[Target],
    prompts: list[PromptItem],
    log,
    log_path: Path | None = None,
    prepared: PreparedEngine | None = None,
) -> list[EngineRun]:
    """Replay every target through ONE worker process of ``job``'s engine; one EngineRun per target.

    The engine starts once for all targets (the worker validates that they share its construction).
    A failure of the process (install, crash, timeout) is an ERROR for every target; evidence that
    fails validation is an ERROR for its own target only. ``log_path`` defaults to the first
    target's ``engines/<name>/worker.log``. ``prepared``: an environment already being prepared
    (:func:`run_gate` starts every engine's at once); default: prepare it here.
    """
    prepared = prepared or PreparedEngine(job, targets[0].cfg.docker, log).start()
    engine = prepared.engine
    out_dirs = [t.run_dir.engine_dir(job.name) for t in targets]
    results = [
        EngineRun(job.name, engine.spec, engine.runner, "error", str(t.run_dir.relative(d)))
        for t, d in zip(targets, out_dirs, strict=True)
    ]
    try:
        runner = prepared.wait()
        for r in results:
            r.prepare_s = prepared.prepare_s
        request_paths = []
        for target, out_dir in zip(targets, out_dirs, strict=True):
            path = out_dir / "request.json"
            build_request(
                target.cfg, engine, prompts, out_dir, job.order_seed, job.grpo_seeds
            ).write(path)
            request_paths.append(path)
        what = "" if len(targets) == 1 else f" ({len(targets)} requests, one engine start)"
        log(f"[{job.name}] replaying through {engine.spec} ({engine.runner} runner){what}")
        # The config's timeout is per replay: a batch gets one allowance per request.
        timeout_s = targets[0].cfg.timeout_s * len(targets)
        outcome = runner.run_worker(
            engine, request_paths, log_path or out_dirs[0] / "worker.log", timeout_s, log
        )
    except EngineError as exc:
        for r in results:
            r.error, r.log_tail = str(exc), exc.log_tail
        log(f"[{job.name}] ERROR: {exc}")
        return results
    finally:
        prepared.cancel()  # a no-op once prepared; stops an install left running by an interrupt
    for result, out_dir in zip(results, out_dirs, strict=True):
        result.worker_s = round(outcome.wall_s, 2)
        try:
            evidence.load(
                out_dir, allow_nonfinite_engine=True
            )  # validates shapes and finiteness before anyone relies on it
        except evidence.EvidenceError as exc:
            result.error = f"engine '{job.name}': {exc}"
            log(f"[{job.name}] ERROR: {result.error}")
            continue
        result.status = "ok"
    return results


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
