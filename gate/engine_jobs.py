"""What one ``gate run`` replays: its engine jobs, the run directories they fill, each job's
environment prepared in the background, and the outcome of each engine."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gate.config import DockerConfig, EngineConfig, GateConfig
from gate.rundir import RunDirectory
from gate.runners import get_runner
from gate.runners.base import Runner


@dataclass(frozen=True)
class EngineJob:
    """One worker run: ``name`` is its folder under engines/ (old, new, or an A/A replica)."""

    name: str
    engine: EngineConfig
    order_seed: int | None = None
    # None: seeds 0..grpo.seeds-1; (): no GRPO run
    grpo_seeds: tuple[int, ...] | None = None


def default_jobs(cfg: GateConfig, only: str | None = None) -> list[EngineJob]:
    names = (only,) if only else ("old", "new")
    return [EngineJob(name, cfg.engines[name], grpo_seeds=run_seeds(cfg, name)) for name in names]


# The old engine's GRPO seed beside a baseline: seed 0, whose trajectory the baseline also holds.
CANARY_SEEDS = (0,)


def run_seeds(cfg: GateConfig, name: str) -> tuple[int, ...]:
    """The GRPO seeds engine ``name`` trains in a gate run: the new engine seeds 0..n-1. Beside a
    baseline, whose seeds are the statistics' null, the old engine trains the canary seed only
    (its chart line); without one, it trains the new engine's seeds, and its spread is the null."""
    if name == "old" and cfg.baseline is not None:
        return CANARY_SEEDS
    return tuple(range(cfg.grpo.seeds))


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


@dataclass(frozen=True)
class Target:
    """One request of a worker call: the config it replays (e.g. its sampling seed) and the run it fills."""

    cfg: GateConfig
    run_dir: RunDirectory


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
