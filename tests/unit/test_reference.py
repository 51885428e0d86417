"""The trainer-side reference: the sampling transform and batched scoring, against hand values."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from gate.contract.evidence import token_ranges  # noqa: E402
from gate.contract.request import Penalties  # noqa: E402
from gate.worker import matmul_precision  # noqa: E402
from gate.worker.reference import (  # noqa: E402
    ReferenceModel,
    SamplingTransform,
    _pack,
    _whole_vocabulary_scores,
    at_boundary,
    full_fp32_matmul,
    processed_logprobs,
    top_p_keep,
    transform_scores,
)


def test_temperature_only():
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    out = processed_logprobs(logits, SamplingTransform(temperature=0.5, top_k=0, top_p=1.0))
    z = np.array([4.0, 2.0, 0.0])
    expected = z - np.log(np.exp(z).sum())
    np.testing.assert_allclose(out.numpy()[0], expected, rtol=1e-6)


def test_top_k_keeps_ties_and_renormalises():
    logits = torch.tensor([[3.0, 1.0, 1.0, 0.0]])
    out = processed_logprobs(
        logits, SamplingTransform(temperature=1.0, top_k=2, top_p=1.0)
    ).numpy()[0]
    # The 2nd largest logit (1.0) is tied: both stay, like vLLM's `logits < kth` mask.
    norm = math.log(math.exp(3) + 2 * math.exp(1))
    np.testing.assert_allclose(out[:3], [3 - norm, 1 - norm, 1 - norm], rtol=1e-6)
    assert out[3] == -math.inf


def test_top_p_drops_the_tail_and_keeps_the_top_token():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    logits = torch.from_numpy(np.log(probs)[None]).float()
    out = processed_logprobs(
        logits, SamplingTransform(temperature=1.0, top_k=0, top_p=0.8)
    ).numpy()[0]
    # ascending cumulative: 0.05, 0.20, 0.50, 1.0; dropped where <= 0.2 -> tokens 3 and 2
    np.testing.assert_allclose(out[:2], np.log(probs[:2] / 0.8), rtol=1e-5)
    assert np.all(np.isneginf(out[2:]))
    tiny = processed_logprobs(
        logits, SamplingTransform(temperature=1.0, top_k=0, top_p=1e-6)
    ).numpy()[0]
    np.testing.assert_allclose(tiny[0], 0.0, atol=1e-6)
    assert np.all(np.isneginf(tiny[1:]))


def test_temperature_then_top_k_then_top_p():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
    out = processed_logprobs(
        logits, SamplingTransform(temperature=0.5, top_k=3, top_p=0.9)
    ).numpy()[0]
    z = np.array([4.0, 2.0, 1.0])  # after T, top-3
    p = (
        np.exp(z) / np.exp(z).sum()
    )  # [0.844, 0.114, 0.042]: ascending cumsum 0.042 <= 0.1 -> drop token 2
    kept = np.log(p[:2] / p[:2].sum())
    np.testing.assert_allclose(out[:2], kept, rtol=1e-5)
    assert np.all(np.isneginf(out[2:]))


def test_ranges_and_packing():
    assert token_ranges(np.array([5, 0, 2]), np.array([2, 0, 3])).tolist() == [5, 6, 2, 3, 4]
    batches = _pack(np.array([2, 0, 1]), np.array([3, 4, 10]), batch_tokens=12)
    assert [b.tolist() for b in batches] == [[2], [0, 1]]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(cfg)
    path = tmp_path_factory.mktemp("tiny")
    model.save_pretrained(path)
    return path, model


def test_batched_scoring_equals_one_sequence_at_a_time(tiny_model):
    path, model = tiny_model
    seqs = [[1, 5, 7, 9, 2], [1, 3], [1, 4, 4, 4, 4, 4, 8], [1, 2, 3]]
    starts = [2, 1, 3, 1]
    transform = SamplingTransform(temperature=0.7, top_k=10, top_p=0.95)
    ref = ReferenceModel(str(path), "float32", lm_head_fp32=False, device="cpu")
    scored = ref.score(seqs, starts, transform, batch_tokens=256)  # small budget: several batches
    expected_raw, expected_proc = [], []
    with torch.no_grad():
        for seq, start in zip(seqs, starts, strict=True):
            logits = model(torch.tensor([seq])).logits[0].float()
            lp = torch.log_softmax(logits, -1)
            pp = processed_logprobs(logits, transform)
            for t in range(start, len(seq)):
                expected_raw.append(lp[t - 1, seq[t]].item())
                expected_proc.append(pp[t - 1, seq[t]].item())
    np.testing.assert_allclose(scored.raw, expected_raw, atol=1e-5)
    np.testing.assert_allclose(scored.processed, expected_proc, atol=1e-5)
    # A bf16 projection must differ from fp32, but only slightly.
    gap = np.abs(scored.raw_bf16_head - scored.raw)
    assert 0 < gap.max() < 0.1


def _vllm_penalties(
    logits: torch.Tensor, prompt: list[int], before: list[int], t: SamplingTransform
) -> torch.Tensor:
    """vLLM's apply_penalties for one row, written out token by token (vllm/model_executor/layers/utils.py)."""
    out = logits.clone()
    for token in set(prompt) | set(before):
        p = t.penalties.repetition
        out[token] = out[token] / p if out[token] > 0 else out[token] * p
    for token in set(before):
        out[token] -= t.penalties.frequency * before.count(token) + t.penalties.presence
    return out


@pytest.mark.parametrize("rows_per_block", [3, 512])  # 3: blocks split sequences mid-completion
@pytest.mark.parametrize(
    "transform",
    [
        SamplingTransform(
            0.7, 10, 0.95, penalties=Penalties(repetition=1.3, presence=0.4, frequency=0.25)
        ),
        SamplingTransform(1.0, 0, 0.9, penalties=Penalties(repetition=0.8)),  # < 1 rewards repeats
        SamplingTransform(
            0.7, 0, 1.0, penalties=Penalties(frequency=-0.5)
        ),  # no truncation: tempered == processed
    ],
)
def test_penalties_shape_the_processed_logprob_as_vllms_sampler_does(tiny_model, transform, rows_per_block,
                                                                      monkeypatch):  # fmt: skip
    """Issue 26, class 7: the reference applies repetition, presence and frequency penalties to the
    logits before temperature and top-k/top-p, counting each position's own earlier output tokens;
    the raw logprob stays before them, as vLLM's raw_logprobs are."""
    import gate.worker.reference as reference

    monkeypatch.setitem(reference.HEAD_CHUNK_ROWS, "cpu", rows_per_block)
    path, model = tiny_model
    seqs = [[1, 5, 7, 5, 5, 9, 7, 2], [1, 4, 4, 8, 4, 4], [3, 3, 3, 6]]
    starts = [3, 2, 1]
    scored = ReferenceModel(str(path), "float32", lm_head_fp32=False, device="cpu").score(
        seqs, starts, transform, batch_tokens=256
    )
    raw, processed, tempered = [], [], []
    with torch.no_grad():
        for seq, start in zip(seqs, starts, strict=True):
            logits = model(torch.tensor([seq])).logits[0].float()
            for t in range(start, len(seq)):
                shaped = _vllm_penalties(logits[t - 1], seq[:start], seq[start:t], transform)
                raw.append(torch.log_softmax(logits[t - 1], -1)[seq[t]].item())
                processed.append(processed_logprobs(shaped[None], transform)[0, seq[t]].item())
                tempered.append(
                    torch.log_softmax(shaped / transform.temperature, -1)[seq[t]].item()
                )
    np.testing.assert_allclose(scored.raw, raw, atol=1e-5)
    np.testing.assert_allclose(scored.processed, processed, atol=1e-5)
    np.testing.assert_allclose(scored.tempered, tempered, atol=1e-5)
    assert (
        np.abs(scored.tempered - _unpenalised(path, seqs, starts, transform)).max() > 0.01
    )  # they move it


def _unpenalised(path, seqs, starts, transform: SamplingTransform) -> np.ndarray:
    plain = SamplingTransform(transform.temperature, transform.top_k, transform.top_p)
    return (
        ReferenceModel(str(path), "float32", lm_head_fp32=False, device="cpu")
        .score(seqs, starts, plain, 256)
        .tempered
    )


@pytest.mark.parametrize(
    "transform",
    [
        SamplingTransform(temperature=0.7, top_k=10, top_p=0.95),  # the tempered log_softmax itself
        SamplingTransform(temperature=1.0, top_k=0, top_p=0.8),  # T = 1: the raw logprob
        SamplingTransform(temperature=0.7, top_k=0, top_p=1.0),  # no truncation: the processed one
    ],
)
def test_the_tempered_logprob_is_log_softmax_over_the_whole_vocabulary(tiny_model, transform):
    """What a trainer that does not renormalise computes (support mismatch, issue 26 class 1); minus
    the processed logprob, the log of the probability the transform kept."""
    path, model = tiny_model
    seqs, starts = [[1, 5, 7, 9, 2], [1, 4, 4, 4, 8]], [1, 2]
    scored = ReferenceModel(str(path), "float32", lm_head_fp32=False, device="cpu").score(
        seqs, starts, transform, batch_tokens=256
    )
    expected, kept_mass = [], []
    with torch.no_grad():
        for seq, start in zip(seqs, starts, strict=True):
            logits = model(torch.tensor([seq])).logits[0].float()
            scaled = logits / (transform.temperature or 1.0)
            full = torch.log_softmax(scaled, -1)
            keep = torch.isfinite(processed_logprobs(logits, transform))
            for t in range(start, len(seq)):
                expected.append(full[t - 1, seq[t]].item())
                kept_mass.append(full[t - 1][keep[t - 1]].exp().sum().item())
    assert scored.tempered is not None
    np.testing.assert_allclose(scored.tempered, expected, atol=1e-5)
    kept = np.isfinite(scored.processed)
    np.testing.assert_allclose(
        np.exp(scored.tempered - scored.processed)[kept], np.asarray(kept_mass)[kept], rtol=1e-5
    )


def test_bf16_trunk_with_fp32_head(tiny_model):
    path, _ = tiny_model
    fp32 = ReferenceModel(str(path), "float32", lm_head_fp32=False, device="cpu")
    mixed = ReferenceModel(str(path), "bfloat16", lm_head_fp32=True, device="cpu")
    assert mixed.head_dtype == torch.float32
    assert (
        ReferenceModel(str(path), "bfloat16", lm_head_fp32=False, device="cpu").head_dtype
        == torch.bfloat16
    )
    seqs, starts = [[1, 5, 7, 9, 2]], [1]
    t = SamplingTransform(1.0, 0, 1.0)
    a, b = fp32.score(seqs, starts, t, 256).raw, mixed.score(seqs, starts, t, 256).raw
    assert 0 < np.abs(a - b).max() < 0.2  # the bf16 trunk moves logprobs a little


def test_the_reference_scores_with_full_fp32_matmuls_whatever_the_process_set():
    # vLLM sets the process-wide precision from VLLM_FLOAT32_MATMUL_PRECISION; "high" means TF32 on GPUs.
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        before = matmul_precision.recorded()
        with full_fp32_matmul():
            inside = matmul_precision.recorded()
            if "fp32_matmul_precision" in inside:  # torch 2.9+: the per-backend settings rule
                assert inside["fp32_matmul_precision"] == {"cuda": "ieee", "mkldnn": "ieee"}
            else:
                assert inside["float32_matmul_precision"] == "highest"
        assert matmul_precision.recorded() == before  # restored for the engine
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(previous)


def _per_backend_api() -> None:
    if not hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        pytest.skip(f"torch {torch.__version__} has no per-backend fp32_precision (added in 2.9)")


def test_a_tf32_set_through_torchs_per_backend_api_neither_breaks_the_reference_nor_survives_it(
    tiny_model,
):
    """A trainer or a stack's hook in the worker's process that turns TF32 (or oneDNN's bf16) on the
    way torch's notes now recommend leaves the process-wide getter raising ("mix of the legacy and
    new APIs"): the reference scores at full fp32 all the same, engine.json records the settings,
    and the process gets its own settings back."""
    _per_backend_api()
    path, _ = tiny_model
    reference = ReferenceModel(str(path), "float32", lm_head_fp32=False, device="cpu")
    seqs, starts, t = [[1, 5, 7, 9, 2]], [1], SamplingTransform(1.0, 0, 1.0)
    expected = reference.score(seqs, starts, t, 256).raw
    previous = {
        name: getattr(torch.backends, name).matmul.fp32_precision for name in ("cuda", "mkldnn")
    }
    try:
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        torch.backends.mkldnn.matmul.fp32_precision = "bf16"
        with pytest.raises(RuntimeError, match="mix of the legacy and new APIs"):
            torch.get_float32_matmul_precision()
        np.testing.assert_array_equal(reference.score(seqs, starts, t, 256).raw, expected)
        assert matmul_precision.recorded() == {
            "float32_matmul_precision": None,
            "fp32_matmul_precision": {"cuda": "tf32", "mkldnn": "bf16"},
        }
    finally:
        for name, value in previous.items():
            getattr(torch.backends, name).matmul.fp32_precision = value


def test_top_k_is_decided_on_logits_rounded_as_the_engine_holds_them():
    # Tokens 0 and 1 differ in fp32 but are one bf16 value: a bf16 engine sees a tie at k = 1.
    logits = torch.tensor([[3.0, 3.001, 1.0, -2.0]])
    fp32 = SamplingTransform(temperature=0.7, top_k=1, top_p=1.0)
    bf16 = SamplingTransform(temperature=0.7, top_k=1, top_p=1.0, mask_dtype="bfloat16")
    assert torch.isfinite(processed_logprobs(logits, fp32)).tolist() == [
        [False, True, False, False]
    ]
    assert torch.isfinite(processed_logprobs(logits, bf16)).tolist() == [[True, True, False, False]]


def test_a_token_one_ulp_from_the_boundary_is_undecidable_and_one_further_is_outside():
    # bf16 around 3.0 is 2^-6 apart: 3.0 - 2^-6 is one ULP below the kept 3.0, 3.0 - 2^-5 two.
    step = 2.0**-6
    logits = torch.tensor([[3.0, 3.0 - step, 3.0 - 2 * step, -2.0]] * 4)
    bf16 = SamplingTransform(temperature=0.7, top_k=1, top_p=1.0, mask_dtype="bfloat16")
    targets = torch.tensor([[0], [1], [2], [3]])
    assert at_boundary(logits, bf16, targets).tolist() == [True, True, False, False]
    fp32 = SamplingTransform(
        temperature=0.7, top_k=1, top_p=1.0
    )  # fp32 ULPs: only the kept token itself
    assert at_boundary(logits, fp32, targets).tolist() == [True, False, False, False]
    untransformed = SamplingTransform(temperature=0.7, top_k=0, top_p=1.0, mask_dtype="bfloat16")
    assert at_boundary(logits, untransformed, targets).tolist() == [False] * 4


def test_top_p_boundary_ties_are_undecidable():
    # Two tokens tied at the nucleus edge (p 0.212 each): the cumulative rule cuts between them, so
    # which one stays is the sort's choice, and a GPU kernel's bisection may choose otherwise.
    logits = torch.tensor([[2.0, 1.0, 1.0, -5.0]] * 2)
    t = SamplingTransform(temperature=1.0, top_k=0, top_p=0.6, mask_dtype="bfloat16")
    kept = torch.isfinite(processed_logprobs(logits, t))[0].tolist()
    assert kept == [True, False, True, False]
    assert at_boundary(logits, t, torch.tensor([[1], [3]])).tolist() == [
        True,
        False,
    ]  # tied: undecidable; far: outside


def _top_p_by_full_sort(scaled: torch.Tensor, top_p: float) -> torch.Tensor:
    """vLLM's rule written out: ascending sort of the whole row, cumsum, cut <= 1 - p, keep the top."""
    sorted_keys, order = scaled.sort(dim=-1, descending=False)
    cut = sorted_keys.softmax(dim=-1).cumsum(dim=-1) <= 1.0 - top_p
    cut[:, -1] = False
    return torch.empty_like(cut).scatter_(-1, order, ~cut)


@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.99])
def test_top_p_over_the_largest_candidates_keeps_what_the_whole_sort_keeps(top_p):
    """A 49k vocabulary, rows from peaked to flat: the rows whose nucleus fits the candidates and
    the rows that fall back to a whole sort both keep exactly the tokens the whole sort keeps."""
    gen = torch.Generator().manual_seed(0)
    scale = torch.logspace(-1, 1.2, 96).unsqueeze(-1)  # logit spread per row: flat ... peaked
    scaled = torch.randn(96, 49_152, generator=gen) * scale
    ours, whole = top_p_keep(scaled, top_p), _top_p_by_full_sort(scaled, top_p)
    kept = whole.sum(-1)
    assert kept.min() == 1 and kept.max() > 512  # both paths ran
    assert torch.equal(ours, whole)


@pytest.mark.parametrize("mask_dtype", [None, "bfloat16"])
@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.99])
def test_transform_scores_over_the_candidates_equal_the_whole_vocabulary(top_p, mask_dtype):
    """Processed logprob, boundary flag and gap, mass above: the candidate path against the
    whole-vocabulary one, on rows from peaked to flat (nuclei within and past the candidates) and
    targets from the top token to ones less likely than every candidate."""
    gen = torch.Generator().manual_seed(1)
    scale = torch.logspace(-1, 1.2, 96).unsqueeze(-1)
    logits = torch.randn(96, 49_152, generator=gen) * scale
    ranked = logits.argsort(dim=-1, descending=True)
    position = torch.tensor([0, 1, 3, 20, 200, 511, 600, 40_000] * 12).unsqueeze(-1)
    targets = ranked.gather(-1, position)
    transform = SamplingTransform(temperature=0.8, top_k=0, top_p=top_p, mask_dtype=mask_dtype)
    fast = transform_scores(logits, transform, targets)
    whole = _whole_vocabulary_scores(logits, transform, targets)
    names = ("processed", "at_boundary", "boundary_gap", "mass_above")
    for name, a, b in zip(names, fast, whole, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, equal_nan=True, msg=name)
    assert (
        torch.isinf(fast[0]).any() and torch.isfinite(fast[0]).any()
    )  # outside and inside both ran


def test_top_p_candidates_with_top_k_masked_tokens_and_ties():
    # top-k leaves -inf behind (probability 0): they are in the tail and never kept
    scaled = torch.tensor([[3.0, 1.0, 1.0, -math.inf, 0.5] + [-math.inf] * 600])
    assert (
        top_p_keep(scaled, 0.8)[0, :5].tolist() == _top_p_by_full_sort(scaled, 0.8)[0, :5].tolist()
    )
    assert top_p_keep(scaled, 0.8)[0, 5:].any().item() is False


# A sharded reference (reference.device_map through accelerate). On a CPU-only machine every
# placement resolves to "cpu": these tests hold the loading path, the placement record and the
# scores to the one-device reference; the device hops themselves run only where there are GPUs.
SHARDED_SEQS, SHARDED_STARTS = [[1, 5, 7, 9, 2], [1, 3], [1, 4, 4, 4, 8]], [1, 1, 2]
EXPLICIT_MAP = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "cpu",
                "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}  # fmt: skip


def _scores(ref):
    t = SamplingTransform(temperature=0.7, top_k=10, top_p=0.95, mask_dtype="bfloat16")
    scored = ref.score(SHARDED_SEQS, SHARDED_STARTS, t, batch_tokens=256)
    return np.stack([scored.raw, scored.processed, scored.raw_bf16_head])


@pytest.mark.parametrize(
    "dtype,lm_head_fp32", [("float32", False), ("bfloat16", True), ("bfloat16", False)]
)
@pytest.mark.parametrize("device_map", ["auto", EXPLICIT_MAP], ids=["auto", "explicit"])
def test_a_spread_reference_scores_as_the_one_device_reference(
    tiny_model, dtype, lm_head_fp32, device_map
):
    pytest.importorskip("accelerate")
    path, _ = tiny_model
    whole = ReferenceModel(str(path), dtype, lm_head_fp32, device="cpu")
    spread = ReferenceModel(str(path), dtype, lm_head_fp32, device="cpu", device_map=device_map,
                            max_memory={"cpu": "1GiB"})  # fmt: skip
    np.testing.assert_array_equal(_scores(spread), _scores(whole))
    record = spread.placement_record()
    assert record["device_map"] == device_map and record["max_memory"] == {"cpu": "1GiB"}
    assert set(record["modules"].values()) == {"cpu"}
    # An fp32 projection on a bf16 trunk is read from the (fp32) checkpoint, not upcast from bf16.
    expected_source = "checkpoint (float32)" if lm_head_fp32 else f"{dtype} load"
    assert record["head_source"] == expected_source
    assert record["bytes_per_device"] == whole.bytes_per_device()


def test_the_one_device_reference_records_its_placement(tiny_model):
    path, model = tiny_model
    ref = ReferenceModel(str(path), "bfloat16", lm_head_fp32=True, device="cpu")
    record = ref.placement_record()
    assert record["modules"] is None and record["device_map"] is None
    assert record["head_dtype"] == "float32" and record["head_device"] == "cpu"
    trunk = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("lm_head"))
    head = model.lm_head.weight.numel()
    # the bf16 trunk, its buffers (rotary frequencies, cast as the trunk is) and the fp32 projection
    buffers = sum(b.numel() * b.element_size() for b in ref.trunk.buffers())
    assert {b.dtype for b in ref.trunk.buffers()} == {torch.bfloat16}
    assert record["bytes_per_device"] == {"cpu": trunk * 2 + buffers + head * 4}


def test_a_spread_reference_without_accelerate_names_the_fix(tiny_model, monkeypatch):
    import sys

    path, _ = tiny_model
    monkeypatch.setitem(sys.modules, "accelerate", None)  # import accelerate raises ImportError
    with pytest.raises(
        RuntimeError, match=r"reference.device_map needs accelerate.*pip_args: \[accelerate\]"
    ):
        ReferenceModel(str(path), "float32", False, device="cpu", device_map="auto")


def test_mass_above_is_the_probability_of_the_more_likely_tokens_after_temperature_and_top_k():
    from gate.worker.reference import _mass_above

    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]] * 3)
    targets = torch.tensor([[0], [2], [3]])
    p = torch.softmax(logits[0] / 0.5, dim=-1)
    mass = _mass_above(logits, SamplingTransform(temperature=0.5, top_k=0, top_p=0.9), targets)
    torch.testing.assert_close(mass, torch.stack([torch.tensor(0.0), p[:2].sum(), p[:3].sum()]))
    topk = _mass_above(logits, SamplingTransform(temperature=0.5, top_k=2, top_p=0.9), targets)
    torch.testing.assert_close(topk, torch.tensor([0.0, 1.0, 1.0]))  # cut by top-k: all mass above
    off = _mass_above(logits, SamplingTransform(temperature=0.5, top_k=0, top_p=1.0), targets)
    assert torch.isnan(off).all()


def test_the_memory_plan_sizes_the_head_blocks_the_reference_scores():
    from gate.memory_plan import REFERENCE_HEAD_CHUNK_ROWS
    from gate.worker.reference import HEAD_CHUNK_ROWS

    assert REFERENCE_HEAD_CHUNK_ROWS == HEAD_CHUNK_ROWS
