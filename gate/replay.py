"""``gate run``: replay the frozen prompt set through the old and the new engine.

Builds one worker request per engine, runs it through the engine's runner, validates the evidence
and writes the run directory. An engine that cannot produce evidence (install error, crash,
timeout, NaN in its output) becomes an ERROR entry with its log tail; the other engine still runs,
so the user sees every problem at once. :func:`run_engine` also serves several run directories
from one worker process (``gate repeat``: one engine start for many sampling seeds).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from gate import __version__, evidence
from gate.config import OPTIONAL_ENGINE_ARGS, EngineConfig, GateConfig
from gate.errors import ConfigError, EngineError
from gate.fingerprint import model_fingerprint
from gate.promptset import PromptSet, load_prompt_set
from gate.request import GrpoRequest, PromptItem, ReferenceRequest, SamplingRequest, WeightSyncRequest, WorkerRequest
from gate.rundir import RunDirectory
from gate.runners import get_runner


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
                raise ConfigError(f"{ps.path}: id: '{item.id}' also appears in prompt set '{seen[item.id]}'")
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
            n=s.n, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
            max_tokens=s.max_tokens, seed=s.seed, logprobs=s.logprobs,
        ),  # fmt: skip
        greedy_max_tokens=cfg.greedy.max_tokens if cfg.greedy.enabled else 0,
        teacher_forced=cfg.teacher_forced.enabled,
        reference=ReferenceRequest(dtype=r.dtype, lm_head_fp32=r.lm_head_fp32, batch_tokens=r.batch_tokens),
        output_dir=str(output_dir),
        order_seed=order_seed,
        weight_sync=_weight_sync_request(cfg),
        grpo=_grpo_request(cfg, grpo_seeds),
    )


def _grpo_request(cfg: GateConfig, seeds: tuple[int, ...] | None) -> GrpoRequest | None:
    g = cfg.grpo
    if not g.enabled:
        return None
    return GrpoRequest(
        steps=g.steps, prompts_per_step=g.prompts_per_step, group_size=g.group_size, max_tokens=g.max_tokens,
        temperature=g.temperature, lr=g.lr, clip_eps=g.clip_eps, seeds=list(seeds if seeds is not None else (g.seed,)),
    )  # fmt: skip


def _weight_sync_request(cfg: GateConfig) -> WeightSyncRequest | None:
    w = cfg.weight_sync
    if not w.enabled:
        return None
    return WeightSyncRequest(perturbation=w.perturbation, seed=w.seed, probes=w.probes, max_tokens=w.max_tokens,
                             hook=cfg.weight_update.hook)  # fmt: skip


@dataclass(frozen=True)
class Target:
    """One request of a worker call: the config it replays (e.g. its sampling seed) and the run it fills."""

    cfg: GateConfig
    run_dir: RunDirectory


def run_gate(cfg: GateConfig, out: Path | None, log: Callable[[str], None], jobs: list[EngineJob] | None = None) -> RunResult:
    prompt_sets, prompts = load_prompts(cfg)
    fingerprint = model_fingerprint(cfg.model.path)
    run_dir = RunDirectory.create(out, cfg.gate_id)
    log(f"run directory: {run_dir.final_path}")
    started = time.time()
    target = Target(cfg, run_dir)
    results = [run_engine(job, [target], prompts, log)[0] for job in (jobs or default_jobs(cfg))]
    status = "ok" if all(r.status == "ok" for r in results) else "error"
    final = run_dir.finish(run_manifest(cfg, prompt_sets, fingerprint, started, results), complete=status == "ok")
    return RunResult(run_dir=final, status=status, engines=results)


def run_manifest(
    cfg: GateConfig, prompt_sets: list[PromptSet], fingerprint: dict, started: float, results: list[EngineRun]
) -> dict:
    """run.json: what ran, with which inputs and settings, and each engine's outcome."""
    status = "ok" if all(r.status == "ok" for r in results) else "error"
    return {
        "gate_version": __version__,
        "gate_id": cfg.gate_id,
        "status": status,
        "config": cfg.source,
        "started": _iso(started),
        "finished": _iso(time.time()),
        "model": {"path": cfg.model.path, **fingerprint},
        "prompt_sets": [{"name": p.name, "file": str(p.path), "sha256": p.sha256, "records": len(p.items)} for p in prompt_sets],
        "sampling": dataclasses.asdict(cfg.sampling),
        "greedy": dataclasses.asdict(cfg.greedy),
        "teacher_forced": dataclasses.asdict(cfg.teacher_forced),
        "reference": dataclasses.asdict(cfg.reference),
        "weight_sync": dataclasses.asdict(cfg.weight_sync) | {"hook": cfg.weight_update.hook},
        "grpo": dataclasses.asdict(cfg.grpo),
        "engines": {r.name: dataclasses.asdict(r) for r in results},
    }


def run_engine(
    job: EngineJob, targets: Sequence[Target], prompts: list[PromptItem], log, log_path: Path | None = None
) -> list[EngineRun]:
    """Replay every target through ONE worker process of ``job``'s engine; one EngineRun per target.

    The engine starts once for all targets (the worker validates that they share its construction).
    A failure of the process (install, crash, timeout) is an ERROR for every target; evidence that
    fails validation is an ERROR for its own target only. ``log_path`` defaults to the first
    target's ``engines/<name>/worker.log``.
    """
    engine = dataclasses.replace(job.engine, name=job.name)  # log prefixes and errors name the job
    out_dirs = [t.run_dir.engine_dir(job.name) for t in targets]
    results = [EngineRun(job.name, engine.spec, engine.runner, "error", str(t.run_dir.relative(d))) for t, d in zip(targets, out_dirs)]
    runner = get_runner(engine, targets[0].cfg.docker)
    try:
        t0 = time.perf_counter()
        runner.prepare(engine, log)
        for r in results:
            r.prepare_s = round(time.perf_counter() - t0, 2)
        request_paths = []
        for target, out_dir in zip(targets, out_dirs):
            path = out_dir / "request.json"
            build_request(target.cfg, engine, prompts, out_dir, job.order_seed, job.grpo_seeds).write(path)
            request_paths.append(path)
        what = "" if len(targets) == 1 else f" ({len(targets)} requests, one engine start)"
        log(f"[{job.name}] replaying through {engine.spec} ({engine.runner} runner){what}")
        # The config's timeout is per replay: a batch gets one allowance per request.
        timeout_s = targets[0].cfg.timeout_s * len(targets)
        outcome = runner.run_worker(engine, request_paths, log_path or out_dirs[0] / "worker.log", timeout_s, log)
    except EngineError as exc:
        for r in results:
            r.error, r.log_tail = str(exc), exc.log_tail
        log(f"[{job.name}] ERROR: {exc}")
        return results
    for result, out_dir in zip(results, out_dirs):
        result.worker_s = round(outcome.wall_s, 2)
        try:
            evidence.load(out_dir)  # validates shapes and finiteness before anyone relies on it
        except evidence.EvidenceError as exc:
            result.error = f"engine '{job.name}': {exc}"
            log(f"[{job.name}] ERROR: {result.error}")
            continue
        result.status = "ok"
    return results


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
