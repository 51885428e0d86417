"""The precision of torch's fp32 matmuls: read for engine.json and pinned to full fp32 while the
reference scores, whichever of torch's two APIs the process used to set it.

torch 2.9 added per-backend settings (``torch.backends.cuda.matmul.fp32_precision`` and
``torch.backends.mkldnn.matmul.fp32_precision``: "ieee", "tf32", "bf16", or "none" to follow the
process-wide one) beside the process-wide ``torch.set_float32_matmul_precision``, and its notes
recommend the new ones. Once code in the process sets a backend through the new API to something
the old setting does not imply (a trainer turning TF32 on, a stack's update hook, vLLM's
batch-invariant mode writing "ieee"), ``torch.get_float32_matmul_precision()`` raises ("mix of the
legacy and new APIs"): the old setting can no longer be read, so it cannot be saved and restored.
Where torch has the per-backend settings they are the ones read, pinned and restored.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

# The backends whose fp32 matmuls torch can run at a reduced precision: cuBLAS (TF32) and oneDNN
# on CPUs (bf16 on AMX and AVX-512 BF16, TF32 on some).
BACKENDS = ("cuda", "mkldnn")
FULL = "ieee"


def _per_backend() -> dict[str, Any]:
    """Each backend's matmul settings object, where this torch has the per-backend API."""
    found: dict[str, Any] = {}
    for name in BACKENDS:
        matmul = getattr(getattr(torch.backends, name, None), "matmul", None)
        if matmul is not None and hasattr(matmul, "fp32_precision"):
            found[name] = matmul
    return found


def recorded() -> dict[str, Any]:
    """engine.json's account: the process-wide setting (None where torch refuses to read it, the
    two APIs disagreeing) and, where torch has them, the per-backend ones."""
    try:
        process_wide: str | None = torch.get_float32_matmul_precision()
    except RuntimeError:
        process_wide = None
    found: dict[str, Any] = {"float32_matmul_precision": process_wide}
    if per_backend := _per_backend():
        found["fp32_matmul_precision"] = {
            name: str(m.fp32_precision) for name, m in per_backend.items()
        }
    return found


@contextlib.contextmanager
def full_fp32_matmul() -> Iterator[None]:
    """fp32 matmuls at full precision while the ``with`` lasts, then the process's own settings.

    The precision is process-wide, and vLLM sets it from VLLM_FLOAT32_MATMUL_PRECISION when it
    starts in this process: "high" would make the fp32 reference a TF32 one on Ampere and later.
    """
    per_backend = _per_backend()
    if not per_backend:  # torch before 2.9: one process-wide setting
        previous = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("highest")
        try:
            yield
        finally:
            torch.set_float32_matmul_precision(previous)
        return
    previous_each = {name: str(m.fp32_precision) for name, m in per_backend.items()}
    for matmul in per_backend.values():
        matmul.fp32_precision = FULL
    try:
        yield
    finally:
        for name, matmul in per_backend.items():
            matmul.fp32_precision = previous_each[name]
