"""Content fingerprints of models, so a run and a baseline can prove they used the same weights."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from gate.models import PROVENANCE_FILE
from gate.promptset import sha256_file

# Above this, hashing every byte of a checkpoint costs minutes; sample instead and say so.
FULL_HASH_LIMIT = 2 << 30
_SAMPLE = 1 << 20


def model_fingerprint(model: str) -> dict:
    """``{"sha256": ..., "method": ...}`` for a local folder; hub ids are recorded as given."""
    folder = Path(model)
    if not folder.is_dir():
        return {"sha256": None, "method": "hub-id (not hashed)"}
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != "SHA256SUMS")
    total = sum(p.stat().st_size for p in files)
    digest = hashlib.sha256()
    full = total <= FULL_HASH_LIMIT
    for p in files:
        digest.update(str(p.relative_to(folder)).encode() + b"\0")
        digest.update(sha256_file(p).encode() if full else _sampled_hash(p).encode())
    found = {
        "sha256": digest.hexdigest(),
        "method": "sha256 of every file" if full else "sha256 of size + first/last MiB per file",
        "bytes": total,
    }
    # A built-in model's folder says where it came from (gate.models): package, GGUF, converter.
    provenance = folder / PROVENANCE_FILE
    if provenance.is_file():
        found["provenance"] = json.loads(provenance.read_text(encoding="utf-8"))
    return found


def _sampled_hash(path: Path) -> str:
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as fh:
        digest.update(fh.read(_SAMPLE))
        fh.seek(max(0, size - _SAMPLE))
        digest.update(fh.read(_SAMPLE))
    return digest.hexdigest()
