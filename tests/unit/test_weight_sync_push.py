"""The weight-sync probe's choices, without an engine: which push path, which weights, which prompts.

The push-path tests use plain classes with the method signatures of the vLLM releases involved
(copied from their source: ``Worker.reload_weights(self)`` up to 0.15.1, ``(self, *args, **kwargs)``
forwarding to the model runner from 0.16.0) and an ``LLM`` with ``collective_rpc``'s calling
convention (a function called with each worker first). The real engine path is covered by
tests/integration/test_weight_sync.py.
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from gate.checks.context import Context  # noqa: E402
from gate.config.checks_section import parse_settings  # noqa: E402
from gate.contract import evidence as ev  # noqa: E402
from gate.judge import run_checks  # noqa: E402
from gate.verdict import Status  # noqa: E402
from gate.worker import policy_weights as pw  # noqa: E402
from gate.worker import weight_push as wp  # noqa: E402
from gate.worker import weight_sync as ws  # noqa: E402

from ..factory import RUN, make_evidence  # noqa: E402

TINY = Path(__file__).resolve().parents[2] / "gate" / "assets" / "models" / "tiny-arith"
PROMPTS = Path(__file__).resolve().parents[2] / "gate" / "assets" / "prompts"


# --- release shapes ------------------------------------------------------------------------------


class TinyModel(torch.nn.Module):
    """A model with vLLM's ``load_weights(weights)`` contract: copy each named tensor in place."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(2, 2, bias=False)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        for name, tensor in weights:
            params[name].data.copy_(tensor)
        return set(params)


class RunnerBefore016:
    def __init__(self) -> None:
        self.model = TinyModel()

    def reload_weights(self) -> None:  # 0.10-0.15: re-reads the checkpoint from disk
        raise AssertionError("the probe must not call a reload that ignores the pushed weights")


class WorkerBefore016:
    def __init__(self) -> None:
        self.model_runner = RunnerBefore016()

    def reload_weights(self) -> None:
        self.model_runner.reload_weights()


class RunnerFrom016:
    def __init__(self) -> None:
        self.model = TinyModel()
        self.loaded: list[str] = []

    def reload_weights(self, weights_iterator: Iterable[tuple[str, torch.Tensor]] | None = None,
                       weights_path: str | None = None, is_checkpoint_format: bool = True) -> None:  # fmt: skip
        self.loaded = [name for name, _ in weights_iterator or ()]


class WorkerFrom016:
    def __init__(self) -> None:
        self.model_runner = RunnerFrom016()

    def reload_weights(self, *args, **kwargs) -> None:
        self.model_runner.reload_weights(*args, **kwargs)


class WorkerWrapper:
    """vLLM's WorkerWrapperBase: what collective_rpc hands a function; attributes reach the worker."""

    def __init__(self, worker) -> None:
        self.worker = worker

    def __getattr__(self, attr: str):
        return getattr(self.worker, attr)


class LLM:
    """``LLM.collective_rpc(method, timeout=None, args=(), kwargs=None)``: ``method(worker, *args)`` per worker."""

    def __init__(self, *workers) -> None:
        self.workers = [WorkerWrapper(w) for w in workers]
        self.resets = 0

    def collective_rpc(
        self, method, timeout=None, args: tuple = (), kwargs: dict | None = None
    ) -> list:
        return [method(w, *args, **(kwargs or {})) for w in self.workers]

    def reset_prefix_cache(self) -> bool:
        self.resets += 1
        return True


class V0Engine:
    """V0: no collective_rpc; the model sits behind llm_engine.model_executor.driver_worker."""

    def __init__(self) -> None:
        runner = type("ModelRunner", (), {"model": TinyModel()})()
        worker = type("Worker", (), {"model_runner": runner})()
        self.llm_engine = type(
            "LLMEngine", (), {"model_executor": type("Executor", (), {"driver_worker": worker})()}
        )()


# --- signature probe and choice ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("worker", "accepts"),
    [(WorkerBefore016(), False), (WorkerFrom016(), True), (RunnerFrom016(), True), (WorkerWrapper(WorkerFrom016()), True),
     (WorkerWrapper(WorkerBefore016()), False), (object(), False)],
    ids=["0.15-worker", "0.16-worker-forwards", "runner-names-it", "0.16-behind-wrapper", "0.15-behind-wrapper", "none"],
)  # fmt: skip
def test_signature_probe(worker, accepts):
    assert wp.accepts_weights_iterator(worker) is accepts


def test_a_kwargs_forward_counts_only_when_the_runner_names_weights_iterator():
    worker = WorkerFrom016()
    worker.model_runner = RunnerBefore016()
    assert not wp.accepts_weights_iterator(worker)


def test_before_016_the_runner_load_weights_path_is_taken_and_loads_in_place():
    llm = LLM(WorkerBefore016())
    with pytest.raises(TypeError):  # what the old probe's choice did on 0.11-0.15
        llm.collective_rpc(wp._reload_on_worker, args=({},))
    adapter = wp.choose_adapter(llm, None)
    assert adapter.name == wp.RUNNER_LOAD_WEIGHTS.name
    assert adapter.probed == wp.PushPaths(reload_weights_iterator=False, runner_load_weights=True)
    new = {"proj.weight": torch.arange(4.0).reshape(2, 2)}
    adapter.push(llm, new)
    assert torch.equal(llm.workers[0].model_runner.model.proj.weight, new["proj.weight"])
    assert llm.resets == 1


def test_from_016_reload_weights_is_taken():
    llm = LLM(WorkerFrom016())
    adapter = wp.choose_adapter(llm, None)
    assert (
        adapter.name
        == wp.RELOAD_WEIGHTS.name
        == "collective_rpc reload_weights + reset_prefix_cache"
    )
    adapter.push(llm, {"proj.weight": torch.zeros(2, 2)})
    assert llm.workers[0].model_runner.loaded == ["proj.weight"] and llm.resets == 1


def test_every_worker_must_offer_the_path():
    adapter = wp.choose_adapter(LLM(WorkerFrom016(), WorkerBefore016()), None)
    assert adapter.name == wp.RUNNER_LOAD_WEIGHTS.name


def test_v0_engine_uses_the_driver_worker():
    llm = V0Engine()
    assert wp.choose_adapter(llm, None).name == wp.V0_LOAD_WEIGHTS.name
    wp.choose_adapter(llm, None).push(llm, {"proj.weight": torch.ones(2, 2)})
    assert torch.equal(
        llm.llm_engine.model_executor.driver_worker.model_runner.model.proj.weight, torch.ones(2, 2)
    )


def test_no_path_is_unsupported_with_the_reason():
    worker = WorkerBefore016()
    del worker.model_runner.model
    with pytest.raises(
        wp.UnsupportedEngine, match=r"takes no weights_iterator.*weight_update\.hook"
    ):
        wp.choose_adapter(LLM(worker), None)


def test_a_hook_wins_without_probing(tmp_path):
    hook = tmp_path / "hook.py"
    hook.write_text("def push(llm, state_dict):\n    llm.pushed = state_dict\n")
    adapter = wp.choose_adapter(object(), f"{hook}:push")  # no engine API at all: never probed
    assert adapter.name == f"hook {hook}:push" and adapter.probed is None


def test_unsupported_engine_is_an_error_of_the_check(tmp_path):
    make_evidence(tmp_path / "new", seed=2, weight_sync=None)
    path = tmp_path / "new" / "engine.json"
    reason = "this engine offers no in-place weight-update path gate knows (no collective_rpc)"
    path.write_text(
        json.dumps(
            {
                **json.loads(path.read_text()),
                "weight_sync": {"adapter": None, "unsupported": reason},
            }
        )
    )
    ctx = Context(
        new=ev.load(tmp_path / "new"),
        old=make_evidence(tmp_path / "old", seed=1),
        run=copy.deepcopy(RUN),
    )
    result = next(
        r for r in run_checks(ctx, parse_settings({}, "gate.yaml")) if r.id == "weight-sync"
    )
    assert (
        result.status == Status.ERROR
        and "This engine offers no in-place weight-update path" in result.diagnosis
    )


def test_a_push_that_raised_is_an_error_of_its_checks_and_the_rest_are_judged(tmp_path):
    """engine.json as the worker writes it when the hook raised on one rank: weight-sync and GRPO are
    ERROR (the hook, the rank, the tails), every replay check keeps its own verdict."""
    make_evidence(tmp_path / "new", seed=2, weight_sync=None)
    path = tmp_path / "new" / "engine.json"
    error = {"message": "AttributeError: 'Parameter' object has no attribute 'weight_loader'",
             "adapter": "hook hooks.py:load_into_driver_model", "hook": "hooks.py:load_into_driver_model",
             "traceback_tail": "  File hooks.py, line 9\nAttributeError: 'Parameter' ...",
             "failed_ranks": ["Worker_TP1"], "log_tail": "(Worker_TP1 pid=7) ERROR boom"}  # fmt: skip
    meta = json.loads(path.read_text())
    meta |= {"weight_sync": {"error": error}, "grpo": {"not_run": "the weight_sync pass failed before it"},
             "passes_not_run": ["grpo"]}  # fmt: skip
    path.write_text(json.dumps(meta))
    ctx = Context(
        new=ev.load(tmp_path / "new"),
        old=make_evidence(tmp_path / "old", seed=1),
        run=copy.deepcopy(RUN),
    )
    results = {r.id: r for r in run_checks(ctx, parse_settings({}, "gate.yaml"))}
    sync, grpo = results["weight-sync"], results["grpo-trajectory"]
    assert sync.status == Status.ERROR
    assert sync.summary.startswith(
        "the weight push via hook hooks.py:load_into_driver_model raised on Worker_TP1: "
    )
    assert "weight_loader" in sync.summary and "(Worker_TP1 pid=7) ERROR boom" in sync.diagnosis
    assert grpo.status == Status.ERROR and "did not run" in grpo.summary
    judged = [r for r in results.values() if r.id not in ("weight-sync", "grpo-trajectory")]
    assert judged and all(r.status != Status.ERROR for r in judged), {
        r.id: r.status for r in judged
    }


# --- tied weights --------------------------------------------------------------------------------


def _tied_model(tmp_path: Path):
    """The tiny model with its head tied to its embedding (tie_word_embeddings, no lm_head in the checkpoint)."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    folder = tmp_path / "tied"
    shutil.copytree(TINY, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    weights = load_file(folder / "model.safetensors")
    del weights["lm_head.weight"]
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def test_tied_weights_are_perturbed_once_and_stay_tied(tmp_path):
    trainer = _tied_model(tmp_path)
    old = pw.clone_state_dict(trainer.state_dict())
    assert old["lm_head.weight"] is old["model.embed_tokens.weight"]  # the copy keeps the tie
    new = pw.perturbed(old, 0.1, seed=0)
    assert new["lm_head.weight"] is new["model.embed_tokens.weight"]
    assert not torch.equal(new["lm_head.weight"], old["lm_head.weight"])

    # The trainer loads every name; vLLM's Llama/Qwen2 skip lm_head.* when tied and read the
    # embedding. Both must end on the same head, or weight-sync sees a "partial update".
    trainer.load_state_dict(new)
    engine_view = _tied_model(tmp_path / "engine")
    engine_view.load_state_dict(
        {k: v for k, v in new.items() if not k.startswith("lm_head.")}, strict=False
    )
    ids = torch.tensor([[1, 40, 41, 42]])
    with torch.no_grad():
        assert torch.equal(trainer(ids).logits, engine_view(ids).logits)


def test_tied_name_groups_are_the_names_of_one_tensor(tmp_path):
    trainer = _tied_model(tmp_path)
    assert pw.tied_name_groups(trainer.state_dict()) == [
        ["lm_head.weight", "model.embed_tokens.weight"]
    ]
    base = torch.randn(4, 3)
    # distinct views of one buffer are distinct tensors; an untied model has no group
    assert pw.tied_name_groups({"a": base[:2], "b": base[2:], "c": torch.randn(2)}) == []
    assert pw.tied_name_groups({"z": base, "y": base, "x": torch.randn(1)}) == [["y", "z"]]


def test_host_state_dicts_are_copies_that_keep_ties_and_load_into_the_one_model(tmp_path):
    trainer = _tied_model(tmp_path)
    live = trainer.state_dict()
    old = pw.host_state_dict(live, pin=False)
    assert old["lm_head.weight"] is old["model.embed_tokens.weight"]
    assert all(t.device.type == "cpu" for t in old.values())
    # Copies, not the model's own tensors: loading the new policy must leave the old one intact.
    assert all(old[k].data_ptr() != v.data_ptr() for k, v in live.items())
    assert all(torch.equal(old[k], v) for k, v in pw.clone_state_dict(live).items())
    new = pw.perturbed(old, 0.1, seed=0)
    trainer.load_state_dict(new)
    assert torch.equal(trainer.lm_head.weight, new["lm_head.weight"])
    assert not torch.equal(old["lm_head.weight"], new["lm_head.weight"])
    trainer.load_state_dict(old)
    assert torch.equal(trainer.lm_head.weight, old["lm_head.weight"])


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [("bfloat16", torch.bfloat16), (torch.float16, torch.float16), (None, torch.float32)],
)
def test_the_trainer_runs_in_the_engines_dtype(dtype, expected):
    model_config = SimpleNamespace(dtype=dtype)
    llm = SimpleNamespace(
        llm_engine=SimpleNamespace(vllm_config=SimpleNamespace(model_config=model_config))
    )
    assert ws.engine_dtype(llm) == expected
    assert ws.engine_dtype(object()) == torch.float32  # an engine that does not say


def test_untied_and_distinct_views_are_perturbed_independently():
    base = torch.randn(4, 3, generator=torch.Generator().manual_seed(1))
    state = {"a": base[:2], "b": base[2:], "c": torch.randn(4, 3), "step": torch.tensor(7)}
    new = pw.perturbed(state, 0.5, seed=3)
    assert all(not torch.equal(new[k], state[k]) for k in "abc")
    assert not torch.allclose(new["a"] - state["a"], new["b"] - state["b"])
    assert torch.equal(new["step"], state["step"])  # integer buffers are copied, not moved
    assert all(
        torch.equal(new[k], v) for k, v in pw.perturbed(state, 0.5, seed=3).items()
    )  # reproducible


# --- prompts -------------------------------------------------------------------------------------


def _tokenizer(bos: bool):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(TINY)
    if not bos:
        tokenizer.bos_token = None  # Qwen's layout: no BOS at all
    return tokenizer


def _prompts(bos: bool) -> tuple[list[list[int]], list[list[int]]]:
    """Chat prompts of the shipped general set behind a shared system message (a long common head).

    Without BOS they are the same prompts minus their leading ``<s>``, so each starts with a real
    token, as Qwen's do (its template opens with ``<|im_start|>``).
    """
    from gate.contract.request import PromptItem
    from gate.worker import replay

    tokenizer = _tokenizer(bos=True)
    items = [json.loads(line) for line in (PROMPTS / "general.jsonl").read_text().splitlines()][:12]
    system = {"role": "system", "content": "You are a helpful assistant. Answer briefly."}
    chats = [PromptItem(id=item["id"], messages=[system, *item["messages"]]) for item in items]
    prompts = [ids if bos else ids[1:] for ids in replay.tokenize_prompts(tokenizer, chats)]
    assert all(ids[0] == tokenizer.bos_token_id for ids in prompts) is bos
    references = [
        tokenizer(item["reference"], add_special_tokens=False).input_ids for item in items
    ]
    return prompts, references


@pytest.mark.parametrize("block_size", [16, 128])
@pytest.mark.parametrize("bos", [True, False], ids=["bos", "no-bos"])
def test_probe_prompts_fit_the_block_and_keep_every_question_token(block_size, bos):
    bos_id = _tokenizer(bos).bos_token_id
    assert (bos_id is not None) is bos
    prompts, references = _prompts(bos)
    control, prefixed = ws.probe_prompts(prompts, references, block_size, 512, 4, 16, bos_id)

    assert len(control) == 4 and len({tuple(q) for q in control}) == 4  # distinct questions
    assert all(len(q) < block_size for q in control)  # no full KV block: no cache hit possible
    tails = [p[-len(q) + (1 if bos else 0) :] for p, q in zip(prompts, control, strict=False)]
    assert all(
        q[1 if bos else 0 :] == t for q, t in zip(control, tails, strict=True)
    )  # the end of each prompt, whole
    shared = len(prefixed[0]) - len(control[0])
    assert shared >= block_size  # the shared prefix fills at least one block
    heads = {tuple(p[: shared + (1 if bos else 0)]) for p in prefixed}
    assert len(heads) == 1  # ... and every prefixed prompt has it
    for q, p in zip(control, prefixed, strict=True):
        body = q[1:] if bos else q
        assert p[-len(body) :] == body  # the question follows whole, its first token included
        assert p.count(bos_id) == (1 if bos else 0) and (p[0] == bos_id) is bos


def test_short_prompts_are_used_whole_on_a_cpu_sized_block():
    prompts, references = _prompts(bos=True)
    control, _ = ws.probe_prompts(
        prompts, references, 128, 512, 4, 16, _tokenizer(bos=True).bos_token_id
    )
    assert control == prompts[:4]


def test_split_bos_strips_only_a_bos_that_is_there():
    assert ws.split_bos([1, 5, 6], 1) == ([1], [5, 6])
    assert ws.split_bos([5, 6], 1) == ([], [5, 6])
    assert ws.split_bos([0, 5], None) == (
        [],
        [0, 5],
    )  # token 0 is not a BOS when the tokenizer has none


def test_too_short_a_context_for_one_block_is_refused():
    with pytest.raises(RuntimeError, match="less than one KV block"):
        ws.probe_prompts([[1, 5, 6, 7]], [[8, 9]], 128, 140, 1, 16, 1)


# --- workers in other processes: the folder push ---------------------------------------------------


class ParallelLLM(LLM):
    """An engine whose workers are other processes: collective_rpc takes method NAMES only, as vLLM
    does across processes without VLLM_ALLOW_INSECURE_SERIALIZATION; ``calls`` records them."""

    def __init__(self, worker_cls: str, world_size: int = 2, backend: str = "mp") -> None:
        super().__init__()
        parallel = SimpleNamespace(world_size=world_size, distributed_executor_backend=backend,
                                   worker_cls=worker_cls)  # fmt: skip
        cache = SimpleNamespace(block_size=128)
        self.llm_engine = SimpleNamespace(
            vllm_config=SimpleNamespace(parallel_config=parallel, cache_config=cache)
        )
        self.calls: list[tuple] = []
        self.read: list[dict] = []

    def collective_rpc(
        self, method, timeout=None, args: tuple = (), kwargs: dict | None = None
    ) -> list:
        if not isinstance(method, str):
            raise TypeError("cannot send a function to another process")
        self.calls.append((method, timeout, kwargs))
        from safetensors.torch import load_file

        folder = Path(kwargs["weights_path"])
        self.read.append(load_file(folder / wp.WEIGHTS_FILE))  # what each rank would load
        return [None, None]


WORKER_FROM_016 = f"{__name__}.WorkerFrom016"
WORKER_BEFORE_016 = f"{__name__}.WorkerBefore016"


class RunnerModelRunner(RunnerFrom016):
    """Named like vLLM's runners, so the class probe finds it beside the worker class below."""


class ForwardingWorker:
    def reload_weights(self, *args, **kwargs) -> None:
        raise AssertionError("a class probe must not call anything")


class WorkerFrom034:
    """vLLM 0.34's Worker.reload_weights: explicit arguments, no forwarding (gpu_worker.py:645;
    the reload itself moved to model_loader/reload/)."""

    def reload_weights(
        self,
        weights_iterator=None,
        weights_path: str | None = None,
        is_checkpoint_format: bool = True,
    ) -> None:
        raise AssertionError("a class probe must not call anything")


def test_the_0_34_reload_signature_takes_both_pushes_and_a_checkpoint_format_default():
    """The worker passes HF-named tensors by keyword; 0.34's third argument defaults to the
    checkpoint format, which is what they are (tests/compat reads the same signature in the wheel)."""
    import inspect

    assert wp.accepts_keyword(WorkerFrom034, "weights_iterator")
    assert wp.accepts_keyword(WorkerFrom034, "weights_path")
    params = inspect.signature(WorkerFrom034.reload_weights).parameters
    assert params["is_checkpoint_format"].default is True


def test_a_worker_class_is_probed_without_an_instance():
    # Worker(*args, **kwargs) forwards to the runner classes its module holds (GPUModelRunner).
    assert wp.accepts_keyword(ForwardingWorker, "weights_path")
    assert wp.model_runner_classes(ForwardingWorker) == [RunnerModelRunner]
    assert not wp.accepts_keyword(WorkerBefore016, "weights_path")


@pytest.mark.parametrize(
    "shape, multiprocess",
    [
        ((1, "uni"), False),
        ((1, None), False),
        ((2, "mp"), True),
        ((1, "mp"), True),
        ((4, "ray"), True),
    ],
)
def test_workers_are_in_other_processes_with_parallel_ranks_or_an_mp_ray_executor(
    shape, multiprocess
):
    llm = ParallelLLM(WORKER_FROM_016, *shape)
    assert wp.executor_shape(llm).multiprocess is multiprocess


def test_tensor_parallel_takes_the_folder_push_and_sends_only_a_path(tmp_path, monkeypatch):
    monkeypatch.setenv(wp.RPC_TIMEOUT_ENV, "42")
    llm = ParallelLLM(f"{__name__}.ForwardingWorker")
    adapter = wp.choose_adapter(llm, None, tmp_path)
    assert adapter.name == wp.FOLDER_RELOAD.name
    assert adapter.probed == wp.PushPaths(False, False, True, True, f"{__name__}.ForwardingWorker")
    state = {"a": torch.ones(2), "b": torch.zeros(3)}
    adapter.push(llm, state)
    ((method, timeout, kwargs),) = llm.calls
    assert (method, timeout, list(kwargs)) == ("reload_weights", 42.0, ["weights_path"])
    assert torch.equal(llm.read[0]["a"], state["a"]) and torch.equal(llm.read[0]["b"], state["b"])
    assert not Path(kwargs["weights_path"]).exists()  # removed after the push
    assert llm.resets == 1


def test_tensor_parallel_before_016_is_unsupported_with_the_reason():
    llm = ParallelLLM(WORKER_BEFORE_016)
    with pytest.raises(wp.UnsupportedEngine, match=r"separate processes.*takes no weights_path"):
        wp.choose_adapter(llm, None)


def test_tied_tensors_are_written_under_both_names(tmp_path):
    from safetensors.torch import load_file

    embed = torch.arange(6.0).reshape(3, 2)
    state = {"model.embed_tokens.weight": embed, "lm_head.weight": embed, "norm": torch.ones(2)}
    with wp.staged_weights(state, [tmp_path]) as folder:
        assert folder.parent == tmp_path
        loaded = load_file(folder / wp.WEIGHTS_FILE)
    assert sorted(loaded) == sorted(state)
    assert torch.equal(loaded["lm_head.weight"], embed) and torch.equal(
        loaded["model.embed_tokens.weight"], embed
    )
    assert list(tmp_path.iterdir()) == []


def test_the_folder_is_removed_when_the_push_fails(tmp_path):
    with (
        pytest.raises(RuntimeError, match="rank 1 broke"),
        wp.staged_weights({"a": torch.ones(2)}, [tmp_path]),
    ):
        raise RuntimeError("rank 1 broke")
    assert list(tmp_path.iterdir()) == []


def test_the_first_folder_with_room_is_used(tmp_path, monkeypatch):
    small, large = tmp_path / "shm", tmp_path / "beside"
    small.mkdir(), large.mkdir()
    free = {str(small): 10 * 2**20, str(large): 10 * 2**30}
    real = wp.shutil.disk_usage
    monkeypatch.setattr(
        wp.shutil,
        "disk_usage",
        lambda p: SimpleNamespace(free=free[str(p)]) if str(p) in free else real(p),
    )
    assert wp.staging_parent(100 * 2**20, [small, large]) == large
    with pytest.raises(
        RuntimeError,
        match=r"no folder has room for the 20\.00 GiB.*shm: 0\.01 GiB free.*missing: No such file",
    ):
        wp.staging_parent(20 * 2**30, [small, large, tmp_path / "missing"])


def test_staging_prefers_gate_push_dir_then_shared_memory_then_beside(tmp_path, monkeypatch):
    monkeypatch.delenv(wp.PUSH_DIR_ENV, raising=False)
    assert wp.staging_roots(tmp_path) == (wp.SHARED_MEMORY, tmp_path)
    monkeypatch.setenv(wp.PUSH_DIR_ENV, "/shared/nfs")
    assert wp.staging_roots(None) == (Path("/shared/nfs"), wp.SHARED_MEMORY)


def test_a_worker_call_that_times_out_names_the_phase():
    class Hung(LLM):
        def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
            raise TimeoutError(f"RPC call to {method} timed out.")

    with pytest.raises(
        wp.WorkerCallTimeout, match=r"weight push: .*collective_rpc\(reload_weights\) within 600s"
    ):
        wp.call_workers(Hung(), "reload_weights", "weight push")


def test_a_push_that_raises_names_its_path():
    adapter = wp.Adapter(
        "hook hooks.py:broken",
        lambda llm, sd: (_ for _ in ()).throw(AttributeError("no weight_loader")),
    )
    with pytest.raises(
        wp.PushFailed, match=r"the push via hook hooks\.py:broken raised AttributeError"
    ) as info:
        wp.push_naming_failures(adapter, LLM(), {})
    assert info.value.adapter == "hook hooks.py:broken"


def test_the_block_size_of_a_parallel_engine_comes_from_the_driver_config():
    assert ws.engine_block_size(ParallelLLM(WORKER_FROM_016)) == 128
