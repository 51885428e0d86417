"""The sections of a rendered report, each prepared from the typed report and drawn by its template.

Layout lives in ``templates/*.md.j2``; this module prepares plain data for them, one function per
section. Every value a template prints goes through the environment's finalizer, which escapes it
with :func:`gate.render.escape.inline` unless it is already :class:`~gate.render.escape.Safe`
(produced by an escape filter or by this module from trusted parts), so a forgotten filter means
escaped text, never injected Markdown.

Order: headline, the outcome (root causes and their fix, the GRPO statistics that did not pass, replay
speed), the config diff when it matters, errors, the checks table worst first (collapsed when all
pass), [omission note], what failed and how to fix it, then ``<details>``: per-check metrics,
environment (what differs), baseline provenance, worst tokens and changed greedy completions, GRPO
trajectories, the memory plan; last the reproduce / regenerate-baseline commands and the footer. A
merged report (``parts``) opens with a per-model table, then each part's sections worst verdict
first, and one commands block and footer for all. Every table is laid out to fit GitHub's 780 px
comment column (tests/browser measures it).

Each section carries a priority (:mod:`gate.render.budget` drops the lowest first to meet a budget).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from gate.render import charts, outcome, templates
from gate.render import escape as esc
from gate.render.bisect import render_bisect
from gate.render.budget import OMITTED, REQUIRED, Limits, Section
from gate.render.escape import Safe
from gate.report_model import (
    Baseline,
    BaselineManifest,
    Bisection,
    Check,
    Engine,
    Grpo,
    GrpoMetric,
    Measurement,
    MemoryPlan,
    ModelRef,
    PromptSetRef,
    RecordedFrom,
    Report,
    ReportBody,
    Run,
)
from gate.verdict import ICON, RANK, icon, rank

if TYPE_CHECKING:
    from gate.github.event import WorkflowRun

_COUNT_WORDS = (
    ("FAIL", "failed"),
    ("ERROR", "errored"),
    ("WARN", "warned"),
    ("PASS", "passed"),
    ("SKIP", "skipped"),
)
_BAD = ("WARN", "FAIL", "ERROR")

# Effective settings worth a row in the environment fingerprint, in this order.
KEY_SETTINGS = (
    "logprobs_mode", "enable_prefix_caching", "async_scheduling", "enable_chunked_prefill", "dtype", "kv_cache_dtype",
    "quantization", "attention_backend", "compilation_mode", "cudagraph_mode", "enforce_eager", "max_num_batched_tokens",
    "max_num_seqs", "max_model_len", "generation_config", "seed", "tensor_parallel_size",
)  # fmt: skip

# Section priorities: higher survives longer (budget.REQUIRED is never dropped).
P_ERRORS, P_PROBLEM_FAIL, P_PROBLEM_WARN, P_BASELINE_BAD, P_COMMANDS = 95, 85, 80, 75, 70
P_CONFIG_BAD, P_BASELINE, P_CONFIG, P_ENV = 90, 60, 55, 50
P_BISECT = 88  # which release changed it: right below the change itself
P_METRICS_BAD, P_GRPO, P_TOKENS, P_MEMORY, P_METRICS = 45, 40, 30, 25, 20
P_MEMORY_BAD = (
    62  # a plan that does not fit explains the run's failure: kept nearly as long as config
)


# ------------------------------------------------------------------------------------- templates
_finalize, _render = templates.finalize, templates.render


def omitted_note(n: int, keys: Sequence[str], limit_name: str) -> str:
    """The note that stands where sections were dropped to fit ``limit_name``."""
    return _render(
        "omitted", n=n, keys=keys[:12], more=max(0, len(keys) - 12), limit_name=limit_name
    )


# -------------------------------------------------------------------------------------- sections
def build(report: Report, lim: Limits, pr_run: WorkflowRun | None = None) -> list[Section]:
    """Every section of ``report`` in reading order; ``pr_run``: the report is that PR run's own word."""
    if pr_run is not None:
        report = _without_commands(report)
    if report.parts:
        # worst part first (stable): what needs attention leads, and passing parts are shed first
        ordered = sorted(report.parts, key=lambda p: -rank(p.verdict))
        out = [Section("headline", REQUIRED, _headline(report, lim, parts=report.parts))]
        out.append(
            Section("parts", REQUIRED, _render("parts", rows=[_part_row(p, lim) for p in ordered]))
        )
        for i, part in enumerate(ordered):
            out += _report_sections(
                part,
                lim,
                prefix=f"part:{i + 1}-{esc.marker_id(part.gate_id or 'part')}/",
                level="###",
            )
        # after the parts: the list of what was cut must not push the first part's fix off the screen
        out.append(Section(OMITTED, REQUIRED, ""))
        out.append(Section("commands", P_COMMANDS, _commands(report, lim)))
    else:
        out = _report_sections(report, lim, prefix="", level="##", top=True)
    out.append(Section("footer", REQUIRED, _footer(report)))
    if pr_run is not None:
        out.insert(1, Section("provenance", REQUIRED, _provenance(pr_run)))
    return [s for s in out if s.text or s.key == OMITTED]


def _bisect(found: Bisection) -> str:
    return render_bisect(asdict(found)).strip()


def _all_pass(r: ReportBody) -> bool:
    return (
        r.verdict == "PASS" and not r.errors and all(c.status in ("PASS", "SKIP") for c in r.checks)
    )


def _report_sections(
    r: ReportBody, lim: Limits, prefix: str, level: str, top: bool = False
) -> list[Section]:
    checks = sorted(r.checks, key=lambda c: -rank(c.status))  # worst first, stable
    found = outcome.outcome(r)
    out = [Section(prefix + "headline", REQUIRED, _headline(r, lim, level=level))]
    out.append(Section(prefix + "outcome", REQUIRED, _outcome(r, found, lim)))
    parity = next((c for c in checks if c.id == "config-parity" and c.status != "SKIP"), None)
    parity_bad = parity is not None and parity.status in _BAD
    if parity is not None and parity_bad:  # the change itself, above the fold
        out.append(Section(prefix + "config-diff", P_CONFIG_BAD, _config_diff(parity, lim, True)))
    if r.bisect is not None:
        out.append(Section(prefix + "bisect", P_BISECT, _bisect(r.bisect)))
    out += _errors(r, lim, prefix)
    rows = [_check_row(c, lim) for c in checks]
    # all passed: a few lines; the checks and everything below them wait behind one summary line
    wrap = _all_pass(r) and bool(rows)
    if wrap:
        summary = f"✅ All {len(rows)} checks passed: the checks, their metrics and the details"
        out.append(Section(prefix + "open", REQUIRED, f"<details><summary>{summary}</summary>"))
    out.append(Section(prefix + "checks", REQUIRED, _render("checks_table", rows=rows)))
    # a merged report's part: the outcome and the table above, what failed and the rest folded
    fold = not wrap and not top and bool(rows)
    if fold:
        summary = f"{icon(r.verdict)} What failed in part {esc.code_inline(r.gate_id or '?', 60)}, and the details"
        out.append(Section(prefix + "open", REQUIRED, f"<details><summary>{summary}</summary>"))
    if top:
        out.append(Section(OMITTED, REQUIRED, ""))
    sub = level + "#"
    for c in checks:
        if c.status in _BAD:
            p = P_PROBLEM_WARN if c.status == "WARN" else P_PROBLEM_FAIL
            out.append(Section(f"{prefix}problem:{c.id}", p, _problem(c, r, lim, sub)))
    for c in checks:
        if c.measurements:
            p = P_METRICS if c.status in ("PASS", "SKIP") else P_METRICS_BAD
            out.append(Section(f"{prefix}metrics:{c.id}", p, _metrics(c, r, lim)))
    if parity is not None and not parity_bad:
        out.append(Section(prefix + "config-diff", P_CONFIG, _config_diff(parity, lim, False)))
    if r.engines:
        out.append(Section(prefix + "environment", P_ENV, _environment(r, lim)))
    if r.baseline is not None:
        bad = r.baseline.status in _BAD or bool(r.baseline.differences)
        p = P_BASELINE_BAD if bad else P_BASELINE
        out.append(Section(prefix + "baseline", p, _baseline(r.baseline, r, lim)))
    tokens = _worst_tokens(r, lim)
    if tokens:
        out.append(Section(prefix + "worst-tokens", P_TOKENS, tokens))
    greedy = _greedy_examples(r, lim)
    if greedy:
        out.append(Section(prefix + "greedy-examples", P_TOKENS, greedy))
    if r.grpo is not None:
        out.append(Section(prefix + "grpo", P_GRPO, _grpo(r.grpo, lim)))
    if r.memory_plan is not None and r.memory_plan.engines:
        p = P_MEMORY if r.memory_plan.fits is not False else P_MEMORY_BAD
        out.append(Section(prefix + "memory-plan", p, _memory_plan(r.memory_plan)))
    if top:
        out.append(Section(prefix + "commands", P_COMMANDS, _commands(r, lim)))
    if wrap or fold:
        out.append(Section(prefix + "close", REQUIRED, "</details>"))
    return [s for s in out if s.text or s.key == OMITTED]


# ------------------------------------------------------------------------------------ provenance

# Only a plain https URL becomes a link (the event is GitHub's, but a link is worth one more check).
_RUN_URL = re.compile(r"https://[A-Za-z0-9.-]+(?::[0-9]+)?/[A-Za-z0-9._~/%-]*")


def _provenance(run: WorkflowRun) -> str:
    """Who vouches for this verdict: the pull request's own run, named by the event, not by the report."""
    label = "the pull request's workflow run"
    link = (
        f"[{label}]({run.html_url})" if run.html_url and _RUN_URL.fullmatch(run.html_url) else label
    )
    where = " ".join(
        p
        for p in (
            f"on {esc.code_inline(run.head_repo, 100)}" if run.head_repo else "",
            f"at {esc.code_inline(run.head_sha[:12])}" if run.head_sha else "",
        )
        if p
    )
    conclusion = f" It concluded {esc.code_inline(run.conclusion, 40)}." if run.conclusion else ""
    return (
        f"⚠️ **Reported by the pull request's own run.** This verdict and everything below come from the "
        f"artifact of {link}{' ' + where if where else ''}, which ran the pull request's code; this job did not "
        f"check them, and the report's commands are not shown.{conclusion}"
    )


def _without_commands(report: Report) -> Report:
    """The report without its commands: text a fork wrote must not appear as a command to run."""
    parts = report.parts
    return replace(
        report,
        commands=None,
        parts=None if parts is None else tuple(replace(p, commands=None) for p in parts),
    )


# -------------------------------------------------------------------------------------- headline
def _engine(r: ReportBody, name: str) -> dict[str, Any] | None:
    e = r.engines.get(name)
    if e is None:
        return None
    reused = e.reused
    return {
        "version": (e.identity or {}).get("vllm") or "?",
        "spec": e.spec or "?",
        "reused": {"created": str(reused.created or "?"), "key": str(reused.key or "?")[:12]}
        if reused is not None
        else None,
    }


def _counts_text(counts: Mapping[str, int]) -> str:
    total = sum(counts.values())
    words = [f"{counts[k]} {w}" for k, w in _COUNT_WORDS if counts.get(k)]
    return (
        f"{total} check{'s' if total != 1 else ''}: {', '.join(words)}"
        if words
        else "no checks ran"
    )


def _basename(path: str | None) -> str:
    s = (path or "").rstrip("/\\")
    return s.replace("\\", "/").rsplit("/", 1)[-1]


def _prompt_sets(sets: Iterable[PromptSetRef]) -> list[str]:
    return [
        f"{p.name if p.name is not None else '?'} ({p.records if p.records is not None else '?'})"
        for p in sets
    ]


def _headline(
    r: ReportBody, lim: Limits, level: str = "##", parts: Sequence[ReportBody] | None = None
) -> str:
    """The verdict line and what was compared; ``parts``: the headline of a merged report."""
    merged = parts is not None
    run = r.run or Run()
    model = run.model or ModelRef()
    verdict = str(r.verdict or "ERROR")
    baseline = r.baseline or Baseline()
    recorded = (baseline.manifest or BaselineManifest()).recorded_from or RecordedFrom()
    part_verdicts: dict[str | None, int] = {}
    for p in parts or ():
        part_verdicts[p.verdict] = part_verdicts.get(p.verdict, 0) + 1
    return _render(
        "headline",
        level=Safe(level),
        icon=Safe(icon(verdict)),
        verdict=verdict,
        gate_id=str(r.gate_id or "?"),
        part=level != "##",
        merged=merged,
        n_parts=len(parts or ()),
        parts_text=", ".join(
            f"{n} {w}" for k, w in _COUNT_WORDS for v, n in part_verdicts.items() if v == k
        ),
        old=_engine(r, "old"),
        new=_engine(r, "new"),
        baseline_from=recorded.spec,
        model_name=_basename(model.path) or None,
        model_sha=(model.sha256 or "")[:12] or None,
        prompt_sets=_prompt_sets(run.prompt_sets),
        counts=_counts_text(r.counts),
        exit_code=r.exit_code,
        fail_on=r.fail_on or "fail",
        baseline_status=baseline.status if not merged and baseline.status in _BAD else None,
        baseline_icon=Safe(ICON.get(str(baseline.status), "")),
        baseline_message=esc.truncate(esc.clean(baseline.message or ""), lim.text),
    )


def _errors(r: ReportBody, lim: Limits, prefix: str) -> list[Section]:
    errors = [esc.truncate(esc.clean(e), lim.text) for e in r.errors]
    logs = [
        {
            "name": name,
            "status": e.status,
            "error": esc.truncate(esc.clean(e.error or ""), lim.text),
            "log": esc.code_block(e.log_tail, "text", lim.log, keep="tail") if e.log_tail else None,
        }
        for name, e in r.engines.items()
        if e.status not in (None, "ok") or e.error
    ]
    if not errors and not logs:
        return []
    return [Section(prefix + "errors", P_ERRORS, _render("errors", errors=errors, engines=logs))]


# ---------------------------------------------------------------------------------------- outcome
def _titles(checks: Iterable[Check], lim: Limits) -> str:
    return ", ".join(_title(c, lim) for c in checks)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _cause_row(c: outcome.Cause, parity: Check | None, lim: Limits) -> dict[str, Any]:
    return {
        "key": esc.truncate(esc.clean(c.key), lim.cell),
        "old": _value(c.old, lim),
        "new": _value(c.new, lim),
        "checks": _titles((*((parity,) if parity else ()), *c.checks), lim),
        "fix": esc.truncate(esc.clean(c.fix), lim.cell) if c.fix else "",
    }


def _speed_line(sp: outcome.Speed | None) -> dict[str, Any] | None:
    if sp is None:
        return None
    return {
        "slower": sp.slower,
        "total_ratio": _ratio_text(sp.total_ratio),
        "sample_ratio": _ratio_text(sp.sample_ratio),
        "limit": f"{outcome.SLOWER_RATIO:g}x",
        "new": _replay_text(sp.new_total_s, sp.new_tokens_per_s),
        "old": _replay_text(sp.old_total_s, sp.old_tokens_per_s) if sp.old_total_s else None,
        "without_grpo": sp.without_grpo,
    }


def _ratio_text(r: float | None) -> str | None:
    return None if r is None else f"{r:.1f}x"


def _replay_text(total: float | None, tps: float | None) -> str:
    parts = [f"{esc.num(total)} s" if total else ""]
    if tps:
        parts.append(f"{tps:,.0f} tokens/s sampled" if tps >= 10 else f"{tps:.2g} tokens/s sampled")
    return ", ".join(p for p in parts if p)


def _grpo_line(g: outcome.GrpoFinding | None) -> dict[str, Any] | None:
    """The GRPO statistics that did not pass, for the opening: name, effect, status, δ90."""
    if g is None:
        return None
    flags = ", ".join(
        f"{esc.clean(f.name)} {_signed(f.effect)} ({esc.clean(f.status)}"
        + (f"; δ90 {esc.num(f.delta90)}" if f.delta90 is not None else "")
        + ")"
        for f in g.flags
    )
    return {"flags": flags, "compared_with": esc.clean(g.compared_with)}


def _outcome(r: ReportBody, found: outcome.Outcome, lim: Limits) -> str:
    """The opening: root causes with their fix, other failures with theirs, the GRPO statistics
    that did not pass, replay speed."""
    # config-parity found every change: named with the first, not repeated
    causes = [
        _cause_row(c, found.parity if i == 0 else None, lim) for i, c in enumerate(found.causes)
    ]
    cause_checks = found.cause_checks
    worst = max((c.status for c in cause_checks), key=rank, default="PASS")
    others = [
        {
            "icon": Safe(icon(o.check.status)),
            "title": _title(o.check, lim),
            "finding": esc.truncate(o.finding, lim.text),
            "advice": esc.truncate(o.advice, lim.cell and 3 * lim.cell),
        }
        for o in found.others
    ]
    return _render(
        "outcome",
        causes=causes,
        n_changes="One change" if len(causes) == 1 else f"{len(causes)} changes",
        verb=("fails" if len(causes) == 1 else "fail")
        if worst in ("FAIL", "ERROR")
        else ("warns in" if len(causes) == 1 else "warn in"),
        n_checks=_plural(len(cause_checks), "check"),
        cause_icon=Safe(icon(worst)),
        fixes=[c["fix"] for c in causes if c["fix"]],
        unpinned=[c["key"] for c in causes if not c["fix"]],
        others=others,
        grpo=_grpo_line(found.grpo),
        speed=_speed_line(found.speed),
        reused=(_engine(r, "old") or {}).get("reused"),
    )


# --------------------------------------------------------------------------------- checks table
INFO_ICON = (
    "\u2139\ufe0f"  # an informational figure: reported, not judged (no ✅: nothing was checked)
)
_INFO = "info"


# Checks that judge figures without warn/fail bounds: against the reference's seeds, by a setting's
# policy. Their rows are judged (not informational), and the note says against what.
_JUDGED_BY = {"grpo-trajectory": "the reference's seeds", "config-parity": "policy"}


def _judged(m: Measurement, c: Check | None = None) -> bool:
    return m.warn is not None or m.fail is not None or (c is not None and c.id in _JUDGED_BY)


def _bound(m: Measurement, value: float | None) -> str:
    if value is None:
        return ""
    direction = "<" if m.higher_is_worse is False else ">"  # not known: higher is worse
    return f"{direction} {esc.num(value)}"


def _threshold(m: Measurement, both: bool = False) -> str:
    """The bound that matters for the status (``both``: warn and fail), e.g. ``fail > 0.01``."""
    bounds = [(k, v) for k, v in (("warn", m.warn), ("fail", m.fail)) if v is not None]
    if not both:
        want = "warn" if m.status in ("PASS", "WARN", "SKIP") else "fail"
        bounds = [b for b in bounds if b[0] == want] or bounds[-1:]
    return ", ".join(f"{k} {_bound(m, v)}" for k, v in bounds)


def _key_measurement(c: Check) -> Measurement | None:
    """The judged figure that decided the check's status (the new engine's first), if any."""
    judged = [m for m in c.measurements if _judged(m, c)]
    if c.status in _BAD:
        judged = [m for m in judged if m.status == c.status]
    if not judged:
        return None
    return max(judged, key=lambda m: (RANK.get(str(m.status), 0), m.engine != "old"))


def _name(m: Measurement) -> str:
    return m.name if m.name is not None else "?"


def _metric_name(m: Measurement) -> str:
    return f"{_name(m)} ({m.engine})" if m.engine else _name(m)


def _title(c: Check, lim: Limits) -> str:
    return esc.truncate(esc.clean(c.title or c.id or "?"), lim.cell)


def _interval(c: Check, m: Measurement) -> dict[str, float] | None:
    """A measurement whose value is the lower end of a 95% interval: its estimate and upper end."""
    if not _name(m).startswith("regression_"):
        return None
    details = c.document.get("details")
    ci = details.get("regression") if isinstance(details, dict) else None
    if not isinstance(ci, dict):
        return None
    point, high = ci.get("point"), ci.get("high")
    if not isinstance(point, (int, float)) or not isinstance(high, (int, float)):
        return None
    return {"point": float(point), "high": float(high)}


def _measured(c: Check, m: Measurement, lim: Limits, both: bool = False) -> str:
    """A value with its threshold in the same cell: ``0.0142 (fail > 0.01)``; a bound says it is one."""
    if m.value is None or isinstance(m.value, str) or (c.id in _JUDGED_BY and m.note):
        return esc.truncate(esc.clean(m.note or m.value or "—"), lim.cell)
    text = esc.num(m.value)
    ci = _interval(c, m)
    bound = _threshold(m, both)
    text = f"{text} ({bound})" if bound else text
    if (
        ci is not None
    ):  # the judged value is the interval's lower end: say so, and show the estimate
        text = f"estimate {esc.num(ci['point'])}; 95% lower bound {text}"
    return text


def _check_row(c: Check, lim: Limits) -> dict[str, Any]:
    m = _key_measurement(c)
    if m is not None:
        metric, measured = _metric_name(m), _measured(c, m, lim)
    else:  # nothing with a threshold decided it: the check's own words (e.g. "new reports raw ...")
        metric, measured = esc.truncate(esc.clean(c.summary or ""), lim.cell), ""
    return {
        "icon": Safe(icon(c.status)),
        "status": c.status,
        "title": _title(c, lim),
        "metric": metric,
        "measured": measured,
    }


def _measurement_row(c: Check, m: Measurement, lim: Limits) -> dict[str, Any]:
    status = str(m.status or "?")
    info = not _judged(m, c) and status == "PASS"
    return {
        "icon": Safe(INFO_ICON if info else icon(status)),
        "status": _INFO if info else status,
        "name": esc.breakable_name(esc.truncate(esc.clean(_name(m)), lim.cell)),
        "engine": esc.truncate(esc.clean(m.engine or ""), lim.cell),
        "measured": _measured(c, m, lim, both=True),
        # a row whose note is its measurement (a setting's change, a paired statistic) shows it once
        "note": ""
        if m.value is None or (c.id in _JUDGED_BY and m.note)
        else esc.breakable_name(esc.truncate(esc.clean(m.note or ""), lim.cell)),
    }


def _problem(c: Check, r: ReportBody, lim: Limits, level: str) -> str:
    bad = [_measurement_row(c, m, lim) for m in c.measurements if m.status in _BAD]
    shown = bad if lim.rows is None else bad[: lim.rows]
    return _render(
        "problem",
        level=Safe(level),
        icon=Safe(icon(c.status)),
        status=c.status,
        title=_title(c, lim),
        summary=esc.truncate(esc.clean(c.summary or ""), lim.text),
        diagnosis=esc.truncate(esc.clean(c.diagnosis or ""), lim.text),
        rows=shown,
        more=len(bad) - len(shown),
    )


def _metrics(c: Check, r: ReportBody, lim: Limits) -> str:
    rows = [_measurement_row(c, m, lim) for m in c.measurements]
    rows.sort(key=lambda row: -RANK.get(str(row["status"]), 0))  # worst first; info with PASS
    shown = rows if lim.rows is None else rows[: lim.rows]
    return _render(
        "metrics",
        icon=Safe(icon(c.status)),
        title=_title(c, lim),
        info=any(row["status"] == _INFO for row in shown),
        rows=shown,
        total=len(rows),
        more=len(rows) - len(shown),
    )


# ------------------------------------------------------------------------------------ config diff
def _value(v: Any, lim: Limits) -> str:
    """A setting's value as its JSON spelling (None -> null), capped, and able to wrap in a cell."""
    s = v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str)
    return esc.breakable(esc.truncate(esc.clean(s), lim.cell))


def _config_diff(c: Check, lim: Limits, open_: bool) -> str:
    d = c.details
    by_name = {m.name: m for m in c.measurements}
    rows = []
    for key, change in sorted(d.diff.items()):
        m = by_name.get(key) or Measurement()
        status = str(m.status or "PASS")
        note = esc.clean(m.note or "")
        policy = note[note.rfind("(") + 1 : -1] if note.endswith(")") and "(" in note else ""
        rows.append(
            {
                "icon": Safe(icon(status)),
                "status": status,
                "key": esc.truncate(key, lim.cell),
                "old": _value(change.old, lim),
                "new": _value(change.new, lim),
                "policy": policy,
            }
        )
    overridden = [
        {
            "key": esc.truncate(k, lim.cell),
            "requested": _value(v.requested, lim),
            "effective": _value(v.effective, lim),
        }
        for k, v in sorted(d.overridden_by_engine.items())
    ]
    return _render(
        "config_diff",
        open=open_,
        compared_with=str(d.compared_with or "old"),
        rows=rows,
        overridden=overridden,
        acknowledged=[esc.truncate(esc.clean(a), lim.cell) for a in d.acknowledged],
    )


# ------------------------------------------------------------------------------------ environment
_MISSING = object()  # a row's cell for an engine that did not report the value (empty, not "null")


def _known(value: Any) -> Any:
    return _MISSING if value is None else value


def _identity(e: Engine, key: str) -> Any:
    return (e.identity or {}).get(key, _MISSING)


def _device(e: Engine) -> Any:
    parts = [
        str(x)
        for x in (_identity(e, "device_kind"), _identity(e, "device_name"))
        if x and x is not _MISSING
    ]
    return " ".join(parts) or _MISSING


def _setting(key: str) -> Callable[[Engine], Any]:
    return lambda e: (e.effective or {}).get(key, _MISSING)


def _identity_field(key: str) -> Callable[[Engine], Any]:
    return lambda e: _identity(e, key)


# (row label, the engine's value or _MISSING), in row order
_ENVIRONMENT_ROWS: tuple[tuple[str, Callable[[Engine], Any]], ...] = (
    ("engine spec", lambda e: _known(e.spec)),
    ("runner", lambda e: _known(e.runner)),
    *[(k, _identity_field(k)) for k in ("vllm", "torch", "transformers", "python")],
    ("device", _device),
    ("engine class", _identity_field("engine_class")),
    ("engine generation", _identity_field("engine_generation")),
    ("platform", _identity_field("platform")),
    *[(k, _setting(k)) for k in KEY_SETTINGS],
    ("dropped engine args", lambda e: e.dropped_engine_args or _MISSING),
)


def _environment(r: ReportBody, lim: Limits) -> str:
    """What differs between the old and new engines and the baseline's; the identical rows by name."""
    columns = {
        n: r.engines[n] for n in sorted(r.engines, key=lambda n: {"old": 0, "new": 1}.get(n, 2))
    }
    manifest = (r.baseline or Baseline()).manifest or BaselineManifest()
    if manifest.engine is not None:
        recorded = manifest.recorded_from or RecordedFrom()
        columns["baseline"] = replace(manifest.engine, spec=recorded.spec)
    rows, same = [], []
    for label, get in _ENVIRONMENT_ROWS:
        values = [get(e) for e in columns.values()]
        if all(v is _MISSING for v in values):
            continue
        shown = ["" if v is _MISSING else _value(v, lim) for v in values]
        if len({v for v in shown if v}) > 1:
            rows.append({"label": label, "values": shown})
        else:
            same.append(label)
    return _render("environment", columns=list(columns), rows=rows, same=same)


# --------------------------------------------------------------------------------------- baseline
def _capitalised(text: str) -> str:
    return text[:1].upper() + text[1:]


def _baseline(b: Baseline, r: ReportBody, lim: Limits) -> str:
    manifest = b.manifest or BaselineManifest()
    recorded = manifest.recorded_from or RecordedFrom()
    status = str(b.status or "SKIP")
    run_model = ((r.run or Run()).model or ModelRef()).sha256
    base_model = (manifest.model or ModelRef()).sha256
    identity = (manifest.engine or Engine()).identity or {}
    return _render(
        "baseline",
        icon=Safe(icon(status)),
        status=status,
        open=status in _BAD or bool(b.differences),
        path=esc.truncate(esc.clean(b.path or ""), lim.cell) or None,
        message=esc.truncate(esc.clean(b.message or ""), lim.text),
        differences=[esc.truncate(esc.clean(d), lim.text) for d in b.differences],
        created=manifest.created,
        spec=recorded.spec,
        recorded_run=recorded.run,
        vllm=identity.get("vllm"),
        device=" ".join(
            str(x) for x in (identity.get("device_kind"), identity.get("device_name")) if x
        )
        or None,
        model_same=None if not (run_model and base_model) else run_model == base_model,
        base_model=(base_model or "")[:12] or None,
        prompt_sets=_prompt_sets(manifest.prompt_sets),
        noise_floors=esc.truncate(esc.clean(_capitalised(b.noise_floors or "")), lim.text) or None,
    )


# ----------------------------------------------------------------------------------- worst tokens
def _worst_tokens(r: ReportBody, lim: Limits) -> str:
    """Top-level worst tokens, then each check's, capped in rows and in context on either side."""
    entries = [*r.worst_tokens, *(t for c in r.checks for t in c.details.worst_tokens)]
    if not entries:
        return ""
    shown = entries if lim.tokens is None else entries[: lim.tokens]
    rows = []
    for t in shown:
        before, after = esc.clean(t.context or ""), esc.clean(t.context_after or "")
        if lim.context is not None and len(before) > lim.context:
            before = "…" + before[-lim.context :]
        if lim.context is not None and len(after) > lim.context:
            after = after[: lim.context] + "…"
        e, tr = t.engine_logprob, t.trainer_logprob
        rows.append(
            {
                "engine": esc.clean(t.engine or ""),
                "prompt": esc.truncate(esc.clean(t.prompt_id), lim.cell),
                "context": esc.breakable(before),
                "token": t.token or "",
                "context_after": esc.breakable(after),
                "position": t.position,
                "engine_lp": e,
                "trainer_lp": tr,
                "delta": tr - e if e is not None and tr is not None else None,
            }
        )
    return _render("worst_tokens", rows=rows, more=len(entries) - len(shown))


# ------------------------------------------------------------------------------ greedy completions
GREEDY_EXAMPLES = 3  # changed greedy completions shown side by side


def _greedy_examples(r: ReportBody, lim: Limits) -> str:
    """The first prompts whose greedy completion changed: the reference's and the new engine's, escaped."""
    check = next((c for c in r.checks if c.id == "greedy-and-length"), None)
    details = check.document.get("details") if check is not None else None
    if not isinstance(details, dict):
        return ""
    found = [
        (label, entry)
        for label, entry in details.items()  # the baseline first, as the check compares
        if isinstance(entry, dict) and isinstance(entry.get("examples"), list) and entry["examples"]
    ]
    if not found:
        return ""
    label, entry = found[0]
    examples = entry["examples"]
    width = lim.cell or 400
    rows = []
    for ex in examples[:GREEDY_EXAMPLES]:
        if not isinstance(ex, dict):
            continue
        rows.append(
            {
                "prompt": esc.breakable(esc.truncate(esc.clean(ex.get("prompt_id", "?")), 40)),
                "position": ex.get("first_divergence"),
                "reference": esc.breakable(esc.truncate(esc.clean(ex.get("reference", "")), width)),
                "new": esc.breakable(esc.truncate(esc.clean(ex.get("new", "")), width)),
            }
        )
    if not rows:
        return ""
    changed = entry.get("greedy", {}).get("diverging_prompts") if isinstance(entry, dict) else None
    total = len(changed) if isinstance(changed, list) else len(rows)
    return _render(
        "greedy_examples",
        label=esc.clean(label),
        rows=rows,
        total=max(total, len(rows)),
        open=check is not None and check.status in _BAD,
    )


# ------------------------------------------------------------------------------------------ GRPO
FLAT = 0.01  # old and new within this share of the chart's height: a flat line, no chart
# ... or within this absolute span: an fp32 engine's k3 (~1e-13) or mean |d| (~1e-7) is rounding,
# whatever the reference seeds' range around it
FLAT_ABS = 1e-6


def _grpo(g: Grpo, lim: Limits) -> str:
    chart_list, table, flat = [], [], []
    for name, metric in g.metrics.items():
        m = metric or GrpoMetric()
        series = {k: charts.as_series(getattr(m, k)) for k in charts.SERIES}
        span = charts.value_range(series.values())
        if span is None:
            continue
        lo, hi = span
        lines = charts.value_range([series["old"], series["new"]]) or span
        exit_step = g.first_exit.get(name)
        # a metric whose engines' lines would be drawn flat (at zero, typically, on CPU) gets no chart
        is_flat = lines[1] - lines[0] <= max(FLAT * (hi - lo), FLAT_ABS)
        row = {
            "name": esc.clean(name),
            "final_old": charts.last_value(series["old"]),
            "final_new": charts.last_value(series["new"]),
            "exit": exit_step,
            "spark": "" if is_flat else charts.sparkline(series["new"], lo, hi, lim.spark),
            "flat_at": esc.num(charts.last_value(series["new"])),
        }
        table.append(row)
        if is_flat:
            flat.append(esc.clean(name))
            continue
        chart_list.append(charts.line_chart(name, series, lo, hi, lim.points, exit_step))
    if not table:
        return ""
    return _render(
        "grpo",
        steps=g.steps,
        statistics=_grpo_statistics(g),
        split=_grpo_split(g),
        seeds=len(g.seeds),
        null_seeds=g.null_seeds,
        note=esc.clean(g.summary or "") if not g.statistics else "",
        rows=table,
        charts=[c for c in chart_list if c],
        flat=flat,
        compared_with=esc.clean(g.compared_with or "old"),
        palette=charts.PALETTE,
    )


def _grpo_statistics(g: Grpo) -> list[dict[str, str]]:
    """The paired statistics as table rows: effect and interval, p-value, δ90, status."""
    rows = []
    for name, stat in g.statistics.items():
        if stat is None:
            continue
        rows.append(
            {
                "name": esc.clean(name),
                "what": esc.clean(stat.what or ""),
                "effect": _signed(stat.effect),
                "interval": f"[{_signed(stat.low)}, {_signed(stat.high)}]",
                "p": "n/a" if stat.p_value is None else f"{stat.p_value:.2g}",
                "level": "?" if stat.alpha is None else f"{stat.alpha:.2g}",
                "delta90": esc.num(stat.delta90),
                "status": esc.clean(stat.status or "?"),
            }
        )
    return rows


def _grpo_split(g: Grpo) -> dict[str, str] | None:
    e = g.eval
    if e is None or e.immediate is None:
        return None
    return {
        "immediate": _signed(e.immediate),
        "learned": _signed(e.learned),
        "checkpoint_new": esc.num(e.checkpoint_new),
        "checkpoint_reference": esc.num(e.checkpoint_reference),
    }


def _signed(x: float | None) -> str:
    return "?" if x is None else f"{x:+.3g}"


# --------------------------------------------------------------------------------------- commands
def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.2f} GiB"


def _memory_plan(m: MemoryPlan) -> str:
    """The plan's phase totals per engine group and device (a column each: phases are rows, so the
    table stays narrow however many phases there are), the measured peak below when known."""
    phases = list(dict.fromkeys(name for e in m.engines for name in e.phases))
    columns, peaks = [], []
    for e in m.engines:
        names = [n for n in e.engines if n]
        found = [v for n in names if (v := m.measured_peak_bytes.get(n)) is not None]
        for i, d in enumerate(e.devices):
            name = d.name or "?"
            peak = e.peak_bytes.get(name)
            peaks.append((peak or 0, name, e.peak_phase.get(name) or "?", d))
            columns.append(
                {
                    "label": f"{', '.join(names)} on {name}",
                    "free": _gib(d.available_bytes),
                    "phases": [
                        _gib(e.phases[p][name].total_bytes) if name in e.phases.get(p, {}) else ""
                        for p in phases
                    ],
                    "peak": _gib(peak),
                    "measured": _gib(max(found)) if found and i == 0 else "",
                }
            )
    rows = [
        {"label": "free", "values": [c["free"] for c in columns]},
        *({"label": p, "values": [c["phases"][j] for c in columns]} for j, p in enumerate(phases)),
        {"label": "peak", "values": [c["peak"] for c in columns]},
    ]
    if m.measured_peak_bytes:
        rows.append({"label": "measured", "values": [c["measured"] for c in columns]})
    top = max(peaks, key=lambda t: t[0], default=None)
    verdict = "fits" if m.fits else "does not fit" if m.fits is False else "fit unknown"
    headline = f"peak {_gib(top[0])} on {top[1]} in {top[2]}, {verdict}" if top else verdict
    return _render(
        "memory_plan",
        headline=headline,
        model=_basename(m.model),
        rows=rows,
        columns=[c["label"] for c in columns],
        parameters=f"{(m.parameters or 0) / 1e6:,.1f}M",
        parameters_from=m.parameters_from or "?",
        measured=bool(m.measured_peak_bytes),
        knobs=[k for k in m.knobs if k],
        problems=[p for e in m.engines for p in e.problems if p],
    )


def _commands(r: ReportBody, lim: Limits) -> str:
    reproduce = r.commands.reproduce if r.commands else None
    regenerate = r.commands.regenerate_baseline if r.commands else None
    return _render(
        "commands",
        reproduce=esc.code_block(reproduce, "bash", lim.text) if reproduce else None,
        regenerate=esc.code_block(regenerate, "bash", lim.text) if regenerate else None,
    )


def _footer(r: Report) -> str:
    run = r.run or Run()
    return _render(
        "footer",
        gate_version=str(r.gate_version or "?"),
        schema=str(r.schema or "?"),
        started=run.started,
        finished=run.finished,
    )


# ------------------------------------------------------------------------------------------ parts
def _part_row(p: ReportBody, lim: Limits) -> dict[str, Any]:
    verdict = str(p.verdict or "ERROR")
    old, new = _engine(p, "old"), _engine(p, "new")
    model = (p.run or Run()).model or ModelRef()
    found = outcome.outcome(p)
    if found.causes:
        first = found.causes[0]
        cause = (
            f"{esc.code_inline(first.key, lim.cell)} → {esc.code_inline(_value(first.new, lim))}"
        )
    elif found.others:
        cause = esc.inline(_title(found.others[0].check, lim))
    else:
        cause = "—"
    return {
        "icon": Safe(icon(verdict)),
        "verdict": verdict,
        "gate_id": str(p.gate_id or "?"),
        "vllm": " → ".join(e["version"] for e in (old, new) if e) or "?",
        "model": (_basename(model.path) or (model.sha256 or "")[:12]) or "?",
        "counts": _counts_short(p.counts),
        "cause": Safe(cause),
    }


def _counts_short(counts: Mapping[str, int]) -> str:
    words = [f"{counts[k]} {w}" for k, w in _COUNT_WORDS if counts.get(k)]
    return ", ".join(words) or "none ran"
