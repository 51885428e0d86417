"""``gate bisect``: the first release between a good and a bad pin where the gate's judgment changes.

RL stacks jump several vLLM releases at a time; when the gate says FAIL on such a jump, the next
question is which release did it. The releases between the two pins come from the installer's
indexes (gate.releases). Every release runs with the *new* engine's settings (runner, engine
arguments, environment, server), so only the release changes:

1. the good and the bad release replay once each, into one run (``steps/<bad>``), judged as
   ``gate run`` judges; the good release's evidence is judged against itself too (``steps/<good>``,
   no replay): the target's reading where nothing changed;
2. a release between them replays against the good release's evidence (hard links, never a second
   replay of the good engine) and is judged the same way; binary search over the releases, the
   environments of both possible next releases built meanwhile;
3. the last release that held and the first that changed are judged against each other (no
   replay): config-parity's comparison of their effective settings by meaning, and every other
   check across that one step; plus the worker features their sources offer (gate.compat) and a
   link to the release's notes.

The target is the verdict, the worst status of named checks, or one measurement (``CHECK:NAME``):
its status where it has bounds, else whether its value moved off the good release's. A step that
cannot be installed or started is skipped with the reason, as ``git bisect skip``; a step whose
deciding statistic lies within its calibrated noise of a bound is replayed again (``reruns``) and
reported as ambiguous while it stays there, never forced into held or changed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import Version

from gate.config import EngineConfig, GateConfig
from gate.contract import evidence
from gate.engine_jobs import EngineJob, EngineRun, PreparedEngine, Target
from gate.errors import ConfigError, GateError
from gate.files import REPORT_FILE, write_json
from gate.fingerprint import model_fingerprint
from gate.releases import Pin, Release, release_notes_url
from gate.replay import run_engine, run_gate, run_manifest
from gate.rundir import RunDirectory
from gate.verdict import rank
from gate.worker_request import load_prompts

BISECT_FILE = "bisect.json"
SUMMARY_FILE = "bisect.md"
HELD, CHANGED, SKIPPED, AMBIGUOUS = "held", "changed", "skipped", "ambiguous"

Log = Callable[[str], None]


# -- the target -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reading:
    """What the target reads in one report."""

    status: str  # the verdict, the worst named check's status, or the measurement's
    value: float | None = None  # the measurement's value (metric targets)
    bounded: bool = True  # a measurement with warn/fail bounds; False: judged by movement
    near: list[str] = field(
        default_factory=list
    )  # deciding statistics within their noise of a bound
    noise: float | None = None  # the measurement's calibrated noise (metric targets)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class TargetSpec:
    """The verdict (no checks, no metric), the worst of ``checks``, or the measurement ``metric``."""

    checks: tuple[str, ...] = ()
    metric: tuple[str, str] | None = None  # (check id, measurement name)

    @classmethod
    def parse(
        cls, checks: Sequence[str], metric: str | None, known_checks: Sequence[str]
    ) -> TargetSpec:
        if checks and metric:
            raise ConfigError("bisect: --check and --metric: choose one target")
        for check in [*checks, *([metric.split(":", 1)[0]] if metric else [])]:
            if check not in known_checks:
                raise ConfigError(
                    f"bisect: unknown check {check!r} (known: {', '.join(known_checks)})"
                )
        if metric is None:
            return cls(tuple(checks))
        check, sep, name = metric.partition(":")
        if not sep or not name:
            raise ConfigError(
                f"bisect: --metric {metric!r}: expected CHECK:MEASUREMENT, e.g. "
                "greedy-and-length:same_seed_sample_match_rate"
            )
        return cls((), (check, name))

    def describe(self) -> str:
        if self.metric:
            return f"the measurement {self.metric[1]} of {self.metric[0]}"
        return f"the status of {', '.join(self.checks)}" if self.checks else "the verdict"

    def read(self, report: dict[str, Any]) -> Reading:
        checks = {c["id"]: c for c in report.get("checks", [])}
        if self.metric:
            return self._read_metric(checks)
        if not self.checks:
            deciding = list(checks.values())
            return Reading(str(report.get("verdict", "ERROR")), near=_near_bounds(deciding))
        found = [checks[c] for c in self.checks if c in checks]
        worst = max((c["status"] for c in found), key=rank, default="ERROR")
        if len(found) < len(self.checks):
            worst = "ERROR"
        return Reading(worst, near=_near_bounds(found))

    def _read_metric(self, checks: dict[str, dict[str, Any]]) -> Reading:
        assert self.metric is not None
        check_id, name = self.metric
        check = checks.get(check_id)
        measured = [m for m in (check or {}).get("measurements", []) if m.get("name") == name]
        if not measured:
            return Reading("ERROR")
        # The comparison with the old engine (the good release here) first: that is the step's change.
        m = next((x for x in measured if x.get("engine") == "vs old"), measured[0])
        bounded = m.get("warn") is not None or m.get("fail") is not None
        return Reading(
            m.get("status") or "ERROR",
            m.get("value"),
            bounded,
            _near_bounds([{"measurements": [m]}]),
            m.get("noise"),
        )


def _near_bounds(checks: Sequence[dict[str, Any]]) -> list[str]:
    """Measurements within their calibrated noise of a bound: their status could go either way."""
    near = []
    for check in checks:
        for m in check.get("measurements", []):
            noise, value = m.get("noise"), m.get("value")
            if not noise or value is None or not math.isfinite(noise):
                continue
            for bound in ("warn", "fail"):
                edge = m.get(bound)
                if edge is not None and abs(value - edge) <= noise:
                    near.append(
                        f"{check.get('id', '')}:{m.get('name')} {value:.3g} within {noise:.2g} of its {bound} bound {edge:.3g}"
                    )
    return near


def classify(reading: Reading, good: Reading, bad: Reading) -> str:
    """held / changed / ambiguous, against the good and the bad release's readings."""
    if reading.status == "ERROR" and bad.status != "ERROR":
        return AMBIGUOUS  # a check could not judge: neither side
    if reading.bounded:
        if reading.near:
            return AMBIGUOUS
        return CHANGED if rank(reading.status) >= rank(bad.status) else HELD
    tolerance = max(reading.noise or 0.0, 0.0)
    if reading.value is None or good.value is None:
        return AMBIGUOUS
    return CHANGED if abs(reading.value - good.value) > tolerance else HELD


def changes_at_all(good: Reading, bad: Reading) -> bool:
    """Whether the target reads differently at the bad release than where nothing changed."""
    if bad.bounded:
        return rank(bad.status) > rank(good.status)
    return classify(bad, good, bad) == CHANGED


# -- the steps --------------------------------------------------------------------------------------


@dataclass
class Step:
    version: str
    spec: str
    outcome: str  # held, changed, skipped, ambiguous
    reading: Reading | None = None
    reason: str = ""  # why skipped or ambiguous
    run_dir: str | None = None
    seconds: float = 0.0
    replays: int = 0

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["reading"] = self.reading.to_dict() if self.reading else None
        return d


@dataclass
class BisectResult:
    project: str
    good: str
    bad: str
    target: str
    candidates: list[str]
    steps: list[Step]
    status: str  # found, no-change, inconclusive
    first_changed: str | None = None
    last_held: str | None = None
    untested_between: list[str] = field(
        default_factory=list
    )  # skipped/ambiguous inside the final range
    boundary: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    replays: int = 0
    replay_s: float = 0.0  # the engine replays' own time (worker wall time), summed

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["steps"] = [s.to_dict() for s in self.steps]
        return d

    def for_report(self) -> dict[str, Any]:
        """What ``--attach`` adds to a report.json (``bisect``; docs/report.md): no machine paths."""
        d = self.to_dict()
        for step in d["steps"]:
            step.pop("run_dir", None)
        d["boundary"] = {k: v for k, v in d["boundary"].items() if k != "run_dir"}
        return d


class Bisector:
    """One bisection: the runs, their readings, the search."""

    def __init__(
        self,
        cfg: GateConfig,
        pin: Pin,
        good: str,
        bad: str,
        releases: Sequence[Release],
        target: TargetSpec,
        out: Path,
        log: Log,
        reruns: int = 1,
    ) -> None:
        self.cfg, self.pin, self.target = cfg, pin, target
        self.out, self.log, self.reruns = out, log, reruns
        self.good_version, self.bad_version = good, bad
        self.candidates = [r.text for r in releases]
        self.versions = [good, *self.candidates, bad]  # index 0 held, last changed
        self.steps: dict[str, Step] = {}
        self.prepared: dict[str, PreparedEngine] = {}
        self.replays, self.replay_s = 0, 0.0
        self.good_evidence: Path | None = None
        # version -> the folder of its evidence (the good release's: engines/old of the first run)
        self.new_evidence: dict[str, Path] = {}
        self._prompt_sets, self._prompts = load_prompts(cfg)
        self._fingerprint = model_fingerprint(cfg.model.path)

    # -- engines ------------------------------------------------------------------------------

    def engine(self, version: str) -> EngineConfig:
        base = self.cfg.engines["new"]
        return dataclasses.replace(base, spec=self.pin.at(version))

    def step_cfg(self, version: str) -> GateConfig:
        engines = {"old": self.engine(self.good_version), "new": self.engine(version)}
        return dataclasses.replace(self.cfg, engines=engines)

    def prepare(self, version: str) -> PreparedEngine:
        """The release's environment, built in the background from now (once)."""
        if version not in self.prepared:
            job = EngineJob("new", self.engine(version))
            self.prepared[version] = PreparedEngine(job, self.cfg.docker, self.log).start()
        return self.prepared[version]

    def close(self) -> None:
        for env in self.prepared.values():
            env.cancel()

    # -- the two ends ---------------------------------------------------------------------------

    def run_ends(self) -> tuple[Reading, Reading]:
        """Replay the good and the bad release (one run), and judge good against itself."""
        good, bad = self.good_version, self.bad_version
        self.log(f"bisect: replaying the good ({good}) and the bad release ({bad})")
        out = self.out / "steps" / bad
        jobs = [EngineJob("old", self.engine(good)), EngineJob("new", self.engine(bad))]
        started = time.perf_counter()
        result = run_gate(self.step_cfg(bad), out, self.log, jobs)
        self.replays += 2
        self.replay_s += sum(e.worker_s for e in result.engines)
        old, new = result.engines
        if old.status != "ok":
            raise GateError(
                f"bisect: the good release {self.pin.at(good)} produced no evidence: {old.error}"
            )
        self.good_evidence = result.run_dir / "engines" / "old"
        if new.status != "ok":
            raise GateError(
                f"bisect: the bad release {self.pin.at(bad)} produced no evidence: {new.error}"
            )
        self.new_evidence[bad] = result.run_dir / "engines" / "new"
        self.new_evidence[good] = self.good_evidence
        bad_reading = self.target.read(self._judge(result.run_dir, self.step_cfg(bad)))
        self.steps[bad] = Step(
            bad,
            self.pin.at(bad),
            CHANGED,
            bad_reading,
            run_dir=str(result.run_dir),
            seconds=round(time.perf_counter() - started, 1),
            replays=2,
        )
        good_dir = self._pair_run(
            self.out / "steps" / good, self.good_evidence, self.good_evidence, good
        )
        good_reading = self.target.read(self._judge(good_dir, self.step_cfg(good)))
        self.steps[good] = Step(good, self.pin.at(good), HELD, good_reading, run_dir=str(good_dir))
        return good_reading, bad_reading

    # -- one release between ------------------------------------------------------------------

    def run_step(self, version: str, good: Reading, bad: Reading) -> Step:
        """Replay ``version`` against the good release's evidence; judge; replay again while ambiguous."""
        started = time.perf_counter()
        step = Step(version, self.pin.at(version), SKIPPED)
        for attempt in range(1 + self.reruns):
            label = version if attempt == 0 else f"{version}-rerun{attempt}"
            before = self.replays
            run_dir, error = self._replay_against_good(version, self.out / "steps" / label)
            step.replays += self.replays - before
            if error is not None:
                step.outcome, step.reason, step.run_dir = SKIPPED, error, str(run_dir)
                break
            reading = self.target.read(self._judge(run_dir, self.step_cfg(version)))
            outcome = classify(reading, good, bad)
            step.reading, step.run_dir = reading, str(run_dir)
            step.outcome = outcome
            if outcome != AMBIGUOUS:
                self.new_evidence[version] = run_dir / "engines" / "new"
                break
            step.reason = (
                "; ".join(reading.near) or f"the target reads {reading.status}: neither side"
            )
            self.log(
                f"bisect: {version} is ambiguous ({step.reason}); "
                + ("replaying it again" if attempt < self.reruns else "left undecided")
            )
        step.seconds = round(time.perf_counter() - started, 1)
        return step

    def _replay_against_good(self, version: str, out: Path) -> tuple[Path, str | None]:
        """A run directory: the good release's evidence as old, ``version`` replayed as new."""
        assert self.good_evidence is not None
        cfg = self.step_cfg(version)
        run_dir = RunDirectory.create(out, cfg.gate_id)
        _link_tree(self.good_evidence, run_dir.engine_dir("old"))
        old_entry = EngineRun(
            "old",
            self.pin.at(self.good_version),
            cfg.engines["old"].runner,
            "ok",
            "engines/old",
            reused={"from": str(self.good_evidence)},
        )
        env = self.prepare(version)
        [new] = run_engine(
            EngineJob("new", cfg.engines["new"]),
            [Target(cfg, run_dir)],
            self._prompts,
            self.log,
            prepared=env,
        )
        if new.worker_s:  # the engine ran (an environment that could not be built replayed nothing)
            self.replays += 1
            self.replay_s += new.worker_s
        manifest = run_manifest(
            cfg, self._prompt_sets, self._fingerprint, time.time(), [old_entry, new]
        )
        final = run_dir.finish(manifest, complete=new.status == "ok")
        if new.status != "ok":
            return final, _first_line(new.error or "the engine produced no evidence")
        return final, None

    def _pair_run(
        self, out: Path, old: Path, new: Path, version: str, old_version: str | None = None
    ) -> Path:
        """A run directory of two existing evidence folders (no replay), for judging."""
        cfg = self.step_cfg(version)
        run_dir = RunDirectory.create(out, cfg.gate_id)
        _link_tree(old, run_dir.engine_dir("old"))
        _link_tree(new, run_dir.engine_dir("new"))
        entries = [
            EngineRun(
                "old",
                self.pin.at(old_version or self.good_version),
                cfg.engines["old"].runner,
                "ok",
                "engines/old",
                reused={"from": str(old)},
            ),
            EngineRun(
                "new",
                self.pin.at(version),
                cfg.engines["new"].runner,
                "ok",
                "engines/new",
                reused={"from": str(new)},
            ),
        ]
        return run_dir.finish(
            run_manifest(cfg, self._prompt_sets, self._fingerprint, time.time(), entries), True
        )

    def _judge(self, run_dir: Path, cfg: GateConfig) -> dict[str, Any]:
        from gate import report
        from gate.judge import judge

        judgment = judge(run_dir, cfg)
        built = report.build(run_dir, cfg, judgment)
        report.write(run_dir, built)
        return json.loads((run_dir / REPORT_FILE).read_text(encoding="utf-8"))

    # -- the search -----------------------------------------------------------------------------

    def search(self, good: Reading, bad: Reading) -> tuple[int, int]:
        """Binary search over ``self.versions``; (index of the last held, index of the first changed)."""
        lo, hi = 0, len(self.versions) - 1
        while True:
            pick = self._next(lo, hi)
            if pick is None:
                return lo, hi
            version = self.versions[pick]
            self.prepare(version)  # begun earlier as a lookahead, or now
            for nxt in self._lookahead(lo, hi, pick):  # build both possible next environments now
                self.prepare(self.versions[nxt])
            self.log(
                f"bisect: step {len(self.steps) - 1}: {version} ({hi - lo - 1} release(s) left between "
                f"{self.versions[lo]} and {self.versions[hi]})"
            )
            step = self.run_step(version, good, bad)
            self.steps[version] = step
            self.log(
                f"bisect: {version}: {step.outcome}"
                + (f" ({step.reading.status})" if step.reading else "")
                + (f": {step.reason}" if step.reason else "")
            )
            if step.outcome == CHANGED:
                hi = pick
            elif step.outcome == HELD:
                lo = pick

    def _next(self, lo: int, hi: int) -> int | None:
        """The untested release nearest the middle of (lo, hi); None when every one is tested."""
        inside = [i for i in range(lo + 1, hi) if self.versions[i] not in self.steps]
        if not inside:
            return None
        middle = (lo + hi) / 2
        return min(inside, key=lambda i: (abs(i - middle), i))

    def _lookahead(self, lo: int, hi: int, pick: int) -> list[int]:
        return [
            i for i in (self._next(lo, pick), self._next(pick, hi)) if i is not None and i != pick
        ]

    # -- what changed at the boundary ---------------------------------------------------------

    def boundary(self, last_held: str, first_changed: str) -> dict[str, Any]:
        """The two adjacent releases judged against each other, their features, the release notes."""
        old, new = self.new_evidence.get(last_held), self.new_evidence.get(first_changed)
        found: dict[str, Any] = {
            "notes": release_notes_url(self.pin.project, Version(first_changed))
        }
        if old is not None and new is not None:
            run_dir = self._pair_run(self.out / "boundary", old, new, first_changed, last_held)
            report = self._judge(run_dir, self.step_cfg(first_changed))
            parity = next((c for c in report["checks"] if c["id"] == "config-parity"), None)
            found["run_dir"] = str(run_dir)
            found["settings"] = _setting_differences(parity)
            found["checks"] = {
                c["id"]: {"status": c["status"], "summary": c["summary"]} for c in report["checks"]
            }
        found["features"] = _feature_changes(last_held, first_changed, self.log)
        return found


def _setting_differences(parity: dict[str, Any] | None) -> dict[str, Any]:
    """config-parity between the two releases: each effective setting whose meaning differs."""
    diff = ((parity or {}).get("details") or {}).get("diff") or {}
    return {k: v for k, v in diff.items() if isinstance(v, dict)}


def _feature_changes(old: str, new: str, log: Log) -> dict[str, Any]:
    """The worker features (gate.compat) whose availability differs between the two releases'
    sources; where a source cannot be read, why."""
    from gate import compat, vllm_source

    found: dict[str, dict[str, bool]] = {}
    for version in (old, new):
        base = Version(version).base_version
        try:
            if vllm_source.cached_source(base) is None:
                log(
                    f"bisect: reading vLLM {base}'s source for its features (one download, then cached)"
                )
            root = vllm_source.ensure_source(base)
            found[version] = {k: f.present for k, f in vllm_source.check_release(root).items()}
        except (vllm_source.FetchError, OSError, ValueError) as exc:
            return {"error": f"vLLM {base}'s source could not be read: {_first_line(str(exc))}"}
    labels = {f.key: f.label for f in compat.FEATURES}
    changed = [
        {"feature": labels.get(k, k), "key": k, old: found[old].get(k), new: found[new].get(k)}
        for k in sorted(set(found[old]) | set(found[new]))
        if found[old].get(k) != found[new].get(k)
    ]
    return {"changed": changed}


def _link_tree(src: Path, dst: Path) -> None:
    from gate.repeat import _link_or_copy

    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst, copy_function=_link_or_copy)
    evidence.load(dst, allow_nonfinite_engine=True)  # a reused folder is validated like a fresh one


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0][:400]


# -- the whole command --------------------------------------------------------------------------------


def bisect(
    cfg: GateConfig,
    pin: Pin,
    good: str,
    bad: str,
    releases: Sequence[Release],
    target: TargetSpec,
    out: Path,
    log: Log,
    reruns: int = 1,
) -> BisectResult:
    """Bisect ``releases`` (strictly between ``good`` and ``bad``, oldest first) for ``target``."""
    started = time.perf_counter()
    if not releases:  # adjacent releases: the bad one is the answer, no replay needed
        log(f"bisect: no release lies between {good} and {bad}: {bad} is the one")
        return BisectResult(
            pin.project,
            pin.at(good),
            pin.at(bad),
            target.describe(),
            [],
            [],
            "adjacent",
            first_changed=bad,
            last_held=good,
        )
    b = Bisector(cfg, pin, good, bad, releases, target, out, log, reruns)
    result = BisectResult(
        pin.project, pin.at(good), pin.at(bad), target.describe(), b.candidates, [], "inconclusive"
    )
    try:
        first = b._next(0, len(b.versions) - 1)
        if first is not None:  # built while the two ends (prepared by their run) replay
            b.prepare(b.versions[first])
        good_reading, bad_reading = b.run_ends()
        if not changes_at_all(good_reading, bad_reading):
            result.status = "no-change"
            log(
                f"bisect: {target.describe()} reads {bad_reading.status} at {bad} and {good_reading.status} where "
                "nothing changed: nothing to bisect"
            )
        else:
            lo, hi = b.search(good_reading, bad_reading)
            result.last_held, result.first_changed = b.versions[lo], b.versions[hi]
            result.untested_between = [v for v in b.versions[lo + 1 : hi]]
            result.status = "found" if not result.untested_between else "inconclusive"
            result.boundary = b.boundary(b.versions[lo], b.versions[hi])
    finally:
        b.close()
        order = {v: i for i, v in enumerate(b.versions)}
        result.steps = sorted(b.steps.values(), key=lambda s: order[s.version])
        result.replays, result.replay_s = b.replays, round(b.replay_s, 1)
        result.wall_s = round(time.perf_counter() - started, 1)
    return result


def attach(result: BisectResult, report_path: Path) -> None:
    """Add the result to a report.json (``bisect``), so ``gate comment`` and ``gate publish`` show it."""
    from gate.files import read_report_json
    from gate.report_model import Report

    data, file = read_report_json(report_path)
    data["bisect"] = result.for_report()
    Report.from_dict(data, str(file))  # what the renderer will read must hold the schema
    write_json(file, data)


def write(result: BisectResult, out: Path) -> tuple[Path, Path]:
    """bisect.json and bisect.md under ``out``."""
    from gate.render.bisect import render_bisect

    json_path, md_path = out / BISECT_FILE, out / SUMMARY_FILE
    write_json(json_path, result.to_dict())
    md_path.write_text(render_bisect(result.to_dict()), encoding="utf-8")
    return json_path, md_path
