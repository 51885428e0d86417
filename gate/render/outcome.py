"""What a report means, derived for the comment's opening: root causes and their fix, the step where
the GRPO run left its band, and a replay that got slower.

Nothing here is judged anew: the checks' statuses stand. A root cause is an RL-relevant setting that
``config-parity`` found changed; a failing check is grouped under it when that setting is known to
move what the check measures (:data:`EXPLAINS`), so "one change fails 3 checks" reads as one fix, not
three problems. A failing check no changed setting explains keeps its own diagnosis and advice.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gate.report_model import Check, Engine, Grpo, ReportBody
from gate.verdict import rank

BAD = ("WARN", "FAIL", "ERROR")

# Setting -> the checks whose figures it moves (besides config-parity, which reports the change).
# Order matters: a check two changed settings could explain is grouped under the first listed here.
_NUMERICS = ("forward-drift", "train-inference-mismatch", "greedy-and-length", "grpo-trajectory")
EXPLAINS: Mapping[str, frozenset[str]] = {
    "logprobs_mode": frozenset(
        {"logprob-semantics", "train-inference-mismatch", "grpo-trajectory"}
    ),
    "dtype": frozenset({*_NUMERICS, "precision", "logprob-semantics"}),
    "quantization": frozenset({*_NUMERICS, "precision"}),
    "kv_cache_dtype": frozenset(_NUMERICS),
    "default_sampling_params": frozenset(
        {"greedy-and-length", "logprob-semantics", "train-inference-mismatch", "grpo-trajectory"}
    ),
    "generation_config": frozenset({"greedy-and-length", "logprob-semantics"}),
    "generation_config_overrides": frozenset({"greedy-and-length", "logprob-semantics"}),
    "override_generation_config": frozenset({"greedy-and-length", "logprob-semantics"}),
    "enable_prefix_caching": frozenset({"weight-sync", "grpo-trajectory"}),
    "async_scheduling": frozenset({"weight-sync", "grpo-trajectory", "train-inference-mismatch"}),
    "logits_processors": frozenset({"logprob-semantics", "train-inference-mismatch"}),
}
PARITY = "config-parity"

# A replay this many times slower than the old engine's (per sampled token, or in all) is flagged.
SLOWER_RATIO = 1.5


@dataclass(frozen=True)
class Cause:
    """One changed setting config-parity flagged, and the other failing checks it explains."""

    key: str
    old: Any
    new: Any
    status: str  # the worst of its own parity row and the checks it explains
    checks: tuple[Check, ...]  # the failing checks it explains, config-parity not included

    @property
    def fix(self) -> str:
        """The engine argument that restores the old behaviour, in Python spelling."""
        return f"{self.key}={_python(self.old)}" if self.old is not None else ""


@dataclass(frozen=True)
class Other:
    """A failing check no changed setting explains: what it found and what to do."""

    check: Check
    finding: str
    advice: str


@dataclass(frozen=True)
class GrpoFlag:
    """One GRPO statistic that did not pass: its effect, status and δ90."""

    name: str
    status: str
    effect: float | None
    delta90: float | None


@dataclass(frozen=True)
class GrpoFinding:
    """The GRPO run's statistics that did not pass, against whose seeds."""

    flags: tuple[GrpoFlag, ...]
    compared_with: str


@dataclass(frozen=True)
class Speed:
    """Replay time and sampling throughput of both engines; ``ratio``: new over old, the worse of the two."""

    old_total_s: float | None  # replay time outside the GRPO run (_replay_s)
    new_total_s: float | None
    old_tokens_per_s: float | None
    new_tokens_per_s: float | None
    old_reused: bool
    without_grpo: bool = False  # the totals leave the GRPO run out

    @property
    def total_ratio(self) -> float | None:
        return _ratio(self.new_total_s, self.old_total_s)

    @property
    def sample_ratio(self) -> float | None:
        return _ratio(self.old_tokens_per_s, self.new_tokens_per_s)

    @property
    def slower(self) -> bool:
        return any(
            r is not None and r > SLOWER_RATIO for r in (self.total_ratio, self.sample_ratio)
        )


@dataclass(frozen=True)
class Outcome:
    causes: tuple[Cause, ...]
    others: tuple[Other, ...]
    grpo: GrpoFinding | None
    speed: Speed | None

    parity: Check | None  # config-parity, when it flagged the causes

    @property
    def cause_checks(self) -> tuple[Check, ...]:
        """Every check the causes explain, config-parity first, each once."""
        claimed = [c for cause in self.causes for c in cause.checks]
        return (self.parity, *claimed) if self.parity is not None and self.causes else ()


def outcome(r: ReportBody) -> Outcome:
    causes = _causes(r)
    return Outcome(
        causes, _others(r, causes), grpo_finding(r.grpo), speed(r.engines), parity_check(r)
    )


def _python(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, (bool, int, float)) or value is None:
        return repr(value)
    return json.dumps(value, sort_keys=True, default=str)


def _causes(r: ReportBody) -> tuple[Cause, ...]:
    parity = parity_check(r)
    if parity is None:
        return ()
    status_of = {m.name: m.status for m in parity.measurements}
    # the changed settings the check flagged, explaining settings first (EXPLAINS order)
    order = {k: i for i, k in enumerate(EXPLAINS)}
    flagged = sorted(
        (k for k in parity.details.diff if status_of.get(k) in BAD),
        key=lambda k: (order.get(k, len(order)), k),
    )
    bad = [c for c in r.checks if c.status in BAD and c.id != PARITY]
    owner = {id(c): next((k for k in flagged if c.id in EXPLAINS.get(k, ())), None) for c in bad}
    out = []
    for k in flagged:
        claimed = tuple(c for c in bad if owner[id(c)] == k)
        worst = max([str(status_of[k]), *(c.status for c in claimed)], key=rank)
        change = parity.details.diff[k]
        out.append(Cause(k, change.old, change.new, worst, claimed))
    return tuple(out)


def parity_check(r: ReportBody) -> Check | None:
    """config-parity when it found a change that matters (WARN or worse)."""
    return next((c for c in r.checks if c.id == PARITY and c.status in BAD), None)


def _others(r: ReportBody, causes: tuple[Cause, ...]) -> tuple[Other, ...]:
    explained = {id(c) for cause in causes for c in cause.checks}
    out = []
    for c in sorted(r.checks, key=lambda c: -rank(c.status)):
        if c.status in BAD and id(c) not in explained and not (c.id == PARITY and causes):
            finding, advice = split_diagnosis(c.diagnosis or c.summary or "")
            out.append(Other(c, finding, advice))
    return tuple(out)


_FIX = re.compile(r"\bFix:\s*")


def split_diagnosis(text: str) -> tuple[str, str]:
    """(what was found, what to do): the text before and after ``Fix:``, else its first sentence and the rest."""
    text = " ".join(text.split())
    m = _FIX.search(text)
    if m:
        return text[: m.start()].rstrip(" :;."), text[m.end() :]
    cut = _first_sentence_end(text)
    if cut < 0:
        return text.rstrip("."), ""
    return text[:cut], text[cut + 2 :]


# A ". " after these, or inside parentheses, does not end a sentence: "(e.g. prompt 3, ...)".
_ABBREVIATIONS = ("e.g", "i.e", "vs", "cf")


def _first_sentence_end(text: str) -> int:
    """The index of the period that ends the first sentence, -1 when there is none."""
    for m in re.finditer(r"\. ", text):
        head = text[: m.start()]
        if head.count("(") <= head.count(")") and not head.lower().endswith(_ABBREVIATIONS):
            return m.start()
    return -1


def grpo_finding(g: Grpo | None) -> GrpoFinding | None:
    """The GRPO run's statistics that did not pass, worst first; None where all passed or none ran."""
    if g is None:
        return None
    flags = sorted(
        (
            GrpoFlag(name, s.status, s.effect, s.delta90)
            for name, s in g.statistics.items()
            if s is not None and s.status not in (None, "PASS")
        ),
        key=lambda f: -rank(f.status),
    )
    return GrpoFinding(tuple(flags), g.compared_with or "old") if flags else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b is not None and a > 0 and b > 0 else None


def _replay_s(e: Engine | None) -> float | None:
    """An engine's replay time outside the GRPO run: beside a baseline the old engine trains one
    seed and the new engine several, so their GRPO phases are not the same work."""
    total = _timing(e, "total_s")
    grpo = _timing(e, "grpo_s") or 0.0
    return None if total is None else max(total - grpo, 0.0) or None


def _timing(e: Engine | None, key: str) -> float | None:
    v = None if e is None else e.timings.get(key)
    return float(v) if isinstance(v, (int, float)) and v > 0 else None


def _throughput(e: Engine | None) -> float | None:
    seconds = _timing(e, "sample_s")
    tokens = None if e is None else e.counts.get("sampled_tokens")
    return tokens / seconds if seconds and isinstance(tokens, int) and tokens > 0 else None


def speed(engines: Mapping[str, Engine]) -> Speed | None:
    old, new = engines.get("old"), engines.get("new")
    if new is None or _timing(new, "total_s") is None:
        return None
    return Speed(
        old_total_s=_replay_s(old),
        new_total_s=_replay_s(new),
        old_tokens_per_s=_throughput(old),
        new_tokens_per_s=_throughput(new),
        old_reused=old is not None and old.reused is not None,
        without_grpo=_timing(new, "grpo_s") is not None,
    )
