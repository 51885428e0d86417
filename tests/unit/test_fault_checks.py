"""What issue 6's fault matrix added to the checks and the evidence, against hand-computed values."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from gate.checks.context import Context, per_prompt, sampled_pairs
from gate.config.checks_section import parse_settings
from gate.contract import evidence as ev
from gate.contract import keys
from gate.judge import run_checks
from gate.verdict import Status

from ..factory import RUN, make_evidence, script

subset_evidence = script("evidence_subset").subset_evidence


def _results(ctx):
    return {r.id: r for r in run_checks(ctx, parse_settings({}, "gate.yaml"))}


def _mask(e: ev.Evidence, tokens: list[int]) -> ev.Evidence:
    """The engine sampled these tokens although top-k/top-p excludes them: the reference says -inf."""
    arrays = dict(e.arrays)
    processed = arrays["sample_trainer_logprob_processed"].copy()
    processed[tokens] = -np.inf
    arrays["sample_trainer_logprob_processed"] = processed
    return ev.Evidence(e.path, arrays, e.engine, e.texts)


@pytest.fixture
def ctx(tmp_path):
    run = copy.deepcopy(RUN)
    run["sampling"] = {**run["sampling"], "top_p": 0.8}
    return Context(
        new=make_evidence(tmp_path / "new", seed=2),
        old=make_evidence(tmp_path / "old", seed=1),
        run=run,
    )


def test_sampled_pairs_drop_masked_tokens_and_reindex_sequences(tmp_path):
    # 20 prompts x 2 samples x 8 tokens; mask tokens 0, 1 (sequence 0) and 17 (sequence 2)
    e = _mask(make_evidence(tmp_path / "e", seed=2), [0, 1, 17])
    pairs = sampled_pairs(e)
    assert (pairs.masked, pairs.total) == (3, 320)
    assert pairs.masked_fraction == pytest.approx(3 / 320)
    assert pairs.offsets[:4].tolist() == [0, 6, 14, 21]  # 8-2, +8, +7 tokens
    assert pairs.offsets[-1] == 317 and len(pairs.trainer) == len(pairs.engine) == 317
    assert np.isfinite(pairs.trainer).all()
    # per-prompt means over the kept tokens: prompt 0 = mean of its two sequences' kept-token means
    d = np.abs(pairs.trainer.astype(float) - pairs.engine)
    expected = (d[0:6].mean() + d[6:14].mean()) / 2
    assert per_prompt(e, keys.SAMPLE, d, pairs.offsets)[0] == pytest.approx(expected)
    clean = sampled_pairs(make_evidence(tmp_path / "c", seed=2))
    assert clean.masked == 0 and len(clean.trainer) == 320


def test_tokens_outside_top_k_top_p_fail_with_the_fix(ctx):
    ctx.new = _mask(ctx.new, list(range(0, 320, 40)))  # 8 of 320 = 2.5% > 1e-3
    r = _results(ctx)["logprob-semantics"]
    assert r.status == Status.FAIL
    m = next(
        m for m in r.measurements if m.name == "tokens_outside_transform" and m.engine == "new"
    )
    assert m.value == pytest.approx(8 / 320) and m.note == "8 of 320 sampled tokens"
    assert r.details["tokens_outside_transform"] == {"old": 0, "new": 8}
    assert "sampled 8 of 320 tokens (2.50%)" in r.diagnosis and "top_p=0.8" in r.diagnosis
    assert "does not apply top-k/top-p although the request asked for them" in r.diagnosis
    # the other checks still judge the tokens that have a finite d, instead of crashing
    mismatch = _results(ctx)["train-inference-mismatch"]
    assert (
        mismatch.status != Status.ERROR and mismatch.details["new"]["tokens_outside_transform"] == 8
    )


def test_one_boundary_token_warns_and_the_old_engine_is_context(ctx):
    ctx.new = _mask(ctx.new, [5])  # 1 of 320 = 3.1e-3 > 1e-3: FAIL
    assert _results(ctx)["logprob-semantics"].status == Status.FAIL
    big = make_evidence(
        ctx.new.path.parent / "big", seed=2, n_prompts=200, n=3, length=8
    )  # 4800 tokens
    ctx.new = _mask(big, [5])  # 1 / 4800 = 2.1e-4: above 0, below 1e-3
    ctx.old = None
    r = _results(ctx)["logprob-semantics"]
    assert r.status == Status.WARN and "sampled 1 of 4800 tokens" in r.diagnosis
    ctx.new = make_evidence(ctx.new.path.parent / "new2", seed=2)
    ctx.old = _mask(make_evidence(ctx.new.path.parent / "old2", seed=1), [3])
    assert (
        _results(ctx)["logprob-semantics"].status == Status.PASS
    )  # the old engine's problem is not this PR's


def test_evidence_allows_minus_inf_only_where_the_transform_masks(tmp_path):
    e = make_evidence(tmp_path / "e", seed=2)
    arrays = dict(e.arrays)
    arrays["sample_trainer_logprob_processed"] = arrays["sample_trainer_logprob_processed"].copy()
    arrays["sample_trainer_logprob_processed"][3] = -np.inf
    ev.validate(ev.Evidence(e.path, arrays, e.engine, e.texts))  # a finding, not bad evidence
    arrays["sample_trainer_logprob_processed"][4] = np.nan
    with pytest.raises(ev.EvidenceError, match="sample_trainer_logprob_processed: 1 NaN/\\+inf"):
        ev.validate(ev.Evidence(e.path, arrays, e.engine, e.texts))
    arrays = dict(e.arrays)
    arrays["sample_trainer_logprob_raw"] = arrays["sample_trainer_logprob_raw"].copy()
    arrays["sample_trainer_logprob_raw"][
        0
    ] = -np.inf  # raw logprobs of a sampled token are never -inf
    with pytest.raises(ev.EvidenceError, match="sample_trainer_logprob_raw: 1 non-finite"):
        ev.validate(ev.Evidence(e.path, arrays, e.engine, e.texts))


def test_subset_evidence_keeps_chosen_prompts_and_cuts_completions(tmp_path):
    e = make_evidence(tmp_path / "e", seed=2, n_prompts=5, n=2, length=8)
    full = subset_evidence(e, np.arange(5))
    for key in full.arrays:
        assert np.array_equal(full[key], e[key]), key
    assert not any(k.startswith(("ws_", "grpo_")) for k in full.arrays)
    cut = subset_evidence(e, np.array([3, 1]), max_tokens=3)
    ev.validate(cut)
    assert cut.n_prompts == 2
    assert cut.prompt_tokens(0).tolist() == e.prompt_tokens(3).tolist()
    assert cut["sample_prompt_index"].tolist() == [0, 0, 1, 1]
    assert cut["sample_offsets"].tolist() == [0, 3, 6, 9, 12]
    # prompt 3's sequences are 6 and 7 of the original, each 8 tokens from offset 48 / 56
    assert (
        cut["sample_token_ids"][:6].tolist()
        == e["sample_token_ids"][[48, 49, 50, 56, 57, 58]].tolist()
    )
    assert cut["sample_engine_logprob"][3] == e["sample_engine_logprob"][56]
    assert cut["sample_topk_ids"].shape == (12, 5)
    assert cut["sample_finish"].tolist() == [1, 1, 1, 1]  # cut short: "length"
    assert cut["greedy_offsets"].tolist() == [0, 3, 6]
    assert cut["tf_prompt_index"].tolist() == [0, 1]
    tf_len = np.diff(e["tf_offsets"])
    assert cut["tf_offsets"].tolist() == [
        0,
        tf_len[3],
        tf_len[3] + tf_len[1],
    ]  # teacher-forced: whole
    lo, hi = e["tf_input_offsets"][3], e["tf_input_offsets"][4]
    assert cut["tf_input_ids"][: hi - lo].tolist() == e["tf_input_ids"][lo:hi].tolist()
    longer = subset_evidence(
        e, np.arange(5), max_tokens=100
    )  # a limit above every length changes nothing
    assert np.array_equal(longer["sample_finish"], e["sample_finish"])


def test_subset_evidence_keeps_the_text_round_trip_per_sequence_and_drops_it_where_it_cuts(
    tmp_path,
):
    """A real tokenizer's evidence holds the text round trip per sampled sequence (10 here, over
    80 tokens): chosen per sequence, never indexed by token; a cut sequence's text never existed."""
    e = make_evidence(tmp_path / "e", seed=2, n_prompts=5, n=2, length=8)
    e.arrays["sample_text_mismatch"] = np.arange(10) % 3 == 0
    e.arrays["sample_retokenized_at"] = np.arange(10, dtype=np.int32) - 1
    ev.validate(e)
    whole = subset_evidence(e, np.array([3, 1]), max_tokens=8)
    ev.validate(whole)
    assert whole["sample_retokenized_at"].tolist() == [5, 6, 1, 2]  # sequences 6, 7, 2, 3
    assert whole["sample_text_mismatch"].tolist() == [True, False, False, True]
    cut = subset_evidence(e, np.array([3, 1]), max_tokens=3)
    ev.validate(cut)
    assert "sample_text_mismatch" not in cut.arrays and "sample_retokenized_at" not in cut.arrays


def _trainer_logits_off_by(ctx, rng, most: float) -> None:
    """The trainer's raw top-k logprobs: the engine's logits, each up to ``most`` off (bf16-like)."""
    temperature = ctx.run["sampling"]["temperature"]
    engine_topk = ctx.new["sample_topk_logprobs"].astype(np.float64)
    noise = rng.uniform(-most, most, engine_topk.shape)
    ctx.new.arrays[f"{keys.SAMPLE}_{keys.TRAINER_TOPK_RAW}"] = (
        engine_topk * temperature + noise
    ).astype(np.float32)


def test_tokens_nearer_the_nucleus_edge_than_the_logit_noise_are_undecidable(ctx):
    """A bf16 engine and trainer disagree on logits by their rounding: a sampled token the
    reference puts 0.01 logits outside the nucleus is that noise, one 1.0 outside is a finding."""
    rng = np.random.default_rng(5)
    t = ctx.new["sample_engine_logprob"].shape[0]
    _trainer_logits_off_by(ctx, rng, 0.05)
    masked = list(range(0, 320, 40))  # 8 outside the reference's nucleus
    ctx.new = _mask(ctx.new, masked)
    gap = np.full(t, -1.0, dtype=np.float32)  # kept tokens: inside, a negative gap
    gap[masked[:5]] = 0.01  # nearly tied with the smallest kept logit
    gap[masked[5:]] = 1.0
    ctx.new.arrays[f"{keys.SAMPLE}_{keys.TRAINER_BOUNDARY_GAP}"] = gap
    r = _results(ctx)["logprob-semantics"]
    assert r.details["tokens_outside_transform"]["new"] == 3
    edge = next(
        m for m in r.measurements if m.name == "tokens_at_transform_boundary" and m.engine == "new"
    )
    assert (
        edge.value == pytest.approx(5 / 320) and "measured logit noise band (0.1" in edge.note
    )  # 2 x its 99th percentile
    ctx.new.arrays[f"{keys.SAMPLE}_{keys.TRAINER_BOUNDARY_GAP}"] = np.where(
        gap > 0, 1.0, gap
    ).astype(np.float32)
    assert _results(ctx)["logprob-semantics"].details["tokens_outside_transform"]["new"] == 8


def test_tokens_just_past_the_top_p_cut_by_probability_are_undecidable(ctx):
    """The cut can fall between two tokens far apart in logits: what the noise moves is the mass
    above the token. 0.805 above it at top_p 0.8 is within reach of the noise; 0.95 is not."""
    rng = np.random.default_rng(6)
    t = ctx.new["sample_engine_logprob"].shape[0]
    _trainer_logits_off_by(ctx, rng, 0.05)
    masked = list(range(0, 320, 40))
    ctx.new = _mask(ctx.new, masked)
    ctx.new.arrays[f"{keys.SAMPLE}_{keys.TRAINER_BOUNDARY_GAP}"] = np.where(
        np.isin(np.arange(t), masked), 1.5, -1.0
    ).astype(np.float32)
    mass = rng.uniform(0.0, 0.7, t).astype(np.float32)
    mass[masked[:3]], mass[masked[3:]] = 0.805, 0.95
    ctx.new.arrays[f"{keys.SAMPLE}_{keys.TRAINER_MASS_ABOVE}"] = mass
    assert _results(ctx)["logprob-semantics"].details["tokens_outside_transform"]["new"] == 5


def test_tokens_on_the_transform_boundary_are_undecidable_not_outside(ctx):
    # A GPU kernel keeps exactly k of tied tokens: a token one ULP from the cut may go either way.
    masked = list(range(0, 320, 40))
    ctx.new = _mask(ctx.new, masked)
    edge = np.zeros(320, dtype=bool)
    edge[masked[:6]] = True
    edge[[3, 4]] = True  # on the boundary but kept by the reference: not counted anywhere
    ctx.new.arrays[f"{keys.SAMPLE}_{keys.TRAINER_AT_BOUNDARY}"] = edge
    r = _results(ctx)["logprob-semantics"]
    outside = next(
        m for m in r.measurements if m.name == "tokens_outside_transform" and m.engine == "new"
    )
    assert (
        outside.note == "2 of 320 sampled tokens"
        and r.details["tokens_outside_transform"]["new"] == 2
    )
    boundary = next(
        m for m in r.measurements if m.name == "tokens_at_transform_boundary" and m.engine == "new"
    )
    assert boundary.value == pytest.approx(6 / 320) and boundary.status == Status.PASS
    ctx.new.arrays[f"{keys.SAMPLE}_{keys.TRAINER_AT_BOUNDARY}"] = np.zeros(320, dtype=bool)
    assert _results(ctx)["logprob-semantics"].details["tokens_outside_transform"]["new"] == 8


def test_the_nucleus_edge_band_is_twice_the_measured_noise_quantile(ctx):
    """A token whose mass above sits past top_p by more than one 99th percentile of the logit
    noise, and less than two, is undecidable (measured on SmolLM2: such tokens reach 1.9x); past
    two it is a finding."""
    from gate.analysis.nucleus_edge import EDGE_MARGIN, undecidable_outside
    from gate.analysis.temperature_fit import evidence_logit_noise

    rng = np.random.default_rng(7)
    t = ctx.new["sample_engine_logprob"].shape[0]
    temperature = ctx.run["sampling"]["temperature"]
    _trainer_logits_off_by(ctx, rng, 0.05)
    masked = list(range(0, 320, 40))
    ctx.new = _mask(ctx.new, masked)
    ctx.new.arrays[f"{keys.SAMPLE}_{keys.TRAINER_BOUNDARY_GAP}"] = np.where(
        np.isin(np.arange(t), masked), 5.0, -1.0
    ).astype(np.float32)
    q99 = evidence_logit_noise(ctx.new)
    top_p = 0.8
    sampling = {**ctx.run["sampling"], "top_p": top_p}

    def mass_at(
        quantiles: float,
    ) -> float:  # log-odds of the mass above = top_p's + quantiles * q99 / T
        return float(
            1 / (1 + np.exp(-(np.log(top_p / (1 - top_p)) + quantiles * q99 / temperature)))
        )

    mass = rng.uniform(0.0, 0.7, t).astype(np.float64)
    mass[masked[:4]] = mass_at(1.5)  # past one quantile, inside the band
    mass[masked[4:]] = mass_at(EDGE_MARGIN + 0.5)
    ctx.new.arrays[f"{keys.SAMPLE}_{keys.TRAINER_MASS_ABOVE}"] = mass.astype(np.float32)
    undecidable, band = undecidable_outside(ctx.new, sampling)
    assert band == pytest.approx(EDGE_MARGIN * q99) and undecidable == 4


def test_a_fitted_temperature_within_the_dtypes_roundoff_is_no_finding():
    """Two bf16 implementations differ by a logit scale of one unit roundoff (2^-8), which the fit
    reads as a temperature: SmolLM2's A/A read T_eff up to 0.806 at T 0.8. The bound adds one
    roundoff (WARN) or two (FAIL) to four standard errors; in fp32 nothing changes."""
    from gate.analysis.temperature_fit import TemperatureFit
    from gate.checks.semantics import ROUNDOFF, THRESHOLDS, _rel_error

    th = THRESHOLDS["temperature_rel_error"]
    bf16 = ROUNDOFF["bfloat16"]
    fit = TemperatureFit(0.806, 0.0016 * 0.806, pairs=2500, positions=1000)  # +0.75%, 0.16% s.e.
    assert _rel_error(fit, 0.8, th, "new").status == Status.WARN  # fp32 bounds: 0.64% / 1%
    at_bf16 = _rel_error(fit, 0.8, th, "new", bf16)
    assert at_bf16.status == Status.PASS
    assert at_bf16.warn == pytest.approx(4 * 0.0016 + bf16) and at_bf16.fail == pytest.approx(
        4 * 0.0016 + 2 * bf16
    )
    # a sampler off by 2% (the noise study's temperature fault) still fails in bf16
    assert (
        _rel_error(
            TemperatureFit(0.8 * 1.02 * 1.005, 0.0013, 2500, 1000), 0.8, th, "new", bf16
        ).status
        == Status.FAIL
    )
    assert ROUNDOFF["float32"] < 1e-7  # fp32 keeps the 0.5% / 1% bounds


def test_tokens_outside_a_penalised_nucleus_name_the_penalties_as_a_cause(ctx):
    """Row 26f on SmolLM2: an engine that penalises other tokens than the trainer moves tokens across
    the edge of the reference's (penalised) nucleus while applying top-p itself; the finding must
    not only say "does not apply top-k/top-p". Without penalties it still does."""
    ctx.new = _mask(ctx.new, list(range(0, 320, 40)))
    plain = _results(ctx)["logprob-semantics"]
    assert plain.status == Status.FAIL and "it does not apply top-k/top-p" in plain.diagnosis
    ctx.run["sampling"] = {**ctx.run["sampling"], "repetition_penalty": 1.3}
    penalised = _results(ctx)["logprob-semantics"]
    assert penalised.status == Status.FAIL
    assert "applies the penalties to other tokens than the trainer" in penalised.diagnosis
    assert penalised.diagnosis.count("vLLM #52461") == 1, penalised.diagnosis
