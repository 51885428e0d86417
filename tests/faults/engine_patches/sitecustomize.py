"""Engine-build faults for issue 6's fault matrix, patched into vLLM the way a buggy build behaves.

Some faults live where no engine argument or logits processor reaches: vLLM applies top-k/top-p
after every logits processor, inside its sampler. This folder goes on the engine environment's
PYTHONPATH; Python imports ``sitecustomize`` at start-up, and with ``GATE_FAULT`` set this module
installs an import hook that patches the named vLLM module right after it is first imported
(nothing is imported eagerly, so start-up and unrelated processes such as pip are untouched).
Without ``GATE_FAULT`` it does nothing. An unknown fault name, or a vLLM release that lacks the
patched function, fails the process loudly: a fault that silently did not apply would make its
test pass for the wrong reason.

Faults:
- ``skip_top_k_top_p``: ``vllm.v1.sample.ops.topk_topp_sampler.apply_top_k_top_p`` returns the
  logits unchanged, so every sampler path that calls it (the CPU path ``forward_cpu`` and the
  native path) samples from the full temperature-scaled distribution although the request asked
  for top-k / top-p, and processed logprobs are those of the untruncated distribution.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from typing import Callable


def _skip_top_k_top_p(module) -> None:
    if not hasattr(module, "apply_top_k_top_p"):
        raise AttributeError(f"{module.__name__} has no apply_top_k_top_p: this fault does not fit this vLLM release")

    def apply_top_k_top_p(logits, k, p):  # the bug: truncation requested, never applied
        return logits

    module.apply_top_k_top_p = apply_top_k_top_p


FAULTS: dict[str, tuple[str, Callable]] = {
    "skip_top_k_top_p": ("vllm.v1.sample.ops.topk_topp_sampler", _skip_top_k_top_p),
}


class _PatchingLoader(importlib.abc.Loader):
    """Runs the real loader, then the patch, before anyone else sees the module."""

    def __init__(self, inner: importlib.abc.Loader, patch: Callable) -> None:
        self.inner, self.patch = inner, patch

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        self.patch(module)
        print(f"[gate-fault] {os.environ['GATE_FAULT']}: patched {module.__name__}", file=sys.stderr, flush=True)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def __init__(self, target: str, patch: Callable) -> None:
        self.target, self.patch = target, patch

    def find_spec(self, fullname, path, target=None):
        if fullname != self.target:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader, self.patch)
        return spec


def _install() -> None:
    fault = os.environ.get("GATE_FAULT")
    if not fault:
        return
    if fault not in FAULTS:
        raise SystemExit(f"GATE_FAULT={fault!r}: unknown fault (known: {', '.join(FAULTS)})")
    sys.meta_path.insert(0, _PatchOnImport(*FAULTS[fault]))


_install()
