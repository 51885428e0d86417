"""Every vLLM release in gate.compat.RELEASES, read from its wheel's source: the worker has a push path.

Each release's wheel is fetched once into $GATE_CACHE_DIR/vllm-source (gate/vllm_source.py); a
release whose wheel cannot be downloaded is skipped with pip's reason, never passed. The
expectations below were read off the vLLM source by hand; a check that drifts from them fails here.
"""

from __future__ import annotations

import ast

import pytest

from gate import compat, vllm_source

pytestmark = pytest.mark.compat


def _v(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


# First release (of RELEASES) whose source has the feature; every later one has it too.
SINCE = {
    compat.COLLECTIVE_RPC: "0.10.2",
    compat.RESET_PREFIX_CACHE: "0.10.2",
    compat.DEFAULT_SAMPLING_PARAMS: "0.10.2",
    compat.DIFF_SAMPLING_PARAM: "0.10.2",
    compat.LOGPROBS_MODE: "0.10.2",
    compat.RELOAD_WEIGHTS: "0.10.2",
    compat.RUNNER_LOAD_WEIGHTS: "0.10.2",
    compat.FLAT_LOGPROBS: "0.12.0",
    # Worker.reload_weights(self) up to 0.15.1; (*args, **kwargs) -> runner(weights_iterator=...) from 0.16.0.
    compat.RELOAD_WEIGHTS_ITERATOR: "0.16.0",
    # The runner's reload_weights(weights_iterator=None, weights_path=None, ...) arrived as one signature.
    compat.RELOAD_WEIGHTS_PATH: "0.16.0",
    compat.WT_INIT: "0.16.0",
    compat.WT_UPDATE: "0.16.0",
    compat.WT_START: "0.21.0",
    compat.WT_FINISH: "0.21.0",
}
# Effective settings no worker path reaches before a release (the worker then records null).
SETTING_SINCE = {"attention_backend": "0.13.0"}
# Releases the worker cannot push weights into, with the words their reason must contain.
UNSUPPORTED: dict[str, str] = {}

_memo: dict[str, dict | vllm_source.FetchError] = {}


@pytest.fixture(scope="module", autouse=True)
def _fetch_every_release_up_front():
    """A cold cache fetches every release's wheel: four at a time, not one per first test."""
    for version, source in vllm_source.ensure_sources(compat.RELEASES).items():
        if isinstance(source, vllm_source.FetchError):
            _memo[version] = source


def findings(version: str) -> dict[str, vllm_source.Finding]:
    if version not in _memo:
        try:
            _memo[version] = vllm_source.check_release(vllm_source.ensure_source(version))
        except vllm_source.FetchError as exc:
            _memo[version] = exc
    result = _memo[version]
    if isinstance(result, vllm_source.FetchError):
        pytest.skip(f"vllm {version} not checked, its wheel could not be fetched: {result}")
    return result


def test_every_feature_has_an_expectation():
    assert set(SINCE) == set(compat.FEATURE_KEYS)


@pytest.mark.parametrize("version", compat.RELEASES)
def test_the_worker_has_a_weight_push_path(version):
    status, detail = compat.worker_path({k: f.present for k, f in findings(version).items()})
    if version in UNSUPPORTED:
        assert status == compat.UNSUPPORTED and detail.startswith("unsupported release: ")
        assert UNSUPPORTED[version] in detail
        return
    assert status == compat.SUPPORTED, f"vllm {version}: {detail}"
    expected = (
        compat.PUSH_RELOAD_WEIGHTS
        if _v(version) >= _v("0.16.0")
        else compat.PUSH_RUNNER_LOAD_WEIGHTS
    )
    assert detail == (expected, compat.PUSH_RESET)


@pytest.mark.parametrize("version", compat.RELEASES)
def test_workers_in_other_processes_get_the_folder_push_from_0_16(version):
    status, detail = compat.worker_path(
        {k: f.present for k, f in findings(version).items()}, multiprocess=True
    )
    if _v(version) >= _v("0.16.0"):
        assert (status, detail) == (
            compat.SUPPORTED,
            (compat.PUSH_RELOAD_FROM_FOLDER, compat.PUSH_RESET),
        )
    else:
        assert status == compat.UNSUPPORTED and "takes no weights_path" in detail


@pytest.mark.parametrize("version", compat.RELEASES)
def test_features_are_where_the_source_has_them(version):
    found = findings(version)
    wrong = {
        key: f"expected {'present' if _v(version) >= _v(since) else 'absent'}, read {found[key]}"
        for key, since in SINCE.items()
        if found[key].present != (_v(version) >= _v(since))
    }
    assert not wrong, f"vllm {version}: {wrong}"


@pytest.mark.parametrize("version", compat.RELEASES)
def test_every_effective_setting_has_a_path(version):
    found = findings(version)
    missing = {k.removeprefix(compat.SETTING_PREFIX): f.note for k, f in found.items()
               if k.startswith(compat.SETTING_PREFIX) and not f.present}  # fmt: skip
    expected = {name for name, since in SETTING_SINCE.items() if _v(version) < _v(since)}
    assert set(missing) == expected, f"vllm {version}: settings no worker path reaches: {missing}"


# gate/worker/model_runner.py's rule, release by release: VllmConfig.use_v2_model_runner decides per
# engine from 0.22 to 0.33; 0.34 has no V1 runner left.
V2_DECIDED_PER_ENGINE = ("0.22.1", "0.33.0")
V1_REMOVED = "0.34.0"


@pytest.mark.parametrize("version", compat.RELEASES)
def test_the_model_runner_rule_matches_the_source(version):
    findings(version)  # skips where the wheel could not be fetched
    root = vllm_source.ensure_source(version)
    decides = any(
        "def use_v2_model_runner" in path.read_text(encoding="utf-8")
        for path in (root / "vllm" / "config").rglob("*.py")
    )
    first, last = (_v(v) for v in V2_DECIDED_PER_ENGINE)
    assert decides == (first <= _v(version) <= last)
    has_v1 = (root / "vllm" / "v1" / "worker" / "gpu_model_runner.py").is_file()
    assert has_v1 == (_v(version) < _v(V1_REMOVED))
    if _v(version) >= _v(V1_REMOVED):
        assert (root / "vllm" / "v1" / "worker" / "gpu" / "model_runner.py").is_file()


# What a request sent during an abort or wait pause meets (gate.worker.inflight_server's pause
# contract): queued until resume up to 0.32; from 0.33 EngineCoreProc._reject_add_while_paused ends it
# with a retryable RequestError("engine_paused"), which the server streams as HTTP 503.
PAUSE_REJECTS_SINCE = "0.33.0"


@pytest.mark.parametrize("version", compat.RELEASES)
def test_requests_sent_during_a_pause_are_turned_away_from_0_33(version):
    findings(version)  # skips where the wheel could not be fetched
    tree = vllm_source.SourceTree(vllm_source.ensure_source(version))
    found = tree.method("EngineCoreProc", "_reject_add_while_paused")
    assert (found is not None) == (_v(version) >= _v(PAUSE_REJECTS_SINCE))
    if found is None:
        return
    body = ast.unparse(found[1])
    assert "code='engine_paused'" in body and "retryable=True" in body
    error = tree.find("RetryableRequestError")
    assert error is not None and "HTTPStatus.SERVICE_UNAVAILABLE" in ast.unparse(error.node)


def test_the_0_34_reload_keeps_the_keywords_the_worker_passes():
    """0.34 refactored reload (model_loader/reload/): Worker.reload_weights now names its
    arguments, and the third, is_checkpoint_format, defaults to True (HF names: what gate pushes)."""
    findings("0.34.0")
    tree = vllm_source.SourceTree(vllm_source.ensure_source("0.34.0"))
    found = tree.method("Worker", "reload_weights")
    assert found is not None
    args = found[1].args
    names = [a.arg for a in args.args]
    assert names == ["self", "weights_iterator", "weights_path", "is_checkpoint_format"]
    assert ast.unparse(args.defaults[-1]) == "True" and args.kwarg is None
