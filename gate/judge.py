"""Judge a run directory: load evidence and baseline, run the checks, decide the verdict.

The verdict is the worst status of the checks and of the baseline provenance (each check can be
configured fail / warn / off). ERROR means the gate could not judge: an engine produced no
evidence, or the baseline is unreadable.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gate import baseline as bl
from gate.checks import registry
from gate.checks.base import CheckResult, CheckSettings
from gate.checks.context import Context
from gate.checks.logprob_integrity import engines_with_nonfinite
from gate.config import GateConfig
from gate.config.checks_section import default_settings
from gate.contract import evidence as ev
from gate.run_record import read_run_manifest
from gate.verdict import Status, exit_code, worst


@dataclass
class BaselineStatus:
    path: str | None
    status: Status
    message: str
    differences: list[str]
    manifest: dict[str, Any] | None
    # what noise the thresholds scaled with, and the false-alarm rate they are designed for
    noise_floors: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "status": self.status.value,
            "message": self.message,
            "differences": self.differences,
            "manifest": self.manifest,
            "noise_floors": self.noise_floors,
        }


@dataclass
class Judgment:
    verdict: Status
    checks: list[CheckResult]
    baseline: BaselineStatus
    errors: list[str]

    def exit_code(self, fail_on: str) -> int:
        return exit_code(self.verdict, fail_on)


def judge(run_dir: Path, cfg: GateConfig) -> Judgment:
    run = read_run_manifest(run_dir)
    engines, errors = {}, []
    for name in ("old", "new"):
        entry = run["engines"].get(name)
        if entry is None:
            continue
        if entry["status"] != "ok":
            errors.append(entry.get("error") or f"engine '{name}' produced no evidence")
            continue
        try:
            engines[name] = ev.load(run_dir / "engines" / name, allow_nonfinite_engine=True)
        except ev.EvidenceError as exc:
            errors.append(f"engine '{name}': {exc}")
    base_status, base = _baseline(cfg, run, engines.get("new"))
    if errors or "new" not in engines:
        errors = errors or ["the new engine was not replayed"]
        return Judgment(Status.ERROR, [], base_status, errors)
    ctx = Context(
        new=engines["new"],
        old=engines.get("old"),
        run=run,
        baseline=base,
        baseline_comparable=base is not None and bl.comparable(base, run),
        noise_applicable=base is not None and bl.noise_applies(base, run, engines["new"]),
        acknowledge=frozenset(cfg.acknowledge),
        trainer_normalize=cfg.reference.normalize,
    )
    if base is not None:
        base_status = dataclasses.replace(
            base_status, noise_floors=_noise_floors(base, ctx.noise_applicable)
        )
    checks = run_checks(ctx, cfg.check_settings)
    verdict = worst([c.status for c in checks] + [base_status.status])
    return Judgment(verdict, checks, base_status, [])


def _noise_floors(base: bl.Baseline, applies: bool) -> str:
    if not applies:
        return "not applied: the baseline was calibrated for another model, prompt set, settings, device or CPU class"
    return bl.design_statement(base.noise_design, base.noise)


def _baseline(
    cfg: GateConfig, run: dict, new: ev.Evidence | None
) -> tuple[BaselineStatus, bl.Baseline | None]:
    if cfg.baseline is None:
        return BaselineStatus(
            None, Status.SKIP, "no baseline configured: comparing new against old only", [], None
        ), None
    if not Path(cfg.baseline).exists():
        message = f"no baseline recorded at {cfg.baseline} yet (`gate baseline record`): comparing new against old only"
        return BaselineStatus(cfg.baseline, Status.WARN, message, [], None), None
    try:
        base = bl.load(Path(cfg.baseline))
    except bl.BaselineError as exc:
        return BaselineStatus(cfg.baseline, Status.ERROR, str(exc), [], None), None
    if new is None:  # nothing to compare; the verdict is an ERROR for the missing evidence anyway
        return BaselineStatus(
            cfg.baseline,
            Status.SKIP,
            "not compared: the new engine produced no evidence",
            [],
            base.manifest,
        ), base
    diffs = bl.provenance_differences(base, run, new)
    if not diffs:
        notes = bl.provenance_notes(base, new)
        message = "run matches the baseline's provenance" + (
            f" (noted: {'; '.join(notes)})" if notes else ""
        )
        return BaselineStatus(cfg.baseline, Status.PASS, message, [], base.manifest), base
    mismatch_status = Status.FAIL if cfg.baseline_mismatch == "fail" else Status.WARN
    comparable = bl.comparable(base, run)
    message = "provenance differs from the baseline" + (
        ""
        if comparable
        else "; token-level baseline comparisons skipped (different model, prompts, settings or CPU class)"
    )
    return BaselineStatus(cfg.baseline, mismatch_status, message, diffs, base.manifest), base


def run_checks(ctx: Context, settings: dict[str, CheckSettings]) -> list[CheckResult]:
    unusable = engines_with_nonfinite(ctx)
    results = []
    for spec in registry():
        s = settings.get(spec.id) or default_settings(spec)
        if s.mode == "off":
            results.append(
                CheckResult(spec.id, spec.title, Status.SKIP, "turned off in the config")
            )
            continue
        if unusable and spec.compares_engine_logprobs:
            why = f"not judged: the {' and '.join(unusable)} engine's logprobs hold NaN/inf (logprob-integrity)"
            results.append(CheckResult(spec.id, spec.title, Status.SKIP, why))
            continue
        missing = spec.requires and [
            n for n, e in ctx.engines() if spec.requires[0] not in e.arrays
        ]
        if spec.requires and missing:
            why = f"not judged: the {' and '.join(missing)} engine's evidence has no {spec.requires[0]} ({spec.requires[1]})"
            results.append(CheckResult(spec.id, spec.title, Status.SKIP, why))
            continue
        try:
            result = spec.run(ctx, s)
        except Exception as exc:
            result = CheckResult(
                spec.id, spec.title, Status.ERROR, f"check crashed: {type(exc).__name__}: {exc}"
            )
        if s.mode == "warn" and result.status == Status.FAIL:
            result = dataclasses.replace(
                result, status=Status.WARN, summary=result.summary + " (capped at WARN by config)"
            )
        results.append(result)
    return results
