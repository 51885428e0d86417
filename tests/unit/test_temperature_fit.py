"""The effective-temperature fit: recovered from known transforms, and named by logprob-semantics."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from gate.analysis.temperature_fit import fit_evidence, fit_temperature
from gate.checks.context import Context
from gate.config.checks_section import parse_settings
from gate.contract import evidence as ev
from gate.contract import keys
from gate.judge import run_checks
from gate.verdict import Status

from ..factory import RUN, make_evidence

K = 5


def _log_softmax(x: np.ndarray) -> np.ndarray:
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def _topk(
    rows: int, t_engine: float, seed: int = 0, vocab: int = 50, top_k: int = 0, noise: float = 0.0
):
    """(engine top-k processed logprobs at t_engine, trainer raw logprobs of the same ids, ids)."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0, 2.0, (rows, vocab))
    scaled = z / t_engine
    if top_k:
        kth = np.sort(scaled, axis=1)[:, -top_k][:, None]
        scaled = np.where(scaled >= kth, scaled, -np.inf)
    processed = _log_softmax(scaled)
    ids = np.argsort(-z, axis=1)[:, :K]
    engine = np.take_along_axis(processed, ids, 1) + rng.normal(0, noise, (rows, K)) * (noise > 0)
    return engine, np.take_along_axis(_log_softmax(z), ids, 1), ids


@pytest.mark.parametrize("t", [0.7, 0.721, 1.0, 1.3])
def test_fit_recovers_the_temperature(t):
    engine, trainer, _ = _topk(400, t)
    fit = fit_temperature(engine, trainer)
    assert fit.temperature == pytest.approx(t, rel=1e-9)
    assert fit.pairs == 400 * (K - 1) and fit.positions == 400


def test_top_k_masking_and_padding_drop_out():
    engine, trainer, _ = _topk(300, 0.7, top_k=3)  # columns 3 and 4 are -inf on the engine side
    engine[:10, 1:] = -np.inf  # fewer reported
    trainer[10:20, 2] = np.nan
    fit = fit_temperature(engine, trainer)
    assert fit.temperature == pytest.approx(0.7, rel=1e-9)
    assert fit.pairs == 290 * 2 - 10


def test_noise_gives_a_standard_error_that_covers_the_truth():
    engine, trainer, _ = _topk(2000, 0.7 * 1.03, seed=3, noise=0.02)
    fit = fit_temperature(engine, trainer)
    assert 0 < fit.rel_stderr < 2e-3
    assert abs(fit.temperature - 0.721) < 4 * fit.stderr


def test_nothing_to_fit():
    assert fit_temperature(np.zeros((3, 1)), np.zeros((3, 1))) is None  # one column: no difference
    assert fit_temperature(np.full((3, 4), -np.inf), np.zeros((3, 4))) is None
    assert fit_temperature(np.zeros((3, 4)), np.zeros((4, 4))) is None


def _evidence(folder, t_engine: float, seed: int, noise: float = 0.0) -> ev.Evidence:
    e = make_evidence(folder, seed=seed)
    n = len(e[f"{keys.SAMPLE}_{keys.TOKEN_IDS}"])
    engine, trainer, ids = _topk(n, t_engine, seed=seed, noise=noise)
    ids[:, 0] = e[
        f"{keys.SAMPLE}_{keys.TOKEN_IDS}"
    ]  # the sampled token heads the top-k: no extra pair
    e.arrays[f"{keys.SAMPLE}_{keys.TOPK_IDS}"] = ids.astype(np.int32)
    e.arrays[f"{keys.SAMPLE}_{keys.TOPK_LOGPROBS}"] = engine.astype(np.float32)
    e.arrays[f"{keys.SAMPLE}_{keys.TRAINER_TOPK_RAW}"] = trainer.astype(np.float32)
    return e


def _semantics(
    tmp_path, t_new: float, t_old: float = 0.7, noise: float = 0.0, temperature: float = 0.7
):
    run = copy.deepcopy(RUN)
    run["sampling"]["temperature"] = temperature
    ctx = Context(
        new=_evidence(tmp_path / "new", t_new, 2, noise), old=_evidence(tmp_path / "old", t_old, 1),
        run=run,
    )  # fmt: skip
    return next(
        r for r in run_checks(ctx, parse_settings({}, "gate.yaml")) if r.id == "logprob-semantics"
    )


def test_a_three_percent_temperature_error_fails_and_is_named(tmp_path):
    r = _semantics(tmp_path, 0.7 * 1.03)
    assert r.status == Status.FAIL
    assert "the engine behaves like T=0.721 while 0.7 was requested" in r.summary
    assert "+3.0%" in r.diagnosis and "temperature" in r.diagnosis
    assert r.details["effective_temperature"]["new"] == pytest.approx(0.721, rel=1e-5)


def test_the_requested_temperature_passes(tmp_path):
    r = _semantics(tmp_path, 0.7)
    m = {(m.name, m.engine): m for m in r.measurements}
    assert m[("temperature_rel_error", "new")].status == Status.PASS
    assert m[("temperature_rel_error", "new")].value < 1e-5


@pytest.mark.parametrize(
    "factor, expected", [(1.004, Status.PASS), (1.007, Status.WARN), (0.985, Status.FAIL)]
)
def test_tolerance_bounds(tmp_path, factor, expected):
    r = _semantics(tmp_path, 0.7 * factor)
    m = next(m for m in r.measurements if m.name == "temperature_rel_error" and m.engine == "new")
    assert (m.status, m.warn, m.fail) == (expected, 0.005, 0.01)


def test_a_coarse_fit_widens_the_bounds(tmp_path):
    # Heavy noise: 4 standard errors exceed 1%, so a 1.2% deviation is not called a fault.
    r = _semantics(tmp_path, 0.7 * 1.012, noise=3.0)
    m = next(m for m in r.measurements if m.name == "temperature_rel_error" and m.engine == "new")
    assert m.fail > 0.01 and m.status != Status.FAIL


def test_the_old_engine_is_context_only(tmp_path):
    r = _semantics(tmp_path, 0.7, t_old=0.7 * 1.05)
    assert r.status == Status.PASS
    assert r.details["effective_temperature"]["old"] == pytest.approx(0.735, rel=1e-5)


def test_evidence_without_trainer_top_k_has_no_fit(tmp_path):
    assert fit_evidence(make_evidence(tmp_path / "e", seed=1)) is None


def test_with_penalties_the_fit_reads_the_penalised_logprobs(tmp_path):
    # Penalties act before temperature: the engine's differences are the penalised ones over T. The
    # raw ones (what trainer_topk_raw would hold) are other numbers; the fit must not read them.
    e = _evidence(tmp_path / "e", 0.7, seed=3)
    topk = e.arrays.pop(f"{keys.SAMPLE}_{keys.TRAINER_TOPK_RAW}")
    e.arrays[f"{keys.SAMPLE}_{keys.TRAINER_TOPK_PENALISED}"] = topk
    # the sampled token heads the top-k (no extra pair): its raw logprob is left far off on purpose
    e.arrays[f"{keys.SAMPLE}_{keys.TRAINER_PENALISED}"] = topk[:, 0].copy()
    e.arrays[f"{keys.SAMPLE}_{keys.TRAINER_RAW}"] = topk[:, 0] - 5.0
    ev.validate(e)
    assert fit_evidence(e).temperature == pytest.approx(0.7, rel=1e-5)
    # the sampled token outside the engine's top-k is a pair, read after the penalties (a pair read
    # from trainer_logprob_raw, 5 nats off, would move the fit)
    e.arrays[f"{keys.SAMPLE}_{keys.ENGINE_LOGPROB}"] = e[f"{keys.SAMPLE}_{keys.TOPK_LOGPROBS}"][
        :, 0
    ].copy()
    e.arrays[f"{keys.SAMPLE}_{keys.TOPK_IDS}"][:, 0] = -1
    e.arrays[f"{keys.SAMPLE}_{keys.TOPK_LOGPROBS}"][:, 0] = np.nan
    assert fit_evidence(e).temperature == pytest.approx(0.7, rel=1e-5)
    del e.arrays[f"{keys.SAMPLE}_{keys.TRAINER_PENALISED}"]
    assert fit_evidence(e) is None  # half the inputs: no fit, rather than raw pairs mixed in


def test_reference_scores_the_extra_ids(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from gate.contract.request import Penalties
    from gate.worker.reference import ReferenceModel, SamplingTransform

    cfg = transformers.LlamaConfig(
        vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    model.save_pretrained(tmp_path)
    seqs, starts = [[1, 5, 7, 9], [1, 3, 4]], [2, 1]
    also = np.array([[3, 4, -1], [0, 39, 2], [5, 5, 5], [7, -1, -1]])
    ref = ReferenceModel(str(tmp_path), "float32", lm_head_fp32=False, device="cpu")
    scored = ref.score(
        seqs, starts, SamplingTransform(0.7, 0, 1.0), batch_tokens=256, also_ids=also
    )
    rows = []
    with torch.no_grad():
        for seq, start in zip(seqs, starts, strict=True):
            lp = torch.log_softmax(model(torch.tensor([seq])).logits[0].float(), -1)
            rows += [lp[t - 1].numpy() for t in range(start, len(seq))]
    expected = np.where(
        also >= 0, np.take_along_axis(np.array(rows), np.maximum(also, 0), 1), np.nan
    )
    np.testing.assert_allclose(scored.also_raw, expected, atol=1e-5)

    # With penalties on, the same ids after the penalties (vLLM applies them before temperature)
    from .test_reference import _vllm_penalties

    transform = SamplingTransform(
        0.7, 0, 1.0, penalties=Penalties(repetition=1.3, presence=0.4, frequency=0.25)
    )
    # ids the penalties act on at each position: prompt tokens (1, 5 / 1) and generated ones (7 / 3)
    also = np.array([[1, 5, 7], [7, 5, 0], [1, 3, 39], [3, 1, -1]])
    scored = ref.score(seqs, starts, transform, batch_tokens=256, also_ids=also)
    rows = []
    with torch.no_grad():
        for seq, start in zip(seqs, starts, strict=True):
            logits = model(torch.tensor([seq])).logits[0].float()
            for t in range(start, len(seq)):
                row = _vllm_penalties(logits[t - 1], seq[:start], seq[start:t], transform)
                rows.append(torch.log_softmax(row, -1).numpy())
    expected = np.where(
        also >= 0, np.take_along_axis(np.array(rows), np.maximum(also, 0), 1), np.nan
    )
    np.testing.assert_allclose(scored.also_raw, expected, atol=1e-5)


def test_at_temperature_one_the_check_skips_unless_the_temperature_is_off(tmp_path):
    r = _semantics(tmp_path, 1.0, t_old=1.0, temperature=1.0)
    assert r.status == Status.SKIP
    r = _semantics(tmp_path / "b", 1.03, t_old=1.0, temperature=1.0)
    assert r.status == Status.FAIL and "T=1.030 while 1 was requested" in r.summary


def test_logit_noise_is_the_quantile_of_how_far_logit_differences_stray():
    from gate.analysis.temperature_fit import logit_noise

    # T 0.5: engine differences are the trainer's x 2; the trainer's second logit is 0.1 or 0.3 off
    trainer = np.array([[0.0, -1.0], [0.0, -2.0], [0.0, -3.0], [0.0, -4.0]])
    off = np.array([[0.0, 0.1], [0.0, -0.1], [0.0, 0.3], [0.0, 0.1]])
    engine = (trainer + off) / 0.5
    fit = fit_temperature(engine, trainer)
    residual = np.abs(
        fit.temperature * (engine[:, 1] - engine[:, 0]) - (trainer[:, 1] - trainer[:, 0])
    )
    assert logit_noise(engine, trainer, quantile=1.0) == pytest.approx(residual.max())
    assert logit_noise(engine, trainer, quantile=0.5) == pytest.approx(np.median(residual))
    assert logit_noise(engine[:, :1], trainer[:, :1]) is None  # no pair at one position
