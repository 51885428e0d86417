"""The engine-environment installers: pip's settings read as pip reads them, carried over to uv.

The end-to-end cases install real (tiny, locally made) wheels with real uv and real pip from a
local wheel folder and a local PEP 503 index, through a pip.conf, and check both resolve alike.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gate import config as gate_config
from gate.runners import venv_build as vb
from tests.factory import make_wheel


def test_installer_vocabulary_is_the_configs():
    assert vb.INSTALLERS == gate_config.INSTALLERS


def test_pip_settings_follow_pips_override_order(tmp_path):
    global_conf = tmp_path / "global.conf"
    global_conf.write_text("[global]\nindex-url = https://global.example/simple\nfind-links = /a /b\n"
                           "[install]\nconstraint = /c.txt\n[download]\nno-index = true\n")  # fmt: skip
    user_conf = tmp_path / "user.conf"
    user_conf.write_text("[global]\nindex-url = https://user.example/simple\n")
    env = {
        "PIP_FIND_LINKS": "/env-wheels",
        "PIP_TRUSTED_HOST": "mirror.local",
        "PIP_CONFIG_FILE": "/x",
    }
    settings = vb.pip_settings(env, files=[global_conf, user_conf])
    assert settings == {
        "index-url": "https://user.example/simple",  # a later file wins
        "find-links": "/env-wheels",  # PIP_* variables win over every file
        "constraint": "/c.txt",  # [install] applies to pip install
        "trusted-host": "mirror.local",
    }  # [download] does not, and PIP_CONFIG_FILE names a file, not a setting


def test_pip_config_file_devnull_loads_no_file(tmp_path):
    assert vb.pip_config_files({"PIP_CONFIG_FILE": os.devnull, "HOME": str(tmp_path)}) == []
    files = vb.pip_config_files(
        {"PIP_CONFIG_FILE": str(tmp_path / "mine.conf"), "HOME": str(tmp_path)}
    )
    assert files[-1] == tmp_path / "mine.conf"
    assert (
        tmp_path / ".pip" / "pip.conf" in files
    )  # the named file does not exist: user files still load


def test_uv_args_carry_indexes_links_constraints_and_tls():
    settings = {
        "index-url": "https://idx.example/simple",
        "extra-index-url": "file:///opt/a\nfile:///opt/b",
        "find-links": "/w1 /w2",
        "constraint": "/etc/c.txt",
        "trusted-host": "h1 h2",
        "cert": "/etc/ca.pem",
        "default-timeout": "180",
        "no-index": "false",
        "disable-pip-version-check": "1",
        "src": "/somewhere",
    }
    logged: list[str] = []
    args, env = vb.uv_install_args(settings, (), log=logged.append)
    assert args == ["--index-strategy", "unsafe-best-match",
                    "--index-url", "https://idx.example/simple",
                    "--extra-index-url", "file:///opt/a", "--extra-index-url", "file:///opt/b",
                    "--find-links", "/w1", "--find-links", "/w2",
                    "--constraint", "/etc/c.txt",
                    "--allow-insecure-host", "h1", "--allow-insecure-host", "h2"]  # fmt: skip
    assert env["SSL_CERT_FILE"] == "/etc/ca.pem" and env["UV_HTTP_TIMEOUT"] == "180"
    assert logged == [
        "pip setting(s) without a uv equivalent, not applied: src (installer: pip applies them)"
    ]


def test_explicit_pip_args_win_over_settings():
    args, _ = vb.uv_install_args(
        {"index-url": "https://conf/simple", "find-links": "/w"},
        ("--index-url=https://mine/simple",),
    )
    assert "https://conf/simple" not in args and args[-2:] == ["--find-links", "/w"]
    assert vb.translate_pip_args(("--pre", "--trusted-host", "h", "--no-deps")) == [
        "--prerelease", "allow", "--allow-insecure-host", "h", "--no-deps"]  # fmt: skip


def test_installer_choice(monkeypatch):
    monkeypatch.setattr(vb, "find_uv", lambda: None)
    assert vb.resolve_installer("auto") is None  # falls back to pip
    with pytest.raises(vb.VenvBuildError, match="uv is not installed"):
        vb.resolve_installer("uv")
    with pytest.raises(vb.VenvBuildError, match="expected one of"):
        vb.resolve_installer("conda")
    monkeypatch.setattr(vb, "find_uv", lambda: "/opt/uv")
    assert vb.resolve_installer("auto") == "/opt/uv" and vb.resolve_installer("pip") is None


# -- real installs from a local wheel folder and a local index ----------------------------------


def _index(root: Path, wheels: list[Path], project: str) -> str:
    """A PEP 503 simple index on disk; returns its file:// URL."""
    page = root / "simple" / project
    page.mkdir(parents=True)
    links = "".join(f'<a href="{w.as_uri()}">{w.name}</a>\n' for w in wheels)
    (page / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    return (root / "simple").as_uri()


@pytest.fixture
def local_packages(tmp_path):
    """gatepkg 1.0 in a find-links folder, 2.0 on a local index, a constraint file that caps it below 2."""
    links = tmp_path / "wheels"
    make_wheel(links, "gatepkg", "1.0")
    index_url = _index(
        tmp_path / "index", [make_wheel(tmp_path / "index-wheels", "gatepkg", "2.0")], "gatepkg"
    )
    constraint = tmp_path / "constraints.txt"
    constraint.write_text("gatepkg<2\n")
    return links, index_url, constraint


def _install(tmp_path: Path, installer: str, conf: Path) -> str:
    """Install gatepkg with ``installer`` under pip.conf ``conf``; returns the version it got."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    env |= {"PIP_CONFIG_FILE": str(conf), "UV_CACHE_DIR": str(tmp_path / "uv-cache")}
    target = tmp_path / f"venv-{installer}"
    if installer == "uv":
        uv = vb.find_uv()
        args, uv_env = vb.uv_install_args(vb.pip_settings(env), ())
        subprocess.run(
            [uv, "venv", "-q", "--python", sys.executable, str(target)],
            env=env | uv_env,
            check=True,
        )
        cmd = [uv, "pip", "install", "--python", str(target / "bin" / "python"), *args, "gatepkg"]
        subprocess.run(cmd, env=env | uv_env, check=True, capture_output=True)
    else:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)], check=True)
        site = subprocess.run([str(target / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", site, "gatepkg"],
                       env=env, check=True, capture_output=True)  # fmt: skip
    out = subprocess.run([str(target / "bin" / "python"), "-c", "import gatepkg; print(gatepkg.VERSION)"],
                         capture_output=True, text=True, check=True)  # fmt: skip
    return out.stdout.strip()


@pytest.mark.skipif(
    vb.find_uv() is None, reason="uv is a dependency of gate; this environment lacks it"
)
@pytest.mark.parametrize("constrained", [False, True], ids=["best-match", "constrained"])
def test_uv_resolves_like_pip_under_the_same_pip_conf(tmp_path, local_packages, constrained):
    links, index_url, constraint = local_packages
    conf = tmp_path / "pip.conf"
    lines = ["[global]", f"index-url = {index_url}", f"find-links = {links}"]
    conf.write_text(
        "\n".join(lines + ([f"constraint = {constraint}"] if constrained else [])) + "\n"
    )
    expected = (
        "1.0" if constrained else "2.0"
    )  # pip takes the best version across index and find-links
    assert _install(tmp_path, "pip", conf) == expected
    assert _install(tmp_path, "uv", conf) == expected


@pytest.mark.skipif(
    vb.find_uv() is None, reason="uv is a dependency of gate; this environment lacks it"
)
def test_uv_honours_no_index_with_find_links(tmp_path, local_packages):
    links, index_url, _ = local_packages
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\nindex-url = {index_url}\nfind-links = {links}\nno-index = true\n")
    assert _install(tmp_path, "pip", conf) == "1.0"
    assert _install(tmp_path, "uv", conf) == "1.0"


def test_bytecode_is_compiled_once_per_shared_source_file(tmp_path):
    """What an engine imports is compiled by importing it, nothing else; two venvs sharing a
    hard-linked source share its .pyc; a file of their own gets its own."""
    old, new = tmp_path / "old", tmp_path / "new"
    site = {}
    for venv in (old, new):
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        site[venv] = Path(
            subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           capture_output=True, text=True, check=True).stdout.strip()
        )  # fmt: skip
        (site[venv] / "pkg").mkdir()
        (site[venv] / "pkg" / "__init__.py").write_text("")
        (site[venv] / "pkg" / "unused.py").write_text("VALUE = 0\n")
    (site[old] / "pkg" / "shared.py").write_text("VALUE = 1\n")
    os.link(site[old] / "pkg" / "shared.py", site[new] / "pkg" / "shared.py")
    (site[old] / "pkg" / "own.py").write_text("VALUE = 'old'\n")
    (site[new] / "pkg" / "own.py").write_text("VALUE = 'new'\n")
    logged: list[str] = []
    modules = ("pkg.shared", "pkg.own", "pkg.not_in_this_release")
    # no vllm here: no versions read, so the build probes them itself (and fails with the error)
    assert vb.compile_bytecode(old, logged.append, modules=modules) == {}
    assert vb._compiled_siblings(new) == [old]  # old's bytecode is complete: new may share it
    vb.compile_bytecode(new, logged.append, share_from=[old], modules=modules)
    tag = sys.implementation.cache_tag
    pyc = {
        v: {p.name: p for p in (site[v] / "pkg" / "__pycache__").glob("*.pyc")} for v in (old, new)
    }
    expected = {f"__init__.{tag}.pyc", f"shared.{tag}.pyc", f"own.{tag}.pyc"}
    assert set(pyc[old]) == set(pyc[new]) == expected  # unused.py: never imported, not compiled
    assert os.path.samefile(pyc[old][f"shared.{tag}.pyc"], pyc[new][f"shared.{tag}.pyc"])
    assert not os.path.samefile(pyc[old][f"own.{tag}.pyc"], pyc[new][f"own.{tag}.pyc"])
    assert logged == ["1 .pyc files shared with old"]
    # The shared .pyc is valid for the new venv's path: importing there uses it and reads its source's values.
    out = subprocess.run([str(new / "bin" / "python"), "-B", "-c", "import pkg.shared, pkg.own; print(pkg.shared.__file__, pkg.own.VALUE)"],
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert out.stdout.split() == [str(site[new] / "pkg" / "shared.py"), "new"]


def test_index_credentials_from_pip_conf_never_reach_logs_or_the_stamp(tmp_path):
    args, _ = vb.uv_install_args({"index-url": "https://user:s3cret@idx.example/simple",
                                  "extra-index-url": "https://tok@extra.example/simple file:///opt/x"}, ())  # fmt: skip
    assert "https://user:s3cret@idx.example/simple" in args  # uv needs them to install
    redacted = [vb.redact_credentials(a) for a in args]
    assert (
        "https://***@idx.example/simple" in redacted
        and "https://***@extra.example/simple" in redacted
    )
    assert not any("s3cret" in a or "tok@" in a for a in redacted)
    assert "file:///opt/x" in redacted  # no credentials: unchanged
    log = tmp_path / "install.log"
    vb.run_plain([sys.executable, "-c", "pass", "--index-url", "https://user:s3cret@idx.example/simple"], dict(os.environ),
                 log, "probe", None)  # fmt: skip
    assert "s3cret" not in log.read_text() and "https://***@idx.example/simple" in log.read_text()
