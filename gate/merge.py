"""Merge several report.json files (one per model or matrix job) into one report: one verdict, one comment.

The result keeps the schema (``gate-report/1``) and adds ``parts``: each input report in full (minus
its own ``schema``), in the order given. Top-level fields summarise them: the verdict is the worst part
verdict (ERROR > FAIL > WARN > PASS), counts are summed, ``fail_on`` is ``warn`` if any part used it,
and ``exit_code`` is recomputed from those. ``checks`` lists every part's checks, each tagged with its
part's ``gate_id`` under ``part``, so consumers that walk ``checks`` (annotations) still see them all.
Merging a merged report flattens its parts.

The summaries are computed from the typed reports; the parts and checks are copied from the JSON
they were read from (``document``), so keys this gate does not interpret survive the merge.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Sequence
from typing import Any

from gate import __version__
from gate.errors import ConfigError
from gate.report_model import SCHEMA, Report, ReportBody
from gate.verdict import RANK, STATUSES, exit_code, worst_verdict


def _parts_of(report: Report) -> tuple[ReportBody, ...]:
    return report.parts if report.parts is not None else (report,)


def _part_document(part: ReportBody) -> dict[str, Any]:
    """The part as its JSON, without a schema line (a part has none of its own)."""
    return {k: copy.deepcopy(v) for k, v in part.document.items() if k != "schema"}


def merged_gate_id(ids: list[str]) -> str:
    """One id when all parts share it, else the ids joined by '+' (hashed when that gets long)."""
    unique = sorted(set(ids))
    if len(unique) == 1:
        return unique[0]
    joined = "+".join(unique)
    if len(joined) <= 80:
        return joined
    return f"merged-{len(unique)}-{hashlib.sha256(joined.encode()).hexdigest()[:12]}"


def merge_reports(reports: Sequence[Report]) -> dict[str, Any]:
    """The merged report.json document of ``reports``, in the order given."""
    if not reports:
        raise ConfigError("merge: no reports given")
    parts = [p for r in reports for p in _parts_of(r)]
    verdict = worst_verdict(p.verdict or "ERROR" for p in parts)
    fail_on = "warn" if any(p.fail_on == "warn" for p in parts) else "fail"
    counts = {s: sum(p.counts.get(s, 0) for p in parts) for s in STATUSES}
    ids = [p.gate_id or "?" for p in parts]
    starts = [p.run.started for p in parts if p.run and p.run.started]
    ends = [p.run.finished for p in parts if p.run and p.run.finished]
    baseline_worst = max(
        ((p.baseline.status if p.baseline else None) or "SKIP" for p in parts),
        key=lambda s: RANK.get(s, 0),
    )
    commands: dict[str, str] = {}
    for key in ("reproduce", "regenerate_baseline"):
        lines = [c for p in parts if p.commands and (c := getattr(p.commands, key))]
        if lines:
            commands[key] = "\n".join(dict.fromkeys(lines))
    return {
        "schema": SCHEMA,
        "gate_version": __version__,
        "gate_id": merged_gate_id(ids),
        "verdict": verdict,
        "exit_code": exit_code(verdict, fail_on),
        "fail_on": fail_on,
        "counts": counts,
        "errors": [f"{gid}: {e}" for gid, p in zip(ids, parts, strict=True) for e in p.errors],
        "run": {
            "started": min(starts) if starts else None,
            "finished": max(ends) if ends else None,
        },
        "engines": {},
        "baseline": {
            "path": None,
            "status": baseline_worst,
            "message": f"worst baseline status of {len(parts)} parts",
            "differences": [
                f"{gid}: {d}"
                for gid, p in zip(ids, parts, strict=True)
                for d in (p.baseline.differences if p.baseline else ())
            ],
            "manifest": None,
        },
        "checks": [
            {**copy.deepcopy(dict(c.document)), "part": gid}
            for gid, p in zip(ids, parts, strict=True)
            for c in p.checks
        ],
        "commands": commands,
        "parts": [_part_document(p) for p in parts],
    }
