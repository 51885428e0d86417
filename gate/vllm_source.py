"""Read what a vLLM release offers the worker from its source, without installing or importing it.

The CUDA wheel of each release is downloaded once (``pip download --no-deps``, ~500 MB), the few
source files the checks read are extracted into a compact cache, and the wheel is deleted:

    $GATE_CACHE_DIR/vllm-source/<version>/vllm/...   (default ~/.cache/gate; ~2 MB a release)
    $GATE_CACHE_DIR/vllm-source/<version>/MANIFEST.json

:func:`check_release` then answers every feature of :mod:`gate.compat` by reading the source with
``ast``: classes are found by name in the tree (files move between releases), methods and
attributes through the class's bases, and the worker's effective-setting paths hop by hop through
the config classes. Standard library only.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from gate import compat, host
from gate.files import recover_swap, staged_folder
from gate.promptset import sha256_file

REPO_WORKER_ENGINE = Path(__file__).resolve().parent / "worker" / "engine.py"

# Classes the checks read, with the file each one lives in today. A class found elsewhere is taken
# when its definition is the only one in the tree (several releases define e.g. a V0 and a V1
# ``Worker``; the hint picks the V1 GPU one).
CLASS_HINTS: dict[str, tuple[str, ...]] = {
    "LLM": ("vllm/entrypoints/llm.py",),
    "LLMEngine": (
        "vllm/v1/engine/llm_engine.py",
    ),  # the V1 engine, what llm.llm_engine is from 0.10
    "EngineArgs": ("vllm/engine/arg_utils.py",),
    "SamplingParams": ("vllm/sampling_params.py",),
    "Worker": ("vllm/v1/worker/gpu_worker.py",),
    "GPUModelRunner": ("vllm/v1/worker/gpu_model_runner.py",),
    # what a request sent during a pause meets (the in-flight probe's pause contract)
    "EngineCoreProc": ("vllm/v1/engine/core.py",),
    "RetryableRequestError": ("vllm/exceptions.py",),
}
CONFIG_DIRS = ("vllm/config/", "vllm/config.py")  # every config class; kept whole
# Bumped whenever what is kept changes: older cache entries are then fetched again.
CACHE_FORMAT = 2
DOWNLOAD_TIMEOUT_S = 900


class FetchError(RuntimeError):
    """The release's wheel could not be downloaded or read (network, registry, disk)."""


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """``$GATE_VLLM_SOURCE_DIR``, else ``<gate cache>/vllm-source``.

    Its own variable, so a CI run whose gate cache starts empty can still keep this one (released
    sources never change) on the machine.
    """
    if cache_dir is not None:
        return Path(cache_dir or host.cache_root()) / "vllm-source"
    return host.settings().vllm_source_dir


def cached_source(version: str, cache_dir: str | os.PathLike | None = None) -> Path | None:
    """The release's extracted source when the cache holds it in the current format, else None."""
    root = cache_root(cache_dir) / version
    recover_swap(root)
    try:
        manifest = json.loads((root / "MANIFEST.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return (
        root
        if manifest.get("format") == CACHE_FORMAT and manifest.get("version") == version
        else None
    )


def ensure_source(version: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """The release's extracted source, downloaded and extracted first when not cached.

    Raises FetchError when the wheel cannot be downloaded or read.
    """
    found = cached_source(version, cache_dir)
    if found is not None:
        return found
    parent = cache_root(cache_dir)
    parent.mkdir(parents=True, exist_ok=True)
    dest = parent / version
    with (
        tempfile.TemporaryDirectory(prefix=f".{version}-", dir=parent) as tmp,
        staged_folder(dest) as staged,
    ):
        wheel = _download_wheel(version, Path(tmp) / "wheel")
        files = _extract(wheel, staged)
        manifest = {
            "format": CACHE_FORMAT,
            "version": version,
            "wheel": wheel.name,
            "wheel_sha256": sha256_file(wheel),
            "files": files,
        }
        (staged / "MANIFEST.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
        wheel.unlink()  # 500 MB: gone before the next release is fetched
        if cached_source(version, cache_dir) is not None:  # another process finished first
            shutil.rmtree(staged)  # keep its folder (a stale format is replaced)
    return dest


def ensure_sources(
    versions: Iterable[str], cache_dir: str | os.PathLike | None = None, workers: int = 4
) -> dict[str, Path | FetchError]:
    """:func:`ensure_source` for several releases, ``workers`` downloads at a time: a cold cache
    is network-bound (24 wheels of ~500 MB), not CPU-bound. A release that cannot be fetched maps
    to its FetchError; the others are still fetched."""

    def one(version: str) -> Path | FetchError:
        try:
            path = ensure_source(version, cache_dir)
        except FetchError as exc:
            print(f"[vllm-source] {version}: {exc}", file=sys.stderr, flush=True)
            return exc
        print(f"[vllm-source] {version}: {path}", file=sys.stderr, flush=True)
        return path

    wanted = list(dict.fromkeys(versions))
    found: dict[str, Path | FetchError] = {}
    for version in wanted:
        if (path := cached_source(version, cache_dir)) is not None:
            found[version] = path
    missing = [v for v in wanted if v not in found]
    if missing:
        print(
            f"[vllm-source] fetching {len(missing)} release(s) into {cache_root(cache_dir)}, "
            f"{workers} at a time: {' '.join(missing)}",
            file=sys.stderr,
            flush=True,
        )
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            found |= dict(zip(missing, pool.map(one, missing), strict=True))
    return {v: found[v] for v in wanted}


def _download_wheel(version: str, into: Path) -> Path:
    # --no-cache-dir: pip's HTTP cache would keep every 500 MB wheel. --python-version: old releases
    # cap Requires-Python; the .py files read here do not depend on the interpreter that fetches them.
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--no-cache-dir",
        "--python-version",
        "3.12",
        "--disable-pip-version-check",
        "--quiet",
        f"vllm=={version}",
        "-d",
        str(into),
    ]
    try:
        proc = subprocess.run(
            cmd, check=False, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        raise FetchError(f"pip download vllm=={version} took over {DOWNLOAD_TIMEOUT_S} s") from None
    wheels = sorted(into.glob("vllm-*.whl")) if into.is_dir() else []
    if proc.returncode != 0 or len(wheels) != 1:
        tail = "\n".join(
            line for line in (proc.stderr or proc.stdout).splitlines() if "is ignored" not in line
        )
        raise FetchError(
            f"pip download vllm=={version} failed (exit {proc.returncode}): {tail[-1500:].strip()}"
        )
    return wheels[0]


# Files defining a class the checks read, wherever the release keeps it. Methods are looked up
# through the class and its bases, so a method's own file needs no pattern.
_KEEP_RE = re.compile(rb"^class\s+(?:" + "|".join(CLASS_HINTS).encode() + rb")\b", re.MULTILINE)


def _extract(wheel: Path, dest: Path) -> list[str]:
    """Extract the files the checks read, then the files defining the classes those refer to."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            sources = {
                n: zf.read(n) for n in zf.namelist() if n.startswith("vllm/") and n.endswith(".py")
            }
    except (OSError, zipfile.BadZipFile) as exc:
        raise FetchError(f"{wheel.name}: cannot read the wheel: {exc}") from None
    keep = {n for n, text in sources.items() if n.startswith(CONFIG_DIRS) or _KEEP_RE.search(text)}
    # Inherited methods and attributes need the base classes' files (e.g. WorkerBase), and the
    # model_runner.model check the classes that wrap the model (e.g. CUDAGraphWrapper).
    defined = {name for n in keep for name in _class_names(sources[n])}
    pending = {b for n in keep for b in _referenced_classes(sources[n])} - defined
    while pending:
        name = pending.pop()
        pattern = re.compile(rb"^class\s+" + re.escape(name.encode()) + rb"\b", re.MULTILINE)
        for n in sorted(sources.keys() - keep):
            if pattern.search(sources[n]):
                keep.add(n)
                defined |= set(_class_names(sources[n]))
                pending |= set(_referenced_classes(sources[n])) - defined
    for n in keep:
        path = dest / n
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(sources[n])
    return sorted(keep)


def _class_names(text: bytes) -> list[str]:
    return [m.decode() for m in re.findall(rb"^class\s+(\w+)", text, re.MULTILINE)]


def _referenced_classes(text: bytes) -> set[str]:
    """Base classes of the module's top-level classes, and classes called in ``self.model = X(...)``."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return set()
    names = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names |= {_dotted(b).rsplit(".", 1)[-1] for b in node.bases if _dotted(b)}
            names |= {
                w
                for sub in ast.walk(node)
                if isinstance(sub, ast.Assign) and (w := _model_wrapper(sub))
            }
    return names


def _model_wrapper(node: ast.Assign) -> str | None:
    """``X`` in ``self.model = X(...)``: a class the model runner wraps its model in."""
    if (
        _self_target(node, "model") is not None
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
    ):
        return node.value.func.id
    return None


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else ""
    if isinstance(node, ast.Subscript):  # Generic[T], Base[...]
        return _dotted(node.value)
    return ""


# --------------------------------------------------------------------------------------------
# Static checks


@dataclass(frozen=True)
class Finding:
    present: bool
    where: str  # "path:line" of the definition that decided it, or "" when absent
    note: str = ""  # why absent; for a setting found, the path that resolved


@dataclass
class ClassInfo:
    name: str
    path: str
    node: ast.ClassDef

    @property
    def where(self) -> str:
        return f"{self.path}:{self.node.lineno}"


class SourceTree:
    """The classes of one release's extracted source, by name."""

    def __init__(self, root: Path):
        self.root = root
        self.classes: dict[str, list[ClassInfo]] = {}
        for file in sorted(root.rglob("*.py")):
            rel = file.relative_to(root).as_posix()
            tree = ast.parse(file.read_bytes(), filename=rel)
            for node in tree.body:
                if isinstance(node, ast.ClassDef):
                    self.classes.setdefault(node.name, []).append(ClassInfo(node.name, rel, node))

    def find(self, name: str) -> ClassInfo | None:
        candidates = self.classes.get(name, [])
        for hint in CLASS_HINTS.get(name, ()) + CONFIG_DIRS:
            for c in candidates:
                if c.path == hint or (hint.endswith("/") and c.path.startswith(hint)):
                    return c
        return candidates[0] if len(candidates) == 1 else None

    def mro(self, cls: ClassInfo) -> list[ClassInfo]:
        """The class and its bases found in the tree, depth first (enough for single inheritance chains)."""
        out, stack, seen = [], [cls], set()
        while stack:
            c = stack.pop(0)
            if c.where in seen:
                continue
            seen.add(c.where)
            out.append(c)
            for base in c.node.bases:
                found = self.find(_dotted(base).rsplit(".", 1)[-1]) if _dotted(base) else None
                if found is not None:
                    stack.append(found)
        return out

    def method(
        self, cls_name: str, name: str
    ) -> tuple[ClassInfo, ast.FunctionDef | ast.AsyncFunctionDef] | None:
        cls = self.find(cls_name)
        if cls is None:
            return None
        for c in self.mro(cls):
            for node in c.node.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                    return c, node
        return None

    def attribute(
        self, cls_name: str, name: str
    ) -> tuple[ClassInfo, ast.stmt, ast.expr | None] | None:
        """Where ``name`` becomes an attribute of instances of the class: (class, node, annotation).

        A class-body field (dataclass, pydantic, msgspec; not an InitVar), a method or property, or a
        ``self.name = ...`` in any method.
        """
        cls = self.find(cls_name)
        if cls is None:
            return None
        for c in self.mro(cls):
            for node in c.node.body:
                if (
                    isinstance(node, ast.AnnAssign)
                    and isinstance(node.target, ast.Name)
                    and node.target.id == name
                ):
                    if "InitVar" not in ast.unparse(node.annotation):
                        return c, node, node.annotation
                elif isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == name for t in node.targets
                ):
                    return c, node, None
                elif (
                    isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name
                ):
                    return c, node, node.returns
            for walked in ast.walk(c.node):
                if isinstance(walked, _ASSIGNMENTS) and _self_target(walked, name) is not None:
                    annotation = walked.annotation if isinstance(walked, ast.AnnAssign) else None
                    return c, walked, annotation
        return None


_ASSIGNMENTS = (ast.Assign, ast.AnnAssign, ast.AugAssign)


def _self_target(
    node: ast.Assign | ast.AnnAssign | ast.AugAssign, name: str
) -> ast.Attribute | None:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    for t in targets:
        for sub in ast.walk(t):  # tuple unpacking: self.a, self.b = ...
            if (
                isinstance(sub, ast.Attribute)
                and sub.attr == name
                and isinstance(sub.value, ast.Name)
                and sub.value.id == "self"
            ):
                return sub
    return None


def _where(cls: ClassInfo, node: ast.stmt) -> str:
    return f"{cls.path}:{node.lineno}"


def worker_setting_paths(
    engine_py: Path = REPO_WORKER_ENGINE,
) -> dict[str, tuple[str, ...]]:
    """The worker's effective-setting table (``_SETTINGS`` in gate/worker/engine.py), read without importing it."""
    tree = ast.parse(engine_py.read_text(encoding="utf-8"))
    target: ast.expr
    for node in tree.body:
        if isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        elif isinstance(node, ast.Assign):
            target, value = node.targets[0], node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id == "_SETTINGS" and value is not None:
            return {k: tuple(v) for k, v in ast.literal_eval(value).items()}
    raise LookupError(
        f"{engine_py}: no _SETTINGS table; the compatibility check follows the worker's own paths"
    )


def _config_class(hop: str, annotation: ast.expr | None, tree: SourceTree) -> str | None:
    """The class an attribute hop leads to: its annotation's class where it names one, else by convention."""
    if annotation is not None:
        names = [n.id for n in ast.walk(annotation) if isinstance(n, ast.Name)]
        names += [
            n.value
            for n in ast.walk(annotation)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
        ]
        for name in names:
            if name.endswith("Config") and tree.find(name) is not None:
                return name
    conventional = "".join(
        part.capitalize() for part in hop.split("_")
    )  # vllm_config -> VllmConfig
    return conventional if tree.find(conventional) is not None else None


def resolve_path(tree: SourceTree, root_class: str, path: str) -> Finding:
    """Whether ``root.a.b.c`` names attributes that exist, hop by hop (the worker's getattr chain)."""
    cls_name = root_class
    hops = path.split(".")
    where = ""
    for i, hop in enumerate(hops):
        found = tree.attribute(cls_name, hop)
        if found is None:
            return Finding(False, "", f"{cls_name} has no attribute {hop!r}")
        cls, node, annotation = found
        where = _where(cls, node)
        if i + 1 < len(hops):
            nxt = _config_class(hop, annotation, tree)
            if nxt is None:
                return Finding(False, where, f"cannot tell the class of {cls_name}.{hop}")
            cls_name = nxt
    return Finding(True, where)


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    a = fn.args
    return [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]


def _reload_accepts_iterator(tree: SourceTree) -> Finding:
    """Worker.reload_weights(weights_iterator=...), following a ``*args, **kwargs`` forward to the runner."""
    return _reload_accepts(tree, "weights_iterator")


def _reload_accepts(tree: SourceTree, keyword: str) -> Finding:
    """Worker.reload_weights(<keyword>=...), following a ``*args, **kwargs`` forward to the runner."""
    cls_name = "Worker"
    for _ in range(3):  # Worker -> GPUModelRunner; a longer chain would be new and worth a look
        found = tree.method(cls_name, "reload_weights")
        if found is None:
            return Finding(False, "", f"{cls_name}.reload_weights is missing")
        cls, fn = found
        where = _where(cls, fn)
        if keyword in _params(fn):
            return Finding(True, where)
        if fn.args.kwarg is None:
            return Finding(
                False,
                where,
                f"{cls.name}.reload_weights({', '.join(_params(fn))}) takes no {keyword}",
            )
        target = _forward_target(fn)
        if target is None:
            return Finding(
                False,
                where,
                f"{cls.name}.reload_weights(**kwargs) does not forward to a known runner",
            )
        cls_name = target
    return Finding(False, "", "reload_weights forwards too deep to follow")


# ``self.<attr>.<same method>(..., **kwargs)`` inside a forwarding method -> the attribute's class.
FORWARD_CLASSES = {"model_runner": "GPUModelRunner"}


def _forward_target(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    for node in ast.walk(fn):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == fn.name
            and isinstance(node.func.value, ast.Attribute)
            and isinstance(node.func.value.value, ast.Name)
            and node.func.value.value.id == "self"
            and any(k.arg is None for k in node.keywords)
        ):
            return FORWARD_CLASSES.get(node.func.value.attr)
    return None


def _runner_model_load_weights(tree: SourceTree) -> Finding:
    """worker.model_runner.model.load_weights: the attributes exist and wrappers forward attributes."""
    runner = tree.attribute("Worker", "model_runner")
    if runner is None:
        return Finding(False, "", "Worker has no model_runner")
    gpu_runner = tree.find("GPUModelRunner")
    model = tree.attribute("GPUModelRunner", "model")
    if gpu_runner is None or model is None:  # no class: no attribute either
        return Finding(False, _where(runner[0], runner[1]), "GPUModelRunner has no model attribute")
    # self.model = Wrapper(self.model, ...): load_weights must still reach the wrapped model.
    for runner_cls in tree.mro(gpu_runner):
        for node in ast.walk(runner_cls.node):
            if not isinstance(node, ast.Assign):
                continue
            wrapper = _model_wrapper(node)
            if wrapper is None:
                continue
            where = f"{runner_cls.path}:{node.lineno}"
            if tree.find(wrapper) is None:
                if not wrapper[
                    :1
                ].isupper():  # a function returning the model (get_model()), not a wrapper
                    continue
                return Finding(
                    False,
                    where,
                    f"GPUModelRunner may wrap its model in {wrapper}, not in the source",
                )
            if (
                tree.method(wrapper, "__getattr__") is None
                and tree.method(wrapper, "load_weights") is None
            ):
                return Finding(
                    False,
                    where,
                    f"GPUModelRunner wraps its model in {wrapper}, which forwards no load_weights",
                )
    return Finding(True, _where(model[0], model[1]))


def _method(tree: SourceTree, cls_name: str, name: str) -> Finding:
    found = tree.method(cls_name, name)
    if found is None:
        return Finding(
            False,
            "",
            f"{cls_name}.{name} is missing" if tree.find(cls_name) else f"no class {cls_name}",
        )
    return Finding(True, _where(*found))


def _collective_rpc(tree: SourceTree) -> Finding:
    found = tree.method("LLM", "collective_rpc")
    if found is None:
        return Finding(False, "", "LLM.collective_rpc is missing")
    cls, fn = found
    method = next((p for p in fn.args.args + fn.args.kwonlyargs if p.arg == "method"), None)
    annotation = (
        ast.unparse(method.annotation)
        if method is not None and method.annotation is not None
        else ""
    )
    if "Callable" not in annotation:
        return Finding(
            False,
            _where(cls, fn),
            f"LLM.collective_rpc's method is typed {annotation or 'untyped'}, not a callable",
        )
    return Finding(True, _where(cls, fn))


def _field(tree: SourceTree, cls_name: str, name: str) -> Finding:
    found = tree.attribute(cls_name, name)
    if found is None:
        return Finding(False, "", f"{cls_name} has no field {name}")
    return Finding(True, _where(found[0], found[1]))


def check_tree(
    tree: SourceTree, settings: dict[str, tuple[str, ...]] | None = None
) -> dict[str, Finding]:
    """Every feature of gate.compat (plus ``setting.<name>`` per effective setting) for one release."""
    settings = worker_setting_paths() if settings is None else settings
    out = {
        compat.COLLECTIVE_RPC: _collective_rpc(tree),
        compat.RESET_PREFIX_CACHE: _method(tree, "LLM", "reset_prefix_cache"),
        compat.DEFAULT_SAMPLING_PARAMS: _method(tree, "LLM", "get_default_sampling_params"),
        compat.DIFF_SAMPLING_PARAM: _method(tree, "ModelConfig", "get_diff_sampling_param"),
        compat.LOGPROBS_MODE: _field(tree, "EngineArgs", "logprobs_mode"),
        compat.FLAT_LOGPROBS: _field(tree, "SamplingParams", "flat_logprobs"),
        compat.RELOAD_WEIGHTS: _method(tree, "Worker", "reload_weights"),
        compat.RELOAD_WEIGHTS_ITERATOR: _reload_accepts_iterator(tree),
        compat.RELOAD_WEIGHTS_PATH: _reload_accepts(tree, "weights_path"),
        compat.RUNNER_LOAD_WEIGHTS: _runner_model_load_weights(tree),
        compat.WT_INIT: _method(tree, "Worker", "init_weight_transfer_engine"),
        compat.WT_START: _method(tree, "Worker", "start_weight_update"),
        compat.WT_UPDATE: _method(tree, "Worker", "update_weights"),
        compat.WT_FINISH: _method(tree, "Worker", "finish_weight_update"),
    }
    assert set(out) == set(compat.FEATURE_KEYS), "check_tree and gate.compat.FEATURES disagree"
    for name, paths in settings.items():
        findings = [(p, resolve_path(tree, "LLMEngine", p)) for p in paths]
        hit = next(((p, f) for p, f in findings if f.present), None)
        if hit is not None:
            out[compat.SETTING_PREFIX + name] = Finding(True, hit[1].where, hit[0])
        else:
            out[compat.SETTING_PREFIX + name] = Finding(
                False, "", "; ".join(f"{p}: {f.note}" for p, f in findings)
            )
    return out


def check_release(
    root: Path, settings: dict[str, tuple[str, ...]] | None = None
) -> dict[str, Finding]:
    return check_tree(SourceTree(root), settings)


def main(argv: list[str] | None = None) -> int:
    """``python -m gate.vllm_source [VERSION ...]``: fill the source cache (every release of
    gate.compat.RELEASES by default). Exit 0 even where a release could not be fetched: the
    compatibility test skips it with the reason; exit 1 only when none could."""
    versions = (argv if argv is not None else sys.argv[1:]) or list(compat.RELEASES)
    found = ensure_sources(versions)
    return 1 if all(isinstance(v, FetchError) for v in found.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
