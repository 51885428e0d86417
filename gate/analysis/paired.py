"""Paired statistics for the mini GRPO run: the new engine's seeds against the baseline's.

Seed ``s`` of the new engine and seed ``s`` of the baseline share their prompts and their trainer,
so each statistic is a per-seed difference ``D_s = X_new[s] - X_base[s]`` over ``n`` seeds. Its
spread is not taken from the new run: a broken engine that makes its seeds scatter would widen its
own band and hide. The null spread is the baseline's own between-seed SD over its ``S_b`` seeds,
``s_null``; two independent seeds differ by ``sqrt(2) * s_null``, so the mean of ``n`` differences
has standard error ``sqrt(2) * s_null / sqrt(n)`` and ``t = mean(D) / se`` is Student's t with
``S_b - 1`` degrees of freedom under the null (exactly, for normal per-seed values; pairing only
shrinks the true spread, so the test errs on the quiet side).

Student's t comes from the regularized incomplete beta function (a Lentz continued fraction,
vectorised over t) so that the orchestrator needs no scipy.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

ALTERNATIVES = ("less", "greater", "two-sided")

_DELTA_POWER = 0.9  # the power PairedTest.delta90 is stated at

_CF_EPS = 1e-15  # a continued-fraction term within this of 1 changes nothing in float64
_CF_TINY = 1e-300  # Lentz's guard against a zero denominator
# Terms of the continued fraction: under 80 suffice for every df up to 1e10 (measured on a dense t
# grid), so the cap is a backstop that never binds in range, not an accuracy setting.
_CF_MAX_TERMS = 300
# Beyond this df the beta function's continued fraction loses more (1e-6 near its switch point,
# t = 1.8) than Student's t differs from the normal (about t^4 / 4df relative: 4e-10 at t = 2, 3e-8
# at t = 6), so it is the normal.
_NORMAL_DF = 1e10
# From this a on, lgamma(a + 1/2) - lgamma(a) by Stirling's series (_lgamma_half_ratio).
_STIRLING_FROM = 20.0


# --- Student's t ------------------------------------------------------------------------------


@overload
def t_sf(t: float, df: float) -> float: ...
@overload
def t_sf(t: np.ndarray, df: float) -> np.ndarray: ...
def t_sf(t: float | np.ndarray, df: float) -> float | np.ndarray:
    """P(T > t) for Student's t with ``df`` degrees of freedom (``math.inf``: the normal).

    Vectorised over ``t``; a scalar ``t`` gives a float. Relative error below 1e-10 for df in
    [1, 1e6] wherever the result is a normal float (beyond 1e6 it grows about in proportion to df,
    1e-7 at 1e9: the continued fraction cancels near its switch point); ``t = +-inf`` gives 0 and 1.
    """
    _check_df(df)
    values = np.asarray(t, dtype=np.float64)
    finite = np.isfinite(values)
    # Infinities and NaN take no part in the arithmetic: their answer is set afterwards.
    safe = np.where(finite, values, 0.0)
    upper = _normal_upper(np.abs(safe)) if df > _NORMAL_DF else _t_upper(np.abs(safe), df)
    sf = np.where(safe >= 0, upper, 1.0 - upper)
    sf = np.where(finite, sf, np.where(values > 0, 0.0, np.where(values < 0, 1.0, np.nan)))
    return float(sf) if sf.ndim == 0 else sf


def t_ppf(q: float, df: float) -> float:
    """The ``q``-quantile of Student's t (0 < q < 1); ``math.inf`` df is the normal.

    A safeguarded Newton iteration on log P(T > t) inside a bracket that only shrinks: Newton
    converges in a few steps from anywhere the bracket allows, the bisection fallback makes it
    converge at all (tails of df = 1 reach 1e300). Accurate to 1e-11 relative for df up to 1e6.
    """
    if not 0.0 < q < 1.0:
        raise ValueError(f"t_ppf: q must lie in (0, 1), got {q}")
    _check_df(df)
    if q == 0.5:
        return 0.0
    # 1 - q is exact for q >= 0.5 (Sterbenz), so the far tail on either side keeps its digits.
    tail = min(q, 1.0 - q)
    upper = _upper_root(tail, df)
    return upper if q > 0.5 else -upper


def _upper_root(tail: float, df: float) -> float:
    """The t >= 0 with P(T > t) = tail (tail < 0.5)."""
    lo, hi = 0.0, 2.0
    while (
        t_sf(hi, df) > tail
    ):  # squaring reaches the tails of df = 1 in ten steps, doubling in 1000
        if hi == sys.float_info.max:
            return math.inf  # the quantile is past the largest float
        lo, hi = hi, min(hi * hi, sys.float_info.max)
    t = math.sqrt(lo) * math.sqrt(hi) if lo > 0 else hi / 2
    log_tail = math.log(tail)
    for _ in range(200):
        s = t_sf(t, df)
        if s > tail:
            lo = t
        else:
            hi = t
        density = _t_pdf(t, df)
        # Newton on log P(T > t), nearly linear in t in either tail; NaN where it underflowed.
        nxt = t + (math.log(s) - log_tail) * s / density if s > 0 and density > 0 else math.nan
        if not lo < nxt < hi:
            # Geometric midpoints while the bracket spans orders of magnitude, arithmetic after.
            nxt = math.sqrt(lo) * math.sqrt(hi) if lo > 0 and hi > 4 * lo else (lo + hi) / 2
        if abs(nxt - t) <= 1e-13 * nxt or hi - lo <= 4 * math.ulp(hi):
            return nxt
        t = nxt
    return t


def _t_pdf(t: float, df: float) -> float:
    """Student's t density at ``t`` (for the Newton steps of t_ppf)."""
    if df > _NORMAL_DF:
        return math.exp(-0.5 * t * t) / math.sqrt(2.0 * math.pi)
    log_norm = -_log_beta_half(df / 2.0) - 0.5 * math.log(df)
    log_kernel = float(_log1p_square(np.asarray(abs(t) / math.sqrt(df))))
    return math.exp(log_norm - 0.5 * (df + 1.0) * log_kernel)


def _normal_upper(z: np.ndarray) -> np.ndarray:
    """P(Z > z) for z >= 0. math.erfc per element: the normal is asked for a handful of values
    (report-time quantiles), never for the simulation-sized arrays the t path serves."""
    erfc = np.frompyfunc(math.erfc, 1, 1)
    return 0.5 * np.asarray(erfc(z / math.sqrt(2.0)), dtype=np.float64)


def _t_upper(t: np.ndarray, df: float) -> np.ndarray:
    """P(T > t) for t >= 0: ``I_x(df/2, 1/2) / 2`` with ``x = df / (df + t^2)``.

    The continued fraction converges fast only for ``x < (a + 1) / (a + b + 2)``; past that the
    symmetry ``I_x(a, b) = 1 - I_{1-x}(b, a)`` is evaluated instead (there the tail is not small,
    so the subtraction costs no relative accuracy). Both ``log x`` and ``log(1 - x)`` are taken
    from ``t / sqrt(df)`` directly: ``1 - x`` formed by subtraction would lose the small side.
    """
    a = df / 2.0
    r = t / math.sqrt(df)
    with np.errstate(divide="ignore"):  # t = 0: log(1 - x) = -inf, and the tail is 1/2
        log_x = -_log1p_square(r)
        log_y = 2.0 * np.log(r) + log_x
    x, y = np.exp(log_x), np.exp(log_y)
    direct = x < (a + 1.0) / (a + 2.5)
    # The beta function's parameters as evaluated: (a, 1/2), or (1/2, a) by the symmetry.
    first = np.where(direct, a, 0.5)
    second = np.where(direct, 0.5, a)
    with np.errstate(divide="ignore", invalid="ignore"):
        front = np.exp(a * log_x + 0.5 * log_y - _log_beta_half(a) - np.log(first))
    frac = _beta_continued_fraction(first, second, np.where(direct, x, y), np.where(direct, y, x))
    incomplete = np.where(r > 0, front * frac, 0.0)
    return np.where(direct, 0.5 * incomplete, 0.5 - 0.5 * incomplete)


def _log1p_square(r: np.ndarray) -> np.ndarray:
    """log(1 + r^2), without overflowing r^2 (t = 1e200 at df = 1 has a tail of 3e-201)."""
    big = r > 1.0
    inverse = np.where(big, 1.0 / np.where(big, r, 1.0), r)
    with np.errstate(divide="ignore"):
        return np.log1p(inverse * inverse) + np.where(big, 2.0 * np.log(np.where(big, r, 1.0)), 0.0)


def _beta_continued_fraction(
    a: np.ndarray, b: np.ndarray, x: np.ndarray, one_minus_x: np.ndarray
) -> np.ndarray:
    """The continued fraction of ``I_x(a, b)`` (Numerical Recipes' betacf, modified Lentz),
    elementwise. Every element steps together; one that has converged keeps its value, and the
    loop ends when none is left (NaN counts as converged)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = np.ones_like(x)
    # 1 - (a + b) x / (a + 1), rearranged so that x near its switch point does not cancel.
    d = 1.0 / _nonzero((qap * one_minus_x + (1.0 - b) * x) / qap)
    h = d.copy()
    active = np.ones(x.shape, dtype=bool)
    for m in range(1, _CF_MAX_TERMS + 1):
        m2 = 2.0 * m
        for coefficient in (
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ):
            d = 1.0 / _nonzero(1.0 + coefficient * d)
            c = _nonzero(1.0 + coefficient / c)
            delta = d * c
            h = np.where(active, h * delta, h)
        active &= np.abs(delta - 1.0) >= _CF_EPS
        if not active.any():
            break
    return h


def _nonzero(v: np.ndarray) -> np.ndarray:
    return np.where(np.abs(v) < _CF_TINY, _CF_TINY, v)


def _log_beta_half(a: float) -> float:
    """log B(a, 1/2) = log Gamma(a) + log sqrt(pi) - log Gamma(a + 1/2)."""
    return 0.5 * math.log(math.pi) - _lgamma_half_ratio(a)


def _lgamma_half_ratio(a: float) -> float:
    """log Gamma(a + 1/2) - log Gamma(a).

    The difference of two math.lgamma values of 6e6 (df = 1e6) keeps only 1e-9 of its digits, and
    that error lands on every tail probability; Stirling's series for the difference has no such
    cancellation, and with four terms it is exact to 1e-15 from a = 20 on.
    """
    if a < _STIRLING_FROM:
        return math.lgamma(a + 0.5) - math.lgamma(a)

    def correction(z: float) -> float:  # log Gamma(z) less its Stirling leading terms
        z2 = z * z
        return (1 / 12 - (1 / 360 - (1 / 1260 - 1 / (1680 * z2)) / z2) / z2) / z

    return (
        (a - 0.5) * math.log1p(0.5 / a)
        + 0.5 * math.log(a + 0.5)
        - 0.5
        + correction(a + 0.5)
        - correction(a)
    )


def _check_df(df: float) -> None:
    if not df > 0:  # catches NaN too
        raise ValueError(f"degrees of freedom must be positive, got {df}")


# --- the paired test --------------------------------------------------------------------------


@dataclass(frozen=True)
class PairedTest:
    """One statistic of the new engine's seeds against the baseline's (module doc)."""

    effect: float  # mean of D_s = new - base over the n paired seeds
    se: float  # sqrt(2) * s_null / sqrt(n), s_null the SD (ddof 1) of the baseline's seeds
    df: int  # len(null) - 1
    t: float  # effect / se: NaN where both are 0, +-inf where only se is
    p_value: float  # in the direction of `alternative` (two-sided: twice the smaller tail)
    # effect -+ q * se, q the t quantile at 1 - alpha one-sided (the end away from the alternative
    # is the test's bound: "less" is significant exactly when high < 0) or 1 - alpha/2 two-sided.
    low: float
    high: float
    delta90: (
        float  # the smallest |effect| detected with 90% power at alpha, beyond the practical size
    )
    alpha: float  # the level it is judged at, after any correction for the family
    alternative: str
    seeds: int  # n
    null_seeds: int  # S_b
    per_seed: tuple[float, ...]  # the D_s

    @property
    def significant(self) -> bool:
        return self.p_value < self.alpha

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: NaN and infinities become None (the t of a null without spread)."""
        return {
            "effect": _json_float(self.effect),
            "se": _json_float(self.se),
            "df": self.df,
            "t": _json_float(self.t),
            "p_value": _json_float(self.p_value),
            "low": _json_float(self.low),
            "high": _json_float(self.high),
            "delta90": _json_float(self.delta90),
            "alpha": _json_float(self.alpha),
            "alternative": self.alternative,
            "seeds": self.seeds,
            "null_seeds": self.null_seeds,
            "per_seed": [_json_float(v) for v in self.per_seed],
            "significant": self.significant,
        }


def paired_test(
    new: np.ndarray,
    base: np.ndarray,
    null: np.ndarray,
    alternative: str,
    alpha: float,
    practical: float = 0.0,
) -> PairedTest:
    """Test the paired differences ``new - base`` against the null spread of ``null``.

    ``practical``: the smallest effect that counts however significant; δ90 is then the effect
    that is both significant and beyond it with 90% power, max(t_(1-alpha) se, practical) +
    t_0.9 se (with no spread, the practical size itself).

    ``new``, ``base``: [n] per-seed values of the same seeds; ``null``: [S_b] the baseline's
    per-seed values, whose spread is the null's. ``alternative``: "less" (the new engine's
    values are lower), "greater" or "two-sided". Where the null has no spread at all, an effect
    of exactly 0 has p = 1 (the degenerate null puts all its mass there) and any other effect
    has p = 0 in its direction.
    """
    _check_alternative(alternative)
    _check_alpha(alpha, "paired_test")
    if not (math.isfinite(practical) and practical >= 0):
        raise ValueError(f"paired_test: practical must be finite and >= 0, got {practical}")
    new_a, base_a, null_a = (np.asarray(v, dtype=np.float64) for v in (new, base, null))
    if new_a.ndim != 1 or new_a.shape != base_a.shape:
        raise ValueError(
            f"paired_test: new {new_a.shape} and base {base_a.shape} must be [n] values of the same seeds"
        )
    if len(new_a) < 1:
        raise ValueError("paired_test: needs at least 1 paired seed, got 0")
    if null_a.ndim != 1 or len(null_a) < 2:
        raise ValueError(
            f"paired_test: null must be [S_b] values with S_b >= 2 (its spread), got shape {null_a.shape}"
        )
    for name, values in (("new", new_a), ("base", base_a), ("null", null_a)):
        if not np.isfinite(values).all():
            where = np.flatnonzero(~np.isfinite(values)).tolist()
            raise ValueError(f"paired_test: {name} has non-finite values at seeds {where}")
    diffs = new_a - base_a
    effect, se, t = (float(v) for v in paired_t(diffs, null_a))
    df = len(null_a) - 1
    p_value = float(p_values(np.asarray(t), df, alternative))
    one_sided = alternative != "two-sided"
    level = alpha if one_sided else alpha / 2.0
    quantile = t_ppf(1.0 - level, df)
    return PairedTest(
        effect=effect,
        se=se,
        df=df,
        t=t,
        p_value=p_value,
        low=effect - quantile * se,
        high=effect + quantile * se,
        delta90=max(quantile * se, practical) + t_ppf(_DELTA_POWER, df) * se,
        alpha=alpha,
        alternative=alternative,
        seeds=len(diffs),
        null_seeds=len(null_a),
        per_seed=tuple(float(v) for v in diffs),
    )


def paired_t(diffs: np.ndarray, null: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(effect, se, t) over the last axis of ``diffs`` [..., n] and ``null`` [..., S_b]: what
    paired_test computes, for whole batches of replications at once."""
    effect = diffs.mean(axis=-1)
    # Deviations from the first value: a constant null gives an SD of exactly 0 (its mean in
    # float64 may be an ulp off its value, and the SD then 1e-17 instead of 0).
    spread = np.std(null - null[..., :1], axis=-1, ddof=1)
    se = math.sqrt(2.0) * spread / math.sqrt(diffs.shape[-1])
    with np.errstate(divide="ignore", invalid="ignore"):
        t = effect / se
    return effect, se, t


def p_values(t: np.ndarray, df: float, alternative: str) -> np.ndarray:
    """The p-value of ``t`` in the direction of ``alternative``; NaN t (0 / 0) has p = 1."""
    if alternative == "less":
        p = t_sf(-t, df)
    elif alternative == "greater":
        p = t_sf(t, df)
    else:
        p = np.minimum(1.0, 2.0 * t_sf(np.abs(t), df))
    return np.where(np.isnan(t), 1.0, p)


def family_alpha(alpha: float, statistics: int) -> float:
    """Bonferroni: each of ``statistics`` tests at alpha / statistics, so that the chance that any
    of them alarms on a clean upgrade stays at most ``alpha`` however the statistics correlate
    (the run's statistics share seeds, so they do)."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"family_alpha: alpha must lie in (0, 1), got {alpha}")
    if statistics < 1:
        raise ValueError(f"family_alpha: needs at least 1 statistic, got {statistics}")
    return alpha / statistics


# --- per-seed statistics of a run -------------------------------------------------------------


def log_growth(values: np.ndarray, floor: float) -> np.ndarray:
    """[seeds, steps] -> [seeds]: each seed's mean of ``log(max(values, floor))`` over its steps,
    less the log of the run's first value (``values[0, 0]``: the first seed's first step, before any
    update was pushed): how far above where it started a mismatch runs as updates are pushed, in
    nats of log-ratio (ln 2: twice as large, on average over the seed).

    The rows are the seeds in the order they ran; a push path that leaves the engine behind also
    leaves every later seed's start behind, which the first value alone does not share. The floor
    keeps a mismatch that is bitwise zero (an fp32 engine and trainer on CPU) finite, and makes such
    a run's growth 0 instead of undefined.
    """
    v = _per_step(values, "log_growth", min_steps=1)
    if not (math.isfinite(floor) and floor > 0):
        raise ValueError(f"log_growth: floor must be positive and finite, got {floor}")
    logs = np.log(np.maximum(v, floor))
    return logs.mean(axis=1) - logs[0, 0]


def late_minus_early(values: np.ndarray, share: float = 0.25) -> np.ndarray:
    """[seeds, steps] -> [seeds]: the mean of the last ceil(share * steps) steps minus the first
    step's value: the entropy drift H(pi_K) - H(pi_0) as the run records it, the late mean
    steadying the end against one step's noise."""
    v = _per_step(values, "late_minus_early", min_steps=2)
    if not 0.0 < share <= 1.0:
        raise ValueError(f"late_minus_early: share must lie in (0, 1], got {share}")
    # 0.28 * 25 is 7.000000000000001 in float64: an ulp over an integer means that integer.
    late = max(1, math.ceil(share * v.shape[1] * (1.0 - 1e-12)))
    return v[:, -late:].mean(axis=1) - v[:, 0]


def _per_step(values: np.ndarray, caller: str, min_steps: int) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 2 or v.shape[1] < min_steps:
        raise ValueError(
            f"{caller}: values must be [seeds, steps] with at least {min_steps} steps, got shape {v.shape}"
        )
    if not np.isfinite(v).all():
        seeds = np.flatnonzero(~np.isfinite(v).all(axis=1)).tolist()
        raise ValueError(f"{caller}: non-finite values in seeds {seeds}")
    return v


def seeds_for_power(
    se_one_seed: float, df: int, delta: float, alpha: float, power: float = 0.9
) -> int:
    """The fewest paired seeds n with ``(t_ppf(1 - alpha, df) + t_ppf(power, df)) * se_one_seed /
    sqrt(n) <= delta``: a one-sided test at ``alpha`` then detects an effect of ``delta`` with
    ``power``. ``se_one_seed = sqrt(2) * s_null`` (one seed's difference); the null's df does not
    depend on n, so the bound is closed-form and only its rounding needs checking.
    """
    if not (math.isfinite(se_one_seed) and se_one_seed >= 0):
        raise ValueError(f"seeds_for_power: se_one_seed must be finite and >= 0, got {se_one_seed}")
    if not (math.isfinite(delta) and delta > 0):
        raise ValueError(f"seeds_for_power: delta must be positive and finite, got {delta}")
    if df < 1:
        raise ValueError(f"seeds_for_power: df must be >= 1, got {df}")
    _check_alpha(alpha, "seeds_for_power")
    if not 0.0 < power < 1.0:
        raise ValueError(f"seeds_for_power: power must lie in (0, 1), got {power}")
    width = (t_ppf(1.0 - alpha, df) + t_ppf(power, df)) * se_one_seed

    def enough(n: int) -> bool:
        return width / math.sqrt(n) <= delta

    if enough(1):
        return 1
    n = math.ceil((width / delta) ** 2)
    # The square and the ceiling each round; step to the exact boundary of the inequality.
    while not enough(n):
        n += 1
    while n > 1 and enough(n - 1):
        n -= 1
    return n


# --- checks and JSON ---------------------------------------------------------------------------


def _check_alternative(alternative: str) -> None:
    if alternative not in ALTERNATIVES:
        raise ValueError(
            f"alternative must be one of {', '.join(ALTERNATIVES)}; got {alternative!r}"
        )


def _check_alpha(alpha: float, caller: str) -> None:
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"{caller}: alpha must lie in (0, 0.5), got {alpha}")


def _json_float(value: float) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None
