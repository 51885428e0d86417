"""The old engine's evidence reused: on a pull request the old engine is unchanged, so its
evidence comes from gate.evidence_cache when every input that shapes it is the same, and a fresh
replay refills the cache otherwise."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path

from gate import evidence_cache
from gate.config import GateConfig
from gate.contract import evidence
from gate.contract.request import PromptItem
from gate.engine_jobs import EngineJob, EngineRun, PreparedEngine, Target
from gate.errors import GateError
from gate.promptset import PromptSet
from gate.worker_request import build_request


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

    def replay(
        self,
        target: Target,
        env: PreparedEngine,
        use_stored: bool,
        run: Callable[[], EngineRun],
    ) -> EngineRun:
        """The stored evidence where its key matches and ``use_stored``; else ``run()`` (the
        replay), whose evidence is stored for later runs."""
        key = self._key(env)
        cached = evidence_cache.lookup(key, self.log) if key is not None and use_stored else None
        if cached is not None:
            restored = self._restore(cached, target, env)
            if restored is not None:
                return restored
        result = run()
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
