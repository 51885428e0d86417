"""tokenization: the same prompt must give the same token ids in both environments.

Prompts are tokenized inside each engine environment (chat template applied there), so a
transformers or chat-template change that rides along with an engine upgrade shows up here.
"""

from __future__ import annotations

import numpy as np

from gate import evidence as ev
from gate.checks.base import CheckResult, CheckSpec, Measurement
from gate.verdict import Status, worst

ID = "tokenization"
TITLE = "Tokenization parity"


def differing_prompts(a: ev.Evidence, b: ev.Evidence) -> list[int]:
    if np.array_equal(a[ev.PROMPT_OFFSETS], b[ev.PROMPT_OFFSETS]) and np.array_equal(
        a[ev.PROMPT_TOKEN_IDS], b[ev.PROMPT_TOKEN_IDS]
    ):
        return []
    if a.n_prompts != b.n_prompts:
        return list(range(max(a.n_prompts, b.n_prompts)))
    return [
        i for i in range(a.n_prompts) if not np.array_equal(a.prompt_tokens(i), b.prompt_tokens(i))
    ]


def run(ctx, settings) -> CheckResult:
    refs = ctx.references()
    if not refs:
        return CheckResult(ID, TITLE, Status.SKIP, "no old engine or baseline to compare with")
    ids = ctx.new.texts.get("prompt_ids", [])
    measurements, details = [], {}
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
    status = worst(m.status for m in measurements)
    summary = ", ".join(f"{d['count']} prompt(s) differ vs {label}" for label, d in details.items())
    diagnosis = ""
    if status == Status.FAIL:
        versions = {n: e.engine.get("identity", {}).get("transformers") for n, e in ctx.engines()}
        diagnosis = (
            f"Prompts tokenize differently (transformers {versions}); the trainer and the engine no longer see the same "
            "tokens. Pin the tokenizer / chat template (model.tokenizer in the config, or the tokenizer files), or the "
            "transformers version in the engine environment."
        )
    return CheckResult(ID, TITLE, status, summary, diagnosis, measurements, details)


SPEC = CheckSpec(id=ID, title=TITLE, run=run)
