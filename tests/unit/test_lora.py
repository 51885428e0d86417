"""LoRA mode: the adapter as PEFT applies it, the config that turns it on, and how the weight-sync
check reads the LoRA probe (gate/worker/lora.py, gate/worker/lora_sync.py, gate/checks/weight_sync.py)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from gate.checks.context import Context
from gate.config import load_config
from gate.config.checks_section import parse_settings
from gate.contract import keys
from gate.contract.request import LoraRequest
from gate.errors import ConfigError
from gate.judge import run_checks
from gate.verdict import Status
from gate.worker import layout

from ..factory import RUN, make_evidence

torch = pytest.importorskip("torch")
lora = pytest.importorskip("gate.worker.lora")

TARGETS = ["q_proj", "v_proj"]


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj = torch.nn.Linear(6, 4, bias=False)
        self.v_proj = torch.nn.Linear(6, 5, bias=False)
        self.norm = torch.nn.LayerNorm(6)


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList([_Block(), _Block()])


def _request(**kw) -> LoraRequest:
    return LoraRequest(**{"rank": 2, "alpha": 8.0, "target_modules": TARGETS, **kw})


# -- the adapter ------------------------------------------------------------------------------------


@pytest.mark.parametrize("use_rslora", [False, True])
def test_the_merged_weight_computes_what_peft_computes_unmerged(use_rslora):
    """PEFT's LoRA forward: x W^T + scaling (x A^T) B^T, scaling alpha/r or alpha/sqrt(r)."""
    model, req = _Model(), _request(use_rslora=use_rslora)
    tensors = lora.adapter_tensors(model, req, version=1, size=0.2, seed=0)
    base = model.state_dict()
    merged = lora.merged(base, tensors, req.scaling)
    x = torch.randn(3, 6, dtype=torch.float64)
    for i in range(2):
        for name in TARGETS:
            w = model.state_dict()[f"layers.{i}.{name}.weight"].double()
            a = tensors[f"base_model.model.layers.{i}.{name}.lora_A.weight"].double()
            b = tensors[f"base_model.model.layers.{i}.{name}.lora_B.weight"].double()
            scaling = 8.0 / (2**0.5 if use_rslora else 2)
            unmerged = x @ w.T + scaling * (x @ a.T) @ b.T
            got = x @ merged[f"layers.{i}.{name}.weight"].double().T
            assert torch.allclose(got, unmerged, atol=1e-6)
    assert merged["layers.0.norm.weight"] is base["layers.0.norm.weight"]  # shared, not copied


def test_scaling_follows_peft():
    assert _request().scaling == 4.0
    assert _request(use_rslora=True).scaling == pytest.approx(8.0 / 2**0.5)


def test_adapter_versions_are_seeded_sized_and_named_as_peft_saves_them():
    model, req = _Model(), _request()
    one = lora.adapter_tensors(model, req, 1, 0.2, seed=0)
    assert sorted(one) == sorted(
        f"base_model.model.layers.{i}.{m}.lora_{ab}.weight"
        for i in range(2)
        for m in TARGETS
        for ab in "AB"
    )
    assert one["base_model.model.layers.0.q_proj.lora_A.weight"].shape == (2, 6)
    assert one["base_model.model.layers.0.q_proj.lora_B.weight"].shape == (4, 2)
    again = lora.adapter_tensors(model, req, 1, 0.2, seed=0)
    two = lora.adapter_tensors(model, req, 2, 0.2, seed=0)
    assert all(torch.equal(one[k], again[k]) for k in one)
    assert not any(torch.equal(one[k], two[k]) for k in one)
    # the merged change is ~size x the weight's std (B @ A over 200 draws, so loosely)
    big = torch.nn.Linear(256, 256, bias=False)
    model.layers[0].q_proj = big
    tensors = lora.adapter_tensors(model, _request(rank=8), 1, 0.2, seed=3)
    delta = _request(rank=8).scaling * (
        tensors["base_model.model.layers.0.q_proj.lora_B.weight"]
        @ tensors["base_model.model.layers.0.q_proj.lora_A.weight"]
    )
    assert float(delta.std() / big.weight.detach().std()) == pytest.approx(0.2, rel=0.15)


def test_all_linear_is_every_linear_module_but_the_head_as_peft_expands_it():
    model = _Model()
    model.lm_head = torch.nn.Linear(6, 9, bias=False)
    model.get_output_embeddings = lambda: model.lm_head  # type: ignore[method-assign]
    paths = lora.target_module_paths(model, ["all-linear"])
    assert paths == [f"layers.{i}.{m}" for i in range(2) for m in ("q_proj", "v_proj")]
    tensors = lora.adapter_tensors(model, _request(target_modules=["all-linear"]), 1, 0.2, 0)
    assert lora.module_names(tensors) == ["q_proj", "v_proj"]


def test_a_target_module_the_model_lacks_is_named():
    with pytest.raises(
        ValueError, match=r"lora.target_modules: \['gate_proj'\] match no linear module"
    ):
        lora.target_module_paths(_Model(), ["q_proj", "gate_proj"])


def test_the_adapter_folder_is_what_vllm_reads(tmp_path):
    from safetensors.torch import load_file

    model, req = _Model(), _request(use_rslora=True)
    tensors = lora.adapter_tensors(model, req, 1, 0.2, 0)
    folder = tmp_path / "policy"
    lora.write_adapter(folder, tensors, req, "/models/base")
    config = json.loads((folder / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"], config["use_rslora"]) == (
        "LORA",
        2,
        8.0,
        True,
    )
    assert (
        config["target_modules"] == TARGETS and config["base_model_name_or_path"] == "/models/base"
    )
    assert set(load_file(str(folder / "adapter_model.safetensors"))) == set(tensors)
    (folder / "stale.bin").write_text("x")
    lora.write_adapter(folder, tensors, req, "/models/base")  # a version replaces the folder whole
    assert not (folder / "stale.bin").exists()


def test_each_naming_writes_where_the_stacks_do(tmp_path):
    assert lora.version_folder(tmp_path, _request(), 2) == tmp_path / "v2"
    assert lora.version_folder(tmp_path, _request(naming="same-id"), 2) == tmp_path / "policy"
    assert lora.version_folder(tmp_path, _request(naming="in-place"), 2) == tmp_path / "policy"


def test_alternatives_are_the_other_scaling_and_each_module_left_out():
    names = [a.name for a in lora.alternatives(_request(), TARGETS)]
    assert names == ["scaling alpha/sqrt(r) (rsLoRA)", "q_proj not applied", "v_proj not applied"]
    rs = lora.alternatives(_request(use_rslora=True), TARGETS)
    assert rs[0].name == "scaling alpha/r (rsLoRA ignored)" and rs[0].scaling == 4.0
    assert rs[1].skip == frozenset({"q_proj"})


# -- the config -------------------------------------------------------------------------------------

OFF = "grpo: {enabled: false}\nweight_sync: {inflight: {enabled: false}}\n"


def test_lora_mode_adds_what_serving_an_adapter_needs(minimal_config):
    cfg = load_config(minimal_config(OFF + "lora: {enabled: true, rank: 12, alpha: 24}\n"))
    assert cfg.lora.engine_args({"dtype": "float32"}) == {
        "enable_lora": True,
        "max_lora_rank": 16,  # the smallest rank vLLM accepts that holds 12
        "dtype": "float32",
    }
    assert cfg.lora.engine_args({"max_lora_rank": 64})["max_lora_rank"] == 64  # the user's stands
    off = load_config(minimal_config())
    assert off.lora.engine_args({"dtype": "float32"}) == {"dtype": "float32"}


def test_the_worker_request_carries_lora_mode(minimal_config, tmp_path):
    from gate.worker_request import build_request

    cfg = load_config(minimal_config(OFF + "lora: {enabled: true, use_rslora: true}\n"))
    request = build_request(cfg, cfg.engines["new"], [], tmp_path)
    assert request.lora == LoraRequest(
        rank=8, alpha=16.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], use_rslora=True
    )
    assert request.engine_args["enable_lora"] is True
    assert (
        build_request(load_config(minimal_config()), cfg.engines["new"], [], tmp_path).lora is None
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("lora: {enabled: true}\nweight_sync: {inflight: {enabled: false}}\n", "grpo.enabled: set it to false with lora.enabled"),
        ("lora: {enabled: true}\ngrpo: {enabled: false}\n", "weight_sync.inflight.enabled: set it to false"),
        ("lora: {enabled: true}\ngrpo: {enabled: false}\nweight_sync: {enabled: false}\n", "weight_sync.enabled: lora.enabled drives"),
        (OFF + "lora: {enabled: true, naming: per-step}\n", "lora.naming: must be one of"),
        (OFF + "lora: {enabled: true, rank: 0}\n", "lora.rank: must be >= 1"),
        (OFF + "lora: {enabled: true, target_modules: []}\n", "lora.target_modules: needs at least one"),
        (OFF + "lora: {enabled: true, hook: missing.py:fn}\n", "lora.hook: file"),
        (OFF + "mode: server\nlora: {enabled: true}\n", "engines.old.mode: lora.enabled runs offline only"),
        (OFF + "weight_update: {hook: mod:fn}\nlora: {enabled: true}\n", "weight_update.hook: lora.enabled pushes adapter versions"),
    ],
)  # fmt: skip
def test_lora_mode_refuses_what_it_cannot_run_by_name(minimal_config, extra, message):
    with pytest.raises(ConfigError, match=re_escape(message)):
        load_config(minimal_config(extra))


def re_escape(text: str) -> str:
    import re

    return re.escape(text)


def test_the_cpu_lora_engine_scores_one_sequence_per_call():
    [setting] = layout.prompt_logprobs_per_call({"enable_lora": True}, on_cpu=True)
    assert (setting.name, setting.kind) == (layout.PROMPT_LOGPROBS_PER_CALL, "driving")
    assert "per request, not per prompt row" in setting.reason
    assert layout.prompt_logprobs_per_call({"enable_lora": True}, on_cpu=False) == []
    assert layout.prompt_logprobs_per_call({}, on_cpu=True) == []
    # a driving setting is neither an engine argument nor an environment variable
    assert layout.with_engine_args({"a": 1}, [setting]) == {"a": 1}
    assert layout.env_settings([setting]) == []


# -- the weight-sync check on the LoRA probe ----------------------------------------------------------

ALTERNATIVES = ["scaling alpha/sqrt(r) (rsLoRA)", "q_proj not applied", "v_proj not applied"]


def _lora_context(tmp_path, fits: str | None, mode: str = "ok") -> Context:
    """A clean pair whose new engine ran the LoRA probe: the base model 1e-7 from the trainer;
    version 1's tokens as the trainer applies the adapter, or as the alternative ``fits`` does."""
    old = make_evidence(tmp_path / "old", seed=1)
    new = make_evidence(tmp_path / "new", seed=2, weight_sync=mode)
    rng = np.random.default_rng(5)
    a = new.arrays
    t = len(a[keys.WS_BEFORE_TRAINER_LOGPROB])
    trainer_v1 = a[keys.WS_BEFORE_TRAINER_LOGPROB]
    alt = np.stack([trainer_v1 - rng.uniform(0.05, 0.3, t) for _ in ALTERNATIVES], axis=1)
    engine_v1 = trainer_v1 if fits is None else alt[:, ALTERNATIVES.index(fits)]
    base = -rng.uniform(0.1, 2.0, t).astype(np.float32)
    a |= {
        keys.WS_BASE_IS_PREFIX: a[keys.WS_BEFORE_IS_PREFIX],
        keys.WS_BASE_ENGINE_LOGPROB: (base + 1e-7).astype(np.float32),
        keys.WS_BASE_TRAINER_LOGPROB: base,
        keys.WS_BEFORE_ENGINE_LOGPROB: engine_v1.astype(np.float32),
        keys.WS_BEFORE_TRAINER_ALT_LOGPROB: alt.astype(np.float32),
    }
    new.engine.weight_sync.update(
        adapter="LoRA new-id (add_lora per version)",
        digests={},
        lora={"rank": 2, "alpha": 8.0, "alternatives": ALTERNATIVES, "naming": "new-id"},
    )
    return Context(new=new, old=old, run=copy.deepcopy(RUN))


def _weight_sync(ctx):
    return {r.id: r for r in run_checks(ctx, parse_settings({}, "gate.yaml"))}["weight-sync"]


def test_a_lora_probe_whose_adapter_is_applied_as_the_trainer_applies_it_passes(tmp_path):
    r = _weight_sync(_lora_context(tmp_path, fits=None))
    assert r.status == Status.PASS, r
    assert r.details["adapter_vs_trainer"] == pytest.approx(1e-6, abs=1e-6)
    assert r.details["pre_update_mismatch"] == pytest.approx(
        1e-7, rel=0.5
    )  # the base model's (fp32)
    assert r.summary.startswith("adapter version 1: ")
    assert set(r.details["adapter_fits"]) == set(ALTERNATIVES)


@pytest.mark.parametrize(
    ("fits", "cause"),
    [
        ("scaling alpha/sqrt(r) (rsLoRA)", "the engine scales B @ A by another rule"),
        ("v_proj not applied", "does not apply the adapter's v_proj tensors"),
    ],
)
def test_an_adapter_applied_otherwise_is_named_by_what_the_tokens_fit(tmp_path, fits, cause):
    r = _weight_sync(_lora_context(tmp_path, fits=fits))
    assert r.status == Status.FAIL and r.details["verdict"] == "adapter-mismatch"
    assert (
        f"fit the adapter with {fits}" in r.diagnosis or f"without {fits.split()[0]}" in r.diagnosis
    )
    assert cause in r.diagnosis
    assert fits not in r.diagnosis.split("The other fits:")[1]  # the fit is not listed again
    failed = {m.name for m in r.measurements if m.status == Status.FAIL}
    assert "adapter_vs_trainer" in failed


def test_an_adapter_that_fits_no_alternative_says_so(tmp_path):
    ctx = _lora_context(tmp_path, fits=None)
    a = ctx.new.arrays
    a[keys.WS_BEFORE_ENGINE_LOGPROB] = a[keys.WS_BEFORE_TRAINER_LOGPROB] + np.float32(0.5)
    r = _weight_sync(ctx)
    assert r.details["verdict"] == "adapter-mismatch"
    assert "fit none of the usual differences" in r.diagnosis


@pytest.mark.parametrize(
    ("mode", "verdict", "words"),
    [
        ("stale", "stale-weights", "caches adapters by their integer id"),
        ("stale-cache", "stale-cache", "by the adapter's name and path, not by its contents"),
    ],
)
def test_lora_update_faults_are_said_in_the_adapters_terms(tmp_path, mode, verdict, words):
    ctx = _lora_context(tmp_path, fits=None, mode=mode)
    ctx.new.engine.effective["enable_prefix_caching"] = mode == "stale-cache"
    r = _weight_sync(ctx)
    assert r.status == Status.FAIL and r.details["verdict"] == verdict
    assert words in r.diagnosis and "(LoRA mode" in r.diagnosis


def test_alternatives_that_disagree_with_engine_json_are_refused(tmp_path):
    ctx = _lora_context(tmp_path, fits=None)
    ctx.new.engine.weight_sync["lora"]["alternatives"] = ALTERNATIVES[:2]
    r = _weight_sync(ctx)
    assert r.status == Status.ERROR, r
    assert "one column per alternative in engine.json weight_sync.lora (2)" in r.summary


# -- scoring one sequence per call -------------------------------------------------------------------


class _Logprob:
    def __init__(self, value: float) -> None:
        self.logprob = value


class _Output:
    def __init__(self, seq: list[int]) -> None:
        # the logprob of each token is -(its id): the order of the scores shows which sequence it is
        self.prompt_logprobs = [None] + [{t: _Logprob(-float(t))} for t in seq[1:]]


class _CountingLLM:
    """Records the prompts of each generate call and the adapter it was given."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[list[int]], object]] = []

    def generate(self, prompts, params, use_tqdm=False, lora_request=None):
        ids = [p["prompt_token_ids"] for p in prompts]
        self.calls.append((ids, lora_request))
        return [_Output(seq) for seq in ids]


@pytest.fixture
def no_vllm(monkeypatch):
    """SamplingParams as a plain dict: the calls are what is under test, not vLLM's class."""
    from gate.worker import replay

    monkeypatch.setattr(replay, "_params", lambda **kwargs: kwargs)


def test_one_sequence_per_call_scores_each_alone_in_order_through_the_adapter(no_vllm):
    from gate.worker import replay

    llm, adapter = _CountingLLM(), object()
    seqs = [[1, 5, 6], [1, 7], [1, 8, 9, 10]]
    scores = replay.score_sequences(llm, seqs, np.array([2, 0, 1]), True, adapter)
    assert [ids for ids, _ in llm.calls] == [[seqs[2]], [seqs[0]], [seqs[1]]]  # submission order
    assert all(lr is adapter for _, lr in llm.calls)
    assert scores.offsets.tolist() == [0, 2, 3, 6]  # results in the sequences' own order
    assert scores.logprob.tolist() == [-5, -6, -7, -8, -9, -10]
    batched = _CountingLLM()
    replay.score_sequences(batched, seqs)
    assert len(batched.calls) == 1 and batched.calls[0][1] is None  # no adapter: none passed


def test_the_offline_handle_generates_through_the_policy_adapter_and_reports_no_batches(no_vllm):
    from gate.worker.engine_handle import OfflineEngine

    class _Policy:
        current = "version-1"

    llm = _CountingLLM()
    handle = OfflineEngine(llm, one_sequence_per_call=True, policy=_Policy())  # type: ignore[arg-type]
    handle.score_sequences([[1, 5], [1, 6]], None)
    assert [lr for _, lr in llm.calls] == ["version-1", "version-1"]
    assert "one per call" in (handle.batch_invariance_unavailable() or "")
    assert OfflineEngine(llm).batch_invariance_unavailable() is None


def test_the_reference_merges_in_place_what_the_probe_merges_into_a_state_dict():
    """apply_to (the reference's trunk, paths without the full model's first part) and merged
    (the probe's trainer, full paths) give the same weights."""
    model, req = _Model(), _request()
    tensors = lora.adapter_tensors(model, req, 1, 0.2, seed=0)
    # PEFT's names carry the full model's path: "model.layers..." in a causal LM; a trunk drops "model."
    full = {
        k.replace("base_model.model.", "base_model.model.model."): v for k, v in tensors.items()
    }
    expected = lora.merged(model.state_dict(), tensors, req.scaling)
    assert lora.apply_to(model, full, req.scaling) == 4
    for key, value in model.state_dict().items():
        assert torch.equal(value, expected[key]), key
    with pytest.raises(ValueError, match=r"no module model\.layers\.0\.q_proj"):
        lora.apply_to(torch.nn.Linear(2, 2), full, req.scaling)
