"""gate.compat's push rule and gate.vllm_source's static checks, on small synthetic source trees.

The real releases are checked in tests/compat (needs the registry or a warm cache); these tests pin
what each check must answer for each shape of code, so a check that always says yes fails here.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
import zipfile
from pathlib import Path

import pytest

from gate import compat, vllm_source
from gate.vllm_source import SourceTree, check_tree, resolve_path

PUSH_ALL = {k: True for k in compat.PUSH_FEATURES}


# ---- worker_path --------------------------------------------------------------------------------


def test_push_prefers_reload_weights_with_an_iterator():
    assert compat.worker_path(PUSH_ALL) == (
        compat.SUPPORTED,
        (compat.PUSH_RELOAD_WEIGHTS, compat.PUSH_RESET),
    )


def test_push_falls_back_to_the_runner_model_before_reload_weights_takes_weights():
    features = {**PUSH_ALL, compat.RELOAD_WEIGHTS_ITERATOR: False}
    assert compat.worker_path(features) == (
        compat.SUPPORTED,
        (compat.PUSH_RUNNER_LOAD_WEIGHTS, compat.PUSH_RESET),
    )


@pytest.mark.parametrize(
    "missing, words",
    [
        ((compat.COLLECTIVE_RPC,), "collective_rpc"),
        (
            (compat.RELOAD_WEIGHTS_ITERATOR, compat.RUNNER_LOAD_WEIGHTS),
            "model_runner.model.load_weights",
        ),
        ((compat.RESET_PREFIX_CACHE,), "reset_prefix_cache"),
    ],
)
def test_push_names_what_an_unsupported_release_lacks(missing, words):
    status, reason = compat.worker_path({**PUSH_ALL, **{k: False for k in missing}})
    assert status == compat.UNSUPPORTED
    assert reason.startswith("unsupported release: ") and words in reason


def test_push_refuses_to_guess_a_feature_it_was_not_given():
    with pytest.raises(KeyError, match=compat.RESET_PREFIX_CACHE):
        compat.worker_path(
            {k: True for k in compat.PUSH_FEATURES if k != compat.RESET_PREFIX_CACHE}
        )


def test_workers_in_other_processes_take_the_folder_push():
    assert compat.worker_path(PUSH_ALL, multiprocess=True) == (
        compat.SUPPORTED,
        (compat.PUSH_RELOAD_FROM_FOLDER, compat.PUSH_RESET),
    )


def test_workers_in_other_processes_need_weights_path():
    # 0.10-0.15 shape: the runner's load_weights is there, but only a function reaches it.
    features = {
        **PUSH_ALL,
        compat.RELOAD_WEIGHTS_ITERATOR: False,
        compat.RELOAD_WEIGHTS_PATH: False,
    }
    status, reason = compat.worker_path(features, multiprocess=True)
    assert status == compat.UNSUPPORTED and "takes no weights_path" in reason


@pytest.mark.parametrize("multiprocess", [False, True], ids=["in-process", "multi-process"])
@pytest.mark.parametrize(
    "present",
    [tuple(k for k, on in zip(compat.PUSH_FEATURES, bits, strict=True) if on)
     for bits in __import__("itertools").product([False, True], repeat=len(compat.PUSH_FEATURES))],
    ids=lambda present: "+".join(k.rsplit(".", 1)[-1] for k in present) or "none",
)  # fmt: skip
def test_the_worker_picks_the_push_the_table_states(present, multiprocess):
    """pick_adapter (live engine) and worker_path (release table) are one rule: same answer for every
    combination of features (reset_prefix_cache aside: the worker calls it where it exists)."""
    ws = pytest.importorskip("gate.worker.weight_push")
    features = {k: k in present for k in compat.PUSH_FEATURES}
    status, detail = compat.worker_path({**features, compat.RESET_PREFIX_CACHE: True}, multiprocess)
    paths = (
        ws.PushPaths(
            reload_weights_iterator=features[compat.RELOAD_WEIGHTS_ITERATOR] and not multiprocess,
            runner_load_weights=features[compat.RUNNER_LOAD_WEIGHTS] and not multiprocess,
            reload_weights_path=features[compat.RELOAD_WEIGHTS_PATH],
            multiprocess=multiprocess,
        )
        if features[compat.COLLECTIVE_RPC]
        else None
    )
    try:
        adapter = ws.pick_adapter(paths, has_v0_driver_model=False)
    except ws.UnsupportedEngine:
        assert status == compat.UNSUPPORTED, detail
        return
    pushes = {
        ws.RELOAD_WEIGHTS.name: compat.PUSH_RELOAD_WEIGHTS,
        ws.RUNNER_LOAD_WEIGHTS.name: compat.PUSH_RUNNER_LOAD_WEIGHTS,
        ws.FOLDER_RELOAD.name: compat.PUSH_RELOAD_FROM_FOLDER,
    }
    assert status == compat.SUPPORTED and detail[0] == pushes[adapter.name]


# ---- static checks ------------------------------------------------------------------------------

# A minimal release: the classes the checks read, in vLLM's layout, with the 0.16+ shapes.
BASE = {
    "vllm/entrypoints/llm.py": """
        from typing import Callable
        class LLM:
            def collective_rpc(self, method: str | Callable[..., int], timeout=None, args=(), kwargs=None): ...
            def reset_prefix_cache(self): ...
            def get_default_sampling_params(self): ...
    """,
    "vllm/v1/engine/llm_engine.py": """
        class LLMEngine:
            def __init__(self, vllm_config: VllmConfig):
                self.vllm_config = vllm_config
                self.model_config = vllm_config.model_config
    """,
    "vllm/engine/arg_utils.py": """
        class EngineArgs:
            model: str = "m"
            logprobs_mode: str = "raw_logprobs"
    """,
    "vllm/sampling_params.py": """
        class SamplingParams(Struct):
            flat_logprobs: bool = False
    """,
    "vllm/v1/worker/worker_base.py": """
        class WorkerBase:
            def init_weight_transfer_engine(self, info): ...
    """,
    "vllm/v1/worker/gpu_worker.py": """
        class Worker(WorkerBase):
            def __init__(self):
                self.model_runner = GPUModelRunner()
            def reload_weights(self, *args, **kwargs):
                self.model_runner.reload_weights(*args, **kwargs)
    """,
    "vllm/v1/worker/gpu_model_runner.py": """
        class GPUModelRunner:
            def load_model(self):
                self.model = get_model()
                self.model = CUDAGraphWrapper(self.model)
            def reload_weights(self, weights_iterator=None, weights_path=None): ...
    """,
    "vllm/compilation/cuda_graph.py": """
        class CUDAGraphWrapper:
            def __getattr__(self, key): ...
    """,
    "vllm/config/model.py": """
        class ModelConfig:
            dtype: str = "auto"
            chunked: InitVar[bool] = False
            def get_diff_sampling_param(self): ...
            def __post_init__(self):
                self.max_model_len = 1
    """,
    "vllm/config/vllm.py": """
        class VllmConfig:
            model_config: ModelConfig = None
            cache_config: "CacheConfig" = None
    """,
    "vllm/config/cache.py": """
        class BaseCache:
            block_size: int = 16
        class CacheConfig(BaseCache):
            pass
    """,
}


def _tree(tmp_path: Path, **overrides: str) -> SourceTree:
    files = {**BASE, **{k.replace("__", "/") + ".py": v for k, v in overrides.items()}}
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return SourceTree(tmp_path)


def _check(tree: SourceTree) -> dict[str, bool]:
    return {k: f.present for k, f in check_tree(tree, settings={}).items()}


def test_a_release_with_every_feature_reads_as_such(tmp_path):
    found = _check(_tree(tmp_path))
    assert {k for k, present in found.items() if not present} == {
        compat.WT_START,
        compat.WT_UPDATE,
        compat.WT_FINISH,
    }
    assert found[compat.WT_INIT]  # inherited from WorkerBase


def test_reload_weights_without_arguments_has_no_iterator(tmp_path):
    tree = _tree(tmp_path, vllm__v1__worker__gpu_worker="""
        class Worker(WorkerBase):
            def __init__(self):
                self.model_runner = GPUModelRunner()
            def reload_weights(self) -> None:
                self.model_runner.reload_weights()
    """)  # fmt: skip
    findings = check_tree(tree, settings={})
    assert findings[compat.RELOAD_WEIGHTS].present
    assert not findings[compat.RELOAD_WEIGHTS_ITERATOR].present
    assert "takes no weights_iterator" in findings[compat.RELOAD_WEIGHTS_ITERATOR].note
    assert (
        compat.worker_path({k: f.present for k, f in findings.items()})[1][0]
        == compat.PUSH_RUNNER_LOAD_WEIGHTS
    )


def test_a_forward_to_a_runner_without_the_keyword_has_no_iterator(tmp_path):
    tree = _tree(tmp_path, vllm__v1__worker__gpu_model_runner="""
        class GPUModelRunner:
            def load_model(self):
                self.model = get_model()
            def reload_weights(self): ...
    """)  # fmt: skip
    assert not _check(tree)[compat.RELOAD_WEIGHTS_ITERATOR]
    assert _check(tree)[compat.RUNNER_LOAD_WEIGHTS]


def test_a_model_wrapper_that_forwards_nothing_breaks_the_runner_path(tmp_path):
    tree = _tree(tmp_path, vllm__compilation__cuda_graph="""
        class CUDAGraphWrapper:
            def __call__(self, *args): ...
    """)  # fmt: skip
    finding = check_tree(tree, settings={})[compat.RUNNER_LOAD_WEIGHTS]
    assert not finding.present and "CUDAGraphWrapper" in finding.note


def test_collective_rpc_taking_only_a_name_cannot_run_the_push(tmp_path):
    tree = _tree(tmp_path, vllm__entrypoints__llm="""
        class LLM:
            def collective_rpc(self, method: str, args=()): ...
            def reset_prefix_cache(self): ...
    """)  # fmt: skip
    found = _check(tree)
    assert not found[compat.COLLECTIVE_RPC] and not found[compat.DEFAULT_SAMPLING_PARAMS]
    assert compat.worker_path(found)[0] == compat.UNSUPPORTED


def test_the_hint_picks_the_v1_class_among_namesakes(tmp_path):
    tree = _tree(tmp_path, vllm__worker__worker="""
        class Worker:
            def reload_weights(self): ...
    """)  # fmt: skip
    assert tree.find("Worker").path == "vllm/v1/worker/gpu_worker.py"
    assert _check(tree)[compat.RELOAD_WEIGHTS_ITERATOR]


@pytest.mark.parametrize(
    "path, present",
    [
        (
            "vllm_config.model_config.dtype",
            True,
        ),  # class-body field through an annotated hop
        (
            "model_config.max_model_len",
            True,
        ),  # self.x = ... in __post_init__; hop by convention
        (
            "vllm_config.cache_config.block_size",
            True,
        ),  # a string annotation, an inherited field
        ("vllm_config.model_config.chunked", False),  # InitVar: never an attribute
        ("vllm_config.model_config.missing", False),
        ("vllm_config.attention_config.backend", False),
    ],
)
def test_setting_paths_resolve_hop_by_hop(tmp_path, path, present):
    assert resolve_path(_tree(tmp_path), "LLMEngine", path).present is present


def test_a_setting_reads_from_its_first_path_that_exists(tmp_path):
    settings = {
        "x": ("vllm_config.model_config.nope", "model_config.dtype"),
        "y": ("vllm_config.cache_config.nope",),
    }
    found = check_tree(_tree(tmp_path), settings)
    assert found["setting.x"].present and found["setting.x"].note == "model_config.dtype"
    assert not found["setting.y"].present and "no attribute 'nope'" in found["setting.y"].note


def test_the_worker_setting_table_is_read_from_the_worker_itself():
    pytest.importorskip("torch")
    from gate.worker.engine import _SETTINGS

    assert vllm_source.worker_setting_paths() == _SETTINGS


# ---- cache --------------------------------------------------------------------------------------


def _wheel(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for rel, text in BASE.items():
            zf.writestr(rel, textwrap.dedent(text))
        zf.writestr("vllm/unrelated.py", "class Other: ...\n")
        zf.writestr("vllm/_C.abi3.so", b"\0" * 64)
    return path


def test_a_release_is_fetched_once_reduced_to_its_read_files_and_the_wheel_deleted(
    tmp_path, monkeypatch
):
    calls = []

    def fake_download(version, into):
        calls.append(version)
        into.mkdir(parents=True)
        return _wheel(into / f"vllm-{version}-cp38-abi3-manylinux1_x86_64.whl")

    monkeypatch.setattr(vllm_source, "_download_wheel", fake_download)
    root = vllm_source.ensure_source("9.9.9", tmp_path)
    assert root == tmp_path / "vllm-source" / "9.9.9"
    kept = json.loads((root / "MANIFEST.json").read_text())["files"]
    # the class files, the config files, the base class's and the model wrapper's files; nothing else
    assert set(kept) == set(BASE) and not (root / "vllm/unrelated.py").exists()
    assert not list(tmp_path.rglob("*.whl"))
    assert vllm_source.ensure_source("9.9.9", tmp_path) == root and calls == ["9.9.9"]
    assert _check(SourceTree(root))[compat.RELOAD_WEIGHTS_ITERATOR]


def test_a_failed_download_is_a_fetch_error_that_says_why(tmp_path, monkeypatch):
    def failing_run(cmd, **kwargs):
        return subprocess.CompletedProcess(
            cmd, 1, "", "ERROR: Could not find a version (network unreachable)"
        )

    monkeypatch.setattr(vllm_source.subprocess, "run", failing_run)
    with pytest.raises(vllm_source.FetchError, match=r"vllm==9\.9\.9 failed .*network unreachable"):
        vllm_source.ensure_source("9.9.9", tmp_path)
    assert vllm_source.cached_source("9.9.9", tmp_path) is None


def test_several_releases_are_fetched_concurrently_and_one_failure_stays_its_own(
    tmp_path, monkeypatch
):
    import threading

    both_in_flight = threading.Barrier(2, timeout=10)  # passes only with two downloads at once
    calls = []

    def fake_download(version, into):
        calls.append(version)
        if version == "8.8.8":
            raise vllm_source.FetchError("pip download vllm==8.8.8 failed (exit 1): gone")
        both_in_flight.wait()
        into.mkdir(parents=True)
        return _wheel(into / f"vllm-{version}-cp38-abi3-manylinux1_x86_64.whl")

    monkeypatch.setattr(vllm_source, "_download_wheel", fake_download)
    found = vllm_source.ensure_sources(["9.9.8", "9.9.9"], tmp_path, workers=2)
    assert found == {v: tmp_path / "vllm-source" / v for v in ("9.9.8", "9.9.9")}
    calls.clear()
    found = vllm_source.ensure_sources(["9.9.9", "8.8.8", "9.9.9"], tmp_path, workers=2)
    assert calls == ["8.8.8"]  # the cached release is not fetched again
    assert list(found) == ["9.9.9", "8.8.8"] and isinstance(found["8.8.8"], vllm_source.FetchError)
    assert found["9.9.9"] == tmp_path / "vllm-source" / "9.9.9"


def test_a_cache_entry_of_an_older_format_is_not_used(tmp_path):
    root = tmp_path / "vllm-source" / "1.0.0"
    root.mkdir(parents=True)
    (root / "MANIFEST.json").write_text(
        json.dumps({"format": vllm_source.CACHE_FORMAT - 1, "version": "1.0.0"})
    )
    assert vllm_source.cached_source("1.0.0", tmp_path) is None
