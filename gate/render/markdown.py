"""report.json -> Markdown: the sticky PR comment, the job summary and the full artifact.

Layout lives in ``templates/*.md.j2``; this module prepares plain data for them, one function per
section. Every value a template prints goes through the environment's finalizer, which escapes it
with :func:`gate.render.escape.inline` unless it is already :class:`~gate.render.escape.Safe`
(produced by an escape filter or by this module from trusted parts), so a forgotten filter means
escaped text, never injected Markdown.

Order: headline, errors, checks table, [omission note], what failed and how to fix it, then
``<details>``: per-check metrics, config diff, environment, baseline provenance, worst tokens, GRPO
trajectories; last the reproduce / regenerate-baseline commands. A merged report (``parts``) gets a
parts table and the same sections once per part, worst verdict first.

Sections carry a priority; to meet a budget the least important go first and the text says how
many were omitted. The marker line ``<!-- gate-report:<id> -->`` opens every comment and is the only
HTML comment in it: the rendered body is passed through :func:`~gate.render.escape.neutralise_comments`.

Optional inputs a report may carry (rendered when present, skipped otherwise):

- ``worst_tokens`` (top level, or in any check's ``details``): a list of ``{"engine", "prompt_id",
  "context", "token", "engine_logprob", "trainer_logprob"}`` (``position`` optional);
- ``grpo``: ``{"steps", "metrics": {name: {"old", "new", "band_low", "band_high"}}, "first_exit": {name: step|null}}``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2

from gate.render import escape as esc
from gate.render.budget import COMMENT_BUDGET, SUMMARY_BUDGET, marker
from gate.render.escape import Safe
from gate.report_schema import validate_report
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

# Effective settings worth a row in the environment fingerprint, in this order.
KEY_SETTINGS = (
    "logprobs_mode", "enable_prefix_caching", "async_scheduling", "enable_chunked_prefill", "dtype", "kv_cache_dtype",
    "quantization", "attention_backend", "compilation_mode", "cudagraph_mode", "enforce_eager", "max_num_batched_tokens",
    "max_num_seqs", "max_model_len", "generation_config", "seed", "tensor_parallel_size",
)  # fmt: skip

# Section priorities: higher survives longer; REQUIRED is never dropped.
REQUIRED = 1_000
P_ERRORS, P_PROBLEM_FAIL, P_PROBLEM_WARN, P_BASELINE_BAD, P_COMMANDS = 95, 85, 80, 75, 70
P_CONFIG_BAD, P_BASELINE, P_CONFIG, P_ENV, P_METRICS_BAD, P_GRPO, P_TOKENS, P_METRICS = (
    65,
    60,
    55,
    50,
    45,
    40,
    30,
    20,
)


@dataclass(frozen=True)
class Rendered:
    text: str
    dropped: tuple[str, ...]  # keys of the sections left out to meet the budget


@dataclass(frozen=True)
class Limits:
    """Per-output caps (characters or rows); None is unlimited."""

    cell: int | None  # a table cell
    text: int | None  # a diagnosis or message paragraph
    rows: int | None  # rows of one metrics table
    tokens: int | None  # worst-token rows
    context: int | None  # characters of context before a worst token
    log: int | None  # characters of an engine's log tail
    points: int  # points of a Mermaid chart
    spark: int  # characters of a sparkline


COMMENT = Limits(
    cell=160, text=4_000, rows=60, tokens=10, context=60, log=2_000, points=60, spark=24
)
SUMMARY = Limits(
    cell=400, text=20_000, rows=500, tokens=50, context=120, log=10_000, points=100, spark=40
)
FULL = Limits(
    cell=None, text=None, rows=None, tokens=None, context=None, log=None, points=200, spark=60
)


@dataclass(frozen=True)
class Section:
    key: str
    priority: int
    text: str


# ---------------------------------------------------------------------------------------------- API


def render_comment(
    report: dict,
    gate_id: str | None = None,
    budget: int = COMMENT_BUDGET,
    pr_run: WorkflowRun | None = None,
) -> Rendered:
    """The sticky PR comment: marker line first, under ``budget`` characters (UTF-16 units, the stricter count).

    ``pr_run``: the report is the artifact of this pull-request run (a fork's), so it is labelled as the
    PR's own result, with the run's conclusion and head from the event, and its commands are left out.
    """
    validate_report(report)
    head = marker(gate_id if gate_id is not None else report.get("gate_id") or "") + "\n"
    text, dropped = _fit(
        _sections(report, COMMENT, pr_run),
        budget - _utf16_len(head),
        _utf16_len,
        "GitHub's comment limit",
    )
    return Rendered(head + text, dropped)


def render_summary(
    report: dict, budget: int = SUMMARY_BUDGET, pr_run: WorkflowRun | None = None
) -> str:
    """The job summary ($GITHUB_STEP_SUMMARY): same content, under ``budget`` UTF-8 bytes."""
    validate_report(report)
    text, _ = _fit(
        _sections(report, SUMMARY, pr_run), budget, _utf8_len, "GitHub's job summary limit"
    )
    return text


def render_full(report: dict) -> str:
    """Everything, uncapped: the file uploaded as an artifact."""
    validate_report(report)
    text, _ = _fit(_sections(report, FULL), None, len, "")
    return text


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


# -------------------------------------------------------------------------------------- sections


def _sections(report: dict, lim: Limits, pr_run: WorkflowRun | None = None) -> list[Section]:
    if pr_run is not None:
        report = _without_commands(report)
    parts = report.get("parts")
    if isinstance(parts, list) and parts:
        # worst part first (stable): what needs attention leads, and passing parts are shed first
        ordered = sorted(
            (p for p in parts if isinstance(p, dict)),
            key=lambda p: -rank(p.get("verdict")),
        )
        out = [Section("headline", REQUIRED, _headline(report, lim, merged=True))]
        out.append(
            Section("parts", REQUIRED, _render("parts", rows=[_part_row(p) for p in ordered]))
        )
        out.append(Section("omitted", REQUIRED, ""))
        for i, part in enumerate(ordered):
            out += _report_sections(
                part,
                lim,
                prefix=f"part:{i + 1}-{esc.marker_id(part.get('gate_id') or 'part')}/",
                level="###",
            )
    else:
        out = _report_sections(report, lim, prefix="", level="##", top=True)
    if pr_run is not None:
        out.insert(1, Section("provenance", REQUIRED, _provenance(pr_run)))
    return out


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


def _without_commands(report: dict) -> dict:
    """The report without its commands: text a fork wrote must not appear as a command to run."""
    out = {k: v for k, v in report.items() if k != "commands"}
    if isinstance(report.get("parts"), list):
        out["parts"] = [_without_commands(p) if isinstance(p, dict) else p for p in report["parts"]]
    return out


def _report_sections(
    r: dict, lim: Limits, prefix: str, level: str, top: bool = False
) -> list[Section]:
    checks = [c for c in r.get("checks") or [] if isinstance(c, dict)]
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
        out.append(Section("omitted", REQUIRED, ""))
    sub = level + "#"
    for c in checks:
        if c.get("status") in ("WARN", "FAIL", "ERROR"):
            p = P_PROBLEM_WARN if c.get("status") == "WARN" else P_PROBLEM_FAIL
            out.append(Section(f"{prefix}problem:{c.get('id')}", p, _problem(c, lim, sub)))
    for c in checks:
        if c.get("measurements"):
            p = P_METRICS if c.get("status") in ("PASS", "SKIP") else P_METRICS_BAD
            out.append(Section(f"{prefix}metrics:{c.get('id')}", p, _metrics(c, lim)))
    parity = next(
        (c for c in checks if c.get("id") == "config-parity" and c.get("status") != "SKIP"), None
    )
    if parity is not None:
        p = P_CONFIG if parity.get("status") == "PASS" else P_CONFIG_BAD
        out.append(Section(prefix + "config-diff", p, _config_diff(parity, lim)))
    if r.get("engines"):
        out.append(Section(prefix + "environment", P_ENV, _environment(r, lim)))
    if isinstance(r.get("baseline"), dict):
        bad = r["baseline"].get("status") in ("WARN", "FAIL", "ERROR") or bool(
            r["baseline"].get("differences")
        )
        out.append(
            Section(
                prefix + "baseline",
                P_BASELINE_BAD if bad else P_BASELINE,
                _baseline(r["baseline"], r, lim),
            )
        )
    tokens = _worst_tokens(r, checks, lim)
    if tokens:
        out.append(Section(prefix + "worst-tokens", P_TOKENS, tokens))
    if isinstance(r.get("grpo"), dict):
        out.append(Section(prefix + "grpo", P_GRPO, _grpo(r["grpo"], lim)))
    out.append(Section(prefix + "commands", P_COMMANDS, _commands(r, lim)))
    return [s for s in out if s.text or s.key == "omitted"]


# ---------------------------------------------------------------------------------------- budget


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8"))


def _utf16_len(text: str) -> int:
    """Characters as JavaScript counts them (an emoji is two): never fewer than code points."""
    return len(text.encode("utf-16-le")) // 2


def _fit(
    sections: list[Section], budget: int | None, size: Callable[[str], int], limit_name: str
) -> tuple[str, tuple[str, ...]]:
    """Join the sections, dropping the least important (latest first among equals) until the text fits."""
    sep = "\n\n"
    dropped: set[int] = set()
    if budget is not None:
        sizes = [size(s.text) + size(sep) for s in sections]
        total = sum(sizes) + 1
        longest = sorted((s.key for s in sections), key=len, reverse=True)[:12]
        reserve = (
            size(_omitted_note(len(sections), longest, limit_name)) + 64
        )  # room for the note itself
        candidates = sorted(
            (i for i, s in enumerate(sections) if s.priority < REQUIRED),
            key=lambda i: (sections[i].priority, -i),
        )
        for i in candidates:
            if total + (reserve if dropped or total > budget else 0) <= budget:
                break
            dropped.add(i)
            total -= sizes[i]
    keys = [sections[i].key for i in sorted(dropped, key=lambda i: (sections[i].priority, -i))]
    note = _omitted_note(len(keys), keys, limit_name) if keys else ""
    texts = [
        note if s.key == "omitted" else s.text for i, s in enumerate(sections) if i not in dropped
    ]
    text = esc.neutralise_comments(sep.join(t for t in texts if t)) + "\n"
    if (
        budget is not None and size(text) > budget
    ):  # the required sections alone are too big: cut the text
        note = _omitted_note(len(keys) + 1, [*keys, "the rest of this text"], limit_name)
        room = budget - size(note) - size(sep) - 2
        text = _cut(text, room, size).rstrip() + sep + note + "\n"
    return text, tuple(keys)


def _cut(text: str, room: int, size: Callable[[str], int]) -> str:
    """The longest prefix of ``text`` of at most ``room`` units as ``size`` counts them (never half a character)."""
    room = max(0, room)
    if size is _utf8_len:
        return text.encode("utf-8")[:room].decode("utf-8", "ignore")
    if size is _utf16_len:  # an astral character is two units: slicing code points would overshoot
        return text.encode("utf-16-le")[: 2 * room].decode("utf-16-le", "ignore")
    return text[:room]


def _omitted_note(n: int, keys: list[str], limit_name: str) -> str:
    return _render(
        "omitted", n=n, keys=keys[:12], more=max(0, len(keys) - 12), limit_name=limit_name
    )


# -------------------------------------------------------------------------------------- headline


def _engine(r: dict, name: str) -> dict[str, Any] | None:
    e = (r.get("engines") or {}).get(name)
    if not isinstance(e, dict):
        return None
    identity = e.get("identity") or {}
    reused = e.get("reused") if isinstance(e.get("reused"), dict) else None
    return {
        "version": identity.get("vllm") or "?",
        "spec": e.get("spec") or "?",
        "reused": {
            "created": str(reused.get("created") or "?"),
            "key": str(reused.get("key") or "?")[:12],
        }
        if reused
        else None,
    }


def _counts_text(counts: dict | None) -> str:
    counts = counts or {}
    total = sum(int(v or 0) for v in counts.values())
    words = [f"{int(counts[k])} {w}" for k, w in _COUNT_WORDS if counts.get(k)]
    return (
        f"{total} check{'s' if total != 1 else ''}: {', '.join(words)}"
        if words
        else "no checks ran"
    )


def _basename(path: Any) -> str:
    s = str(path or "").rstrip("/\\")
    return s.replace("\\", "/").rsplit("/", 1)[-1]


def _headline(r: dict, lim: Limits, level: str = "##", merged: bool = False) -> str:
    run = r.get("run") or {}
    model = run.get("model") or {}
    verdict = str(r.get("verdict") or "ERROR")
    baseline = r.get("baseline") if isinstance(r.get("baseline"), dict) else {}
    manifest = baseline.get("manifest") or {}
    parts = r.get("parts") if merged else None
    part_verdicts = {}
    for p in parts or []:
        part_verdicts[p.get("verdict")] = part_verdicts.get(p.get("verdict"), 0) + 1
    return _render(
        "headline",
        level=Safe(level),
        icon=Safe(icon(verdict)),
        verdict=verdict,
        gate_id=str(r.get("gate_id") or "?"),
        part=level != "##",
        merged=merged,
        n_parts=len(parts or []),
        parts_text=", ".join(
            f"{n} {w}" for k, w in _COUNT_WORDS for v, n in part_verdicts.items() if v == k
        ),
        old=_engine(r, "old"),
        new=_engine(r, "new"),
        baseline_from=((manifest.get("recorded_from") or {}).get("spec")),
        model_name=_basename(model.get("path")) or None,
        model_sha=str(model.get("sha256") or "")[:12] or None,
        prompt_sets=[
            f"{p.get('name', '?')} ({p.get('records', '?')})"
            for p in run.get("prompt_sets") or []
            if isinstance(p, dict)
        ],
        counts=_counts_text(r.get("counts")),
        exit_code=r.get("exit_code"),
        fail_on=r.get("fail_on") or "fail",
        baseline_status=baseline.get("status")
        if not merged and baseline.get("status") in ("WARN", "FAIL", "ERROR")
        else None,
        baseline_icon=Safe(ICON.get(str(baseline.get("status")), "")),
        baseline_message=esc.truncate(esc.clean(baseline.get("message") or ""), lim.text),
    )


def _errors(r: dict, lim: Limits, prefix: str) -> list[Section]:
    errors = [esc.truncate(esc.clean(e), lim.text) for e in r.get("errors") or []]
    logs = []
    for name, e in (r.get("engines") or {}).items():
        if isinstance(e, dict) and (e.get("status") not in (None, "ok") or e.get("error")):
            logs.append({"name": str(name), "status": e.get("status"), "error": esc.truncate(esc.clean(e.get("error") or ""), lim.text),
                         "log": esc.code_block(e.get("log_tail") or "", "text", lim.log, keep="tail") if e.get("log_tail") else None})  # fmt: skip
    if not errors and not logs:
        return []
    return [Section(prefix + "errors", P_ERRORS, _render("errors", errors=errors, engines=logs))]


# --------------------------------------------------------------------------------- checks table


def _bound(m: dict, key: str) -> str:
    v = m.get(key)
    if v is None:
        return ""
    return f"{'above' if m.get('higher_is_worse', True) else 'below'} {esc.num(v)}"


def _threshold(m: dict) -> str:
    parts = [f"{k} {_bound(m, k)}" for k in ("warn", "fail") if m.get(k) is not None]
    return ", ".join(parts)


def _key_measurement(c: dict) -> dict | None:
    ms = [m for m in c.get("measurements") or [] if isinstance(m, dict)]
    judged = [m for m in ms if m.get("warn") is not None or m.get("fail") is not None]
    pool = judged or ms
    if not pool:
        return None
    return max(pool, key=lambda m: (RANK.get(str(m.get("status")), 0), m.get("engine") != "old"))


def _metric_name(m: dict) -> str:
    return f"{m.get('name', '?')} ({m['engine']})" if m.get("engine") else str(m.get("name", "?"))


def _short_diagnosis(c: dict, lim: Limits) -> str:
    text = (
        esc.clean(c.get("diagnosis") or "") if c.get("status") in ("WARN", "FAIL", "ERROR") else ""
    )
    if text:
        cut = min((i for i in (text.find(". "), text.find(": ")) if i > 0), default=len(text))
        text = text[: cut + 1].rstrip(".:") if cut < len(text) else text
    return esc.truncate(text or esc.clean(c.get("summary") or ""), lim.cell)


def _check_row(c: dict, lim: Limits) -> dict[str, Any]:
    m = _key_measurement(c)
    status = str(c.get("status") or "?")
    measured: Any = None
    if m is not None:
        measured = (
            m.get("value")
            if m.get("value") is not None
            else esc.truncate(esc.clean(m.get("note") or ""), lim.cell)
        )
    return {
        "icon": Safe(icon(status)),
        "status": status,
        "title": esc.truncate(esc.clean(c.get("title") or c.get("id") or "?"), lim.cell),
        "metric": _metric_name(m) if m else "",
        "measured": measured if m else "",
        "threshold": _threshold(m) if m else "",
        "diagnosis": _short_diagnosis(c, lim),
    }


def _measurement_row(m: dict, lim: Limits) -> dict[str, Any]:
    status = str(m.get("status") or "?")
    value = m.get("value")
    return {
        "icon": Safe(icon(status)),
        "status": status,
        "name": esc.truncate(esc.clean(m.get("name", "?")), lim.cell),
        "engine": esc.truncate(esc.clean(m.get("engine") or ""), lim.cell),
        "value": value
        if isinstance(value, (int, float)) or value is None
        else esc.truncate(esc.clean(value), lim.cell),
        "warn": _bound(m, "warn"),
        "fail": _bound(m, "fail"),
        "threshold": _threshold(m),
        "note": esc.truncate(esc.clean(m.get("note") or ""), lim.cell),
    }


def _problem(c: dict, lim: Limits, level: str) -> str:
    bad = [
        _measurement_row(m, lim)
        for m in c.get("measurements") or []
        if isinstance(m, dict) and m.get("status") in ("WARN", "FAIL", "ERROR")
    ]
    shown = bad if lim.rows is None else bad[: lim.rows]
    status = str(c.get("status"))
    return _render(
        "problem",
        level=Safe(level),
        icon=Safe(icon(status)),
        status=status,
        title=esc.truncate(esc.clean(c.get("title") or c.get("id") or "?"), lim.cell),
        summary=esc.truncate(esc.clean(c.get("summary") or ""), lim.text),
        diagnosis=esc.truncate(esc.clean(c.get("diagnosis") or ""), lim.text),
        rows=shown,
        more=len(bad) - len(shown),
    )


def _metrics(c: dict, lim: Limits) -> str:
    rows = [_measurement_row(m, lim) for m in c.get("measurements") or [] if isinstance(m, dict)]
    shown = rows if lim.rows is None else rows[: lim.rows]
    status = str(c.get("status"))
    return _render(
        "metrics",
        icon=Safe(icon(status)),
        title=esc.truncate(esc.clean(c.get("title") or c.get("id") or "?"), lim.cell),
        rows=shown,
        total=len(rows),
        more=len(rows) - len(shown),
    )


# ------------------------------------------------------------------------------------ config diff


def _value(v: Any, lim: Limits) -> str:
    """A setting's value as its JSON spelling (None -> null), capped."""
    s = v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str)
    return esc.truncate(esc.clean(s), lim.cell)


def _config_diff(c: dict, lim: Limits) -> str:
    d = c.get("details") or {}
    status_of = {m.get("name"): m for m in c.get("measurements") or [] if isinstance(m, dict)}
    rows = []
    for key, change in sorted((d.get("diff") or {}).items()):
        change = change if isinstance(change, dict) else {}
        m = status_of.get(key) or {}
        status = str(m.get("status") or "PASS")
        note = esc.clean(m.get("note") or "")
        policy = note[note.rfind("(") + 1 : -1] if note.endswith(")") and "(" in note else ""
        rows.append({"icon": Safe(icon(status)), "status": status, "key": esc.truncate(key, lim.cell),
                     "old": _value(change.get("old"), lim), "new": _value(change.get("new"), lim), "policy": policy})  # fmt: skip
    overridden = [
        {"key": esc.truncate(k, lim.cell), "requested": _value((v or {}).get("requested"), lim), "effective": _value((v or {}).get("effective"), lim)}
        for k, v in sorted((d.get("overridden_by_engine") or {}).items())
    ]  # fmt: skip
    return _render(
        "config_diff",
        compared_with=str(d.get("compared_with") or "old"),
        rows=rows,
        overridden=overridden,
        acknowledged=[esc.truncate(esc.clean(a), lim.cell) for a in d.get("acknowledged") or []],
    )


# ------------------------------------------------------------------------------------ environment


def _environment(r: dict, lim: Limits) -> str:
    engines = {str(k): v for k, v in (r.get("engines") or {}).items() if isinstance(v, dict)}
    names = sorted(engines, key=lambda n: {"old": 0, "new": 1}.get(n, 2))
    manifest_engine = ((r.get("baseline") or {}).get("manifest") or {}).get("engine")
    columns = names + (["baseline"] if isinstance(manifest_engine, dict) else [])
    source = {n: engines[n] for n in names} | (
        {"baseline": manifest_engine} if "baseline" in columns else {}
    )

    if "baseline" in columns:
        source["baseline"] = {
            **manifest_engine,
            "spec": ((r.get("baseline") or {}).get("manifest") or {})
            .get("recorded_from", {})
            .get("spec", _MISSING),
        }

    def ident(e: dict, key: str) -> Any:
        return (e.get("identity") or {}).get(key, _MISSING)

    def device(e: dict) -> Any:
        parts = [
            str(x)
            for x in (ident(e, "device_kind"), ident(e, "device_name"))
            if x and x is not _MISSING
        ]
        return " ".join(parts) or _MISSING

    fields: list[tuple[str, Callable[[dict], Any]]] = [
        ("engine spec", lambda e: e.get("spec", _MISSING)),
        ("runner", lambda e: e.get("runner", _MISSING)),
        *[(k, (lambda e, k=k: ident(e, k))) for k in ("vllm", "torch", "transformers", "python")],
        ("device", device),
        ("engine class", lambda e: ident(e, "engine_class")),
        ("engine generation", lambda e: ident(e, "engine_generation")),
        ("platform", lambda e: ident(e, "platform")),
        *[(k, (lambda e, k=k: (e.get("effective") or {}).get(k, _MISSING))) for k in KEY_SETTINGS],
        ("dropped engine args", lambda e: e.get("dropped_engine_args") or _MISSING),
        ("replay time", lambda e: _seconds((e.get("timings") or {}).get("total_s"))),
    ]
    rows = []
    for label, get in fields:
        values = [get(source[n]) for n in columns]
        if all(v is _MISSING for v in values):
            continue
        shown = ["" if v is _MISSING else _value(v, lim) for v in values]
        compare = [v for n, v in zip(columns, shown, strict=True) if n in ("old", "new")]
        differs = len(compare) == 2 and compare[0] != compare[1] and label != "replay time"
        rows.append({"label": label, "values": shown, "differs": differs})
    return _render(
        "environment", columns=columns, rows=rows, n_diff=sum(r["differs"] for r in rows)
    )


_MISSING = object()


def _seconds(v: Any) -> Any:
    return f"{esc.num(float(v))} s" if isinstance(v, (int, float)) else _MISSING


# --------------------------------------------------------------------------------------- baseline


def _baseline(b: dict, r: dict, lim: Limits) -> str:
    manifest = b.get("manifest") if isinstance(b.get("manifest"), dict) else {}
    recorded = manifest.get("recorded_from") or {}
    status = str(b.get("status") or "SKIP")
    run_model = ((r.get("run") or {}).get("model") or {}).get("sha256")
    base_model = (manifest.get("model") or {}).get("sha256")
    identity = (manifest.get("engine") or {}).get("identity") or {}
    return _render(
        "baseline",
        icon=Safe(icon(status)),
        status=status,
        open=status in ("WARN", "FAIL", "ERROR") or bool(b.get("differences")),
        path=esc.truncate(esc.clean(b.get("path") or ""), lim.cell) or None,
        message=esc.truncate(esc.clean(b.get("message") or ""), lim.text),
        differences=[esc.truncate(esc.clean(d), lim.text) for d in b.get("differences") or []],
        created=manifest.get("created"),
        spec=recorded.get("spec"),
        recorded_run=recorded.get("run"),
        vllm=identity.get("vllm"),
        device=" ".join(
            str(x) for x in (identity.get("device_kind"), identity.get("device_name")) if x
        )
        or None,
        model_same=None if not (run_model and base_model) else run_model == base_model,
        base_model=str(base_model or "")[:12] or None,
        prompt_sets=[
            f"{p.get('name', '?')} ({p.get('records', '?')})"
            for p in manifest.get("prompt_sets") or []
            if isinstance(p, dict)
        ],
    )


# ----------------------------------------------------------------------------------- worst tokens


def _worst_tokens(r: dict, checks: list[dict], lim: Limits) -> str:
    entries: list[dict] = [t for t in r.get("worst_tokens") or [] if isinstance(t, dict)]
    for c in checks:
        entries += [
            t for t in (c.get("details") or {}).get("worst_tokens") or [] if isinstance(t, dict)
        ]
    if not entries:
        return ""
    shown = entries if lim.tokens is None else entries[: lim.tokens]
    rows = []
    for t in shown:
        context = esc.clean(t.get("context") or "")
        if lim.context is not None and len(context) > lim.context:
            context = "…" + context[-lim.context :]
        e, tr = t.get("engine_logprob"), t.get("trainer_logprob")
        delta = tr - e if isinstance(e, (int, float)) and isinstance(tr, (int, float)) else None
        rows.append({"engine": esc.clean(t.get("engine") or ""), "prompt": esc.truncate(esc.clean(t.get("prompt_id", "")), lim.cell),
                     "context": context, "token": t.get("token", ""), "position": t.get("position"),
                     "engine_lp": e, "trainer_lp": tr, "delta": delta})  # fmt: skip
    return _render("worst_tokens", rows=rows, more=len(entries) - len(shown))


# ------------------------------------------------------------------------------------------ GRPO

SPARK = "▁▂▃▄▅▆▇█"


def _floats(values: Any) -> list[float | None]:
    out: list[float | None] = []
    for v in values if isinstance(values, list) else []:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        out.append(float(v) if ok else None)
    return out


def _downsample(values: list[float | None], k: int) -> list[float | None]:
    """Bucket means to at most k points (None where a bucket has no value)."""
    n = len(values)
    if n <= k:
        return values
    out = []
    for i in range(k):
        bucket = [v for v in values[i * n // k : (i + 1) * n // k] if v is not None]
        out.append(sum(bucket) / len(bucket) if bucket else None)
    return out


def sparkline(
    values: Iterable[float | None],
    lo: float | None = None,
    hi: float | None = None,
    width: int = 40,
) -> str:
    vals = _downsample(_floats(list(values)), width)
    finite = [v for v in vals if v is not None]
    if not finite:
        return ""
    lo = min(finite) if lo is None else lo
    hi = max(finite) if hi is None else hi
    span = hi - lo
    top = len(SPARK) - 1
    return "".join(
        " "
        if v is None
        else SPARK[0 if span <= 0 else max(0, min(top, round((v - lo) / span * top)))]
        for v in vals
    )


def _fixed(values: list[float], digits: int = 4) -> Callable[[float], str]:
    """Fixed-point formatting (Mermaid reads no exponents) with ``digits`` significant digits of the range."""
    scale = max((abs(v) for v in values), default=1.0) or 1.0
    decimals = min(12, max(0, digits - 1 - math.floor(math.log10(scale))))
    return lambda v: f"{v:.{decimals}f}"


def _mermaid_label(name: str) -> str:
    return (
        "".join(ch if ch.isalnum() or ch in " _.-" else "_" for ch in esc.clean(name))[:60]
        or "metric"
    )


def _fill(values: list[float | None]) -> list[float] | None:
    """Forward-fill gaps (then back-fill the start); None when nothing is there."""
    finite = [v for v in values if v is not None]
    if not finite:
        return None
    out, last = [], finite[0]
    for v in values:
        last = v if v is not None else last
        out.append(last)
    return out


def _grpo(g: dict, lim: Limits) -> str:
    metrics = g.get("metrics") if isinstance(g.get("metrics"), dict) else {}
    first_exit = g.get("first_exit") if isinstance(g.get("first_exit"), dict) else {}
    charts, table = [], []
    for name, m in metrics.items():
        m = m if isinstance(m, dict) else {}
        series = {k: _floats(m.get(k)) for k in ("old", "new", "band_low", "band_high")}
        finite = [v for s in series.values() for v in s if v is not None]
        if not finite:
            continue
        lo, hi = min(finite), max(finite)
        spark = {k: sparkline(v, lo, hi, lim.spark) for k, v in series.items()}
        exit_step = first_exit.get(name)
        table.append({"name": esc.clean(name), "old": spark["old"], "new": spark["new"], "band": spark["band_low"] and spark["band_high"],
                      "band_low": spark["band_low"], "band_high": spark["band_high"],
                      "final_old": next((v for v in reversed(series["old"]) if v is not None), None),
                      "final_new": next((v for v in reversed(series["new"]) if v is not None), None),
                      "exit": exit_step, "left": exit_step is not None})  # fmt: skip
        charts.append(_chart(name, series, lo, hi, lim.points))
    if not table:
        return ""
    steps = g.get("steps")
    return _render(
        "grpo",
        steps=steps if isinstance(steps, int) else None,
        rows=table,
        charts=[c for c in charts if c],
    )


def _chart(
    name: str, series: dict[str, list[float | None]], lo: float, hi: float, points: int
) -> dict[str, Any] | None:
    n = max(len(s) for s in series.values())
    if n < 2:
        return None
    k = min(points, n)
    idx = sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})
    pad = (hi - lo) * 0.05 or abs(hi) * 0.05 or 1.0
    fmt = _fixed([lo - pad, hi + pad, hi - lo or pad])
    lines, labels = [], []
    for key in ("old", "new", "band_low", "band_high"):
        filled = _fill(series[key] + [None] * (n - len(series[key])))
        if filled is None:
            continue
        labels.append(key.replace("_", " "))
        lines.append(Safe(", ".join(fmt(filled[i]) for i in idx)))
    return {
        "name": esc.clean(name),
        "title": Safe(_mermaid_label(name)),
        "x": Safe(", ".join(str(i) for i in idx)),
        "ymin": Safe(fmt(lo - pad)),
        "ymax": Safe(fmt(hi + pad)),
        "lines": lines,
        "labels": ", ".join(labels),
    }


# --------------------------------------------------------------------------------------- commands


def _commands(r: dict, lim: Limits) -> str:
    cmds = r.get("commands") if isinstance(r.get("commands"), dict) else {}
    run = r.get("run") or {}
    return _render(
        "commands",
        reproduce=esc.code_block(cmds["reproduce"], "bash", lim.text)
        if cmds.get("reproduce")
        else None,
        regenerate=esc.code_block(cmds["regenerate_baseline"], "bash", lim.text)
        if cmds.get("regenerate_baseline")
        else None,
        gate_version=str(r.get("gate_version") or "?"),
        schema=str(r.get("schema") or "?"),
        started=run.get("started"),
        finished=run.get("finished"),
    )


# ------------------------------------------------------------------------------------------ parts


def _part_row(p: dict) -> dict[str, Any]:
    verdict = str(p.get("verdict") or "ERROR")
    old, new = _engine(p, "old"), _engine(p, "new")
    model = (p.get("run") or {}).get("model") or {}
    return {
        "icon": Safe(icon(verdict)),
        "verdict": verdict,
        "gate_id": str(p.get("gate_id") or "?"),
        "vllm": " → ".join(e["version"] for e in (old, new) if e) or "?",
        "model": (_basename(model.get("path")) or str(model.get("sha256") or "")[:12]) or "?",
        "counts": _counts_text(p.get("counts")),
    }
