"""The checks that turn evidence into PASS / WARN / FAIL / ERROR.

Each check is one module exposing ``SPEC`` (id, title, default thresholds and options, and its
``run(ctx, settings) -> CheckResult``). What several checks measure the same way lives in
gate.analysis; how gate.yaml configures them, in gate.config.checks_section; the loop that runs
them, in gate.judge.
"""

from __future__ import annotations

from gate.checks import (
    config_parity,
    determinism,
    forward_drift,
    greedy,
    grpo,
    inflight,
    logprob_integrity,
    mismatch,
    precision,
    semantics,
    tokenization,
    weight_sync,
)
from gate.checks.base import CheckSpec

# Report order: the logprobs themselves first, the RL dynamics last.
_MODULES = (semantics, mismatch, logprob_integrity, forward_drift, greedy, config_parity, precision,
            tokenization, determinism, weight_sync, inflight, grpo)  # fmt: skip


def registry() -> list[CheckSpec]:
    return [m.SPEC for m in _MODULES]
