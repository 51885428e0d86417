"""``gate run``: replay the frozen prompt set through the old and the new engine.

Builds one worker request per engine, runs it through the engine's runner, validates the evidence
and writes the run directory. An engine that cannot produce evidence (install error, crash,
timeout, NaN in its output) becomes an ERROR entry with its log tail; the other engine still runs,
so the user sees every problem at once.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

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


def run_gate(cfg: GateConfig, out: Path | None, log: Callable[[str], None], jobs: list[EngineJob] | None = None) -> RunResult:
    prompt_sets, prompts = load_prompts(cfg)
    fingerprint = model_fingerprint(cfg.model.path)
    run_dir = RunDirectory.create(out, cfg.gate_id)
    log(f"run directory: {run_dir.final_path}")
    started = time.time()
    results = [_run_engine(cfg, job, prompts, run_dir, log) for job in (jobs or default_jobs(cfg))]
    status = "ok" if all(r.status == "ok" for r in results) else "error"
    manifest = {
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
    final = run_dir.finish(manifest, complete=status == "ok")
    return RunResult(run_dir=final, status=status, engines=results)


def _run_engine(cfg: GateConfig, job: EngineJob, prompts: list[PromptItem], run_dir: RunDirectory, log) -> EngineRun:
    engine = dataclasses.replace(job.engine, name=job.name)  # log prefixes and errors name the job
    out_dir = run_dir.engine_dir(job.name)
    result = EngineRun(job.name, engine.spec, engine.runner, "error", str(run_dir.relative(out_dir)))
    runner = get_runner(engine)
    try:
        t = time.perf_counter()
        runner.prepare(engine, log)
        result.prepare_s = round(time.perf_counter() - t, 2)
        request_path = out_dir / "request.json"
        build_request(cfg, engine, prompts, out_dir, job.order_seed, job.grpo_seeds).write(request_path)
        log(f"[{job.name}] replaying through {engine.spec} ({engine.runner} runner)")
        outcome = runner.run_worker(engine, [request_path], out_dir / "worker.log", cfg.timeout_s, log)
        result.worker_s = round(outcome.wall_s, 2)
        evidence.load(out_dir)  # validates shapes and finiteness before anyone relies on it
    except EngineError as exc:
        result.error, result.log_tail = str(exc), exc.log_tail
        log(f"[{job.name}] ERROR: {exc}")
        return result
    except evidence.EvidenceError as exc:
        result.error = f"engine '{job.name}': {exc}"
        log(f"[{job.name}] ERROR: {result.error}")
        return result
    result.status = "ok"
    return result


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
