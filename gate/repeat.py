"""Repeated runs: the same old/new comparison over many sampling seeds, one engine start per engine.

A single ``gate run`` is one draw: its samples come from one sampling seed. How often the gate
flags a clean upgrade (false alarms) or a real fault (sensitivity) is only visible over many draws.
``gate repeat`` replays the config's old and new engine over N sampling seeds. Each engine runs in
ONE worker process for all seeds (an engine start costs ~15-35 s on CPU, one replay of the default
prompt set a few seconds), and each seed gets an ordinary run directory that ``gate check`` reads
(the command itself is :mod:`gate.commands.repeat`)::

    <out>/seed-<k>/run.json, report.json, engines/old/..., engines/new/...
    <out>/worker-<engine>.log      the one worker process per engine
    <out>/repeat.json              per-seed verdicts and the counts (written last)

Seeds: repetition k (1..N) samples with ``sampling.seed + k * n * prompts``; the worker seeds prompt
i with ``seed + i * n`` and vLLM sample j with that plus j, so no (prompt, sample) pair sees the same
seed twice across repetitions, and none reuses the baseline's own seed.

The weight-sync probe and the mini GRPO run do not depend on the sampling seed and change the
engine's weights, so they run once, on the last seed (the worker allows them only on the last
request of a batch); the other seeds' reports show those checks as SKIP.

Reusing an engine's evidence: ``old_from`` (``--old-from DIR``) copies the old engine's per-seed
evidence from an earlier repeat folder instead of replaying it, after checking that it was made by
the same engine configuration from the same requests. A sweep over several "new" variants (e.g.
the logit-noise sensitivity sweep) replays the old engine once.

:func:`run_variants` is the general form: any set of configs that build the same engines (e.g. one
fault under top-k and under top-p sampling) replayed through one worker process per engine, one run
directory each. :func:`subset_evidence` / :func:`rejudge_subset` judge a run again on fewer prompts
or shorter completions, exactly, from the same evidence.

Seeds are judged with the config's checks and baseline. A seed other than the baseline's makes the
baseline's provenance differ (its samples came from another seed), which is a WARN by
``baseline_mismatch``; ``checks_verdict`` (the worst check status, provenance aside) is therefore
what counts as "flagged" here, and ``verdict`` (the full one) is reported beside it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gate.config import EngineConfig, GateConfig
from gate.contract import evidence
from gate.contract.request import PromptItem, WorkerRequest
from gate.engine_jobs import EngineJob, EngineRun, Target
from gate.errors import EXIT_ERROR, EXIT_OK, ConfigError
from gate.files import REPEAT_FILE, RUN_FILE, write_json
from gate.fingerprint import model_fingerprint
from gate.replay import run_engine, run_manifest
from gate.rundir import RunDirectory
from gate.verdict import Status, worst
from gate.worker_request import build_request, load_prompts

SCHEMA = "gate-repeat/1"
ENGINES = ("old", "new")
FLAGGED = (Status.WARN.value, Status.FAIL.value)


@dataclass(frozen=True)
class SeedOutcome:
    """One seed's judgment, as repeat.json records it."""

    seed: int
    dir: str
    status: str  # "ok" | "error": did every engine produce evidence
    verdict: str  # the full verdict (baseline provenance included)
    checks_verdict: str  # the worst check status: what counts as "flagged"
    checks: dict[str, str]  # check id -> status
    baseline: str  # the baseline provenance status
    errors: list[str] = field(default_factory=list)

    @property
    def flagged(self) -> bool:
        return self.checks_verdict in FLAGGED


@dataclass
class RepeatResult:
    out: Path
    seeds: list[int]
    outcomes: list[SeedOutcome]
    engines: dict[str, dict[str, Any]]
    wall_s: float

    @property
    def engine_error(self) -> bool:
        return any(o.status != "ok" for o in self.outcomes)

    @property
    def exit_code(self) -> int:
        return EXIT_ERROR if self.engine_error else EXIT_OK


def repetition_seeds(cfg: GateConfig, n_prompts: int, count: int) -> list[int]:
    """``count`` sampling seeds whose per-(prompt, sample) seeds never overlap (module docstring)."""
    if count < 1:
        raise ConfigError("--seeds: need at least one seed")
    stride = cfg.sampling.n * n_prompts
    return [cfg.sampling.seed + k * stride for k in range(1, count + 1)]


def seed_config(cfg: GateConfig, seed: int, last: bool) -> GateConfig:
    """The config one seed replays: its sampling seed; RL passes only on the last seed."""
    cfg = dataclasses.replace(cfg, sampling=dataclasses.replace(cfg.sampling, seed=seed))
    if last:
        return cfg
    return dataclasses.replace(
        cfg,
        weight_sync=dataclasses.replace(cfg.weight_sync, enabled=False),
        grpo=dataclasses.replace(cfg.grpo, enabled=False),
    )


def seed_dir_name(seed: int) -> str:
    return f"seed-{seed}"


@dataclass(frozen=True)
class Variant:
    """One run directory of a shared replay: its folder name under ``out`` and the config it replays."""

    label: str
    cfg: GateConfig


def run_repeat(
    cfg: GateConfig,
    seeds: Sequence[int],
    out: Path,
    log: Callable[[str], None],
    only: str | None = None,
    old_from: Path | None = None,
) -> RepeatResult:
    """Replay ``seeds`` through the old and new engine (one process each), judge every seed."""
    seeds = _check_seeds(seeds)
    variants = [
        Variant(seed_dir_name(s), seed_config(cfg, s, last=i == len(seeds) - 1))
        for i, s in enumerate(seeds)
    ]
    return run_variants(cfg, variants, out, log, only=only, old_from=old_from)


def run_variants(
    cfg: GateConfig,
    variants: Sequence[Variant],
    out: Path,
    log: Callable[[str], None],
    only: str | None = None,
    old_from: Path | None = None,
) -> RepeatResult:
    """Replay every variant through each engine in ONE worker process per engine, judge each variant.

    Variants may differ in what a request carries (sampling settings, seeds, RL passes on the last
    one) but not in what builds the engine: model, prompt sets and the engines' configs must be
    ``cfg``'s (checked here; the worker checks the requests again).
    """
    started = time.perf_counter()
    _check_variants(cfg, variants)
    out = _prepare_out(Path(out))
    names = replayed_engines(only, old_from)
    prompt_sets, prompts = load_prompts(cfg)
    fingerprint = model_fingerprint(cfg.model.path)
    if old_from is not None:
        _check_reusable(Path(old_from), cfg.engines["old"], variants, prompts)
    targets = [Target(v.cfg, RunDirectory.create(out / v.label, cfg.gate_id)) for v in variants]
    log(f"repeat: {len(variants)} run(s) into {out}")
    wall0 = time.time()

    per_engine: dict[str, list[EngineRun]] = {}
    engines_meta: dict[str, dict[str, Any]] = {}
    if old_from is not None:
        per_engine["old"] = _reuse_old(Path(old_from), variants, targets, log)
        engines_meta["old"] = _engine_meta(
            cfg.engines["old"], reused_from=str(Path(old_from).resolve())
        )
    for name in names:
        log_path = out / f"worker-{name}.log"
        per_engine[name] = run_engine(
            EngineJob(name, cfg.engines[name]), targets, prompts, log, log_path
        )
        engines_meta[name] = _engine_meta(
            cfg.engines[name], log=str(log_path), worker_s=per_engine[name][0].worker_s
        )

    outcomes = []
    for i, target in enumerate(targets):
        results = [per_engine[n][i] for n in ENGINES if n in per_engine]
        manifest = run_manifest(target.cfg, prompt_sets, fingerprint, wall0, results)
        final = target.run_dir.finish(manifest, complete=manifest["status"] == "ok")
        seed = target.cfg.sampling.seed
        outcome = (
            judge_seed(final, target.cfg, seed, out)
            if "new" in per_engine
            else _unjudged(final, seed, out, results)
        )
        outcomes.append(outcome)
        log(summary_line(outcome))
    result = RepeatResult(
        out,
        [v.cfg.sampling.seed for v in variants],
        outcomes,
        engines_meta,
        round(time.perf_counter() - started, 1),
    )
    write_summary(result, cfg)
    return result


def judge_seed(run_dir: Path, cfg: GateConfig, seed: int, out: Path) -> SeedOutcome:
    """Judge one seed's run directory exactly as ``gate check`` does, and write its report.json."""
    from gate import report
    from gate.judge import judge

    judgment = judge(run_dir, cfg)
    report.write(run_dir, report.build(run_dir, cfg, judgment))
    checks = {c.id: c.status.value for c in judgment.checks}
    checks_verdict = (
        worst([c.status for c in judgment.checks]).value if judgment.checks else Status.ERROR.value
    )
    status = "ok" if not judgment.errors else "error"
    return SeedOutcome(
        seed,
        str(run_dir.relative_to(out)),
        status,
        judgment.verdict.value,
        checks_verdict,
        checks,
        judgment.baseline.status.value,
        list(judgment.errors),
    )


def _unjudged(run_dir: Path, seed: int, out: Path, results: list[EngineRun]) -> SeedOutcome:
    """--only old: nothing to judge (there is no new engine); record whether the evidence exists."""
    errors = [r.error for r in results if r.status != "ok" and r.error]
    status = "ok" if not errors else "error"
    verdict = Status.SKIP.value if status == "ok" else Status.ERROR.value
    return SeedOutcome(
        seed, str(run_dir.relative_to(out)), status, verdict, verdict, {}, Status.SKIP.value, errors
    )


def summary_line(o: SeedOutcome) -> str:
    flagged = [f"{cid} {st}" for cid, st in o.checks.items() if st in FLAGGED]
    tail = f"; flagged: {', '.join(flagged)}" if flagged else ""
    errors = f"; error: {o.errors[0]}" if o.errors else ""
    return f"{o.dir}: checks {o.checks_verdict}, verdict {o.verdict} (baseline {o.baseline}){tail}{errors}"


def counts(outcomes: Sequence[SeedOutcome]) -> dict[str, Any]:
    """How many seeds got each verdict, each checks-verdict, and how often each check flagged."""
    per_check: dict[str, Counter] = {}
    for o in outcomes:
        for cid, st in o.checks.items():
            per_check.setdefault(cid, Counter())[st] += 1
    statuses = [s.value for s in Status]
    return {
        "seeds": len(outcomes),
        "flagged": sum(o.flagged for o in outcomes),
        "verdict": {s: sum(o.verdict == s for o in outcomes) for s in statuses},
        "checks_verdict": {s: sum(o.checks_verdict == s for o in outcomes) for s in statuses},
        "per_check": {
            cid: {s: c.get(s, 0) for s in statuses if c.get(s, 0)} for cid, c in per_check.items()
        },
    }


def write_summary(result: RepeatResult, cfg: GateConfig) -> Path:
    doc = {
        "schema": SCHEMA,
        "config": cfg.source,
        "gate_id": cfg.gate_id,
        "seeds": result.seeds,
        "engines": result.engines,
        "wall_s": result.wall_s,
        "counts": counts(result.outcomes),
        "per_seed": [dataclasses.asdict(o) for o in result.outcomes],
    }
    path = result.out / REPEAT_FILE
    write_json(path, doc)
    return path


def load_summary(out: Path) -> dict[str, Any]:
    path = Path(out) / REPEAT_FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: not a readable `gate repeat` folder: {exc}") from None
    if doc.get("schema") != SCHEMA:
        raise ConfigError(f"{path}: schema: expected {SCHEMA}")
    return doc


# -- input checks --------------------------------------------------------------------------------


def _check_seeds(seeds: Sequence[int]) -> list[int]:
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ConfigError("repeat: no seeds given")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"repeat: seeds repeat: {seeds}")
    return seeds


def _prepare_out(out: Path) -> Path:
    out = out.resolve()
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out}: already exists and is not empty; choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    return out


def replayed_engines(only: str | None, old_from: Path | None) -> list[str]:
    """The engines a repeat replays: both, ``only`` one, or the new one when the old one's evidence is reused."""
    if only is not None and only not in ENGINES:
        raise ConfigError(f"--only: expected one of {ENGINES}, got {only!r}")
    if old_from is not None and only == "old":
        raise ConfigError(
            "--old-from reuses the old engine's evidence: it cannot be combined with --only old"
        )
    if old_from is not None:
        return ["new"]
    return [only] if only else list(ENGINES)


def _engine_meta(engine: EngineConfig, **extra: Any) -> dict[str, Any]:
    keep = ("spec", "runner", "engine_args", "env", "pip_args")
    return {k: v for k, v in dataclasses.asdict(engine).items() if k in keep} | extra


def _check_variants(cfg: GateConfig, variants: Sequence[Variant]) -> None:
    if not variants:
        raise ConfigError("repeat: nothing to run")
    labels = [v.label for v in variants]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"repeat: run labels repeat: {labels}")
    for v in variants:
        for name in ("model", "prompts", "engines", "timeout_s"):
            if getattr(v.cfg, name) != getattr(cfg, name):
                raise ConfigError(
                    f"repeat: run '{v.label}' changes {name}; runs sharing engine processes cannot"
                )


def _check_reusable(
    source: Path, old: EngineConfig, variants: Sequence[Variant], prompts: list[PromptItem]
) -> None:
    """The old evidence under ``source`` must come from this engine and exactly these requests."""
    doc = load_summary(source)
    recorded = doc.get("engines", {}).get("old")
    if recorded is None:
        raise ConfigError(f"{source / REPEAT_FILE}: has no old engine to reuse")
    expected = _engine_meta(old)
    recorded_cfg = {k: recorded.get(k) for k in expected}
    if json.loads(json.dumps(recorded_cfg)) != json.loads(json.dumps(expected)):
        raise ConfigError(
            f"{source}: the old engine there ({recorded_cfg}) is not this config's ({expected})"
        )
    for v in variants:
        folder = source / v.label / "engines" / "old"
        stored_path = folder / "request.json"
        if not stored_path.is_file():
            raise ConfigError(
                f"{stored_path}: missing: {source} holds no old-engine evidence for '{v.label}'"
            )
        stored = _as_current_request(stored_path)
        wanted = json.loads(
            build_request(v.cfg, dataclasses.replace(old, name="old"), prompts, folder).to_json()
        )
        diff = sorted(
            k
            for k in wanted.keys() | stored.keys()
            if k != "output_dir" and wanted.get(k) != stored.get(k)
        )
        if diff:
            raise ConfigError(
                f"{stored_path}: the stored request differs from this config's in {diff}; replay the old engine"
            )


def _as_current_request(path: Path) -> dict[str, Any]:
    """A stored request as this gate version writes it: a field added since, absent there, reads as
    its default (which is what the worker then did)."""
    try:
        return json.loads(WorkerRequest.from_json(path.read_text(encoding="utf-8")).to_json())
    except (OSError, ValueError, TypeError) as exc:
        raise ConfigError(f"{path}: not a request this gate can reuse: {exc}") from None


def _reuse_old(
    source: Path, variants: Sequence[Variant], targets: list[Target], log: Callable[[str], None]
) -> list[EngineRun]:
    """Copy each run's old-engine folder (hard links where possible) and its run.json entry."""
    log(f"[old] reusing evidence from {source}")
    results = []
    for v, t in zip(variants, targets, strict=True):
        seed_src = source / v.label
        entry = json.loads((seed_src / RUN_FILE).read_text(encoding="utf-8"))["engines"]["old"]
        dest = t.run_dir.engine_dir("old")
        shutil.rmtree(dest)
        shutil.copytree(seed_src / "engines" / "old", dest, copy_function=_link_or_copy)
        result = EngineRun(**{f.name: entry.get(f.name) for f in dataclasses.fields(EngineRun)})
        if result.status == "ok":
            try:
                evidence.load(dest, allow_nonfinite_engine=True)
            except evidence.EvidenceError as exc:
                result.status, result.error = "error", f"engine 'old': reused evidence: {exc}"
        results.append(result)
    return results


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)  # evidence files are never modified in place: a hard link is a safe copy
    except OSError:
        shutil.copy2(src, dst)
