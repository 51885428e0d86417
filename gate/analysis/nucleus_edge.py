"""Where the reference's top-k/top-p cut is no finding: sampled tokens on the nucleus edge.

The reference decides the transform on its own logits. A token it excludes that the engine
sampled is a finding only when the engine and the reference could not disagree about it: one
ULP from the cut (GPU kernels keep exactly k of tied tokens, bisect for the top-p cut), or
within the logit noise the two show at the same positions (a bf16 engine against a bf16 trainer
trunk). Shared by logprob-semantics, which judges the rest, and the baseline writer, which
refuses a reference engine that samples outside its transform.

The noise band is ``EDGE_MARGIN`` times the 99th percentile of the discrepancy: that quantile of
one pair's discrepancy is taken over a heavy-tailed distribution (bf16 rounding; the largest pair
is often several times it), and the edge tokens themselves reach past it. Measured on SmolLM2 in
bf16 at top_p 0.9 over 80 replays (20 seeds each: both sides of the A/A and the clean upgrade's
0.32 at logit noise 0, one A/A side at 0.03): 201 sampled tokens outside the reference's nucleus, 7 of them past one such quantile
(at most 1.92x it), none past two; at one, 1 seed in 20 of an A/A WARNed. An engine that ignores
top_p 0.9 still has about half its outside tokens decidable at that width (noise 0.27, T 0.8:
the band is mass above in [0.900, 0.946]), 5% of all its tokens, 50x the FAIL level.
"""

from __future__ import annotations

import numpy as np

from gate.analysis.temperature_fit import evidence_logit_noise
from gate.contract import evidence as ev
from gate.contract import keys

EDGE_MARGIN = 2.0  # the noise band, in 99th percentiles of the measured discrepancy (module doc)


def decidably_outside(e: ev.Evidence, sampling: dict) -> int:
    """Sampled tokens the reference's transform excludes, less those on its edge."""
    outside = int(np.count_nonzero(~np.isfinite(e[f"{keys.SAMPLE}_{keys.TRAINER_PROCESSED}"])))
    return outside - undecidable_outside(e, sampling)[0]


def undecidable_outside(e: ev.Evidence, sampling: dict) -> tuple[int, float | None]:
    """Sampled tokens outside the reference's transform that sit on its edge, and the logit noise
    band that edge was measured with (None where the evidence does not give it).

    On the edge: within one ULP of the boundary logit; or, against the logit noise the engine and
    the reference show at the same positions (``EDGE_MARGIN`` x ``evidence_logit_noise``), nearer
    to the top-k cut than that band, or excluded by top-p by less than that band moves the nucleus:
    the log-odds of the probability above the token exceed those of top_p by at most band / T (a shift of
    ``delta`` in the logits above against those below moves those log-odds by ``delta / T``). A bf16
    engine and a bf16 trainer trunk round differently, and where the cut falls is then no finding.
    """
    outside = ~np.isfinite(e[f"{keys.SAMPLE}_{keys.TRAINER_PROCESSED}"])
    edge = e.arrays.get(f"{keys.SAMPLE}_{keys.TRAINER_AT_BOUNDARY}")
    edge = np.zeros_like(outside) if edge is None else edge.astype(bool)
    gap = e.arrays.get(f"{keys.SAMPLE}_{keys.TRAINER_BOUNDARY_GAP}")
    mass = e.arrays.get(f"{keys.SAMPLE}_{keys.TRAINER_MASS_ABOVE}")
    quantile = evidence_logit_noise(e) if gap is not None or mass is not None else None
    band = None if quantile is None else EDGE_MARGIN * quantile
    if band is not None:
        with np.errstate(invalid="ignore", divide="ignore"):  # NaN: no transform applies there
            if gap is not None:
                edge = edge | (gap <= band)
            top_p = float(sampling.get("top_p", 1.0))
            if mass is not None and 0.0 < top_p < 1.0:
                temperature = float(sampling.get("temperature") or 1.0)
                over = _log_odds(mass.astype(np.float64)) - _log_odds(np.float64(top_p))
                edge = edge | (over <= band / temperature)
    return int(np.count_nonzero(edge & outside)), band


def _log_odds(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-12, 1.0 - 1e-12)
    return np.log(p) - np.log1p(-p)
