"""The sections of a rendered report, each prepared from the typed report and drawn by its template.

Layout lives in ``templates/*.md.j2``; this module prepares plain data for them, one function per
section. Every value a template prints goes through the environment's finalizer, which escapes it
with :func:`gate.render.escape.inline` unless it is already :class:`~gate.render.escape.Safe`
(produced by an escape filter or by this module from trusted parts), so a forgotten filter means
escaped text, never injected Markdown.

Order: headline, errors, checks table, [omission note], what failed and how to fix it, then
``<details>``: per-check metrics, config diff, environment, baseline provenance, worst tokens, GRPO
trajectories, the memory plan; last the reproduce / regenerate-baseline commands. A merged report (``parts``) gets a
parts table and the same sections once per part, worst verdict first.

Each section carries a priority (:mod:`gate.render.budget` drops the lowest first to meet a budget).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2

from gate.render import charts
from gate.render import escape as esc
from gate.render.budget import OMITTED, REQUIRED, Limits, Section
from gate.render.escape import Safe
from gate.report_model import (
    Baseline,
    BaselineManifest,
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
P_CONFIG_BAD, P_BASELINE, P_CONFIG, P_ENV = 65, 60, 55, 50
P_METRICS_BAD, P_GRPO, P_TOKENS, P_MEMORY, P_METRICS = 45, 40, 30, 25, 20
P_MEMORY_BAD = (
    62  # a plan that does not fit explains the run's failure: kept nearly as long as config
)


# ------------------------------------------------------------------------------------- templates
def _finalize(value: Any) -> str:
    if isinstance(value, Safe):
        return value
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return Safe(esc.num(value))
    return esc.inline(value)


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(Path(__file__).parent / "templates")),
        autoescape=False,  # Markdown, not HTML: escaping is the finalizer's and the filters' job
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=False,
        finalize=_finalize,
    )
    env.filters.update(
        prose=esc.prose,
        code=esc.code_inline,
        token=esc.visible_token,
        html=esc.html_text,
        cells=_cells,
    )
    return env


def _cells(values: Iterable[Any], bold: bool = False) -> Safe:
    """Table cells joined by pipes, each escaped (and bold when asked and not empty)."""
    out = [_finalize(v) for v in values]
    return Safe(" | ".join(f"**{v}**" if bold and v else v for v in out))


def _render(name: str, **ctx: Any) -> str:
    return _env().get_template(f"{name}.md.j2").render(**ctx).strip()


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
            Section("parts", REQUIRED, _render("parts", rows=[_part_row(p) for p in ordered]))
        )
        out.append(Section(OMITTED, REQUIRED, ""))
        for i, part in enumerate(ordered):
            out += _report_sections(
                part,
                lim,
                prefix=f"part:{i + 1}-{esc.marker_id(part.gate_id or 'part')}/",
                level="###",
            )
    else:
        out = _report_sections(report, lim, prefix="", level="##", top=True)
    if pr_run is not None:
        out.insert(1, Section("provenance", REQUIRED, _provenance(pr_run)))
    return out


def _report_sections(
    r: ReportBody, lim: Limits, prefix: str, level: str, top: bool = False
) -> list[Section]:
    checks = r.checks
    out = [Section(prefix + "headline", REQUIRED, _headline(r, lim, level=level))]
    out += _errors(r, lim, prefix)
    out.append(
        Section(
            prefix + "checks",
            REQUIRED,
            _render("checks_table", rows=[_check_row(c, lim) for c in checks]),
        )
    )
    if top:
        out.append(Section(OMITTED, REQUIRED, ""))
    sub = level + "#"
    for c in checks:
        if c.status in _BAD:
            p = P_PROBLEM_WARN if c.status == "WARN" else P_PROBLEM_FAIL
            out.append(Section(f"{prefix}problem:{c.id}", p, _problem(c, lim, sub)))
    for c in checks:
        if c.measurements:
            p = P_METRICS if c.status in ("PASS", "SKIP") else P_METRICS_BAD
            out.append(Section(f"{prefix}metrics:{c.id}", p, _metrics(c, lim)))
    parity = next((c for c in checks if c.id == "config-parity" and c.status != "SKIP"), None)
    if parity is not None:
        p = P_CONFIG if parity.status == "PASS" else P_CONFIG_BAD
        out.append(Section(prefix + "config-diff", p, _config_diff(parity, lim)))
    if r.engines:
        out.append(Section(prefix + "environment", P_ENV, _environment(r, lim)))
    if r.baseline is not None:
        bad = r.baseline.status in _BAD or bool(r.baseline.differences)
        p = P_BASELINE_BAD if bad else P_BASELINE
        out.append(Section(prefix + "baseline", p, _baseline(r.baseline, r, lim)))
    tokens = _worst_tokens(r, lim)
    if tokens:
        out.append(Section(prefix + "worst-tokens", P_TOKENS, tokens))
    if r.grpo is not None:
        out.append(Section(prefix + "grpo", P_GRPO, _grpo(r.grpo, lim)))
    if r.memory_plan is not None and r.memory_plan.engines:
        p = P_MEMORY if r.memory_plan.fits is not False else P_MEMORY_BAD
        out.append(Section(prefix + "memory-plan", p, _memory_plan(r.memory_plan)))
    out.append(Section(prefix + "commands", P_COMMANDS, _commands(r, lim)))
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
    where = " ".join(p for p in (
        f"on {esc.code_inline(run.head_repo, 100)}" if run.head_repo else "",
        f"at {esc.code_inline(run.head_sha[:12])}" if run.head_sha else "",
    ) if p)  # fmt: skip
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


# --------------------------------------------------------------------------------- checks table
def _bound(m: Measurement, value: float | None) -> str:
    if value is None:
        return ""
    direction = "below" if m.higher_is_worse is False else "above"  # not known: higher is worse
    return f"{direction} {esc.num(value)}"


def _threshold(m: Measurement) -> str:
    bounds = (("warn", m.warn), ("fail", m.fail))
    return ", ".join(f"{k} {_bound(m, v)}" for k, v in bounds if v is not None)


def _key_measurement(c: Check) -> Measurement | None:
    judged = [m for m in c.measurements if m.warn is not None or m.fail is not None]
    pool = judged or c.measurements
    if not pool:
        return None
    return max(pool, key=lambda m: (RANK.get(str(m.status), 0), m.engine != "old"))


def _name(m: Measurement) -> str:
    return m.name if m.name is not None else "?"


def _metric_name(m: Measurement) -> str:
    return f"{_name(m)} ({m.engine})" if m.engine else _name(m)


def _title(c: Check, lim: Limits) -> str:
    return esc.truncate(esc.clean(c.title or c.id or "?"), lim.cell)


def _short_diagnosis(c: Check, lim: Limits) -> str:
    text = esc.clean(c.diagnosis or "") if c.status in _BAD else ""
    if text:
        cut = min((i for i in (text.find(". "), text.find(": ")) if i > 0), default=len(text))
        text = text[: cut + 1].rstrip(".:") if cut < len(text) else text
    return esc.truncate(text or esc.clean(c.summary or ""), lim.cell)


def _check_row(c: Check, lim: Limits) -> dict[str, Any]:
    m = _key_measurement(c)
    measured: Any = ""
    if m is not None:
        measured = (
            m.value if m.value is not None else esc.truncate(esc.clean(m.note or ""), lim.cell)
        )
    return {
        "icon": Safe(icon(c.status)),
        "status": c.status,
        "title": _title(c, lim),
        "metric": _metric_name(m) if m else "",
        "measured": measured,
        "threshold": _threshold(m) if m else "",
        "diagnosis": _short_diagnosis(c, lim),
    }


def _measurement_row(m: Measurement, lim: Limits) -> dict[str, Any]:
    status = str(m.status or "?")
    value = m.value
    return {
        "icon": Safe(icon(status)),
        "status": status,
        "name": esc.truncate(esc.clean(_name(m)), lim.cell),
        "engine": esc.truncate(esc.clean(m.engine or ""), lim.cell),
        "value": value
        if isinstance(value, (int, float)) or value is None
        else esc.truncate(esc.clean(value), lim.cell),
        "warn": _bound(m, m.warn),
        "fail": _bound(m, m.fail),
        "threshold": _threshold(m),
        "note": esc.truncate(esc.clean(m.note or ""), lim.cell),
    }


def _problem(c: Check, lim: Limits, level: str) -> str:
    bad = [_measurement_row(m, lim) for m in c.measurements if m.status in _BAD]
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


def _metrics(c: Check, lim: Limits) -> str:
    rows = [_measurement_row(m, lim) for m in c.measurements]
    shown = rows if lim.rows is None else rows[: lim.rows]
    return _render(
        "metrics",
        icon=Safe(icon(c.status)),
        title=_title(c, lim),
        rows=shown,
        total=len(rows),
        more=len(rows) - len(shown),
    )


# ------------------------------------------------------------------------------------ config diff
def _value(v: Any, lim: Limits) -> str:
    """A setting's value as its JSON spelling (None -> null), capped."""
    s = v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str)
    return esc.truncate(esc.clean(s), lim.cell)


def _config_diff(c: Check, lim: Limits) -> str:
    d = c.details
    by_name = {m.name: m for m in c.measurements}
    rows = []
    for key, change in sorted(d.diff.items()):
        m = by_name.get(key) or Measurement()
        status = str(m.status or "PASS")
        note = esc.clean(m.note or "")
        policy = note[note.rfind("(") + 1 : -1] if note.endswith(")") and "(" in note else ""
        rows.append({"icon": Safe(icon(status)), "status": status, "key": esc.truncate(key, lim.cell),
                     "old": _value(change.old, lim), "new": _value(change.new, lim), "policy": policy})  # fmt: skip
    overridden = [
        {"key": esc.truncate(k, lim.cell), "requested": _value(v.requested, lim), "effective": _value(v.effective, lim)}
        for k, v in sorted(d.overridden_by_engine.items())
    ]  # fmt: skip
    return _render(
        "config_diff",
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


def _seconds(v: float | None) -> Any:
    return f"{esc.num(float(v))} s" if isinstance(v, (int, float)) else _MISSING


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
    ("replay time", lambda e: _seconds(e.timings.get("total_s"))),
)


def _environment(r: ReportBody, lim: Limits) -> str:
    """The old and new engines side by side, and the engine the baseline was recorded with."""
    columns = {
        n: r.engines[n] for n in sorted(r.engines, key=lambda n: {"old": 0, "new": 1}.get(n, 2))
    }
    manifest = (r.baseline or Baseline()).manifest or BaselineManifest()
    if manifest.engine is not None:
        recorded = manifest.recorded_from or RecordedFrom()
        columns["baseline"] = replace(manifest.engine, spec=recorded.spec)
    rows = []
    for label, get in _ENVIRONMENT_ROWS:
        values = [get(e) for e in columns.values()]
        if all(v is _MISSING for v in values):
            continue
        shown = ["" if v is _MISSING else _value(v, lim) for v in values]
        compare = [v for n, v in zip(columns, shown, strict=True) if n in ("old", "new")]
        differs = len(compare) == 2 and compare[0] != compare[1] and label != "replay time"
        rows.append({"label": label, "values": shown, "differs": differs})
    return _render(
        "environment", columns=list(columns), rows=rows, n_diff=sum(r["differs"] for r in rows)
    )


# --------------------------------------------------------------------------------------- baseline
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
        rows.append({"engine": esc.clean(t.engine or ""), "prompt": esc.truncate(esc.clean(t.prompt_id), lim.cell),
                     "context": before, "token": t.token or "", "context_after": after, "position": t.position,
                     "engine_lp": e, "trainer_lp": tr,
                     "delta": tr - e if e is not None and tr is not None else None})  # fmt: skip
    return _render("worst_tokens", rows=rows, more=len(entries) - len(shown))


# ------------------------------------------------------------------------------------------ GRPO
def _grpo(g: Grpo, lim: Limits) -> str:
    chart_list, table = [], []
    for name, metric in g.metrics.items():
        m = metric or GrpoMetric()
        series = {k: charts.as_series(getattr(m, k)) for k in charts.SERIES}
        span = charts.value_range(series.values())
        if span is None:
            continue
        lo, hi = span
        spark = {k: charts.sparkline(v, lo, hi, lim.spark) for k, v in series.items()}
        exit_step = g.first_exit.get(name)
        table.append({"name": esc.clean(name), "old": spark["old"], "new": spark["new"], "band": spark["band_low"] and spark["band_high"],
                      "band_low": spark["band_low"], "band_high": spark["band_high"],
                      "final_old": charts.last_value(series["old"]), "final_new": charts.last_value(series["new"]),
                      "exit": exit_step, "left": exit_step is not None})  # fmt: skip
        chart_list.append(charts.line_chart(name, series, lo, hi, lim.points))
    if not table:
        return ""
    return _render("grpo", steps=g.steps, rows=table, charts=[c for c in chart_list if c])


# --------------------------------------------------------------------------------------- commands
def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.2f} GiB"


def _memory_plan(m: MemoryPlan) -> str:
    """The plan's phase totals per engine group and device, the measured peak beside it when known."""
    phases = list(dict.fromkeys(name for e in m.engines for name in e.phases))
    rows, peaks = [], []
    for e in m.engines:
        names = [n for n in e.engines if n]
        measured = [m.measured_peak_bytes.get(n) for n in names]
        for i, d in enumerate(e.devices):
            name = d.name or "?"
            peak = e.peak_bytes.get(name)
            peaks.append((peak or 0, name, e.peak_phase.get(name) or "?", d))
            found = [v for v in measured if v is not None]
            rows.append({
                "engines": ", ".join(names), "device": name, "free": _gib(d.available_bytes),
                "phases": [_gib(e.phases[p][name].total_bytes) if name in e.phases.get(p, {}) else ""
                           for p in phases],
                "peak": _gib(peak),
                "measured": _gib(max(found)) if found and i == 0 else "",
            })  # fmt: skip
    top = max(peaks, key=lambda t: t[0], default=None)
    verdict = "fits" if m.fits else "does not fit" if m.fits is False else "fit unknown"
    headline = f"peak {_gib(top[0])} on {top[1]} in {top[2]}, {verdict}" if top else verdict
    return _render(
        "memory_plan", headline=headline, model=_basename(m.model), rows=rows, phases=phases,
        parameters=f"{(m.parameters or 0) / 1e6:,.1f}M", parameters_from=m.parameters_from or "?",
        measured=bool(m.measured_peak_bytes), knobs=[k for k in m.knobs if k],
        problems=[p for e in m.engines for p in e.problems if p],
    )  # fmt: skip


def _commands(r: ReportBody, lim: Limits) -> str:
    reproduce = r.commands.reproduce if r.commands else None
    regenerate = r.commands.regenerate_baseline if r.commands else None
    run = r.run or Run()
    return _render(
        "commands",
        reproduce=esc.code_block(reproduce, "bash", lim.text) if reproduce else None,
        regenerate=esc.code_block(regenerate, "bash", lim.text) if regenerate else None,
        gate_version=str(r.gate_version or "?"),
        schema=str(r.schema if isinstance(r, Report) else "?"),
        started=run.started,
        finished=run.finished,
    )


# ------------------------------------------------------------------------------------------ parts
def _part_row(p: ReportBody) -> dict[str, Any]:
    verdict = str(p.verdict or "ERROR")
    old, new = _engine(p, "old"), _engine(p, "new")
    model = (p.run or Run()).model or ModelRef()
    return {
        "icon": Safe(icon(verdict)),
        "verdict": verdict,
        "gate_id": str(p.gate_id or "?"),
        "vllm": " → ".join(e["version"] for e in (old, new) if e) or "?",
        "model": (_basename(model.path) or (model.sha256 or "")[:12]) or "?",
        "counts": _counts_text(p.counts),
    }
