"""gate.metrics against hand-computed values, edge cases and properties (its time budget: scripts/bench_metrics.py --check)."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

from gate import metrics
from gate.metrics import (
    bootstrap_mean_ci,
    bootstrap_mean_diff_ci,
    greedy_agreement,
    length_ratio,
    length_ratio_se,
    logprob_semantics_distances,
    mismatch,
    per_group_mean,
    per_sequence_mean,
    topk_overlap,
)

e = math.exp
RTOL = 1e-12

# ------------------------------------------------------------------------------------------------
# mismatch: hand-computed values
# ------------------------------------------------------------------------------------------------

# Two sequences: tokens 0-1 and token 2.
LP_TRAINER = np.array([-1.0, -2.0, -0.5])
LP_ENGINE = np.array([-1.1, -1.8, -0.5])
OFFSETS = np.array([0, 2, 3])
# d = lp_trainer - lp_engine = [0.1, -0.2, 0.0];  |d| = [0.1, 0.2, 0.0];  r = exp(d) = [e^0.1, e^-0.2, 1]


def test_mismatch_abs_diff_statistics():
    s = mismatch(LP_TRAINER, LP_ENGINE, OFFSETS)
    assert (s.n_tokens, s.n_sequences) == (3, 2)
    # mean |d| = (0.1 + 0.2 + 0)/3 = 0.1
    assert_allclose(s.mean_abs_diff, 0.1, rtol=RTOL)
    # sorted |d| = [0, 0.1, 0.2]; linear interpolation: p50 at rank 1.0 -> 0.1, p99 at rank 1.98 -> 0.1 + 0.98*0.1
    assert_allclose(s.p50_abs_diff, 0.1, rtol=RTOL)
    assert_allclose(s.p99_abs_diff, 0.198, rtol=RTOL)
    assert_allclose(s.max_abs_diff, 0.2, rtol=RTOL)
    # NeMo-RL: mean exp(|d|) = (e^0.1 + e^0.2 + e^0)/3
    assert_allclose(s.token_mult_prob_error, (e(0.1) + e(0.2) + 1) / 3, rtol=RTOL)


def test_mismatch_kl_estimators_and_sign_convention():
    s = mismatch(LP_TRAINER, LP_ENGINE, OFFSETS)
    # k1 = mean(lp_engine - lp_trainer) = mean(-d) = -(0.1 - 0.2 + 0)/3 = 0.1/3
    assert_allclose(s.k1_kl, 0.1 / 3, rtol=1e-10)
    # k3 = mean(e^d - d - 1) = ((e^0.1 - 0.1 - 1) + (e^-0.2 + 0.2 - 1) + (1 - 0 - 1))/3
    assert_allclose(s.k3_kl, ((e(0.1) - 1.1) + (e(-0.2) + 0.2 - 1) + 0.0) / 3, rtol=1e-10)


def test_mismatch_ratio_and_ess():
    s = mismatch(LP_TRAINER, LP_ENGINE, OFFSETS)
    r = [e(0.1), e(-0.2), 1.0]
    assert_allclose(s.ratio_mean, sum(r) / 3, rtol=RTOL)
    assert_allclose(s.ratio_min, e(-0.2), rtol=RTOL)
    assert_allclose(s.ratio_max, e(0.1), rtol=RTOL)
    # ESS = 1/mean(w^2), w = r/mean(r)  ==  mean(r)^2 / mean(r^2)
    mean_r = sum(r) / 3
    mean_r2 = sum(x * x for x in r) / 3
    assert_allclose(s.ess, mean_r**2 / mean_r2, rtol=RTOL)


def test_mismatch_clip_fractions():
    # eps = 0.2, band [0.8, 1.2]: r = [1.105, 0.819, 1] all inside. Sequence ratios:
    # seq0 exp((0.1 - 0.2)/2) = e^-0.05 = 0.951, seq1 e^0 = 1: inside.
    s = mismatch(LP_TRAINER, LP_ENGINE, OFFSETS)
    assert (s.clip_eps, s.clip_eps_high, s.clip_frac_token, s.clip_frac_seq) == (0.2, 0.2, 0.0, 0.0)
    # eps = 0.1, band [0.9, 1.1]: 1.105 and 0.819 outside -> 2/3 tokens; sequences 0.951 and 1 inside -> 0
    s = mismatch(LP_TRAINER, LP_ENGINE, OFFSETS, clip_eps=0.1)
    assert_allclose([s.clip_frac_token, s.clip_frac_seq], [2 / 3, 0.0], rtol=RTOL)
    # eps = 0.04, band [0.96, 1.04]: tokens 2/3; seq0 0.951 outside, seq1 inside -> 1/2
    s = mismatch(LP_TRAINER, LP_ENGINE, OFFSETS, clip_eps=0.04)
    assert_allclose([s.clip_frac_token, s.clip_frac_seq], [2 / 3, 0.5], rtol=RTOL)
    # asymmetric (clip-higher reversed): band [0.8, 1.05]: only 1.105 outside -> 1/3
    s = mismatch(LP_TRAINER, LP_ENGINE, OFFSETS, clip_eps=0.2, clip_eps_high=0.05)
    assert s.clip_eps_high == 0.05
    assert_allclose(s.clip_frac_token, 1 / 3, rtol=RTOL)


def test_mismatch_probability_space():
    s = mismatch(LP_TRAINER, LP_ENGINE, OFFSETS)
    # |p_trainer - p_engine| = [|e^-1 - e^-1.1|, |e^-2 - e^-1.8|, 0]
    diffs = [abs(e(-1) - e(-1.1)), abs(e(-2) - e(-1.8)), 0.0]
    assert_allclose(s.prob_abs_diff_max, max(diffs), rtol=RTOL)
    assert_allclose(s.prob_abs_diff_mean, sum(diffs) / 3, rtol=RTOL)
    # Pearson = sum(xc*yc)/sqrt(sum(xc^2) sum(yc^2)) with centred probabilities
    x = [e(-1), e(-2), e(-0.5)]
    y = [e(-1.1), e(-1.8), e(-0.5)]
    xc = [v - sum(x) / 3 for v in x]
    yc = [v - sum(y) / 3 for v in y]
    rho = sum(a * b for a, b in zip(xc, yc, strict=True)) / math.sqrt(
        sum(a * a for a in xc) * sum(b * b for b in yc)
    )
    assert_allclose(s.prob_pearson, rho, rtol=1e-12)


def test_pearson_of_two_tokens_is_the_sign_of_the_slope():
    # Two points always lie on a line: p_trainer = [e^-1, e^-2] falls, p_engine = [e^-3, e^-0.5] rises -> -1
    s = mismatch([-1.0, -2.0], [-3.0, -0.5], [0, 2])
    assert s.prob_pearson == -1.0
    # A constant shift d = 0.3 everywhere makes p_engine = e^-0.3 * p_trainer: perfectly correlated
    lt = np.array([-0.1, -1.0, -2.5, -4.0])
    s = mismatch(lt, lt - 0.3, [0, 4])
    assert_allclose(s.prob_pearson, 1.0, rtol=1e-12)


# ------------------------------------------------------------------------------------------------
# mismatch: edge cases
# ------------------------------------------------------------------------------------------------


def test_identical_inputs_give_zero_mismatch_and_full_ess():
    lp = np.array([-0.1, -2.0, -0.7, -3.3, -0.01])
    s = mismatch(lp, lp.copy(), [0, 2, 5])
    for name in (
        "mean_abs_diff",
        "p50_abs_diff",
        "p99_abs_diff",
        "max_abs_diff",
        "k1_kl",
        "k3_kl",
        "clip_frac_token",
        "clip_frac_seq",
        "prob_abs_diff_max",
        "prob_abs_diff_mean",
    ):
        assert getattr(s, name) == 0.0, name
    for name in (
        "token_mult_prob_error",
        "ratio_mean",
        "ratio_min",
        "ratio_max",
        "ess",
        "prob_pearson",
    ):
        assert_allclose(getattr(s, name), 1.0, rtol=1e-15, err_msg=name)


def test_zero_width_band_clips_nothing_when_identical():
    # eps = 0: band [1, 1] is closed, so r == 1 exactly stays inside
    lp = np.array([-0.5, -1.5])
    s = mismatch(lp, lp, [0, 1, 2], clip_eps=0.0)
    assert (s.clip_frac_token, s.clip_frac_seq) == (0.0, 0.0)


def test_single_token():
    s = mismatch([-0.5], [-0.7], [0, 1])  # d = 0.2
    assert (s.n_tokens, s.n_sequences) == (1, 1)
    assert_allclose(
        [s.p50_abs_diff, s.p99_abs_diff, s.max_abs_diff, s.mean_abs_diff], [0.2] * 4, rtol=1e-12
    )
    assert_allclose(s.k3_kl, e(0.2) - 0.2 - 1, rtol=1e-10)
    assert s.ess == 1.0  # one weight, normalised by itself
    assert math.isnan(s.prob_pearson)  # a single value is constant: documented NaN


def test_zero_length_sequences():
    # Sequences: [], [0.1, -0.2], [], [0.5]  (d values); offsets hold empty runs at both ends and between.
    d = np.array([0.1, -0.2, 0.5])
    lp_engine = np.array([-1.0, -1.0, -1.0])
    off = [0, 0, 2, 2, 3]
    s = mismatch(lp_engine + d, lp_engine, off, clip_eps=0.2)
    assert (s.n_tokens, s.n_sequences) == (3, 4)
    # Non-empty sequences only: seq1 exp(-0.05) = 0.951 inside [0.8, 1.2], seq3 exp(0.5) = 1.65 outside -> 1/2
    assert_allclose(s.clip_frac_seq, 0.5, rtol=RTOL)
    assert_allclose(s.k1_kl, -0.4 / 3, rtol=1e-10)


def test_empty_input_is_nan_except_counts():
    for off, n_seq in (([0], 0), ([0, 0, 0], 2)):
        d = mismatch(np.array([]), np.array([]), off).to_dict()
        assert (d["n_tokens"], d["n_sequences"], d["clip_eps"], d["clip_eps_high"]) == (
            0,
            n_seq,
            0.2,
            0.2,
        )
        others = {
            k: v
            for k, v in d.items()
            if k not in ("n_tokens", "n_sequences", "clip_eps", "clip_eps_high")
        }
        assert others and all(math.isnan(v) for v in others.values())


def test_non_finite_input_raises_with_count():
    lt = np.array([-1.0, -np.inf, np.nan, -0.5])
    le = np.array([-1.0, -1.0, -1.0, np.inf])
    with pytest.raises(ValueError, match=r"2 in lp_trainer, 1 in lp_engine"):
        mismatch(lt, le, [0, 4])


@pytest.mark.parametrize(
    "lt, le, off, match",
    [
        ([-1.0, -2.0], [-1.0], [0, 2], "tokens"),
        ([-1.0, -2.0], [-1.0, -2.0], [0, 1], "end at 2"),
        ([-1.0, -2.0], [-1.0, -2.0], [1, 2], "start at 0"),
        ([-1.0, -2.0], [-1.0, -2.0], [0, 2, 1, 2], "non-decreasing"),
        ([-1.0, -2.0], [-1.0, -2.0], [], "at least one"),
        ([[-1.0]], [[-1.0]], [0, 1], "1-D"),
    ],
)
def test_mismatch_rejects_malformed_input(lt, le, off, match):
    with pytest.raises(ValueError, match=match):
        mismatch(lt, le, off)


def test_negative_clip_eps_raises():
    with pytest.raises(ValueError, match="clip_eps_high"):
        mismatch([-1.0], [-1.0], [0, 1], clip_eps=0.2, clip_eps_high=-0.1)


def test_float32_input_is_computed_in_float64():
    rng = np.random.default_rng(3)
    le = (-rng.exponential(1.0, 10_000)).astype(np.float32)
    lt = (le + rng.normal(0, 1e-3, le.size)).astype(np.float32)
    off = np.array([0, 4_000, 10_000])
    s32 = mismatch(lt, le, off)
    s64 = mismatch(lt.astype(np.float64), le.astype(np.float64), off)
    assert s32.to_dict() == s64.to_dict()


def test_k3_keeps_second_order_terms_of_tiny_differences():
    # d = 1e-6: exp(d) - d - 1 = d^2/2 + d^3/6 + ... = 5e-13; the naive float formula loses most digits.
    d = 1e-6
    s = mismatch([-1.0 + d], [-1.0], [0, 1])
    dd = (-1.0 + d) - (-1.0)  # the d the function actually sees after float rounding
    assert_allclose(s.k3_kl, dd**2 / 2 + dd**3 / 6, rtol=1e-9)


def test_ess_does_not_overflow_on_huge_ratios():
    # d = [800, 0]: r = [inf, 1] overflows, but ESS depends on w = r/mean(r) only:
    # w ∝ [1, e^-800 = 0] -> mean(w)^2 / mean(w^2) = (1/2)^2 / (1/2) = 0.5
    s = mismatch([0.0, -1.0], [-800.0, -1.0], [0, 2])
    assert s.ess == 0.5
    assert s.ratio_max == math.inf  # reported as is, not hidden


def test_to_dict_is_json_ready():
    d = mismatch(LP_TRAINER, LP_ENGINE, OFFSETS).to_dict()
    assert list(d) == [f for f in metrics.MismatchStats.__dataclass_fields__]
    assert all(type(v) in (int, float) for v in d.values())
    assert type(d["n_tokens"]) is int and type(d["k3_kl"]) is float
    json.dumps(d)


# ------------------------------------------------------------------------------------------------
# mismatch: properties on random ragged data, against a plain-Python reference
# ------------------------------------------------------------------------------------------------


def _reference_mismatch(lt, le, off, eps_low, eps_high):
    """Loop-by-loop reference of the vectorised formulas (slow, obviously correct)."""
    d = [a - b for a, b in zip(lt, le, strict=True)]
    r = [math.exp(x) for x in d]
    seq_ratio = [math.exp(sum(d[i:j]) / (j - i)) for i, j in itertools.pairwise(off) if j > i]
    w = [x / (sum(r) / len(r)) for x in r]
    out = lambda x: x < 1 - eps_low or x > 1 + eps_high  # noqa: E731
    return {
        "k1_kl": -sum(d) / len(d),
        "k3_kl": sum(math.exp(x) - x - 1 for x in d) / len(d),
        "token_mult_prob_error": sum(math.exp(abs(x)) for x in d) / len(d),
        "clip_frac_token": sum(map(out, r)) / len(r),
        "clip_frac_seq": sum(map(out, seq_ratio)) / len(seq_ratio),
        "ess": 1 / (sum(x * x for x in w) / len(w)),
        "prob_pearson": float(np.corrcoef(np.exp(lt), np.exp(le))[0, 1]),
    }


@pytest.mark.parametrize("seed", range(5))
def test_mismatch_matches_reference_and_stays_in_range(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 12, size=40)  # includes zero-length sequences
    lengths[0] = max(lengths[0], 1)
    off = np.concatenate([[0], np.cumsum(lengths)])
    le = -rng.exponential(1.0, off[-1])
    lt = le + rng.normal(0, 0.15, off[-1])
    s = mismatch(lt, le, off, clip_eps=0.1, clip_eps_high=0.15)
    ref = _reference_mismatch(lt.tolist(), le.tolist(), off.tolist(), 0.1, 0.15)
    for name, value in ref.items():
        assert_allclose(getattr(s, name), value, rtol=1e-9, err_msg=name)
    assert s.k3_kl >= 0.0
    assert 0.0 <= s.clip_frac_token <= 1.0 and 0.0 <= s.clip_frac_seq <= 1.0
    assert 0.0 < s.ess <= 1.0
    assert s.ratio_min <= s.ratio_mean <= s.ratio_max
    assert s.p50_abs_diff <= s.p99_abs_diff <= s.max_abs_diff
    assert s.token_mult_prob_error >= 1.0


# ------------------------------------------------------------------------------------------------
# per-sequence / per-group means
# ------------------------------------------------------------------------------------------------


def test_per_sequence_mean_hand_values_and_empty_sequence():
    values = np.array([1.0, 2.0, 3.0, 10.0], dtype=np.float32)
    # sequences: [1, 2, 3] -> 2, [] -> NaN, [10] -> 10
    out = per_sequence_mean(values, [0, 3, 3, 4])
    assert out.dtype == np.float64
    assert_allclose(out, [2.0, np.nan, 10.0], rtol=RTOL)


def test_per_sequence_mean_of_no_tokens():
    assert_allclose(per_sequence_mean([], [0, 0]), [np.nan])
    assert per_sequence_mean([], [0]).shape == (0,)


def test_per_group_mean_weighs_sequences_equally():
    values = np.array([1.0, 3.0, 5.0, 7.0, 8.0, 4.0])
    # sequences: [1, 3] -> 2, [5] -> 5, [7, 8] -> 7.5, [] -> excluded, [4] -> 4
    off = [0, 2, 3, 5, 5, 6]
    groups = [0, 0, 2, 2, 2]
    # group 0: (2 + 5)/2 = 3.5;  group 1: no sequence -> NaN;  group 2: (7.5 + 4)/2 = 5.75 (the empty one is left out)
    # group 3: only exists as a slot -> NaN
    assert_allclose(per_group_mean(values, off, groups, 4), [3.5, np.nan, 5.75, np.nan], rtol=RTOL)


def test_per_group_mean_with_only_empty_sequences_is_nan():
    assert_allclose(per_group_mean([5.0], [0, 0, 1], [0, 1], 2), [np.nan, 5.0])


@pytest.mark.parametrize("groups, n_groups", [([0, 2], 2), ([-1, 0], 2), ([0], 2)])
def test_per_group_mean_rejects_bad_group_index(groups, n_groups):
    with pytest.raises(ValueError, match="group_index"):
        per_group_mean([1.0, 2.0], [0, 1, 2], groups, n_groups)


# ------------------------------------------------------------------------------------------------
# bootstrap
# ------------------------------------------------------------------------------------------------


def test_bootstrap_diff_of_a_constant_shift_is_exact():
    # a - b = 0.25 for every unit: every resample mean is 0.25, so the CI has zero width
    base = np.array([3.0, -1.0, 7.5, 0.0, 2.0])
    low, high, point = bootstrap_mean_diff_ci(base + 0.25, base)
    assert_allclose([low, high, point], [0.25] * 3, rtol=1e-12)


def test_bootstrap_point_is_the_mean_difference_and_inside_the_ci():
    rng = np.random.default_rng(7)
    b = rng.normal(0, 1, 200)
    a = b + rng.normal(0.1, 0.05, 200)
    low, high, point = bootstrap_mean_diff_ci(a, b)
    assert_allclose(point, np.mean(a - b), rtol=1e-12)
    assert low < point < high
    assert low > 0.0  # the shift of 0.1 is detected; pairing removes the N(0, 1) prompt spread


def test_bootstrap_ci_narrows_with_more_units():
    rng = np.random.default_rng(11)
    widths = []
    for n in (50, 5_000):
        low, high, _ = bootstrap_mean_ci(rng.normal(0, 1, n))
        widths.append(high - low)
    # width ~ 2 * 1.96 / sqrt(n): 0.55 for n=50 and 0.055 for n=5000
    assert widths[1] < widths[0] / 5
    assert_allclose(widths, [2 * 1.96 / math.sqrt(50), 2 * 1.96 / math.sqrt(5_000)], rtol=0.25)


def test_bootstrap_is_deterministic_given_the_seed():
    x = np.random.default_rng(0).normal(0, 1, 300)
    assert bootstrap_mean_ci(x, seed=5) == bootstrap_mean_ci(x, seed=5)
    assert bootstrap_mean_ci(x, seed=5) != bootstrap_mean_ci(x, seed=6)
    assert bootstrap_mean_diff_ci(x, x[::-1], seed=1) == bootstrap_mean_diff_ci(x, x[::-1], seed=1)


def test_bootstrap_chunked_draws_agree_with_one_draw(monkeypatch):
    x = np.random.default_rng(2).exponential(1.0, 400)
    one = bootstrap_mean_ci(x, n_boot=4000)
    monkeypatch.setattr(metrics, "_CHUNK_ELEMENTS", 1_000)  # 2 resamples per chunk, 2000 chunks
    chunked = bootstrap_mean_ci(x, n_boot=4000)
    assert chunked[2] == one[2]
    assert_allclose(chunked[:2], one[:2], atol=0.1 * (one[1] - one[0]))


def test_bootstrap_edge_cases():
    assert bootstrap_mean_ci([4.0]) == (4.0, 4.0, 4.0)  # one unit: zero-width CI
    assert all(math.isnan(v) for v in bootstrap_mean_ci([]))
    assert all(math.isnan(v) for v in bootstrap_mean_diff_ci([np.nan], [1.0]))
    # NaN pairs (a prompt with no tokens on one side) are dropped: only (3 - 1) and (5 - 2) remain
    low, high, point = bootstrap_mean_diff_ci([3.0, np.nan, 5.0, 9.0], [1.0, 0.0, 2.0, np.nan])
    assert_allclose(point, 2.5, rtol=RTOL)
    assert 2.0 <= low <= point <= high <= 3.0


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: bootstrap_mean_diff_ci([1.0, np.inf], [0.0, 0.0]), "1 in a"),
        (lambda: bootstrap_mean_ci([1.0, -np.inf]), "1 in a"),
        (lambda: bootstrap_mean_diff_ci([1.0, 2.0], [1.0]), "differ in length"),
        (lambda: bootstrap_mean_ci([1.0], n_boot=0), "n_boot"),
        (lambda: bootstrap_mean_ci([1.0], confidence=1.0), "confidence"),
    ],
)
def test_bootstrap_rejects_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ------------------------------------------------------------------------------------------------
# top-k overlap
# ------------------------------------------------------------------------------------------------


def test_topk_overlap_hand_values_with_padding():
    a = np.array([[1, 2, 3], [4, 5, -1]])
    b = np.array([[3, 2, 9], [-1, 7, 4]])
    # row 0: {1,2,3} ∩ {3,2,9} = {2,3} -> 2/3;  row 1: {4,5} ∩ {7,4} = {4} -> 1/3 (the two -1 never match)
    # mean = (2/3 + 1/3)/2 = 0.5
    assert_allclose(topk_overlap(a, b), 0.5, rtol=RTOL)


def test_topk_overlap_counts_duplicates_once():
    # A = {7} (listed three times), B = {7, 8, 9}: |A ∩ B| / k = 1/3
    assert_allclose(topk_overlap([[7, 7, 7]], [[7, 8, 9]]), 1 / 3, rtol=RTOL)
    assert_allclose(topk_overlap([[7, 8, 9]], [[7, 7, 7]]), 1 / 3, rtol=RTOL)


def test_topk_overlap_identical_padding_only_and_empty():
    ids = np.array([[5, 1, 9], [2, 8, 0]])
    assert topk_overlap(ids, ids.copy()) == 1.0
    assert topk_overlap(np.full((2, 3), -1), np.full((2, 3), -1)) == 0.0
    assert math.isnan(
        topk_overlap(np.zeros((0, 4), dtype=np.int64), np.zeros((0, 4), dtype=np.int64))
    )


def test_topk_overlap_matches_sets_on_random_rows():
    rng = np.random.default_rng(4)
    a = rng.integers(-1, 12, size=(997, 5))  # a small id range makes duplicates and padding common
    b = rng.integers(-1, 12, size=(997, 5))
    by_sets = np.mean(
        [len(set(x) & set(y) - {-1}) / 5 for x, y in zip(a.tolist(), b.tolist(), strict=True)]
    )
    assert_allclose(topk_overlap(a, b), by_sets, rtol=RTOL)
    assert_allclose(topk_overlap(b, a), by_sets, rtol=RTOL)  # |A ∩ B| is symmetric


@pytest.mark.parametrize(
    "a, b",
    [
        (np.zeros((2, 3)), np.zeros((2, 4))),
        (np.zeros(3), np.zeros(3)),
        (np.zeros((2, 0)), np.zeros((2, 0))),
    ],
)
def test_topk_overlap_rejects_bad_shapes(a, b):
    with pytest.raises(ValueError):
        topk_overlap(a, b)


# ------------------------------------------------------------------------------------------------
# greedy agreement
# ------------------------------------------------------------------------------------------------


def _flat(seqs):
    lengths = [len(s) for s in seqs]
    tokens = np.array([t for s in seqs for t in s], dtype=np.int64)
    return tokens, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def test_greedy_agreement_hand_values():
    a = [[1, 2, 3], [4, 5], [6], [], [7, 8], [1, 2], [9, 9]]
    b = [[1, 2, 3], [4, 5, 9], [6, 0], [], [7, 9], [1], [0, 9]]
    # identical -> -1; a is a prefix of b -> len(a) = 2; prefix -> 1; both empty -> -1 (identical);
    # differs at 1; b is a prefix of a -> len(b) = 1; differs at 0
    g = greedy_agreement(*_flat(a), *_flat(b))
    assert_array_equal(g.first_divergence, [-1, 2, 1, -1, 1, 1, 0])
    assert g.n_sequences == 7
    assert_allclose(g.exact_match_rate, 2 / 7, rtol=RTOL)
    # mean over the 5 diverging sequences: (2 + 1 + 1 + 1 + 0)/5 = 1.0
    assert_allclose(g.mean_first_divergence, 1.0, rtol=RTOL)
    d = g.to_dict()
    assert d["first_divergence"] == [-1, 2, 1, -1, 1, 1, 0]
    json.dumps(d)


def test_greedy_agreement_identical_and_empty():
    tokens, off = _flat([[3, 1], [2]])
    g = greedy_agreement(tokens, off, tokens.copy(), off.copy())
    assert g.exact_match_rate == 1.0 and math.isnan(g.mean_first_divergence)
    g = greedy_agreement([], [0], [], [0])
    assert (
        g.n_sequences == 0 and math.isnan(g.exact_match_rate) and g.first_divergence.shape == (0,)
    )


def test_greedy_agreement_matches_a_loop_on_random_data():
    rng = np.random.default_rng(9)
    a = [rng.integers(0, 3, rng.integers(0, 8)).tolist() for _ in range(300)]
    b = [
        s[: rng.integers(0, len(s) + 1)] + rng.integers(0, 3, rng.integers(0, 3)).tolist()
        for s in a
    ]

    def first_div(x, y):
        for i, (p, q) in enumerate(zip(x, y, strict=False)):  # the shorter one ends the comparison
            if p != q:
                return i
        return -1 if len(x) == len(y) else min(len(x), len(y))

    g = greedy_agreement(*_flat(a), *_flat(b))
    assert_array_equal(g.first_divergence, [first_div(x, y) for x, y in zip(a, b, strict=True)])


def test_greedy_agreement_needs_the_same_number_of_sequences():
    with pytest.raises(ValueError, match="sequences"):
        greedy_agreement([1], [0, 1], [1], [0, 0, 1])


# ------------------------------------------------------------------------------------------------
# length ratio and logprob semantics
# ------------------------------------------------------------------------------------------------


def test_length_ratio_se():
    # paired (same count): new 3, 4, 5 vs ref 2, 4, 4 -> d = 1, 0, 1; sd(ddof 1) = sqrt(1/3);
    # se = sqrt(1/3) / sqrt(3) = 1/3; over the reference's mean 10/3 -> 0.1
    assert_allclose(length_ratio_se([0, 3, 7, 12], [0, 2, 6, 10]), 0.1, rtol=RTOL)
    assert length_ratio_se([0, 3, 7, 12], [0, 3, 7, 12]) == 0.0  # the same draws: no sampling error
    # unpaired: new 2, 4 (var 2) vs ref 1, 2, 3 (var 1): sqrt(2/2 + 1/3) / 2 = sqrt(4/3) / 2
    assert_allclose(length_ratio_se([0, 2, 6], [0, 1, 3, 6]), math.sqrt(4 / 3) / 2, rtol=RTOL)
    assert length_ratio_se([0, 3], [0, 4, 9]) == 0.0  # one sequence: no spread to read
    assert length_ratio_se([0, 3, 5], [0, 0, 0]) == 0.0  # the reference produced nothing
    with pytest.raises(ValueError, match="offsets_new"):
        length_ratio_se([0, 5, 3], [0, 1, 2])


def test_length_ratio():
    # new: lengths 3, 6 -> mean 4.5;  ref: lengths 5, 5 -> mean 5;  4.5/5 = 0.9
    assert_allclose(length_ratio([0, 3, 9], [0, 5, 10]), 0.9, rtol=RTOL)
    # different sequence counts: new mean 12/3 = 4, ref mean 5/1 = 5 -> 0.8
    assert_allclose(length_ratio([0, 4, 8, 12], [0, 5]), 0.8, rtol=RTOL)
    assert math.isnan(length_ratio([0, 3], [0, 0]))  # reference produced nothing
    assert math.isnan(length_ratio([0], [0, 5]))  # no sequences
    with pytest.raises(ValueError, match="offsets_ref"):
        length_ratio([0, 3], [0, 4, 2])


def test_logprob_semantics_distances():
    engine = np.array([-1.0, -0.5])
    processed = np.array([-1.1, -0.5])  # |d| = 0.1, 0 -> mean 0.05
    raw = np.array([-2.0, -1.5])  # |d| = 1, 1 -> mean 1
    out = logprob_semantics_distances(engine, processed, raw)
    assert set(out) == {"mean_abs_diff_processed", "mean_abs_diff_raw"}
    assert_allclose(
        [out["mean_abs_diff_processed"], out["mean_abs_diff_raw"]], [0.05, 1.0], rtol=1e-12
    )
    empty = logprob_semantics_distances([], [], [])
    assert all(math.isnan(v) for v in empty.values())
    with pytest.raises(ValueError, match="1 in lp_trainer_processed"):
        logprob_semantics_distances(engine, [-np.inf, -0.5], raw)
    with pytest.raises(ValueError, match="token counts"):
        logprob_semantics_distances(engine, processed, raw[:1])
