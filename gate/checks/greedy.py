"""greedy-and-length: greedy completions and output lengths against the baseline and the old engine.

Cheap drift guards peers use: greedy completions should be identical on the same model and
settings (first divergence reported), and the mean sampled output length should stay within
+/-10% of the reference (MLPerf's accuracy-run guard).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gate import evidence as ev
from gate.checks.base import CheckResult, CheckSpec, Limit, Threshold, measure
from gate.checks.context import sequences
from gate.metrics import greedy_agreement, length_ratio
from gate.verdict import Status, worst

ID = "greedy-and-length"
EXAMPLES = 3  # changed completions kept for the report, side by side (reference, new)
TITLE = "Greedy agreement and output length"

THRESHOLDS = {
    "greedy_exact_match_rate": Threshold(
        Limit(0.95),
        Limit(0.8),
        higher_is_worse=False,
        source="identical greedy completions expected on the same model and dtype",
    ),
    "length_ratio_deviation": Threshold(
        Limit(0.05), Limit(0.10), source="MLPerf: output length within +/-10%"
    ),
}


def run(ctx, settings) -> CheckResult:
    th = settings.thresholds
    refs = ctx.references()
    if not refs:
        return CheckResult(ID, TITLE, Status.SKIP, "no baseline and no old engine to compare with")
    g, s = ev.GREEDY, ev.SAMPLE
    measurements, details = [], {}
    for label, ref in refs:
        entry: dict[str, Any] = {}  # JSON details: the agreement's figures and the length ratio
        if f"{g}_{ev.OFFSETS}" in ctx.new.arrays and f"{g}_{ev.OFFSETS}" in ref.arrays:
            agree = greedy_agreement(ctx.new[f"{g}_{ev.TOKEN_IDS}"], ctx.new[f"{g}_{ev.OFFSETS}"],
                                     ref[f"{g}_{ev.TOKEN_IDS}"], ref[f"{g}_{ev.OFFSETS}"])  # fmt: skip
            measurements.append(
                measure(
                    "greedy_exact_match_rate",
                    agree.exact_match_rate,
                    th["greedy_exact_match_rate"],
                    engine=f"vs {label}",
                )
            )
            diverged = np.flatnonzero(agree.first_divergence >= 0)
            entry["greedy"] = {**{k: v for k, v in agree.to_dict().items() if k != "first_divergence"},
                               "diverging_prompts": diverged[:20].tolist()}  # fmt: skip
            if len(diverged):
                entry["examples"] = _examples(
                    ctx.new, ref, diverged[:EXAMPLES], agree.first_divergence
                )
        ratio = length_ratio(ctx.new[f"{s}_{ev.OFFSETS}"], ref[f"{s}_{ev.OFFSETS}"])
        measurements.append(
            measure(
                "length_ratio_deviation",
                abs(ratio - 1.0),
                th["length_ratio_deviation"],
                engine=f"vs {label}",
            )
        )
        entry["length_ratio"] = ratio
        details[label] = entry
    status = worst(m.status for m in measurements)
    first = measurements[0]
    summary = f"greedy match {first.value:.0%} {first.engine}, length x{details[refs[0][0]]['length_ratio']:.3f}"
    diagnosis = ""
    if status in (Status.WARN, Status.FAIL):
        diagnosis = (
            "Greedy completions or output lengths moved. If forward drift is clean, look at sampling-side changes "
            "(generation defaults from generation_config.json, stop tokens, detokenization); otherwise fix the forward drift first."
        )
    return CheckResult(ID, TITLE, status, summary, diagnosis, measurements, details)


def _examples(
    new: ev.Evidence, ref: ev.Evidence, which: np.ndarray, first: np.ndarray
) -> list[dict[str, Any]]:
    """The reference's and the new engine's greedy completions of the sequences ``which``, decoded
    (untrusted text, escaped where it is rendered), with the prompt id and the first differing token."""
    g = ev.GREEDY
    new_seqs, ref_seqs = sequences(new, g), sequences(ref, g)
    prompt_of = new[f"{g}_{ev.PROMPT_INDEX}"]
    names = new.texts.get("prompt_ids") if isinstance(new.texts, dict) else None
    out = []
    for i in which.tolist():
        p = int(prompt_of[i])
        out.append({
            "prompt_id": names[p] if isinstance(names, list) and p < len(names) else p,
            "first_divergence": int(first[i]),
            "reference": ref.decode(ref_seqs[i].tolist()),
            "new": new.decode(new_seqs[i].tolist()),
        })  # fmt: skip
    return out


SPEC = CheckSpec(id=ID, title=TITLE, run=run, thresholds=THRESHOLDS)
