"""Merge several report.json files (one per model or matrix job) into one report: one verdict, one comment.

The result keeps the schema (``gate-report/1``) and adds ``parts``: each input report in full (minus
its own ``schema``), in the order given. Top-level fields summarise them: the verdict is the worst part
verdict (ERROR > FAIL > WARN > PASS), counts are summed, ``fail_on`` is ``warn`` if any part used it,
and ``exit_code`` is recomputed from those. ``checks`` lists every part's checks, each tagged with its
part's ``gate_id`` under ``part``, so consumers that walk ``checks`` (annotations) still see them all.
Merging a merged report flattens its parts.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any

from gate import __version__
from gate.errors import ConfigError
from gate.report_schema import SCHEMA_PREFIX, SUPPORTED_MAJOR, validate_report
from gate.verdict import RANK, STATUSES, exit_code, worst_verdict

SCHEMA = f"{SCHEMA_PREFIX}{SUPPORTED_MAJOR}"


def _parts_of(report: dict, index: int) -> list[dict]:
    validate_report(report, f"report {index + 1}")
    if isinstance(report.get("parts"), list):
        return [copy.deepcopy(p) for p in report["parts"] if isinstance(p, dict)]
    return [{k: copy.deepcopy(v) for k, v in report.items() if k != "schema"}]


def merged_gate_id(ids: list[str]) -> str:
    """One id when all parts share it, else the ids joined by '+' (hashed when that gets long)."""
    unique = sorted(set(ids))
    if len(unique) == 1:
        return unique[0]
    joined = "+".join(unique)
    if len(joined) <= 80:
        return joined
    return f"merged-{len(unique)}-{hashlib.sha256(joined.encode()).hexdigest()[:12]}"


def merge_reports(reports: list[dict]) -> dict[str, Any]:
    if not reports:
        raise ConfigError("merge: no reports given")
    parts = [p for i, r in enumerate(reports) for p in _parts_of(r, i)]
    verdicts = [str(p.get("verdict") or "ERROR") for p in parts]
    verdict = worst_verdict(verdicts)
    fail_on = "warn" if any(p.get("fail_on") == "warn" for p in parts) else "fail"
    counts = {s: sum(int((p.get("counts") or {}).get(s) or 0) for p in parts) for s in STATUSES}
    ids = [str(p.get("gate_id") or "?") for p in parts]
    starts = [s for p in parts if (s := (p.get("run") or {}).get("started"))]
    ends = [s for p in parts if (s := (p.get("run") or {}).get("finished"))]
    baseline_worst = max(((p.get("baseline") or {}).get("status") or "SKIP" for p in parts),
                         key=lambda s: RANK.get(s, 0))  # fmt: skip
    commands: dict[str, str] = {}
    for key in ("reproduce", "regenerate_baseline"):
        lines = [c for p in parts if (c := (p.get("commands") or {}).get(key))]
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
        "errors": [
            f"{gid}: {e}" for gid, p in zip(ids, parts, strict=True) for e in p.get("errors") or []
        ],
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
                for d in (p.get("baseline") or {}).get("differences") or []
            ],
            "manifest": None,
        },
        "checks": [
            {**c, "part": gid}
            for gid, p in zip(ids, parts, strict=True)
            for c in p.get("checks") or []
            if isinstance(c, dict)
        ],
        "commands": commands,
        "parts": parts,
    }
