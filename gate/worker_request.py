"""The worker request one engine gets: the prompts a config replays, and the config and the
engine's settings mapped onto the seam's request (gate.contract.request), in one place."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, TypeVar

from gate.config import (
    OPTIONAL_ENGINE_ARGS,
    SERVER_PENALTY_FIELDS,
    SERVER_REQUEST_FIELDS,
    EngineConfig,
    GateConfig,
)
from gate.contract.request import (
    GrpoRequest,
    InflightRequest,
    LoraRequest,
    PromptItem,
    ReferenceRequest,
    SamplingRequest,
    ServerRequest,
    WeightSyncRequest,
    WorkerRequest,
)
from gate.errors import ConfigError
from gate.promptset import PromptSet, load_prompt_set

T = TypeVar("T")


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
    return WorkerRequest(
        engine_name=engine.name,
        model=cfg.model.path,
        tokenizer=cfg.model.tokenizer,
        engine_args=cfg.lora.engine_args(engine.engine_args),
        optional_engine_args=list(OPTIONAL_ENGINE_ARGS),
        prompts=list(prompts),
        sampling=same_fields(SamplingRequest, cfg.sampling),
        greedy_max_tokens=cfg.greedy.max_tokens if cfg.greedy.enabled else 0,
        teacher_forced=cfg.teacher_forced.enabled,
        batch_invariance=cfg.teacher_forced.enabled and cfg.teacher_forced.batch_invariance,
        reference=same_fields(ReferenceRequest, cfg.reference),
        output_dir=str(output_dir),
        order_seed=order_seed,
        weight_sync=_weight_sync_request(cfg, engine),
        grpo=_grpo_request(cfg, grpo_seeds, prompts),
        mode=engine.mode,
        server=_server_request(engine, cfg.sampling.record()),
        lora=_lora_request(cfg),
    )


def _lora_request(cfg: GateConfig) -> LoraRequest | None:
    lora = cfg.lora
    if not lora.enabled:
        return None
    return LoraRequest(
        rank=lora.rank,
        alpha=lora.alpha,
        target_modules=list(lora.target_modules),
        use_rslora=lora.use_rslora,
        naming=lora.naming,
        hook=lora.hook,
        size=cfg.weight_sync.perturbation,
        seed=cfg.weight_sync.seed,
    )


def same_fields(request_type: type[T], section: object) -> T:
    """A request section from the config section that declares the same fields by the same names
    (sampling, reference): the mapping is the request's own field list, declared once. A field the
    config lacks is an AttributeError here, at the first request built, not a silent default."""
    return request_type(
        **{f.name: getattr(section, f.name) for f in dataclasses.fields(request_type)}  # type: ignore[arg-type]
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


def _grpo_request(
    cfg: GateConfig, seeds: tuple[int, ...] | None, prompts: list[PromptItem]
) -> GrpoRequest | None:
    g = cfg.grpo
    if not g.enabled or seeds == ():  # () : a job that trains no seed (a calibration replica)
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
        seeds=list(seeds if seeds is not None else range(g.seeds)),
        trainable=g.trainable,
        optimizer=g.optimizer,
        loss=g.loss,
        clip_eps_high=eps_high,
        eval_prompts=eval_prompts(cfg, prompts),
        eval_samples=g.eval_samples,
        eval_held_out=g.eval_held_out,
        sampling_seed_offset=g.sampling_seed_offset,
    )


def eval_prompts(cfg: GateConfig, prompts: list[PromptItem]) -> list[int]:
    """The GRPO run's held-out eval set: ``grpo.eval_prompts`` records with an answer, evenly
    spaced through the prompt sets (so every set and every part of one is represented), as indices
    into ``prompts``. The sets are content-hashed, so the choice is too."""
    g = cfg.grpo
    answered = [i for i, p in enumerate(prompts) if p.answer]
    if not answered:  # no reward at all: the worker's GRPO pass says so, as an error of that pass
        return []
    left = len(answered) - (g.eval_prompts if g.eval_held_out else 0)
    if left < g.prompts_per_step or g.eval_prompts > len(answered):
        raise ConfigError(
            f"{cfg.source}: grpo.eval_prompts: {g.eval_prompts} of the {len(answered)} records "
            f"with an answer leave {max(left, 0)} to train on, fewer than prompts_per_step "
            f"({g.prompts_per_step})"
        )
    k = g.eval_prompts
    return [answered[(2 * j + 1) * len(answered) // (2 * k)] for j in range(k)]


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
