"""precision: does the engine's final projection behave like an fp32 or a bf16 lm_head?

On the teacher-forced tokens, the engine's raw logprobs are compared with the reference computed
with an fp32 projection and with a bf16 one. Logits from a bf16 lm_head move policy ratios enough
to matter (MiniMax-M1, ScaleRL, PipelineRL all moved to an fp32 head on both sides). FAIL when the
config declares ``expect_lm_head: fp32`` and the engine is clearly closer to bf16.
"""

from __future__ import annotations

import numpy as np

from gate import evidence as ev
from gate.checks.base import CheckResult, CheckSpec, Measurement, Status

ID = "precision"
TITLE = "lm_head precision"


def classify(d_fp32: float, d_bf16: float, decisive_ratio: float) -> str:
    if d_fp32 * decisive_ratio <= d_bf16:
        return "fp32"
    if d_bf16 * decisive_ratio <= d_fp32:
        return "bf16"
    return "inconclusive"


def run(ctx, settings) -> CheckResult:
    opts = settings.options
    expect = opts["expect_lm_head"]
    found, measurements = {}, []
    for name, e in ctx.engines():
        engine = e[f"{ev.TF}_{ev.ENGINE_LOGPROB}"].astype(np.float64)
        d_fp32 = float(np.abs(engine - e[f"{ev.TF}_{ev.TRAINER_RAW}"]).mean())
        d_bf16 = float(np.abs(engine - e[f"{ev.TF}_{ev.TRAINER_RAW_BF16_HEAD}"]).mean())
        found[name] = classify(d_fp32, d_bf16, opts["decisive_ratio"])
        measurements += [
            Measurement("mean_abs_diff_fp32_head", d_fp32, Status.PASS, engine=name),
            Measurement("mean_abs_diff_bf16_head", d_bf16, Status.PASS, engine=name),
        ]
    summary = ", ".join(f"{n} behaves like {v}" for n, v in found.items())
    details = {"behaves_like": found, "expect_lm_head": expect}
    if expect != "any" and found["new"] != expect and found["new"] != "inconclusive":
        diagnosis = (
            f"The config declares an {expect} lm_head but the new engine's logprobs match a {found['new']} projection "
            "better. Run the final projection in fp32 in the engine (and the trainer), e.g. keep lm_head weights and "
            "logits in fp32, or change expect_lm_head if bf16 is intended."
        )
        return CheckResult(ID, TITLE, Status.FAIL, summary, diagnosis, measurements, details)
    if "old" in found and found["old"] != found["new"] and "inconclusive" not in found.values():
        return CheckResult(ID, TITLE, Status.WARN, summary, "The lm_head precision changed between the engines.", measurements, details)
    return CheckResult(ID, TITLE, Status.PASS, summary, "", measurements, details)


SPEC = CheckSpec(id=ID, title=TITLE, run=run, options={"expect_lm_head": "any", "decisive_ratio": 3.0})
