"""inflight-update: weights pushed while requests are generating; which weights computed each token?

Reads the in-flight phase of the weight-sync probe (gate/worker/inflight.py): per request, the
engine's greedy tokens and logprobs, how many tokens it had when the update's first and last calls
ran, and the trainer's logprobs of the same tokens under the old weights (OLD), the new weights
recomputed from scratch (REC) and the new weights over the old weights' KV before the switch
(STALE). Each token is labelled with the candidates it matches within a tolerance calibrated on
the same engine's idle probe (``factor`` x its 99th-percentile engine-vs-trainer gap, at least
``floor``):

- before the switch a token must be OLD (STALE is OLD there);
- after it, exactly one of OLD / STALE / REC, or NEITHER (torn: computed on half-updated
  weights or over KV they wrote), or ambiguous (the candidates lie within the tolerance);
- after the update's last call, OLD alone means the engine still samples from the old weights.

FAIL (new engine): tokens that fit no weights (torn when engine steps ran inside the update,
partial when none did: the update reached only part of the model), requests lost (aborted and not resubmitted, cut short, or returned
without logprobs), or old weights after the update. WARN: a behaviour (STALE or REC after the
switch) that differs between the engines, or from what a built-in path asks for. SKIP with
"inconclusive" where the labels do not separate, never a guess. docs/checks.md has the stacks'
paths and what a correct one shows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gate.checks.base import CheckResult, CheckSettings, CheckSpec, Measurement
from gate.checks.context import Context
from gate.checks.weight_sync import push_failure
from gate.contract import keys
from gate.verdict import Status

ID = "inflight-update"
TITLE = "In-flight weight update"

FINISH_ABORT = 2  # gate.worker.inflight.FINISH_CODES

# What each built-in update asks the engine for, after the switch.
EXPECTED = {"keep": "STALE", "keep_clear": "REC", "abort_resubmit": "REC", "no_pause": "STALE"}
MEANING = {
    "STALE": "kept the KV the old weights computed (new weights over old keys and values)",
    "REC": "recomputed every running request on the new weights",
    "mixed": "some tokens over the old KV, some recomputed",
}
FIXES = {
    "partial": "Tokens after an update that ran between two steps fit no weights: the update reached only part "
    "of the model (one tensor-parallel rank, some layers, names the loader skipped). Push to every rank "
    "(collective_rpc to all workers) and every tensor, as the idle weight-sync probe's path does.",
    "torn": "Decode steps ran on partly updated weights: the update is several calls into the engine with "
    "generation running between them. Pause first (pause_generation(mode='keep') or /pause?mode=keep), "
    "push everything, then resume, or push in one collective_rpc.",
    "lost": "Requests in flight did not come back whole: an abort without resubmission drops them. Resubmit "
    "prompt + partial output after the update (AReaL), or pause with mode='keep' instead of aborting.",
    "stale": "Tokens after the update returned still match the old weights: the push did not reach the "
    "engine (or not all of it) before generation resumed.",
}


@dataclass
class Attribution:
    """One update on one engine: each request's labels and what they add up to."""

    name: str
    labels: list[str]  # per request: one letter per token, O S R x (none) ? (ambiguous)
    switch_start: list[int]
    switch_end: list[int]
    pre_tokens: int = 0
    pre_not_old: int = 0
    post_tokens: int = 0
    counts: dict[str, int] = field(
        default_factory=dict
    )  # OLD STALE REC NEITHER ambiguous, after the switch
    stale_after_update: int = 0  # OLD-only tokens after the update's last call
    lost: list[str] = field(default_factory=list)  # per lost request, why
    # Bounds on where the first call ran (server mode: known within the tokens that arrived while
    # it was under way; offline both equal switch_start), and the engine's own weight-version
    # label's first new token per request (-1: none returned).
    switch_lower: list[int] = field(default_factory=list)
    switch_upper: list[int] = field(default_factory=list)
    version_switch: list[int] = field(default_factory=list)
    steps_inside: int | None = None  # engine steps between the first and last call, where recorded

    @property
    def versions_agree(self) -> bool | None:
        """Whether the engine's version labels change where the update ran; None without labels."""
        pairs = [
            (v, s) for v, s in zip(self.version_switch, self.switch_start, strict=True) if v >= 0
        ]
        return None if not pairs else all(v == s for v, s in pairs)

    @property
    def behaviour(self) -> str | None:
        """STALE or REC when at least 90% of the labelled tokens after the switch agree; None without any."""
        stale, rec = self.counts.get("STALE", 0), self.counts.get("REC", 0)
        if stale + rec == 0:
            return None
        if stale >= 0.9 * (stale + rec):
            return "STALE"
        return "REC" if rec >= 0.9 * (stale + rec) else "mixed"


def tolerance(e, factor: float, floor: float) -> float | None:
    """``factor`` x the idle probe's 99th-percentile |engine - trainer|: before its push, and after
    it where the engine then held the new weights. A push that missed them (weight-sync FAILs it)
    measures the miss, not the engine's noise: taken in, it let a partial update in flight pass for
    "old weights" (row 27a)."""
    pairs = [(keys.WS_BEFORE_ENGINE_LOGPROB, keys.WS_BEFORE_TRAINER_LOGPROB)]
    if idle_push_took(e):
        pairs.append((keys.WS_ENGINE_LOGPROB, keys.WS_TRAINER_NEW_LOGPROB))
    gaps = []
    for eng, ref in pairs:
        if eng in e.arrays and ref in e.arrays and len(e[eng]):
            gaps.append(np.abs(e[eng].astype(np.float64) - e[ref]))
    if not gaps:
        return None
    return max(factor * float(np.quantile(np.concatenate(gaps), 0.99)), floor)


def idle_push_took(e) -> bool:
    """Whether the engine after the idle push is nearer the new weights than the old ones, on mean
    |engine - trainer|; True where the old weights' logprobs were not recorded."""
    a = e.arrays
    if (
        keys.WS_TRAINER_OLD_LOGPROB not in a
        or keys.WS_ENGINE_LOGPROB not in a
        or not len(a[keys.WS_ENGINE_LOGPROB])
    ):
        return True
    eng = a[keys.WS_ENGINE_LOGPROB].astype(np.float64)
    return bool(
        np.mean(np.abs(eng - a[keys.WS_TRAINER_NEW_LOGPROB]))
        < np.mean(np.abs(eng - a[keys.WS_TRAINER_OLD_LOGPROB]))
    )


def attribute(
    arrays: dict[str, np.ndarray],
    names: list[str],
    tol: float,
    max_tokens: int | None = None,
    steps_inside: list[int | None] | None = None,
) -> list[Attribution]:
    """Label every token of every request, per update (``names``: the updates in run order;
    ``max_tokens``: what each request was asked for, so a shorter one counts as lost;
    ``steps_inside``: per update, engine steps between its first and last call, where recorded)."""
    offsets = arrays[keys.WSI_OFFSETS]
    eng = arrays[keys.WSI_ENGINE_LOGPROB].astype(np.float64)
    fits = {
        k: np.abs(eng - arrays[name]) <= tol
        for k, name in (
            ("OLD", keys.WSI_OLD_LOGPROB),
            ("STALE", keys.WSI_STALE_LOGPROB),
            ("REC", keys.WSI_REC_LOGPROB),
        )
    }
    update_of = arrays[keys.WSI_UPDATE_INDEX]
    lengths = np.diff(offsets)
    # Each token's place in its request, and the request's switch points, per token.
    row = np.repeat(np.arange(len(lengths)), lengths)
    j = np.arange(len(eng)) - offsets[:-1][row]
    start, end = arrays[keys.WSI_SWITCH_START][row], arrays[keys.WSI_SWITCH_END][row]
    # Where the update's first call ran: before it every token must be OLD. An update whose calls
    # spanned engine steps has its STALE switch fitted inside [first call, last call], and tokens
    # between the first call and that fit ran on weights the update had begun to change (row 30a
    # on SmolLM2: 30 per-layer calls, STALE fitted 14-25 tokens past the first one).
    first = arrays.get(keys.WSI_SWITCH_LOWER, arrays[keys.WSI_SWITCH_START])[row]
    post = j >= start
    inside = j >= first
    # Before the switch STALE is OLD by construction: only OLD against REC tells anything there.
    unique = {
        "OLD": fits["OLD"] & ~fits["REC"] & (~fits["STALE"] | ~post),
        "STALE": post & fits["STALE"] & ~fits["OLD"] & ~fits["REC"],
        "REC": fits["REC"] & ~fits["OLD"] & (~fits["STALE"] | ~post),
    }
    none = ~(fits["OLD"] | fits["REC"] | (fits["STALE"] & post)) | ~np.isfinite(eng)
    letters = np.full(len(eng), "?", dtype="<U1")
    for label, letter in (("OLD", "O"), ("STALE", "S"), ("REC", "R")):
        letters[unique[label]] = letter
    letters[none] = "x"
    out = []
    for u, name in enumerate(names):
        rows = np.flatnonzero(update_of == u)
        mask = np.isin(row, rows)
        a = Attribution(
            name=name,
            labels=["".join(letters[offsets[r] : offsets[r + 1]]) for r in rows],
            switch_start=arrays[keys.WSI_SWITCH_START][rows].tolist(),
            switch_end=arrays[keys.WSI_SWITCH_END][rows].tolist(),
            pre_tokens=int(np.count_nonzero(mask & ~inside)),
            pre_not_old=int(np.count_nonzero(mask & ~inside & ~fits["OLD"])),
            post_tokens=int(np.count_nonzero(mask & inside)),
            counts={
                **{k: int(np.count_nonzero(mask & inside & v)) for k, v in unique.items()},
                "NEITHER": int(np.count_nonzero(mask & inside & none)),
                "ambiguous": int(np.count_nonzero(mask & inside & (letters == "?"))),
            },
            stale_after_update=int(np.count_nonzero(mask & (j > end) & unique["OLD"])),
            lost=_lost(arrays, rows, lengths, max_tokens),
            switch_lower=_per_row(arrays, keys.WSI_SWITCH_LOWER, rows, keys.WSI_SWITCH_START),
            switch_upper=_per_row(arrays, keys.WSI_SWITCH_UPPER, rows, keys.WSI_SWITCH_START),
            version_switch=_per_row(arrays, keys.WSI_VERSION_SWITCH, rows, None),
            steps_inside=steps_inside[u] if steps_inside and u < len(steps_inside) else None,
        )
        out.append(a)
    return out


def _per_row(
    arrays: dict[str, np.ndarray], key: str, rows: np.ndarray, fallback: str | None
) -> list[int]:
    """``arrays[key]`` at ``rows``; evidence from before the key existed reads ``fallback``'s (or -1)."""
    if key in arrays:
        return arrays[key][rows].tolist()
    return arrays[fallback][rows].tolist() if fallback else [-1] * len(rows)


def _lost(
    arrays: dict[str, np.ndarray], rows: np.ndarray, lengths: np.ndarray, max_tokens: int | None
) -> list[str]:
    """Why each lost request of ``rows`` is lost: aborted, cut short, or without logprobs."""
    eng, offsets = arrays[keys.WSI_ENGINE_LOGPROB], arrays[keys.WSI_OFFSETS]
    found = []
    for r in rows.tolist():
        n = int(lengths[r])
        if arrays[keys.WSI_FINISH][r] == FINISH_ABORT:
            found.append(f"request {r}: aborted after {n} tokens and not resubmitted")
        elif max_tokens is not None and n < max_tokens:
            found.append(f"request {r}: {n} of {max_tokens} tokens")
        elif n and not np.all(np.isfinite(eng[offsets[r] : offsets[r + 1]])):
            found.append(f"request {r}: returned without logprobs for some tokens")
    return found


def torn_limit(a: Attribution, torn_share: float) -> float:
    """Tokens after the switch that may fit no weights before it is torn: ``torn_share`` of them,
    or three times the share before the switch that missed the old weights (this engine's own
    noise around the tolerance), and at least one."""
    pre_miss = a.pre_not_old / a.pre_tokens if a.pre_tokens else 0.0
    return max(1.0, max(torn_share, 3 * pre_miss) * a.post_tokens)


def findings(a: Attribution, torn_share: float) -> list[str]:
    """The failure kinds of one attribution: torn or partial, lost, stale."""
    kinds = []
    torn = a.counts.get("NEITHER", 0) > torn_limit(a, torn_share)
    if torn:
        # Steps inside the update: they ran on half-pushed weights. None inside: what arrived was partial.
        spans = (
            a.steps_inside > 0
            if a.steps_inside is not None
            else any(e > s for s, e in zip(a.switch_start, a.switch_end, strict=True))
        )
        kinds.append("torn" if spans else "partial")
    if a.lost:
        kinds.append("lost")
    # Not over KV that torn or partial weights wrote: there a token may fit the old weights by chance.
    if a.stale_after_update and not torn:
        kinds.append("stale")
    return kinds


def inconclusive(a: Attribution, pre_share: float, min_decisive: int) -> str | None:
    """Why the labels of ``a`` cannot be trusted, or None."""
    if a.pre_tokens and a.pre_not_old > pre_share * a.pre_tokens:
        return (
            f"{a.pre_not_old} of {a.pre_tokens} tokens before the switch do not match the old weights "
            "within the idle probe's tolerance"
        )
    if not a.post_tokens and not a.lost:
        return (
            "no request generated a token after the update's first call (it ran after every request had "
            "finished, or made no call into the engine): raise weight_sync.inflight.max_tokens"
        )
    decisive = sum(a.counts.get(k, 0) for k in ("OLD", "STALE", "REC"))
    if a.post_tokens and decisive < min_decisive:
        return (
            f"only {decisive} of {a.post_tokens} tokens after the switch fit exactly one of OLD / STALE / REC "
            f"(at least {min_decisive} needed): raise weight_sync.inflight.perturbation to separate them"
        )
    return None


def shown(name: str) -> str:
    """An update as the report names it: a hook's file without its folder."""
    module, sep, func = name.rpartition(":")
    return f"{Path(module).name}:{func}" if sep and module.endswith(".py") else name


def _section(e) -> dict[str, Any]:
    return e.engine.weight_sync_inflight


def _attributions(e, opts) -> tuple[list[Attribution] | None, str | None, float | None]:
    section = _section(e)
    updates = section.get("updates") or []
    names = [u["name"] for u in updates]
    tol = tolerance(e, opts["factor"], opts["floor"])
    if tol is None:
        return (
            None,
            "the idle weight-sync probe's tokens, which calibrate the tolerance, are missing",
            None,
        )
    inside = [u.get("steps_inside") for u in updates]
    return attribute(e.arrays, names, tol, section.get("max_tokens"), inside), None, tol


def _skip_reason(e) -> str | None:
    section = _section(e)
    if keys.WSI_OFFSETS in e.arrays:
        return None
    if section.get("not_covered"):
        return f"not covered: {section['not_covered']}"
    if section.get("unsupported"):
        return f"the in-flight phase could not run on this engine: {section['unsupported']}"
    return "the in-flight phase did not run (weight_sync.inflight.enabled: false, or an older gate's evidence)"


def run(ctx: Context, settings: CheckSettings) -> CheckResult:
    e, opts = ctx.new, settings.options
    failed = push_failure(_section(e), ID, TITLE, "The in-flight update phase")
    if failed is not None:
        return failed
    reason = _skip_reason(e)
    if reason is not None:
        return CheckResult(ID, TITLE, Status.SKIP, reason)
    errors = [u for u in _section(e).get("updates") or [] if u.get("error")]
    if errors:
        first = errors[0]
        return CheckResult(
            ID,
            TITLE,
            Status.ERROR,
            f"the in-flight update {shown(first['name'])} raised: {first['error']}"[:300],
            "The update's own code raised while requests were running; its tokens are not judged.",
            details={"errors": {u["name"]: u["error"] for u in errors}},
        )
    new, why, tol = _attributions(e, opts)
    if new is None:
        return CheckResult(ID, TITLE, Status.SKIP, f"inconclusive: {why}")
    old = _old_attributions(ctx, opts)
    status, lines, diagnosis = Status.PASS, [], []
    measurements: list[Measurement] = []
    # the weights' distance decides how many tokens can be told apart (None: an older gate's evidence)
    details: dict[str, Any] = {
        "tolerance": tol,
        "perturbation": _section(e).get("perturbation"),
        "updates": {},
    }
    for a in new:
        before = old.get(a.name)
        details["updates"][a.name] = _detail(a, before)
        unsure = inconclusive(a, opts["pre_share"], opts["min_decisive"])
        kinds = findings(a, opts["torn_share"])
        measurements += _measurements(a, opts["torn_share"])
        if kinds:
            status = Status.FAIL
            lines.append(f"{shown(a.name)}: {', '.join(_describe(k, a) for k in kinds)}")
            diagnosis += [f"{shown(a.name)}: {FIXES[k]}" for k in kinds]
            continue
        if unsure:
            details["updates"][a.name]["inconclusive"] = unsure
            lines.append(f"{shown(a.name)}: inconclusive")
            diagnosis.append(f"{shown(a.name)}: inconclusive: {unsure}.")
            status = Status.SKIP if status == Status.PASS else status
            continue
        for note in (_changed(a, before), _versions_off(a)):
            if note:
                status = Status.WARN if status in (Status.PASS, Status.SKIP) else status
                diagnosis.append(note)
        lines.append(f"{shown(a.name)}: {a.behaviour or 'no token after the switch'}")
    pauses = pause_findings(ctx)
    if pauses.rows:
        details["pause_contract"] = pauses.details
        measurements += pauses.rows
        lines.append(pauses.summary)
        found = {m.status for m in pauses.rows}
        if Status.FAIL in found:
            status = Status.FAIL
        elif Status.WARN in found and status in (Status.PASS, Status.SKIP):
            status = Status.WARN
        diagnosis += pauses.diagnosis
    rejected = {
        u["name"]: u["rejected_while_paused"]
        for u in _section(e).get("updates") or []
        if u.get("rejected_while_paused")
    }
    if rejected:
        details["rejected_while_paused"] = rejected
    summary = "; ".join(lines) + f" (tolerance {tol:.1e})"
    if status == Status.SKIP:
        summary = "inconclusive: " + summary
    return CheckResult(ID, TITLE, status, summary, "\n".join(diagnosis), measurements, details)


@dataclass
class PauseFindings:
    """The pause contract of each engine (what a request sent during a pause meets), compared."""

    rows: list[Measurement] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    summary: str = ""
    diagnosis: list[str] = field(default_factory=list)


PAUSE_FIX = (
    "From vLLM 0.33 a request sent while generation is paused with mode='abort' or 'wait' is answered "
    "HTTP 503 (engine_paused, retryable) instead of waiting for /resume; mode='keep' still queues it. "
    "A client that resubmits aborted requests before it resumes (AReaL's, verl's async server) must "
    "retry them after /resume, as gate's own client does, or pause with mode='keep'."
)


PAUSE_OUTCOMES = ("queued", "rejected", "served", "failed")  # gate.worker.inflight_server


def _malformed_pauses(section: dict) -> str:
    """Why a recorded pause contract cannot be read (evidence is the pull request's); "" if it can."""
    for mode, row in section.items():
        if mode not in ("abort", "wait", "keep") or not isinstance(row, dict):
            return f"a malformed record for {str(mode)[:40]!r}"
        if row.get("while_paused") not in PAUSE_OUTCOMES or not isinstance(
            row.get("after_resume", ""), str
        ):
            return f"a malformed record for pause({mode})"
    return ""


def pause_findings(ctx: Context) -> PauseFindings:
    """Rows per pause mode (server mode): WARN where a request sent during the pause meets
    something else than on the old engine (queued -> rejected), FAIL where it is not served even
    after /resume (lost)."""
    out = PauseFindings()
    new = _section(ctx.new).get("pause_contract")
    if not isinstance(new, dict) or not new:
        return out
    old = _section(ctx.old).get("pause_contract") if ctx.old is not None else None
    why = str(new["error"])[:300] if "error" in new else _malformed_pauses(new)
    if why:
        out.rows.append(Measurement("pause contract", None, Status.PASS, note=f"not probed: {why}"))
        out.summary = "pause contract not probed"
        return out
    old = old if isinstance(old, dict) and "error" not in old and not _malformed_pauses(old) else {}
    changed = []
    for mode, row in new.items():
        now = row.get("while_paused")
        before = (old.get(mode) or {}).get("while_paused")
        served_after = row.get("after_resume", "served") == "served" or now == "served"
        status, note = Status.PASS, f"new: {now}" + (f", old: {before}" if before else "")
        if not served_after:
            status = Status.FAIL
            note += f"; not served after /resume: {row.get('after_resume')}"
            out.diagnosis.append(
                f"pause({mode}): a request sent during the pause was not served after /resume "
                f"either ({row.get('after_resume')}): a stack's resubmission is lost. {PAUSE_FIX}"
            )
        elif before and before != now:
            status = Status.WARN
            changed.append(f"{mode}: {before} -> {now}")
        out.rows.append(
            Measurement(f"pause({mode}): a request sent meanwhile", None, status, note=note)
        )
        out.details[mode] = {"new": row, "old": old.get(mode)}
    if changed:
        out.diagnosis.append(
            f"The release changed what a request sent during a pause meets ({'; '.join(changed)}). "
            + PAUSE_FIX
        )
    out.summary = "pause: " + ", ".join(
        f"{mode} {row.get('while_paused')}" for mode, row in new.items()
    )
    return out


def _old_attributions(ctx, opts) -> dict[str, Attribution]:
    if (
        ctx.old is None
        or keys.WSI_OFFSETS not in ctx.old.arrays
        or _section(ctx.old).get("updates") is None
    ):
        return {}
    found, _, _ = _attributions(ctx.old, opts)
    return {a.name: a for a in found or []}


def _changed(a: Attribution, before: Attribution | None) -> str | None:
    """A WARN's diagnosis: the behaviour moved between the engines, or is not what the path asks for."""
    now = a.behaviour
    if before is not None and before.behaviour and now and before.behaviour != now:
        return (
            f"{shown(a.name)}: the release changed what this update does to running requests: the old engine "
            f"{MEANING[before.behaviour]}, the new one {MEANING[now]}. Correct either way, but the rollout "
            "logprobs after an update now come from other weights' KV; check the pause's clear_cache "
            "setting and the release's pause_generation notes."
        )
    wanted = EXPECTED.get(a.name)
    if wanted and now and now != wanted:
        return (
            f"{shown(a.name)}: asks for requests that {MEANING[wanted]}, but this engine {MEANING[now]} "
            "(pause_generation's clear_cache is what decides it)."
        )
    return None


def _versions_off(a: Attribution) -> str | None:
    """A WARN's diagnosis: the engine's own weight-version labels change elsewhere than the update ran."""
    if a.versions_agree is not False:
        return None
    off = [
        (i, v, s)
        for i, (v, s) in enumerate(zip(a.version_switch, a.switch_start, strict=True))
        if v >= 0 and v != s
    ]
    i, v, s = off[0]
    return (
        f"{shown(a.name)}: the engine's weight-version spans label tokens from {v} on as the new version "
        f"(request {i}), but the weights changed at token {s}; a stack that reads the spans to tell which "
        "policy sampled a token (prime-rl's per-sample span, AReaL's per-token version) attributes "
        f"{abs(v - s)} token(s) to the wrong policy."
    )


def _describe(kind: str, a: Attribution) -> str:
    if kind in ("torn", "partial"):
        return f"{kind} ({a.counts['NEITHER']} of {a.post_tokens} tokens after the switch fit no weights)"
    if kind == "lost":
        return f"lost ({len(a.lost)} request(s))"
    return f"old weights after the update ({a.stale_after_update} tokens)"


def _measurements(a: Attribution, torn_share: float) -> list[Measurement]:
    neither, limit = a.counts.get("NEITHER", 0), torn_limit(a, torn_share)
    return [
        Measurement(
            f"{shown(a.name)}: tokens fitting no weights",
            neither,
            Status.FAIL if neither > limit else Status.PASS,
            fail=limit,
            engine="new",
        ),
        Measurement(
            f"{shown(a.name)}: requests lost",
            len(a.lost),
            Status.FAIL if a.lost else Status.PASS,
            fail=0,
            engine="new",
        ),
        Measurement(
            f"{shown(a.name)}: old-weight tokens after the update",
            a.stale_after_update,
            Status.FAIL if a.stale_after_update else Status.PASS,
            fail=0,
            engine="new",
        ),
    ]


def _detail(a: Attribution, before: Attribution | None) -> dict[str, Any]:
    return {
        "behaviour": a.behaviour,
        "behaviour_old_engine": before.behaviour if before else None,
        "counts": a.counts,
        "pre_tokens": a.pre_tokens,
        "pre_not_old": a.pre_not_old,
        "stale_after_update": a.stale_after_update,
        "lost": a.lost,
        "switch_start": a.switch_start,
        "switch_end": a.switch_end,
        "switch_lower": a.switch_lower,
        "switch_upper": a.switch_upper,
        "steps_inside": a.steps_inside,
        "version_switch": a.version_switch,
        "versions_agree": a.versions_agree,
        "labels": a.labels,
    }


SPEC = CheckSpec(
    id=ID,
    title=TITLE,
    run=run,
    options={
        # x the idle probe's q99 engine-vs-trainer gap: bf16 SmolLM2's in-flight tokens before the
        # switch reach 1.0x its q99 (0.13), and the candidates after it sit 0.09-0.20 apart (median)
        "factor": 1.5,
        "floor": 1e-4,
        "torn_share": 0.05,  # tokens after the switch fitting no weights, above which it is torn
        "pre_share": 0.05,  # tokens before the switch not OLD, above which the labels are not trusted
        "min_decisive": 8,  # tokens after the switch that fit exactly one candidate, for a behaviour
    },
)
