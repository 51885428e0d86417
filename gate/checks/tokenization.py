"""tokenization: the same prompt must give the same token ids in both environments, and each
engine's text must be the text of the ids it sampled.

Prompts are tokenized inside each engine environment (chat template applied there), so a
transformers or chat-template change that rides along with an engine upgrade shows up here.

Sampled ids through text (issue 26, class 8; TRL #5238, prime-rl #1637): stacks that hand rollouts
on as text (multi-turn and agent loops that render the conversation again) train on the ids the
text encodes to, not on the ids the engine sampled. Per engine, the worker records whether the
engine's text is the tokenizer's decoding of its ids (a detokenizer that loses or alters text is a
fault: judged), and where encoding that text again departs from the ids (re-tokenization drift: a
property of the tokenizer on sampled text, reported).
"""

from __future__ import annotations

import numpy as np

from gate.checks.base import CheckResult, CheckSettings, CheckSpec, Limit, Measurement, Threshold
from gate.checks.context import Context
from gate.contract import evidence as ev
from gate.contract import keys
from gate.contract.request import ENGINE_FILE
from gate.verdict import Status, worst

ID = "tokenization"
TITLE = "Tokenization parity"
SHOWN = 3
_OLD_SIDE = " The replaced engine does this today: a WARN, not what the upgrade changed."

THRESHOLDS = {
    "text_mismatch_fraction": Threshold(
        Limit(0.0),
        Limit(0.01),
        source="sampled sequences whose engine text is not the tokenizer's decoding of the sampled "
        "ids (special tokens left out): none in a sound engine",
    ),
}


def differing_prompts(a: ev.Evidence, b: ev.Evidence) -> list[int]:
    if np.array_equal(a[keys.PROMPT_OFFSETS], b[keys.PROMPT_OFFSETS]) and np.array_equal(
        a[keys.PROMPT_TOKEN_IDS], b[keys.PROMPT_TOKEN_IDS]
    ):
        return []
    if a.n_prompts != b.n_prompts:
        return list(range(max(a.n_prompts, b.n_prompts)))
    return [
        i for i in range(a.n_prompts) if not np.array_equal(a.prompt_tokens(i), b.prompt_tokens(i))
    ]


def run(ctx: Context, settings: CheckSettings) -> CheckResult:
    measurements: list[Measurement] = []
    details: dict[str, dict] = {}
    parts: list[str] = []
    refs = ctx.references()
    ids = ctx.new.texts.get("prompt_ids", [])
    for label, ref in refs:
        bad = differing_prompts(ctx.new, ref)
        status = Status.FAIL if bad else Status.PASS
        measurements.append(
            Measurement(
                "prompts_tokenized_differently", float(len(bad)), status, engine=f"vs {label}"
            )
        )
        details[label] = {
            "differing": [ids[i] if i < len(ids) else i for i in bad[:20]],
            "count": len(bad),
        }
        parts.append(f"{len(bad)} prompt(s) differ vs {label}")
    rendered = {name: rec for name, e in ctx.engines() if (rec := prompt_ids_record(e))}
    for name, rec in rendered.items():
        measurements.append(_unlike_trainer_measurement(name, rec))
        parts.append(
            f"{name}: {rec['unlike_trainer']['count']} of {rec['checked']} prompt(s) run on "
            "other ids than the trainer's"
        )
    if rendered:
        details["unlike_trainer"] = rendered
    trips = {name: trip for name, e in ctx.engines() if (trip := round_trip(e)) is not None}
    for name, trip in trips.items():
        measurements += _round_trip_measurements(name, trip, settings)
        parts.append(
            f"{name}: text off its ids in {trip['text_mismatch']} of {trip['sequences']} "
            f"samples, {trip['retokenized']} re-tokenize to other ids"
        )
    if not measurements:
        return CheckResult(ID, TITLE, Status.SKIP, "no old engine or baseline to compare with")
    if trips:
        details["round_trip"] = trips
    status = worst(m.status for m in measurements)
    return CheckResult(
        ID, TITLE, status, "; ".join(parts), _diagnosis(ctx, details, status), measurements, details
    )


def round_trip(e: ev.Evidence) -> dict | None:
    """One engine's sampled ids through text (None: evidence from before it was recorded)."""
    mismatch = e.arrays.get(f"{keys.SAMPLE}_{keys.TEXT_MISMATCH}")
    at = e.arrays.get(f"{keys.SAMPLE}_{keys.RETOKENIZED_AT}")
    if mismatch is None or at is None:
        return None
    off = np.flatnonzero(mismatch)
    drift = np.flatnonzero(at >= 0)
    return {
        "sequences": len(mismatch),
        "text_mismatch": len(off),
        "text_mismatch_at": e.sequence_labels(keys.SAMPLE, off[:SHOWN].tolist()),
        "retokenized": len(drift),
        "retokenized_at": [
            f"{where} token {int(at[s])}"
            for where, s in zip(
                e.sequence_labels(keys.SAMPLE, drift[:SHOWN].tolist()), drift, strict=False
            )
        ],
    }


def prompt_ids_record(e: ev.Evidence) -> dict | None:
    """engine.json ``prompt_ids`` (the worker's replay.prompt_ids_record), checked: evidence may come
    from a cache or an artifact. None: evidence from before it was recorded."""
    rec = e.engine.prompt_ids
    if rec is None:
        return None
    found = rec.get("unlike_trainer") if isinstance(rec, dict) else None
    first = found.get("first") if isinstance(found, dict) else None
    ok = (
        isinstance(found, dict)
        and isinstance(rec.get("source"), str)
        and _count(rec.get("checked"))
        and _count(found.get("count"))
        and isinstance(found.get("ids"), list)
        and all(isinstance(i, str) for i in found["ids"])
        and (
            first is None
            or (
                isinstance(first, dict)
                and isinstance(first.get("id"), str)
                and all(_count(first.get(k)) for k in ("at", "trainer_tokens", "engine_tokens"))
            )
        )
    )
    if not ok:
        raise ev.EvidenceError(
            f"{e.path / ENGINE_FILE}: prompt_ids: expected source, checked and unlike_trainer "
            "{count, ids, first} as the worker writes them"
        )
    return rec


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _unlike_trainer_measurement(name: str, rec: dict) -> Measurement:
    """The new engine's prompts on other ids than the trainer's FAIL; the old engine's WARN: they
    are how the stack runs today, not what the upgrade changed."""
    count = int(rec["unlike_trainer"]["count"])
    status = Status.PASS if count == 0 else Status.FAIL if name == "new" else Status.WARN
    return Measurement(
        "prompts_unlike_trainer",
        float(count),
        status,
        engine=name,
        note=f"prompts the engine ran on other token ids than the trainer holds for them "
        f"(engine's ids: {rec['source']})",
    )


def _round_trip_measurements(name: str, trip: dict, settings) -> list[Measurement]:
    n = max(trip["sequences"], 1)
    share = trip["text_mismatch"] / n
    status, warn, fail = settings.thresholds["text_mismatch_fraction"].evaluate(share)
    if name != "new" and status == Status.FAIL:
        # The old engine's texts are how the stack runs today, not what the upgrade changed.
        status = Status.WARN
    drift = trip["retokenized"] / n
    return [
        Measurement(
            "text_mismatch_fraction",
            share,
            status,
            warn,
            fail,
            engine=name,
            note="the engine's text against the tokenizer's decoding of the ids it sampled",
        ),
        Measurement(
            "retokenization_drift",
            drift,
            Status.PASS,
            engine=name,
            note=f"{trip['retokenized']} of {trip['sequences']} sampled sequences encode back to other "
            "ids from their text: what a stack that passes rollouts on as text trains on instead "
            "(reported, not judged: a property of the tokenizer on sampled text)",
        ),
    ]


def _diagnosis(ctx, details: dict, status: Status) -> str:
    if status == Status.PASS:
        return ""
    out = []
    if any(
        d.get("count")
        for label, d in details.items()
        if label not in ("round_trip", "unlike_trainer")
    ):
        versions = {n: e.engine.identity.transformers for n, e in ctx.engines()}
        out.append(
            f"Prompts tokenize differently (transformers {versions}); the trainer and the engine no longer see the same "
            "tokens. Pin the tokenizer / chat template (model.tokenizer in the config, or the tokenizer files), or the "
            "transformers version in the engine environment."
        )
    for name, rec in details.get("unlike_trainer", {}).items():
        if rec["unlike_trainer"]["count"]:
            out.append(_unlike_trainer_sentence(name, rec))
    for name, trip in details.get("round_trip", {}).items():
        if trip["text_mismatch"]:
            out.append(
                f"The {name} engine's text is not the text of the ids it sampled in {trip['text_mismatch']} of "
                f"{trip['sequences']} sequences (e.g. {', '.join(trip['text_mismatch_at'])}): its detokenizer "
                "loses or alters text. A stack that reads the text (rewards, stop strings, the next turn of a "
                "multi-turn rollout) acts on other tokens than the ones it trains on (TRL #5238, prime-rl #1637); "
                "keep token ids end to end, or pin the release whose detokenizer agrees."
                + _OLD_SIDE
                * (name != "new")
            )
    return " ".join(out)


def _unlike_trainer_sentence(name: str, rec: dict) -> str:
    found, first = rec["unlike_trainer"], rec["unlike_trainer"]["first"] or {}
    where = (
        f"; {first['id']} departs at token {first['at']}, {first['trainer_tokens']} tokens in the trainer's "
        f"rendering against {first['engine_tokens']} in the engine's"
        if first
        else ""
    )
    return (
        f"The {name} engine ran {found['count']} of {rec['checked']} prompt(s) on other token ids than the "
        f"trainer holds for them (e.g. {', '.join(found['ids'][:SHOWN])}{where}): the trainer scores, and "
        "trains on, prompts the engine did not see. A server renders chat messages itself: its chat template "
        "or its normalisation of the messages differs from the trainer's apply_chat_template (vLLM #33616: "
        "vLLM renames a message's reasoning_content to reasoning and gives an assistant turn's template "
        "both, so a template that reads reasoning_content renders earlier turns' reasoning that the trainer's "
        "rendering of messages stored with vLLM's reasoning field leaves out). Send the trainer's token ids "
        "(the token-in path), or give the server the trainer's template and message fields."
    )


SPEC = CheckSpec(id=ID, title=TITLE, run=run, thresholds=THRESHOLDS)
