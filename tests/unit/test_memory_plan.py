"""The memory plan: every formula against hand-computed figures, the refusal, the table, run.json,
report.json and the rendered section. No engine starts."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from gate import memory_plan as mp
from gate.cli import main as gate_main
from gate.config import load_config
from gate.config.sections import BUILTIN_CONFIG
from gate.errors import EXIT_USAGE, ConfigError
from gate.memory_plan import Device, GiB, ModelShape, PlanSettings
from gate.render.markdown import render_full
from gate.report_model import Report
from gate.worker_request import load_prompts

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "gate" / "assets" / "models" / "tiny-arith"
EXAMPLES = REPO / "docs" / "examples"

# meta-llama/Meta-Llama-3-8B's config.json, the fields the plan reads.
LLAMA3_8B = {
    "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}  # fmt: skip
LLAMA3_8B_PARAMS = 8_030_261_248  # the published count
H100 = Device("cuda:0", 80 * GiB, 79 * GiB)


@pytest.fixture
def llama8b(tmp_path: Path) -> ModelShape:
    folder = tmp_path / "llama3-8b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA3_8B))
    shape = mp.read_model_shape(str(folder))
    assert shape is not None
    return shape


# -- the model ------------------------------------------------------------------------------------
def test_tiny_model_parameters_from_its_safetensors_header_and_from_the_formula() -> None:
    # embed 128x128; per layer q,k,v,o 4 x 128x128, mlp 3 x 128x512, 2 norms of 128; norm; lm_head
    by_hand = 128 * 128 + 2 * (4 * 128 * 128 + 3 * 128 * 512 + 2 * 128) + 128 + 128 * 128
    assert by_hand == 557_696
    assert mp.safetensors_parameters(TINY) == by_hand
    assert mp.config_parameters(json.loads((TINY / "config.json").read_text())) == by_hand
    shape = mp.read_model_shape(str(TINY))
    assert shape is not None and shape.source == "safetensors header"
    assert shape.parameters == by_hand and shape.dtype == "float32"


def test_safetensors_header_is_read_without_torch(tmp_path: Path) -> None:
    save_file(
        {"a": np.zeros((3, 5), np.float32), "b": np.zeros(7, np.float16)},
        str(tmp_path / "x.safetensors"),
    )
    header = mp.read_safetensors_header(tmp_path / "x.safetensors")
    assert header["a"]["shape"] == [3, 5] and header["b"]["dtype"] == "F16"
    assert mp.safetensors_parameters(tmp_path) == 22


def test_llama3_8b_from_config_json(llama8b: ModelShape) -> None:
    assert llama8b.source == "config.json"
    assert llama8b.parameters == LLAMA3_8B_PARAMS
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    assert llama8b.layer_parameters == layer == 218_112_000
    assert llama8b.head_parameters == 128256 * 4096
    assert round(llama8b.parameters * 2 / 1e9, 2) == 16.06  # bf16 weights: 16.06 GB


def test_tied_embeddings_and_qwen2_biases() -> None:
    qwen = {"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
            "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
            "tie_word_embeddings": True}  # fmt: skip
    # Qwen2.5-0.5B: 494,032,768 parameters (tied head counted once, q/k/v biases)
    assert mp.config_parameters(qwen) == 494_032_768


def test_trainable_subsets(llama8b: ModelShape) -> None:
    assert mp.trainable_parameters(llama8b, "all") == LLAMA3_8B_PARAMS
    assert mp.trainable_parameters(llama8b, "lm_head") == 128256 * 4096
    assert mp.trainable_parameters(llama8b, "norms") == (2 * 32 + 1) * 4096
    assert mp.trainable_parameters(llama8b, {"last_layers": 2}) == 2 * 218_112_000  # 4.4e8


# -- the phases -----------------------------------------------------------------------------------
def gpu_settings(**changes) -> PlanSettings:
    return dataclasses.replace(PlanSettings(engine_dtype="bfloat16", max_num_batched_tokens=8192,
                                            sequence_tokens=512, replay_sequences=64), **changes)  # fmt: skip


def components(plan: mp.EnginePlan, phase: str, device: str) -> dict[str, int]:
    found = next(p for p in plan.phases if p.name == phase)
    return {c.name: c.bytes for c in found.devices[device]}


def test_gpu_engine_takes_its_utilization_share(llama8b: ModelShape) -> None:
    plan = mp.plan_engine(llama8b, gpu_settings(gpu_memory_utilization=0.5), [H100])
    engine = components(plan, "engine", "cuda:0")
    assert engine["engine weights"] == LLAMA3_8B_PARAMS * 2
    assert sum(engine.values()) == int(0.5 * 80 * GiB)  # weights + KV + activations + context
    assert engine["KV cache"] == int(0.5 * 80 * GiB) - sum(
        v for k, v in engine.items() if k != "KV cache"
    )


def test_tensor_parallel_splits_the_weights(llama8b: ModelShape) -> None:
    devices = [Device(f"cuda:{i}", 80 * GiB, 80 * GiB) for i in range(2)]
    plan = mp.plan_engine(llama8b, gpu_settings(tensor_parallel_size=2), devices)
    assert components(plan, "engine", "cuda:1")["engine weights"] == LLAMA3_8B_PARAMS * 2 // 2
    assert "worker CUDA context" in components(plan, "engine", "cuda:0")
    assert "worker CUDA context" not in components(plan, "engine", "cuda:1")
    too_few = mp.plan_engine(llama8b, gpu_settings(tensor_parallel_size=4), devices)
    assert too_few.problems and "tensor_parallel_size 4" in too_few.problems[0]


def test_tensor_parallel_that_does_not_divide_the_heads_is_refused_before_an_engine_starts() -> (
    None
):
    # SmolLM2-135M-Instruct's config.json: 9 attention heads over 3 KV heads
    smollm2 = {"model_type": "llama", "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
               "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
               "tie_word_embeddings": True}  # fmt: skip
    shape = mp._shape_from_config(smollm2)
    devices = [Device(f"cuda:{i}", 80 * GiB, 80 * GiB) for i in range(3)]
    two = mp.plan_engine(shape, gpu_settings(tensor_parallel_size=2), devices)
    assert two.problems == ("engine_args.tensor_parallel_size 2 does not divide the model's 9 attention "
                            "heads (vLLM refuses it)",)  # fmt: skip
    assert not mp.plan_engine(shape, gpu_settings(tensor_parallel_size=3), devices).problems


def test_grpo_keeps_one_model_in_engine_dtype_and_fp32_state_for_what_trains(
    llama8b: ModelShape,
) -> None:
    plan = mp.plan_engine(llama8b, gpu_settings(gpu_memory_utilization=0.3), [H100])
    grpo = components(plan, "grpo", "cuda:0")
    assert grpo["trainer weights"] == 2 * LLAMA3_8B_PARAMS  # bf16, as the engine
    # fp32 master 4 + fp32 gradient 4 + AdamW 8 + the bf16 initial copy 2, per trained parameter
    assert grpo["masters + gradients + optimizer + initial copy"] == 18 * LLAMA3_8B_PARAMS
    sgd = mp.plan_engine(
        llama8b, gpu_settings(grpo_optimizer="sgd", grpo_trainable="lm_head"), [H100]
    )
    head = 128256 * 4096
    assert components(sgd, "grpo", "cuda:0")["masters + gradients + optimizer + initial copy"] == (
        10 * head
    )
    assert "cpu" not in next(p for p in plan.phases if p.name == "grpo").devices


def test_weight_sync_holds_one_device_model_and_the_state_dicts_on_the_host(
    llama8b: ModelShape,
) -> None:
    plan = mp.plan_engine(llama8b, gpu_settings(gpu_memory_utilization=0.3), [H100])
    assert components(plan, "weight_sync", "cuda:0")["weight-sync trainer"] == 2 * LLAMA3_8B_PARAMS
    host = components(plan, "weight_sync", "cpu")
    assert host == {"weight-sync old + new state dicts": 2 * 2 * LLAMA3_8B_PARAMS}
    assert "cpu (host, beside the GPUs): peak" in run_plan(llama8b, plan.settings, [H100]).table()


def test_cpu_float32_rl_phases_hold_what_they_held_before(llama8b: ModelShape) -> None:
    # A float32 engine training every parameter: the trainer is its own master, and the initial
    # copy is the whole model, as the measured CPU plan (+-25% on the mid-size model) assumed.
    s = PlanSettings(engine_dtype="float32", kv_cache_bytes=GiB)
    plan = mp.plan_engine(llama8b, s, [Device("cpu", 512 * GiB, 512 * GiB)])
    p = LLAMA3_8B_PARAMS
    ws = components(plan, "weight_sync", "cpu")
    assert ws["weight-sync trainer"] + ws["weight-sync old + new state dicts"] == 3 * 4 * p
    grpo = components(plan, "grpo", "cpu")
    assert grpo["trainer weights"] + grpo["masters + gradients + optimizer + initial copy"] == (
        2 * 4 * p + 12 * p
    )


def test_reference_keeps_an_fp32_head_and_can_be_spread(llama8b: ModelShape) -> None:
    one = mp.plan_engine(llama8b, gpu_settings(reference_dtype="bfloat16"), [H100])
    ref = components(one, "reference", "cuda:0")
    assert ref["reference trunk"] == (LLAMA3_8B_PARAMS - 128256 * 4096) * 2
    assert ref["reference lm_head (fp32)"] == 128256 * 4096 * 4
    devices = [Device(f"cuda:{i}", 80 * GiB, 80 * GiB) for i in range(4)]
    spread = mp.plan_engine(llama8b, gpu_settings(reference_device_map="balanced"), devices)
    trunks = [components(spread, "reference", d.name)["reference trunk"] for d in devices]
    assert max(trunks) < 0.3 * sum(trunks) and sum(trunks) == (LLAMA3_8B_PARAMS - 128256 * 4096) * 4
    explicit = mp.plan_engine(
        llama8b, gpu_settings(reference_device_map={"model.layers": 1}), devices[:2]
    )
    assert components(explicit, "reference", "cuda:1")["reference trunk"] == 32 * 218_112_000 * 4


def test_cpu_kv_cache_is_per_rank_and_runtime_per_process() -> None:
    shape = mp.read_model_shape(str(TINY))
    assert shape is not None
    host = Device("cpu", 16 * GiB, 12 * GiB)
    one = mp.plan_engine(shape, PlanSettings(engine_dtype="float32", kv_cache_bytes=GiB), [host])
    two = mp.plan_engine(
        shape,
        PlanSettings(engine_dtype="float32", kv_cache_bytes=GiB, tensor_parallel_size=2),
        [host],
    )
    assert components(one, "engine", "cpu")["KV cache"] == GiB
    assert components(two, "engine", "cpu")["KV cache"] == 2 * GiB
    assert components(two, "engine", "cpu")["runtime"] == 3 * mp.CPU_RUNTIME_BYTES
    assert components(two, "grpo", "cpu")["push file in /dev/shm"] == shape.parameters * 4
    auto = mp.plan_engine(
        shape, PlanSettings(engine_dtype="float32", gpu_memory_utilization=0.5), [host]
    )
    assert sum(components(auto, "engine", "cpu").values()) == 8 * GiB  # vLLM's CPU auto size


def test_plan_of_the_builtin_config() -> None:
    cfg = load_config(BUILTIN_CONFIG)
    plan = mp.plan_run(cfg, cfg.engine_order, load_prompts(cfg)[1])
    assert plan.shape is not None and plan.shape.parameters == 557_696
    (group,) = plan.engines  # old and new share every setting
    assert group.engines == ("old", "new") and group.devices[0].name == "cpu"
    assert group.settings.kv_cache_bytes == GiB  # VLLM_CPU_KVCACHE_SPACE: "1"
    assert [p.name for p in group.phases] == ["engine", "weight_sync", "grpo", "reference"]
    data = plan.as_dict()
    assert json.loads(json.dumps(data)) == data and data["parameters"] == 557_696


def test_hub_model_not_cached_is_skipped_not_refused() -> None:
    plan = mp.RunMemoryPlan("org/not-here", None, skipped="org/not-here: no local config.json")
    plan.check("gate.yaml")  # nothing to refuse
    assert "not computed" in plan.table() and plan.as_dict()["skipped"]


# -- refusal and table ----------------------------------------------------------------------------
def run_plan(shape: ModelShape, settings: PlanSettings, devices: list[Device]) -> mp.RunMemoryPlan:
    engine = mp.plan_engine(shape, settings, devices, ("old", "new"))
    return mp.RunMemoryPlan(
        "llama3-8b", shape, (engine,), knobs=tuple(mp.find_knobs(shape, engine))
    )


def test_refusal_names_the_knobs_most_effective_first(llama8b: ModelShape) -> None:
    plan = run_plan(llama8b, gpu_settings(gpu_memory_utilization=0.5), [H100])
    assert not plan.fits()
    with pytest.raises(ConfigError) as err:
        plan.check("gate.yaml")
    message = str(err.value)
    assert message.startswith("gate.yaml: memory plan: the grpo phase needs ")
    assert "\n" not in message and "gate run --no-memory-check skips this check" in message
    knobs = message.split("knobs, most effective first: ")[1]
    # AdamW's two moments: 8 B x 8.03e9 = 59.8 GiB, not enough alone; training lm_head only (or no
    # GRPO) leaves the bf16 trainer beside the engine, which fits.
    assert "grpo.optimizer: sgd saves 59.8 GiB;" in knobs
    assert "grpo.trainable: lm_head saves 173.8 GiB (enough alone)" in knobs
    assert knobs.index("grpo.trainable: lm_head saves") < knobs.index("grpo.optimizer: sgd")
    savings = [k.saves_bytes for k in plan.knobs if k.saves_bytes]
    assert savings == sorted(savings, reverse=True)


def test_a_knob_that_is_enough_alone_comes_first(llama8b: ModelShape) -> None:
    settings = gpu_settings(gpu_memory_utilization=0.3, weight_sync=False)
    # 8B on 80 GB: 24 GB engine + the bf16 trainer (16 GB) + 18 B per parameter to train them all
    plan = run_plan(llama8b, settings, [H100])
    assert not plan.fits()
    first = plan.knobs[0]
    assert first.enough and first.setting == "grpo.enabled: false"
    assert not any(k.enough for k in plan.knobs[1:] if k.setting == "grpo.optimizer: sgd")
    assert "(enough alone)" in mp._knob_text(first)


def test_utilization_knob_when_the_trainer_fits_beside_a_smaller_engine(
    llama8b: ModelShape,
) -> None:
    settings = gpu_settings(grpo_trainable="lm_head", grpo_optimizer="sgd", weight_sync=False)
    plan = run_plan(llama8b, settings, [Device("cuda:0", 141 * GiB, 141 * GiB)])
    assert not plan.fits()
    assert any(
        k.setting.startswith("engine_args.gpu_memory_utilization 0.9 -> 0.") for k in plan.knobs
    )


def test_table_shows_every_phase_and_the_peak(llama8b: ModelShape) -> None:
    table = run_plan(llama8b, gpu_settings(gpu_memory_utilization=0.5), [H100]).table()
    lines = table.splitlines()
    assert lines[0] == ("memory plan: llama3-8b: 8,030.3M parameters (config.json), 32 layers, "
                        "hidden 4096, vocab 128256, bfloat16")  # fmt: skip
    assert (
        "cuda:0: peak" in table
        and "in grpo of 79.00 GiB free (80.00 GiB total): DOES NOT FIT" in table
    )
    for phase in mp.PHASES:
        assert any(line.strip().startswith(phase) for line in lines)


def test_gate_run_refuses_before_any_engine(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(mp, "host_device", lambda meminfo=None: Device("cpu", GiB, GiB // 2))
    started = []
    monkeypatch.setattr("gate.replay.run_gate", lambda *a, **k: started.append(a))
    assert gate_main(["run"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "memory plan: " in err and "DOES NOT FIT" in err and "--no-memory-check" in err
    assert not started


# -- run.json, report.json, the rendered section -------------------------------------------------
def test_run_manifest_and_report_carry_the_plan(tmp_path: Path) -> None:
    from gate import report
    from gate.replay import run_manifest

    cfg = load_config(BUILTIN_CONFIG)
    plan = mp.plan_run(cfg, cfg.engine_order, load_prompts(cfg)[1]).as_dict()
    manifest = run_manifest(cfg, [], {}, 0.0, [], plan)
    assert manifest["memory_plan"] == plan
    assert "memory_plan" not in run_manifest(cfg, [], {}, 0.0, [])
    (tmp_path / "engines" / "new").mkdir(parents=True)
    (tmp_path / "engines" / "new" / "engine.json").write_text(
        json.dumps({"memory_peaks": {"rss_peak_bytes": 3 * GiB}})
    )
    extra = report._memory_plan(tmp_path, manifest | {"engines": {"new": {}}})
    assert extra["memory_plan"]["measured_peak_bytes"] == {"new": 3 * GiB}


def test_rendered_report_shows_the_plan_escaped() -> None:
    data = json.loads((EXAMPLES / "pass.report.json").read_text(encoding="utf-8"))
    data.pop("memory_plan", None)
    assert "Memory plan" not in render_full(Report.from_dict(data))  # old reports: no section
    cfg = load_config(BUILTIN_CONFIG)
    plan = mp.plan_run(cfg, cfg.engine_order, load_prompts(cfg)[1]).as_dict()
    plan["model"] = "/x/<script>|tiny"
    data["memory_plan"] = plan | {"measured_peak_bytes": {"old": 2 * GiB}}
    text = render_full(Report.from_dict(data))
    assert "<details><summary>Memory plan: peak " in text and ", fits</summary>" in text
    assert "<script>" not in text
    # phases are rows, engine groups columns (the table stays narrow): free, 4 phases, peak, measured
    table = text[text.index("| Phase | old, new on cpu |") :].split("\n\n", 1)[0].splitlines()
    assert [row.split(" | ")[0] for row in table[2:]] == [
        "| free", "| engine", "| weight\\_sync", "| grpo", "| reference", "| peak", "| measured"
    ]  # fmt: skip
    assert table[-1] == "| measured | 2.00 GiB |" and all("GiB |" in row for row in table[2:])


def test_parse_size() -> None:
    assert mp.parse_size("20GiB") == 20 * GiB
    assert mp.parse_size("512MB") == 512 * 10**6
    assert mp.parse_size("1000") == 1000


def test_a_model_of_another_shape_gets_no_plan_and_no_refusal(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    cfg = dataclasses.replace(load_config(BUILTIN_CONFIG), model=dataclasses.replace(
        load_config(BUILTIN_CONFIG).model, path=str(tmp_path)))  # fmt: skip
    plan = mp.plan_run(cfg, cfg.engine_order, [])
    assert plan.shape is None and "not a Llama/Qwen2-style decoder config" in (plan.skipped or "")
    plan.check("gate.yaml")


def test_cpu_reference_phase_counts_what_the_release_keeps() -> None:
    mid = ModelShape(vocab=128, hidden=768, intermediate=2560, layers=8, heads=12, kv_heads=4, head_dim=64,
                     tied=False, qkv_bias=False, dtype="float32", parameters=59_978_496, source="test")  # fmt: skip
    s = PlanSettings(engine_dtype="float32", kv_cache_bytes=GiB, grpo_trainable={"last_layers": 2})
    p = mid.parameters
    # engine weights + the weight-sync probe's three fp32 copies (larger than GRPO's here)
    assert mp.cpu_kept_after_release(mid, s) == 4 * p + 3 * 4 * p
    no_ws = dataclasses.replace(s, weight_sync=False, grpo_trainable="all")
    assert mp.cpu_kept_after_release(mid, no_ws) == 4 * p + 2 * 4 * p + 12 * p
    tp2 = dataclasses.replace(s, tensor_parallel_size=2)  # the ranks' processes take theirs along
    assert mp.cpu_kept_after_release(mid, tp2) == 3 * 4 * p
    plan = mp.plan_engine(mid, s, [Device("cpu", 16 * GiB, 12 * GiB)])
    assert components(plan, "reference", "cpu")["kept after the engine's release"] == 16 * p


def test_together_names_a_combination_when_no_knob_alone_fits(llama8b: ModelShape) -> None:
    # A 72 GB engine leaves no room for either RL phase's trainer: both must go.
    plan = mp.plan_engine(llama8b, gpu_settings(gpu_memory_utilization=0.9), [H100])
    together = mp.fitting_combination(llama8b, plan)
    assert together and "weight_sync.enabled: false" in together
    trial = plan.settings
    for setting, change in mp.knob_trials(trial, plan.devices):
        if setting in together:
            trial = change(trial)
    assert mp.plan_engine(llama8b, trial, [H100]).overflow() is None


def test_prompt_lengths_bound_tokens_by_characters() -> None:
    from gate.contract.request import PromptItem

    items = [PromptItem(id="a", prompt="12+34=", reference="7;#46"),
             PromptItem(id="b", messages=[{"role": "user", "content": "hello"}])]  # fmt: skip
    lengths = mp.prompt_lengths(items)
    assert lengths == mp.PromptLengths(
        count=2, longest_prompt=5 + mp.TEMPLATE_TOKENS, longest_reference=5
    )
