"""gate.analysis.paired: Student's t without scipy, the paired test against the baseline's null
spread, and the per-seed statistics of a GRPO run.

Reference values are closed forms where Student's t has one (df = 1 is the Cauchy, df = 2 has an
algebraic cdf), standard table values, or (marked) mpmath at 40 digits.
"""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from gate.analysis.paired import (
    ALTERNATIVES,
    PairedTest,
    family_alpha,
    late_minus_early,
    log_growth,
    p_values,
    paired_t,
    paired_test,
    seeds_for_power,
    t_ppf,
    t_sf,
)

# --- Student's t ------------------------------------------------------------------------------

DFS = (1, 2, 2.5, 7, 31, 1e3, 1e6, math.inf)


@pytest.mark.parametrize(
    ("q", "df", "table"),
    [(0.99, 31, 2.4528), (0.975, 10, 2.2281), (0.9975, 15, 3.2860), (0.95, 1, 6.3138)],
)
def test_t_ppf_matches_the_tables(q, df, table):
    assert abs(t_ppf(q, df) - table) < 5e-5  # the tables' 4 decimals


def test_t_ppf_of_the_normal():
    assert abs(t_ppf(0.9, math.inf) - 1.28155) < 5e-6
    assert t_ppf(0.975, math.inf) == pytest.approx(1.959963984540054, rel=1e-12)


@pytest.mark.parametrize(
    ("q", "df", "quantile"),  # mpmath, 40 digits
    [
        (0.99, 31, 2.45282419340265),
        (0.9975, 15, 3.28603857094623),
        (0.999999, 3, 103.299467779429),
        (1e-6, 7, -14.2414696519814),
    ],
)
def test_t_ppf_to_ten_digits(q, df, quantile):
    assert t_ppf(q, df) == pytest.approx(quantile, rel=1e-10)


@pytest.mark.parametrize("q", [1e-300, 1e-12, 0.01, 0.3, 0.5, 0.7, 0.975, 1 - 1e-12])
def test_t_ppf_closed_forms(q):
    # df = 1: the Cauchy, tan(pi (q - 1/2)) = -cot(pi q) = cot(pi (1 - q)); the cotangent of the
    # smaller tail keeps its digits (1 - q is exact above 1/2).
    cauchy = -1 / math.tan(math.pi * q) if q <= 0.5 else 1 / math.tan(math.pi * (1 - q))
    assert t_ppf(q, 1) == pytest.approx(cauchy, rel=1e-9, abs=1e-15)
    # df = 2: F(t) = 1/2 + t / (2 sqrt(2 + t^2)) inverts to t = (2q - 1) / sqrt(2 q (1 - q)).
    assert t_ppf(q, 2) == pytest.approx(
        (2 * q - 1) / math.sqrt(2 * q * (1 - q)), rel=1e-9, abs=1e-15
    )


@pytest.mark.parametrize("df", DFS)
def test_t_sf_is_one_half_at_zero_and_symmetric(df):
    assert t_sf(0.0, df) == 0.5
    t = np.linspace(-30, 30, 601)
    assert np.max(np.abs(t_sf(-t, df) - (1 - t_sf(t, df)))) < 1e-15


def test_df_one_is_the_cauchy():
    t = np.linspace(-50, 50, 1001)
    assert np.max(np.abs(t_sf(t, 1) - (0.5 - np.arctan(t) / math.pi))) < 1e-12
    # The far tail, relative: sf = atan(1/t) / pi for t > 0 (1e200 squared would overflow).
    far = np.logspace(1, 200, 50)
    assert np.max(np.abs(t_sf(far, 1) / (np.arctan(1 / far) / math.pi) - 1)) < 1e-12


def test_df_two_closed_form():
    # sf = 1/2 - t / (2 s), s = sqrt(2 + t^2), written without cancellation as 1 / (s (s + t)).
    t = np.concatenate([np.linspace(0, 10, 101), np.logspace(1, 3, 21)])
    s = np.sqrt(2 + t * t)
    assert np.max(np.abs(t_sf(t, 2) * s * (s + t) - 1)) < 1e-12


@pytest.mark.parametrize(
    ("t", "df", "sf"),  # mpmath, 40 digits
    [
        (2.0, 2.5, 0.078695747878982993),
        (-1.5, 7, 0.91135075650501498),
        (3.0, 31, 0.0026443733444956763),
        (10.0, 31, 1.6023977459154431e-11),
        (40.0, 3, 1.7190340394579264e-5),
        (1000.0, 1, 0.00031830978008055894),
        (5.0, 1000, 3.3836281823243152e-7),
        (1.76, 1e6, 0.039204056134520071),  # the continued fraction's worst spot at large df
        (8.0, 1e6, 6.2275317166012598e-16),
    ],
)
def test_t_sf_reference_values(t, df, sf):
    assert t_sf(t, df) == pytest.approx(sf, rel=1e-10)


def test_large_df_approaches_the_normal():
    t = np.linspace(-5, 5, 101)
    normal = t_sf(t, math.inf)
    assert t_sf(1.959963984540054, math.inf) == pytest.approx(0.025, rel=1e-12)
    # t_df's tail exceeds the normal's by O(1/df): gaps shrink tenfold with df, to 1.6e-6 at 1e5.
    gaps = [np.max(np.abs(t_sf(t, df) - normal)) for df in (1e2, 1e3, 1e4, 1e5)]
    assert gaps[-1] < 2e-6
    assert all(0.05 < after / before < 0.2 for before, after in itertools.pairwise(gaps))


@pytest.mark.parametrize("df", [1, 31, 1e6, math.inf])
def test_vectorised_call_equals_scalar_calls(df):
    t = np.array([[-40.0, -2.5, -1e-3, 0.0], [0.7, 2.0, 9.0, 300.0]])
    batch = t_sf(t, df)
    assert batch.shape == t.shape
    scalars = [[t_sf(float(v), df) for v in row] for row in t]
    assert all(isinstance(v, float) for row in scalars for v in row)
    np.testing.assert_array_equal(batch, np.array(scalars))


@pytest.mark.parametrize("df", [1, 3, 31, 1e6, math.inf])
def test_ppf_and_sf_invert_each_other(df):
    for q in (1e-9, 0.001, 0.05, 0.4, 0.6, 0.95, 0.999, 1 - 1e-9):
        assert t_sf(t_ppf(q, df), df) == pytest.approx(1 - q, rel=1e-9)
    for t in (-20.0, -1.0, 0.3, 2.0, 6.0):
        assert t_ppf(t_sf(-t, df), df) == pytest.approx(t, rel=1e-8)  # the cdf at t is sf(-t)


def test_t_sf_at_infinities_and_nan():
    np.testing.assert_array_equal(
        t_sf(np.array([math.inf, -math.inf, math.nan]), 5), [0, 1, math.nan]
    )
    assert t_sf(1e200, 1) == pytest.approx(1 / (math.pi * 1e200), rel=1e-12)
    assert t_ppf(1e-300, 1) == pytest.approx(-1 / (math.pi * 1e-300), rel=1e-9)


@pytest.mark.parametrize(
    ("q", "df", "message"),
    [
        (0.0, 5, "q must lie in"),
        (1.0, 5, "q must lie in"),
        (math.nan, 5, "q must lie in"),
        (0.5, 0, "degrees of freedom must be positive, got 0"),
        (0.5, math.nan, "degrees of freedom must be positive, got nan"),
    ],
)
def test_t_ppf_rejects_what_has_no_quantile(q, df, message):
    with pytest.raises(ValueError, match=message):
        t_ppf(q, df)


# --- the paired test --------------------------------------------------------------------------

NEW, BASE = np.array([0.5, 0.4, 0.6]), np.array([0.6, 0.5, 0.6])
# mean 0.5, deviations -0.1, 0, 0.1: variance 0.02 / 2, SD exactly 0.1, df 2 (closed forms below)
NULL = np.array([0.4, 0.5, 0.6])


def _t2_quantile(q: float) -> float:
    return (2 * q - 1) / math.sqrt(2 * q * (1 - q))  # Student's t with df = 2


def test_hand_computed_example():
    r = paired_test(NEW, BASE, NULL, "less", alpha=0.05)
    # D = (-0.1, -0.1, 0): effect -0.2/3; se = sqrt(2) * 0.1 / sqrt(3) = 0.1 sqrt(2/3)
    assert r.per_seed == pytest.approx((-0.1, -0.1, 0.0), abs=1e-15)
    assert r.effect == pytest.approx(-0.2 / 3, rel=1e-12)
    se = 0.1 * math.sqrt(2 / 3)
    assert r.se == pytest.approx(se, rel=1e-12)
    assert r.df == 2 and r.seeds == 3 and r.null_seeds == 3
    # t = -(2/3) / sqrt(2/3) = -sqrt(2/3); at df 2, P(T <= -sqrt(2/3)) = 1/2 - sqrt(2/3) /
    # (2 sqrt(8/3)) = 1/2 - 1/4
    assert r.t == pytest.approx(-math.sqrt(2 / 3), rel=1e-12)
    assert r.p_value == pytest.approx(0.25, rel=1e-12)
    assert r.p_value == pytest.approx(t_sf(-r.t, 2), rel=1e-12)
    # t_0.95(2) = 0.9 / sqrt(0.095) = 2.91999 (the tables' 2.920); t_0.9(2) = 0.8 / sqrt(0.18)
    q95, q90 = _t2_quantile(0.95), _t2_quantile(0.9)
    assert q95 == pytest.approx(2.92, abs=5e-4)
    assert (r.low, r.high) == pytest.approx((-0.2 / 3 - q95 * se, -0.2 / 3 + q95 * se), rel=1e-10)
    assert r.delta90 == pytest.approx((q95 + q90) * se, rel=1e-10)
    assert not r.significant and r.alpha == 0.05 and r.alternative == "less"


def test_a_practical_size_beyond_the_tests_own_bound_sets_delta90():
    # se = 0.1 sqrt(2/3) = 0.0816: the test's bound t_0.95(2) se = 0.238; a practical size of 0.5
    # lies beyond it, so 90% power needs 0.5 + t_0.9(2) se
    se = 0.1 * math.sqrt(2 / 3)
    r = paired_test(NEW, BASE, NULL, "less", alpha=0.05, practical=0.5)
    assert r.delta90 == pytest.approx(0.5 + _t2_quantile(0.9) * se, rel=1e-10)
    small = paired_test(NEW, BASE, NULL, "less", alpha=0.05, practical=0.1)  # under the bound
    assert small.delta90 == paired_test(NEW, BASE, NULL, "less", alpha=0.05).delta90
    flat = paired_test(NEW, BASE, np.zeros(4), "less", alpha=0.05, practical=0.3)
    assert flat.delta90 == 0.3  # no spread: the practical size alone
    with pytest.raises(ValueError, match="practical must be finite and >= 0"):
        paired_test(NEW, BASE, NULL, "less", alpha=0.05, practical=-1.0)


def test_hand_computed_two_sided():
    r = paired_test(NEW, BASE, NULL, "two-sided", alpha=0.1)
    assert r.p_value == pytest.approx(0.5, rel=1e-12)  # twice the one-sided 0.25
    se, q95 = 0.1 * math.sqrt(2 / 3), _t2_quantile(0.95)  # alpha/2 = 0.05 per side
    assert r.high - r.effect == pytest.approx(q95 * se, rel=1e-10)
    assert r.delta90 == pytest.approx((q95 + _t2_quantile(0.9)) * se, rel=1e-10)


def test_the_one_sided_bound_is_the_test():
    # "less" at alpha is significant exactly when the interval's upper end is below 0.
    null = np.array([0.40, 0.45, 0.50, 0.55, 0.60, 0.52, 0.48, 0.41])
    for shift in np.linspace(-0.2, 0.05, 26):
        r = paired_test(BASE + shift, BASE, null, "less", alpha=0.05)
        assert r.significant == (r.high < 0)


def test_less_flags_a_clear_drop_and_not_a_rise():
    null = np.array([0.50, 0.52, 0.48, 0.51, 0.49, 0.50, 0.53, 0.47])
    base = np.array([0.50, 0.49, 0.51, 0.50])
    drop = paired_test(base - 0.2, base, null, "less", alpha=0.01)
    rise = paired_test(base + 0.2, base, null, "less", alpha=0.01)
    assert drop.significant and drop.p_value < 1e-5  # t = -14 at df 7
    assert not rise.significant and rise.p_value > 1 - 1e-5
    assert paired_test(base + 0.2, base, null, "greater", alpha=0.01).significant


def test_two_sided_is_symmetric():
    null = np.array([0.3, 0.5, 0.4, 0.6, 0.45])
    up = paired_test(NEW, BASE, null, "two-sided", alpha=0.05)
    down = paired_test(BASE, NEW, null, "two-sided", alpha=0.05)
    assert up.p_value == pytest.approx(down.p_value, rel=1e-12)
    assert (up.low, up.high) == pytest.approx((-down.high, -down.low), rel=1e-12)
    assert up.delta90 == down.delta90
    one_sided = paired_test(NEW, BASE, null, "less", alpha=0.05)
    assert up.p_value == pytest.approx(2 * one_sided.p_value, rel=1e-12)


def test_the_spread_is_the_null_s_not_the_new_run_s():
    # A broken engine whose seeds scatter wildly must not widen its own band.
    base = np.array([0.5, 0.5, 0.5, 0.5])
    tight = paired_test(base - 0.1, base, NULL, "less", alpha=0.05)
    wild = paired_test(
        base - 0.1 + np.array([3.0, -3.0, 3.0, -3.0]), base, NULL, "less", alpha=0.05
    )
    assert wild.se == tight.se and wild.effect == pytest.approx(tight.effect)


def test_no_null_spread():
    # 0.1 three times: its float mean is an ulp off, and the SD must still come out exactly 0.
    flat = np.array([0.1, 0.1, 0.1])
    same = paired_test(NEW, NEW, flat, "less", alpha=0.05)
    assert same.se == 0 and math.isnan(same.t)
    assert same.p_value == 1.0 and not same.significant  # all the null's mass sits at 0
    assert same.to_dict()["t"] is None
    drop = paired_test(NEW, BASE, flat, "less", alpha=0.05)
    assert drop.t == -math.inf and drop.p_value == 0.0 and drop.significant
    assert drop.low == drop.high == drop.effect
    assert paired_test(NEW, BASE, flat, "greater", alpha=0.05).p_value == 1.0


def test_to_dict_is_json():
    d = paired_test(NEW, BASE, NULL, "less", alpha=0.05).to_dict()
    json.dumps(d, allow_nan=False)
    assert type(d["effect"]) is float and type(d["df"]) is int and d["significant"] is False
    assert d["per_seed"] == pytest.approx([-0.1, -0.1, 0.0], abs=1e-15)
    assert set(d) >= {f.name for f in PairedTest.__dataclass_fields__.values()}
    flat = paired_test(NEW, BASE, np.ones(3), "less", alpha=0.05).to_dict()
    assert flat["t"] is None and json.dumps(flat, allow_nan=False)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((NEW, BASE[:2], NULL, "less", 0.05), r"new \(3,\) and base \(2,\)"),
        ((NEW[None], BASE[None], NULL, "less", 0.05), r"new \(1, 3\)"),
        ((NEW[:0], BASE[:0], NULL, "less", 0.05), "at least 1 paired seed"),
        ((NEW, BASE, NULL[:1], "less", 0.05), r"S_b >= 2.*\(1,\)"),
        ((NEW, BASE, np.array([0.1, math.nan, 0.3]), "less", 0.05), r"null has non-finite.*\[1\]"),
        ((np.array([0.1, 0.2, math.inf]), BASE, NULL, "less", 0.05), r"new has non-finite.*\[2\]"),
        ((NEW, BASE, NULL, "less", 0.5), r"alpha must lie in \(0, 0.5\), got 0.5"),
        ((NEW, BASE, NULL, "less", 0.0), "alpha must lie in"),
        (
            (NEW, BASE, NULL, "lower", 0.05),
            "alternative must be one of less, greater, two-sided; got 'lower'",
        ),
    ],
)
def test_paired_test_rejects(args, message):
    with pytest.raises(ValueError, match=message) as err:
        paired_test(*args)
    assert "\n" not in str(err.value)


def test_family_alpha():
    assert family_alpha(0.05, 5) == pytest.approx(0.01)
    assert family_alpha(0.05, 1) == 0.05
    with pytest.raises(ValueError, match="at least 1 statistic"):
        family_alpha(0.05, 0)


def _simulate(effect: float, null_seeds: int, alternative: str, rng: np.random.Generator) -> float:
    """The rate at which paired_test's statistic rejects at alpha 0.01: 20,000 replications of
    n = 8 paired seeds and a null of ``null_seeds`` seeds, all N(2, 0.3^2), new shifted by
    ``effect``."""
    reps, n, sigma = 20_000, 8, 0.3
    new = rng.normal(2.0 + effect, sigma, (reps, n))
    base = rng.normal(2.0, sigma, (reps, n))
    null = rng.normal(2.0, sigma, (reps, null_seeds))
    _, _, t = paired_t(new - base, null)
    return float(np.mean(p_values(t, null_seeds - 1, alternative) < 0.01))


@pytest.mark.parametrize("alternative", ALTERNATIVES)
def test_false_alarm_rate(alternative):
    # With the null's own seeds from the same normal, t is exactly t_31: the rate is 0.01 (its
    # Monte Carlo SD over 20,000 replications is 0.0007).
    rate = _simulate(0.0, 32, alternative, np.random.default_rng(7))
    assert 0.005 <= rate <= 0.016


def test_power_at_delta90():
    # delta90 = (t_0.99 + t_0.9) se is the textbook stand-in for the noncentral t. With the true
    # se (sigma's, not an estimate) and 200 null seeds, the exact power it gives is 0.8997
    # (noncentral t with df 199, computed offline); the estimated s_null varies by 5% at most
    # there. Monte Carlo SD over 20,000 replications: 0.002.
    df, se = 199, math.sqrt(2) * 0.3 / math.sqrt(8)
    delta90 = (t_ppf(0.99, df) + t_ppf(0.9, df)) * se
    rate = _simulate(-delta90, 200, "less", np.random.default_rng(11))
    assert abs(rate - 0.9) <= 0.03
    assert abs(rate - 0.8997) <= 0.01


def test_the_batch_internals_are_paired_test_s():
    rng = np.random.default_rng(3)
    new, base, null = rng.normal(size=(5, 6)), rng.normal(size=(5, 6)), rng.normal(size=(5, 9))
    effect, se, t = paired_t(new - base, null)
    p = p_values(t, 8, "two-sided")
    for i in range(5):
        r = paired_test(new[i], base[i], null[i], "two-sided", alpha=0.05)
        assert (r.effect, r.se, r.t, r.p_value) == (effect[i], se[i], t[i], p[i])


# --- per-seed statistics of a run -------------------------------------------------------------


def test_log_growth_is_each_seeds_mean_log_over_the_runs_first_value():
    values = np.array([[1e-3, 2e-3, 4e-3], [2e-3, 2e-3, 2e-3], [1e-3, 1e-3, 1e-3]])
    # seed 0: mean(ln 1, ln 2, ln 4) over ln 1e-3 = ln 2; seed 1: ln 2; seed 2: 0
    np.testing.assert_allclose(
        log_growth(values, floor=1e-30), [math.log(2), math.log(2), 0.0], atol=1e-12
    )


def test_log_growth_floor():
    # an fp32 engine: bitwise zero reads as the floor, and a flat run grows by exactly 0
    np.testing.assert_array_equal(log_growth(np.zeros((3, 4)), floor=1e-4), np.zeros(3))
    values = np.array([[0.0, 0.0, 1e-3, 1e-2]])
    # at floor 1e-6: (0 + 0 + ln 1e3 + ln 1e4) / 4 over ln 1e-6 = 7 ln 10 / 4
    np.testing.assert_allclose(log_growth(values, floor=1e-6), [1.75 * math.log(10)], rtol=1e-12)


@pytest.mark.parametrize(
    ("values", "floor", "message"),
    [
        (np.ones(5), 1e-6, r"\[seeds, steps\].*shape \(5,\)"),
        (np.array([[1.0, 2.0], [1.0, math.nan]]), 1e-6, r"non-finite values in seeds \[1\]"),
        (np.ones((2, 3)), 0.0, "floor must be positive"),
    ],
)
def test_log_growth_rejects(values, floor, message):
    with pytest.raises(ValueError, match=message):
        log_growth(values, floor)


def test_late_minus_early():
    # 8 steps: the last ceil(2) = 2 steps, mean(7, 8) - 1; 10 steps: the last ceil(2.5) = 3.
    assert late_minus_early(np.arange(1.0, 9.0)[None]) == pytest.approx([6.5])
    values = np.stack([np.arange(1.0, 11.0), np.full(10, 2.0)])
    np.testing.assert_allclose(late_minus_early(values), [9.0 - 1.0, 0.0])
    # 0.28 * 25 is 7.000000000000001 in float64: still the last 7 steps (19 to 25, mean 22), not 8.
    assert late_minus_early(np.arange(1.0, 26.0)[None], share=0.28) == pytest.approx([21.0])
    assert late_minus_early(np.arange(1.0, 5.0)[None], share=1.0) == pytest.approx([1.5])
    with pytest.raises(ValueError, match="share must lie in"):
        late_minus_early(values, share=0.0)
    with pytest.raises(ValueError, match="at least 2 steps"):
        late_minus_early(np.ones((2, 1)))


def test_seeds_for_power():
    # se 1, delta 0.5, alpha 0.01, df 31: (2.4528 + 1.3095) / 0.5 = 7.5246, squared 56.6: 57 seeds.
    n = seeds_for_power(1.0, 31, 0.5, 0.01)
    assert n == 57
    width = t_ppf(0.99, 31) + t_ppf(0.9, 31)
    assert width / math.sqrt(n) <= 0.5 < width / math.sqrt(n - 1)
    # On the boundary: width / sqrt(16) is width / 4 exactly, so 16 seeds suffice, not 17.
    assert seeds_for_power(1.0, 31, width / 4, 0.01) == 16
    assert seeds_for_power(0.0, 31, 0.5, 0.01) == 1
    assert seeds_for_power(1.0, 31, 10.0, 0.01) == 1
    with pytest.raises(ValueError, match="delta must be positive"):
        seeds_for_power(1.0, 31, 0.0, 0.01)


def test_the_committed_smollm2_null_needs_5_seeds_for_a_010_loss():
    """examples/smollm2-cpu.yaml's GRPO run against baselines/smollm2-cpu's 16 seeds: the seeds a
    0.10 eval-reward loss needs at 90% power at the check's level (1% over its statistics)."""
    from gate import baseline as bl
    from gate.checks.grpo import JUDGED
    from gate.config import load_config
    from tests.conftest import REPO

    cfg = load_config(REPO / "examples" / "smollm2-cpu.yaml")
    null = bl.load(cfg.baseline).evidence["grpo_eval_success"].mean(axis=1)
    level = family_alpha(cfg.grpo.alpha, len(JUDGED))
    se_one_seed = math.sqrt(2) * float(np.std(null, ddof=1))
    assert len(null) == cfg.grpo.baseline_seeds == 16
    assert seeds_for_power(se_one_seed, len(null) - 1, 0.10, level) == 5
    for n, delta90 in ((3, 0.116), (5, 0.090)):
        found = paired_test(null[:n], null[:n], null, "less", level, cfg.grpo.min_effect)
        assert found.delta90 == pytest.approx(delta90, abs=5e-4)
