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
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

from gate import __version__
from gate.config import GateConfig
from gate.contract import evidence
from gate.contract.request import PromptItem
from gate.device import bf16_emulation_note, cpu_isa, host_record, visible_gpus
from gate.engine_jobs import EngineJob, EngineRun, PreparedEngine, RunResult, Target, default_jobs
from gate.errors import EngineError
from gate.fingerprint import model_fingerprint
from gate.old_evidence import OldEvidenceCache
from gate.promptset import PromptSet
from gate.rundir import RunDirectory
from gate.worker_request import build_request, load_prompts


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
                replay = partial(_run_one, job, target, prompts, log, env)
                results.append(cache.replay(target, env, reuse_old, replay))
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
        **({"lora": cfg.lora.record()} if cfg.lora.enabled else {}),
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
        # The config's timeout is per replay: a batch gets one allowance per request, and a job
        # that trains more GRPO seeds than a gate run (a calibration's baseline seeds) more.
        timeout_s = targets[0].cfg.timeout_s * len(targets) * grpo_allowance(targets[0].cfg, job)
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


def grpo_allowance(cfg: GateConfig, job: EngineJob) -> float:
    """How many gate runs' worth of GRPO seeds ``job`` trains (at least 1): ``timeout_s`` is sized
    for a gate run, and recording a baseline trains ``grpo.baseline_seeds`` in one replay."""
    if not cfg.grpo.enabled or not job.grpo_seeds:
        return 1.0
    return max(1.0, len(job.grpo_seeds) / cfg.grpo.seeds)


def _run_one(
    job: EngineJob, target: Target, prompts: list[PromptItem], log, prepared: PreparedEngine
) -> EngineRun:
    return run_engine(job, [target], prompts, log, prepared=prepared)[0]


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
