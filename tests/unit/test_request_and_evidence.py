import json
from pathlib import Path

import numpy as np
import pytest

from gate.contract import evidence as ev
from gate.contract import keys
from gate.contract.request import PromptItem, ReferenceRequest, SamplingRequest, WorkerRequest


def _request(tmp_path) -> WorkerRequest:
    return WorkerRequest(
        engine_name="new",
        model="/m",
        tokenizer=None,
        engine_args={"dtype": "float32"},
        optional_engine_args=["logprobs_mode"],
        prompts=[
            PromptItem(id="a", prompt="1+1=", reference="2"),
            PromptItem(id="b", messages=[{"role": "user", "content": "hi"}]),
        ],
        sampling=SamplingRequest(
            n=2, temperature=0.7, top_p=0.9, top_k=0, max_tokens=8, seed=1, logprobs=5
        ),
        greedy_max_tokens=8,
        teacher_forced=True,
        reference=ReferenceRequest(dtype="float32", lm_head_fp32=False, batch_tokens=1024),
        output_dir=str(tmp_path),
    )


def test_request_roundtrip(tmp_path):
    req = _request(tmp_path)
    req.write(tmp_path / "r.json")
    assert WorkerRequest.read(tmp_path / "r.json") == req


def test_stale_worker_schema_is_refused(tmp_path):
    raw = json.loads(_request(tmp_path).to_json())
    raw["schema_version"] = 999
    with pytest.raises(ValueError, match="schema_version"):
        WorkerRequest.from_json(json.dumps(raw))


def _write_evidence(folder, **overrides):
    arrays = {
        keys.PROMPT_OFFSETS: np.array([0, 2, 5]),
        keys.PROMPT_TOKEN_IDS: np.arange(5, dtype=np.int32),
        "sample_offsets": np.array([0, 3, 4]),
        "sample_token_ids": np.array([1, 2, 3, 4], dtype=np.int32),
        "sample_engine_logprob": np.array([-0.1, -0.2, -0.3, -0.4], dtype=np.float32),
        "sample_trainer_logprob_raw": np.array([-0.1, -0.2, -0.3, -0.4], dtype=np.float32),
        "sample_prompt_index": np.array([0, 1], dtype=np.int32),
        "sample_finish": np.array([0, 1], dtype=np.int8),
    }
    arrays.update(overrides)
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / "evidence.npz", **arrays)
    (folder / "engine.json").write_text("{}")
    (folder / "texts.json").write_text("{}")
    return folder


def test_valid_evidence_loads(tmp_path):
    e = ev.load(_write_evidence(tmp_path / "e"))
    assert e.n_prompts == 2
    assert e.prompt_tokens(1).tolist() == [2, 3, 4]


def test_nan_in_engine_output_is_named(tmp_path):
    folder = _write_evidence(
        tmp_path / "e", sample_engine_logprob=np.array([-0.1, np.nan, -0.3, -np.inf])
    )
    with pytest.raises(ev.EvidenceError, match="sample_engine_logprob: 2 non-finite"):
        ev.load(folder)


def test_misaligned_arrays_are_refused(tmp_path):
    folder = _write_evidence(
        tmp_path / "e", sample_trainer_logprob_raw=np.zeros(3, dtype=np.float32)
    )
    with pytest.raises(ev.EvidenceError, match="sample_trainer_logprob_raw: 3 rows, expected 4"):
        ev.load(folder)
    folder = _write_evidence(tmp_path / "f", sample_offsets=np.array([0, 3, 2]))
    with pytest.raises(ev.EvidenceError, match="not monotone offsets"):
        ev.load(folder)


def test_missing_file(tmp_path):
    folder = _write_evidence(tmp_path / "e")
    (folder / "engine.json").unlink()
    with pytest.raises(ev.EvidenceError, match=r"engine\.json: missing"):
        ev.load(folder)


def test_a_server_mode_request_roundtrips(tmp_path):
    import dataclasses

    from gate.contract.request import ServerRequest

    req = dataclasses.replace(_request(tmp_path), mode="server",
                              server=ServerRequest(request_fields=["temperature"], args=["--x"]))  # fmt: skip
    assert WorkerRequest.from_json(req.to_json()) == req


def test_the_inflight_phase_takes_its_own_perturbation_or_the_idle_probes(tmp_path):
    """examples/smollm2-cpu.yaml keeps the idle probe at 0.05 and moves the in-flight phase to 0.2;
    left null, the phase pushes the idle probe's weights. The request carries the resolved value."""
    import dataclasses

    from gate.config import load_config
    from gate.worker_request import _weight_sync_request

    cfg = load_config(Path(__file__).resolve().parents[2] / "examples" / "smollm2-cpu.yaml")
    ws = _weight_sync_request(cfg, cfg.engines["new"])
    assert ws is not None and ws.perturbation == 0.05 and ws.inflight.perturbation == 0.2
    unset = dataclasses.replace(
        cfg.weight_sync, inflight=dataclasses.replace(cfg.weight_sync.inflight, perturbation=None)
    )
    ws = _weight_sync_request(dataclasses.replace(cfg, weight_sync=unset), cfg.engines["new"])
    assert ws.inflight.perturbation == 0.05
    req = dataclasses.replace(_request(tmp_path), weight_sync=ws)
    assert WorkerRequest.from_json(req.to_json()) == req


def test_the_config_to_request_mapping_is_the_requests_own_field_list():
    """SamplingRequest and ReferenceRequest are filled field by field from the config sections of
    the same names (gate.worker_request.same_fields): every request field exists there, and where
    both sides default a field, the defaults agree. GRPO's trainable default is one constant."""
    import dataclasses

    from gate.config.sections import GrpoConfig, ReferenceConfig, SamplingConfig
    from gate.contract.request import GrpoRequest
    from gate.worker_request import same_fields

    def defaults(cls):
        out = {}
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                out[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                out[f.name] = f.default_factory()
        return out

    for request_type, section in (
        (SamplingRequest, SamplingConfig()),
        (ReferenceRequest, ReferenceConfig()),
    ):
        built = same_fields(request_type, section)
        assert dataclasses.asdict(built) == {
            f.name: getattr(section, f.name) for f in dataclasses.fields(request_type)
        }
        request_defaults, config_defaults = defaults(request_type), defaults(type(section))
        assert {k: v for k, v in request_defaults.items() if k in config_defaults} == {
            k: config_defaults[k] for k in request_defaults if k in config_defaults
        }
    grpo_request, grpo_config = defaults(GrpoRequest), defaults(GrpoConfig)
    for name in ("trainable", "optimizer", "loss"):
        assert grpo_request[name] == grpo_config[name], name


def test_the_grpo_eval_set_is_evenly_spaced_answered_records_and_leaves_enough_to_train():
    import dataclasses

    from gate.config import BUILTIN_CONFIG, load_config
    from gate.errors import ConfigError
    from gate.worker_request import eval_prompts, load_prompts

    cfg = load_config(BUILTIN_CONFIG)
    _, prompts = load_prompts(cfg)
    answered = [i for i, p in enumerate(prompts) if p.answer]
    assert len(answered) == 64  # arith's 64; general's 16 have no answer
    # 32 of 64: every other record, the odd positions (the middle of each pair)
    assert eval_prompts(cfg, prompts) == answered[1::2]
    # held out, 60 of 64 would leave 4 to train on, fewer than a step's 8 prompts
    held = dataclasses.replace(cfg.grpo, eval_prompts=60, eval_held_out=True)
    with pytest.raises(
        ConfigError, match=r"grpo\.eval_prompts: 60 of the 64 records with an answer leave 4"
    ):
        eval_prompts(dataclasses.replace(cfg, grpo=held), prompts)
    # in the pool, all 64 may be evaluated; none without an answer
    pool = dataclasses.replace(cfg.grpo, eval_prompts=64, eval_held_out=False)
    assert eval_prompts(dataclasses.replace(cfg, grpo=pool), prompts) == answered
    assert eval_prompts(cfg, [p for p in prompts if not p.answer]) == []
