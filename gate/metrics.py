"""Train-inference mismatch metrics, vectorised with numpy (no torch: the orchestrator runs this).

Every metric uses the definition of the peer that made it familiar, so a user recognises the number.

Conventions
-----------
* Per-token arrays are flat 1-D arrays; ragged sequences are given by ``offsets`` (int, length S+1,
  ``offsets[0] == 0``, non-decreasing, ``offsets[-1] == len(x)``): sequence ``i`` owns
  ``x[offsets[i]:offsets[i+1]]``. Zero-length sequences are allowed everywhere.
* All arithmetic is float64 whatever the input dtype (float32/bf16-rounded logprobs of 1M tokens
  summed in float32 would lose the 1e-5-sized KL values this gate cares about).
* No Python loop runs over tokens or sequences.

Sign conventions
----------------
``d = lp_trainer - lp_engine`` per generated token (same token, same sampling transform), and the
importance ratio is ``r = exp(d) = p_trainer / p_engine``. The tokens were sampled by the engine
(the rollout policy ``q``), so the KL we can estimate without bias is ``KL(q_rollout || p_trainer)``
on those samples:

* ``k1 = mean(lp_engine - lp_trainer) = mean(-d)``   (unbiased, high variance, can be negative)
* ``k3 = mean(r - 1 - log r) = mean(exp(d) - d - 1)`` (Schulman's k3: unbiased because
  ``E_q[r] = 1``, and every term is >= 0)

A positive ``d`` means the trainer finds the sampled token more likely than the engine did.

NaN policy
----------
Statistics of an empty input (no tokens, no sequences, no units) are NaN, and so is a Pearson
correlation where one side is constant. Each function's docstring lists its NaN cases; nothing else
returns NaN. Non-finite logprobs raise ``ValueError`` naming how many there are: averaging an ``-inf``
would silently turn a whole metric into ``inf``/NaN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

__all__ = [
    "GreedyAgreement",
    "MismatchStats",
    "bootstrap_mean_ci",
    "bootstrap_mean_diff_ci",
    "greedy_agreement",
    "largest_abs_diff",
    "length_ratio",
    "logprob_semantics_distances",
    "mismatch",
    "per_group_mean",
    "per_sequence_mean",
    "topk_overlap",
]

_NAN = float("nan")
# Largest number of elements one bootstrap index matrix may hold: keeps it (int64) and the gathered
# values (float64) at 32 MB each whatever the number of units.
_CHUNK_ELEMENTS = 1 << 22


# ----------------------------------------------------------------------------------------------
# Result types
# ----------------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """A JSON-ready Python scalar/list for a numpy scalar, array or plain value."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    return value


@dataclass(frozen=True)
class MismatchStats:
    """Per-token mismatch between trainer and engine logprobs; see :func:`mismatch`."""

    n_tokens: int
    n_sequences: int
    mean_abs_diff: float
    p50_abs_diff: float
    p99_abs_diff: float
    max_abs_diff: float
    token_mult_prob_error: float
    k1_kl: float
    k3_kl: float
    ratio_mean: float
    ratio_min: float
    ratio_max: float
    clip_eps: float
    clip_eps_high: float
    clip_frac_token: float
    clip_frac_seq: float
    ess: float
    prob_abs_diff_max: float
    prob_abs_diff_mean: float
    prob_pearson: float

    def to_dict(self) -> dict[str, int | float]:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}


# eq=False: a generated __eq__ would compare the array field element-wise and fail on truth value;
# compare ``to_dict()`` results instead.
@dataclass(frozen=True, eq=False)
class GreedyAgreement:
    """Agreement of two sets of greedy completions; see :func:`greedy_agreement`."""

    n_sequences: int
    exact_match_rate: float
    mean_first_divergence: float
    first_divergence: np.ndarray  # int64 per sequence: first differing position, -1 if identical

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}


# ----------------------------------------------------------------------------------------------
# Validation and segment helpers
# ----------------------------------------------------------------------------------------------


def _as_float_1d(x: Any, name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array, got shape {arr.shape}")
    return arr


def _as_int_1d(x: Any, name: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name}: expected integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def _check_offsets(offsets: Any, n_tokens: int, name: str = "offsets") -> np.ndarray:
    """Validate CSR offsets for an array of ``n_tokens`` and return them as int64."""
    off = _as_int_1d(offsets, name)
    if off.size < 1:
        raise ValueError(f"{name}: needs at least one entry (0 for no sequences)")
    if off[0] != 0 or off[-1] != n_tokens:
        raise ValueError(f"{name}: must start at 0 and end at {n_tokens}, got {off[0]}..{off[-1]}")
    if np.any(off[1:] < off[:-1]):
        raise ValueError(f"{name}: must be non-decreasing")
    return off


def _require_finite(name_to_array: dict[str, np.ndarray]) -> None:
    bad = {
        name: int(arr.size - np.count_nonzero(np.isfinite(arr)))
        for name, arr in name_to_array.items()
    }
    bad = {name: n for name, n in bad.items() if n}
    if bad:
        detail = ", ".join(f"{n} in {name}" for name, n in bad.items())
        raise ValueError(
            f"non-finite values ({detail}); drop or repair those tokens before computing metrics"
        )


def _segment_sum(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Sum of ``values`` per segment; 0.0 for empty segments.

    ``np.add.reduceat`` returns ``values[i]`` (not 0) for an empty segment and rejects a start equal to
    ``len(values)``, so it is only given the starts of non-empty segments: the tokens between two such
    starts all belong to the first one, because the empty segments in between own none.
    """
    lengths = np.diff(offsets)
    sums = np.zeros(lengths.size, dtype=np.float64)
    nonempty = lengths > 0
    if values.size:
        sums[nonempty] = np.add.reduceat(values, offsets[:-1][nonempty])
    return sums


def _segment_mean(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    lengths = np.diff(offsets)
    with np.errstate(
        invalid="ignore", divide="ignore"
    ):  # 0/0 -> NaN for empty segments, on purpose
        return _segment_sum(values, offsets) / lengths


def _mean(x: np.ndarray) -> float:
    return float(x.mean()) if x.size else _NAN


# ----------------------------------------------------------------------------------------------
# 1. Token-level mismatch
# ----------------------------------------------------------------------------------------------


def mismatch(
    lp_trainer: Any,
    lp_engine: Any,
    offsets: Any,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
) -> MismatchStats:
    """Mismatch statistics between trainer and engine logprobs of the same sampled tokens.

    With ``d = lp_trainer - lp_engine`` and ``r = exp(d)`` (module docstring: sign conventions):

    * ``mean/p50/p99/max_abs_diff`` of ``|d|``: TRL ``sampling_logp_difference``, slime
      ``train_rollout_logprob_abs_diff``. Percentiles use numpy's default linear interpolation
      (the same as ``torch.quantile``).
    * ``token_mult_prob_error = mean(exp(|d|))``: NeMo-RL (healthy < 1.05 at equal precision).
    * ``k1_kl = mean(-d)``, ``k3_kl = mean(exp(d) - d - 1)``: estimators of KL(rollout || trainer);
      k3 is PipelineRL ``kl_new_old`` and prime-rl ``mismatch_kl``. Computed as ``expm1(d) - d``, which
      keeps the ~d**2/2 terms of a near-identical pair instead of cancelling them to 0.
    * ``ratio_mean/min/max`` of ``r`` (PPO/GRPO importance ratio; the mean should be ~1). ``r`` is
      ``inf`` where ``d > ~709`` (float64 overflow); that is reported as is.
    * ``clip_frac_token``: fraction of tokens with ``r`` outside ``[1 - clip_eps, 1 + clip_eps_high]``
      (PPO/GRPO clip rate; the band is closed, so a ratio on the boundary is not clipped).
    * ``clip_frac_seq``: fraction of non-empty sequences whose geometric-mean ratio ``exp(mean d)`` is
      outside the same band (GSPO's sequence-level ratio). Zero-length sequences have no ratio and are
      left out of the denominator.
    * ``ess = 1 / mean(w**2)`` with ``w = r / mean(r)``, in (0, 1]: verl's rollout-IS effective sample
      size (< 0.3 is bad). Computed from ``exp(d - max d)``, which leaves ``w`` unchanged and cannot
      overflow.
    * ``prob_abs_diff_max/mean`` of ``|exp(lp_trainer) - exp(lp_engine)|`` and ``prob_pearson``, the
      Pearson correlation of the two probability arrays (verl).

    ``clip_eps_high`` defaults to ``clip_eps`` (DAPO's clip-higher sets it larger).

    NaN: every statistic when there are no tokens; ``clip_frac_seq`` when no sequence is non-empty;
    ``prob_pearson`` when either probability array is constant (including a single token).

    Raises ``ValueError`` on non-finite logprobs (with their count), mismatched lengths, bad offsets or
    a negative/non-finite ``clip_eps``.
    """
    eps_low, eps_high = _clip_band(clip_eps, clip_eps_high)
    lt = _as_float_1d(lp_trainer, "lp_trainer")
    le = _as_float_1d(lp_engine, "lp_engine")
    if lt.shape != le.shape:
        raise ValueError(f"lp_trainer has {lt.size} tokens but lp_engine has {le.size}")
    off = _check_offsets(offsets, lt.size)
    _require_finite({"lp_trainer": lt, "lp_engine": le})

    n_seq = off.size - 1
    if lt.size == 0:
        return _empty_stats(n_seq, eps_low, eps_high)

    d = lt - le
    abs_d = np.abs(d)
    with np.errstate(over="ignore"):  # huge |d| overflows exp to inf: reported, not hidden
        r = np.exp(d)
        mult_err = np.exp(abs_d)
    p50, p99 = np.quantile(abs_d, [0.5, 0.99])
    p_train, p_engine = np.exp(lt), np.exp(le)
    prob_abs = np.abs(p_train - p_engine)

    return MismatchStats(
        n_tokens=int(lt.size),
        n_sequences=int(n_seq),
        mean_abs_diff=float(abs_d.mean()),
        p50_abs_diff=float(p50),
        p99_abs_diff=float(p99),
        max_abs_diff=float(abs_d.max()),
        token_mult_prob_error=float(mult_err.mean()),
        k1_kl=float(-d.mean()),
        k3_kl=_k3(d),
        ratio_mean=float(r.mean()),
        ratio_min=float(r.min()),
        ratio_max=float(r.max()),
        clip_eps=eps_low,
        clip_eps_high=eps_high,
        clip_frac_token=_outside_band_fraction(r, eps_low, eps_high),
        clip_frac_seq=_seq_clip_fraction(d, off, eps_low, eps_high),
        ess=_ess(d),
        prob_abs_diff_max=float(prob_abs.max()),
        prob_abs_diff_mean=float(prob_abs.mean()),
        prob_pearson=_pearson(p_train, p_engine),
    )


def _clip_band(clip_eps: float, clip_eps_high: float | None) -> tuple[float, float]:
    eps_low = float(clip_eps)
    eps_high = eps_low if clip_eps_high is None else float(clip_eps_high)
    for name, eps in (("clip_eps", eps_low), ("clip_eps_high", eps_high)):
        if not math.isfinite(eps) or eps < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {eps}")
    return eps_low, eps_high


def _empty_stats(n_seq: int, eps_low: float, eps_high: float) -> MismatchStats:
    nan_fields = {
        f.name: _NAN
        for f in fields(MismatchStats)
        if f.name not in ("n_tokens", "n_sequences", "clip_eps", "clip_eps_high")
    }
    return MismatchStats(
        n_tokens=0, n_sequences=n_seq, clip_eps=eps_low, clip_eps_high=eps_high, **nan_fields
    )


def _k3(d: np.ndarray) -> float:
    # expm1(d) - d == exp(d) - d - 1 without the cancellation of exp(d) - 1 near d == 0; each term is
    # >= 0 in floating point too (expm1 is faithfully rounded and its true value exceeds d).
    with np.errstate(over="ignore"):
        return float((np.expm1(d) - d).mean())


def _outside_band_fraction(r: np.ndarray, eps_low: float, eps_high: float) -> float:
    if r.size == 0:
        return _NAN
    outside = (r < 1.0 - eps_low) | (r > 1.0 + eps_high)
    return float(np.count_nonzero(outside) / r.size)


def _seq_clip_fraction(
    d: np.ndarray, offsets: np.ndarray, eps_low: float, eps_high: float
) -> float:
    nonempty = np.diff(offsets) > 0
    seq_mean_d = _segment_mean(d, offsets)[nonempty]
    with np.errstate(over="ignore"):
        return _outside_band_fraction(np.exp(seq_mean_d), eps_low, eps_high)


def _ess(d: np.ndarray) -> float:
    # ESS = 1 / mean((r / mean r)**2) = mean(r)**2 / mean(r**2): invariant to scaling r, so shift d by
    # its max (log-sum-exp trick) to keep every term in (0, 1].
    w = np.exp(d - d.max())
    return float(w.mean() ** 2 / np.mean(w * w))


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    # A constant side has no defined correlation. Test it exactly (max == min): after subtracting a
    # rounded mean, a constant array can leave tiny non-zero residuals and a meaningless coefficient.
    if x.size < 2 or x.max() == x.min() or y.max() == y.min():
        return _NAN
    xc = x - x.mean()
    yc = y - y.mean()
    rho = float(np.dot(xc, yc) / math.sqrt(float(np.dot(xc, xc)) * float(np.dot(yc, yc))))
    return min(1.0, max(-1.0, rho))  # rounding can step just outside [-1, 1]


def largest_abs_diff(lp_trainer: Any, lp_engine: Any, n: int) -> np.ndarray:
    """Flat indices of the ``n`` tokens with the largest ``|d|``, largest first (ties: lower index first).

    One partition over all tokens finds the n-th largest ``|d|``; only the chosen ``n`` are sorted.
    Tokens where either side is not finite (a sampled token the transform excludes) have no ``d`` and
    are never chosen; fewer than ``n`` indices come back when fewer tokens have one.
    """
    trainer = _as_float_1d(lp_trainer, "lp_trainer")
    engine = _as_float_1d(lp_engine, "lp_engine")
    if trainer.size != engine.size:
        raise ValueError(f"lp_trainer has {trainer.size} tokens, lp_engine {engine.size}")
    with np.errstate(invalid="ignore"):  # inf - inf: such tokens are dropped just below
        abs_d = np.abs(trainer - engine)
    candidates = np.flatnonzero(np.isfinite(abs_d))
    k = min(max(int(n), 0), candidates.size)
    if k == 0:
        return np.zeros(0, dtype=np.int64)
    values = abs_d[candidates]
    if k < candidates.size:
        # Everything above the k-th largest, then the earliest of those equal to it: ties at the
        # cut are settled by position, not by the partition's internal order.
        kth = -np.partition(-values, k - 1)[k - 1]
        above, tied = values > kth, values == kth
        tied &= np.cumsum(tied) <= k - int(above.sum())
        candidates, values = candidates[above | tied], values[above | tied]
    return candidates[np.lexsort((candidates, -values))].astype(np.int64)


# ----------------------------------------------------------------------------------------------
# 2. Per-sequence and per-group aggregation (bootstrap units)
# ----------------------------------------------------------------------------------------------


def per_sequence_mean(values: Any, offsets: Any) -> np.ndarray:
    """Mean of the token values of each sequence (float64, length S).

    NaN for a zero-length sequence. Non-finite values are not filtered: they propagate into their own
    sequence's mean only.
    """
    vals = _as_float_1d(values, "values")
    off = _check_offsets(offsets, vals.size)
    return _segment_mean(vals, off)


def per_group_mean(values: Any, offsets: Any, group_index: Any, n_groups: int) -> np.ndarray:
    """Token values averaged per sequence, then those sequence means averaged per group (length n_groups).

    Each sequence weighs the same in its group whatever its length (the per-prompt unit the bootstrap
    resamples; e.g. ``group_index`` is the prompt index of each sampled sequence). Zero-length
    sequences have no mean and are left out. NaN for a group with no non-empty sequence.
    """
    vals = _as_float_1d(values, "values")
    off = _check_offsets(offsets, vals.size)
    seq_means = _segment_mean(vals, off)
    groups = _as_int_1d(group_index, "group_index")
    n_groups = int(n_groups)
    if groups.size != seq_means.size:
        raise ValueError(f"group_index has {groups.size} entries for {seq_means.size} sequences")
    if n_groups < 0 or (groups.size and (groups.min() < 0 or groups.max() >= n_groups)):
        raise ValueError(f"group_index must lie in [0, {n_groups})")
    has_tokens = np.diff(off) > 0
    sums = np.bincount(groups[has_tokens], weights=seq_means[has_tokens], minlength=n_groups)
    counts = np.bincount(groups[has_tokens], minlength=n_groups)
    with np.errstate(invalid="ignore", divide="ignore"):  # 0/0 -> NaN for groups with no sequence
        return sums / counts


# ----------------------------------------------------------------------------------------------
# 3. Bootstrap confidence intervals
# ----------------------------------------------------------------------------------------------


def bootstrap_mean_ci(
    a: Any, n_boot: int = 2000, confidence: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """Percentile-bootstrap CI of ``mean(a)`` over units (e.g. prompts): returns ``(low, high, point)``.

    Resamples units with replacement ``n_boot`` times, vectorised in chunks of index matrices drawn
    from ``np.random.default_rng(seed)``; the result depends only on the inputs and ``seed``.
    NaN units (e.g. :func:`per_group_mean` groups with no sequence) are dropped first; infinite values
    raise ``ValueError``. ``(nan, nan, nan)`` when no unit is left; a single unit gives a zero-width CI.
    """
    x = _bootstrap_units(_as_float_1d(a, "a"), "a")
    return _bootstrap(x, n_boot, confidence, seed)


def bootstrap_mean_diff_ci(
    a: Any, b: Any, n_boot: int = 2000, confidence: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """Paired percentile-bootstrap CI of ``mean(a - b)``: returns ``(low, high, point)``.

    ``a[i]`` and ``b[i]`` are the same unit measured twice (the same prompt's value for the new and the
    old engine), so units are resampled as pairs: the prompt-to-prompt spread shared by both engines
    cancels, which is what makes an engine difference visible with a few hundred prompts.
    A pair with NaN on either side is dropped (it carries no paired information); infinite values
    raise ``ValueError``. Same determinism and empty-input rules as :func:`bootstrap_mean_ci`.
    """
    xa = _as_float_1d(a, "a")
    xb = _as_float_1d(b, "b")
    if xa.size != xb.size:
        raise ValueError(f"paired samples differ in length: a has {xa.size}, b has {xb.size}")
    keep = ~(np.isnan(xa) | np.isnan(xb))
    _require_finite({"a": xa[keep], "b": xb[keep]})
    return _bootstrap(xa[keep] - xb[keep], n_boot, confidence, seed)


def _bootstrap_units(x: np.ndarray, name: str) -> np.ndarray:
    x = x[~np.isnan(x)]
    _require_finite({name: x})
    return x


def _bootstrap(
    x: np.ndarray, n_boot: int, confidence: float, seed: int
) -> tuple[float, float, float]:
    n_boot = int(n_boot)
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    if x.size == 0:
        return _NAN, _NAN, _NAN
    point = float(x.mean())
    means = _bootstrap_means(x, n_boot, np.random.default_rng(seed))
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    return float(low), float(high), point


def _bootstrap_means(x: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Means of ``n_boot`` resamples of ``x``, drawing [rows, n] index matrices a chunk at a time.

    The chunk size depends only on ``n``, so the random stream (and the result) is fixed by the seed.
    """
    n = x.size
    rows_per_chunk = max(1, _CHUNK_ELEMENTS // n)
    means = np.empty(n_boot, dtype=np.float64)
    for start in range(0, n_boot, rows_per_chunk):  # over chunks of resamples, not over units
        rows = min(rows_per_chunk, n_boot - start)
        idx = rng.integers(0, n, size=(rows, n))
        means[start : start + rows] = x[idx].mean(axis=1)
    return means


# ----------------------------------------------------------------------------------------------
# 4. Top-k overlap
# ----------------------------------------------------------------------------------------------


def topk_overlap(ids_a: Any, ids_b: Any) -> float:
    """Mean over tokens of ``|A ∩ B| / k`` for two ``[T, k]`` arrays of top-k token ids.

    ``k`` is the row width, padding included. Entries equal to -1 are padding and never match. ``A`` and
    ``B`` are sets: a token id listed twice in one row (a known engine bug) counts once, so a row of
    duplicates cannot score above its distinct ids. NaN when ``T == 0``; ``ValueError`` when ``k == 0``
    or the shapes differ.
    """
    a = np.asarray(ids_a)
    b = np.asarray(ids_b)
    if a.ndim != 2 or a.shape != b.shape:
        raise ValueError(
            f"ids_a and ids_b must be [T, k] arrays of the same shape, got {a.shape} and {b.shape}"
        )
    n_tokens, k = a.shape
    if k == 0:
        raise ValueError("top-k arrays have k == 0 columns")
    if n_tokens == 0:
        return _NAN
    counted = _in_other_row(a, b) & _first_in_row(a) & (a != -1)
    return float(np.count_nonzero(counted) / (n_tokens * k))


# The two helpers below loop over the k columns (k is small: 1..20), never over tokens. Each step
# broadcasts one column against a whole [T, k] array, which needs only [T, k] temporaries; a single
# [T, k, k] broadcast would need k times the memory and measured about 1.3-2x slower here.


def _in_other_row(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[T, k] mask: ``a[t, i]`` occurs somewhere in row ``b[t]``."""
    found = np.zeros(a.shape, dtype=bool)
    for j in range(b.shape[1]):
        found |= a == b[:, j : j + 1]
    return found


def _first_in_row(a: np.ndarray) -> np.ndarray:
    """[T, k] mask: ``a[t, i]`` does not occur earlier in its row (set semantics for duplicates)."""
    first = np.ones(a.shape, dtype=bool)
    for shift in range(1, a.shape[1]):
        first[:, shift:] &= a[:, shift:] != a[:, :-shift]
    return first


# ----------------------------------------------------------------------------------------------
# 5. Greedy agreement
# ----------------------------------------------------------------------------------------------


def greedy_agreement(
    tokens_a: Any, offsets_a: Any, tokens_b: Any, offsets_b: Any
) -> GreedyAgreement:
    """Compare two sets of greedy (temperature 0) completions, sequence by sequence.

    ``first_divergence[i]`` is the first position where sequence ``i`` differs, -1 when identical
    (length included); when one is a strict prefix of the other it is the shorter length.
    ``exact_match_rate`` is the fraction of identical sequences; ``mean_first_divergence`` averages
    ``first_divergence`` over the diverging sequences only. A cheap drift guard (vLLM's own tests
    compare greedy outputs of vLLM and HF).

    Rather than padding to an ``[S, max_len]`` matrix (one long sequence would blow it up), only the
    first ``min(len_a, len_b)`` positions of each pair are gathered, flat, and compared.

    NaN: ``exact_match_rate`` when ``S == 0``; ``mean_first_divergence`` when no sequence diverges.
    """
    ta = _as_int_1d(tokens_a, "tokens_a")
    tb = _as_int_1d(tokens_b, "tokens_b")
    off_a = _check_offsets(offsets_a, ta.size, "offsets_a")
    off_b = _check_offsets(offsets_b, tb.size, "offsets_b")
    if off_a.size != off_b.size:
        raise ValueError(
            f"offsets_a has {off_a.size - 1} sequences but offsets_b has {off_b.size - 1}"
        )

    len_a, len_b = np.diff(off_a), np.diff(off_b)
    common = np.minimum(len_a, len_b)
    first_diff = _first_mismatch_within(ta, off_a[:-1], tb, off_b[:-1], common)
    # No mismatch within the common part: identical if the lengths agree, else the shorter is a prefix.
    no_diff = first_diff < 0
    first_diff[no_diff & (len_a != len_b)] = common[no_diff & (len_a != len_b)]

    n_seq = int(common.size)
    diverged = first_diff >= 0
    return GreedyAgreement(
        n_sequences=n_seq,
        exact_match_rate=float(np.count_nonzero(~diverged) / n_seq) if n_seq else _NAN,
        mean_first_divergence=_mean(first_diff[diverged].astype(np.float64)),
        first_divergence=first_diff,
    )


def _first_mismatch_within(
    ta: np.ndarray, starts_a: np.ndarray, tb: np.ndarray, starts_b: np.ndarray, common: np.ndarray
) -> np.ndarray:
    """Per sequence, the first position < common[i] where the two token runs differ; -1 if none."""
    n_seq = common.size
    total = int(common.sum())
    seg = np.repeat(np.arange(n_seq, dtype=np.int64), common)
    seg_start = np.concatenate(([0], np.cumsum(common)[:-1])) if n_seq else common
    pos = np.arange(total, dtype=np.int64) - np.repeat(
        seg_start, common
    )  # position inside its sequence
    differs = ta[np.repeat(starts_a, common) + pos] != tb[np.repeat(starts_b, common) + pos]
    first = np.full(n_seq, -1, dtype=np.int64)
    hits = np.flatnonzero(differs)
    # hits is ascending, so the first hit of each sequence is where its sequence id first appears.
    hit_seq, first_hit = np.unique(seg[hits], return_index=True)
    first[hit_seq] = pos[hits[first_hit]]
    return first


# ----------------------------------------------------------------------------------------------
# 6. Length guard
# ----------------------------------------------------------------------------------------------


def length_ratio(offsets_new: Any, offsets_ref: Any) -> float:
    """Mean output length of the new engine over the reference's (MLPerf's ±10 % guard is the caller's).

    NaN when either side has no sequences or the reference's mean length is 0 (a NaN ratio fails any
    ``abs(ratio - 1) <= tol`` check, which is the safe outcome).
    """
    new = _as_int_1d(offsets_new, "offsets_new")
    ref = _as_int_1d(offsets_ref, "offsets_ref")
    _check_offsets(new, int(new[-1]) if new.size else 0, "offsets_new")
    _check_offsets(ref, int(ref[-1]) if ref.size else 0, "offsets_ref")
    if new.size < 2 or ref.size < 2 or ref[-1] == 0:
        return _NAN
    mean_new = new[-1] / (new.size - 1)
    mean_ref = ref[-1] / (ref.size - 1)
    return float(mean_new / mean_ref)


def _lengths(offsets: Any, name: str) -> np.ndarray:
    """Per-sequence lengths from validated CSR offsets."""
    off = _as_int_1d(offsets, name)
    return np.diff(_check_offsets(off, int(off[-1]) if off.size else 0, name))


def length_ratio_se(offsets_new: Any, offsets_ref: Any) -> float:
    """The sampling standard error of :func:`length_ratio`: how far two draws of the same length
    distribution put the ratio from 1 by chance (a release whose sampler draws other samples from
    the same seed compares two independent draws).

    Paired where both sides hold the same number of sequences (the same prompts, samples and seeds
    in one order): the standard error of the mean per-sequence difference, 0 where the draws are
    identical. Otherwise the two means' standard errors combined. Over the reference's mean
    length; 0.0 where either side has fewer than two sequences or the reference's mean is 0.
    """
    new, ref = _lengths(offsets_new, "offsets_new"), _lengths(offsets_ref, "offsets_ref")
    if new.size < 2 or ref.size < 2 or ref.sum() == 0:
        return 0.0
    if new.size == ref.size:
        se = np.std(new - ref, ddof=1) / np.sqrt(new.size)
    else:
        se = np.sqrt(np.var(new, ddof=1) / new.size + np.var(ref, ddof=1) / ref.size)
    return float(se / ref.mean())


# ----------------------------------------------------------------------------------------------
# 7. Logprob semantics
# ----------------------------------------------------------------------------------------------


def logprob_semantics_distances(
    lp_engine: Any, lp_trainer_processed: Any, lp_trainer_raw: Any
) -> dict[str, float]:
    """Mean ``|engine - processed|`` and mean ``|engine - raw|`` over the same tokens.

    vLLM V1 returns raw logprobs unless ``logprobs_mode="processed_logprobs"``; V0 returned logprobs
    after temperature. Whichever reference the engine is closer to tells a later check which
    semantics it reports. Returns ``{"mean_abs_diff_processed": ..., "mean_abs_diff_raw": ...}``;
    both are NaN when there are no tokens. Non-finite inputs raise ``ValueError`` (the sampled token's
    processed logprob is finite unless the reference's top-k/top-p masked a token the engine sampled,
    which the caller must look at, not average away).
    """
    le = _as_float_1d(lp_engine, "lp_engine")
    lp = _as_float_1d(lp_trainer_processed, "lp_trainer_processed")
    lr = _as_float_1d(lp_trainer_raw, "lp_trainer_raw")
    if not (le.size == lp.size == lr.size):
        raise ValueError(
            f"token counts differ: engine {le.size}, processed {lp.size}, raw {lr.size}"
        )
    _require_finite({"lp_engine": le, "lp_trainer_processed": lp, "lp_trainer_raw": lr})
    return {
        "mean_abs_diff_processed": _mean(np.abs(le - lp)),
        "mean_abs_diff_raw": _mean(np.abs(le - lr)),
    }
