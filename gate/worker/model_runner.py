"""Which model runner an engine's workers run: vLLM's V1 runner or Model Runner V2.

The two runners sample, draw random numbers and compute logprobs with code of their own
(``vllm/v1/worker/gpu_model_runner.py`` and ``vllm/v1/worker/gpu/``), so a change of runner changes
the rollouts' numerics even where every engine argument is the same. Read in the wheels' source:

* up to 0.21 Model Runner V2 is opt-in: ``VLLM_USE_V2_MODEL_RUNNER`` set true;
* 0.22 .. 0.33 decide per engine in ``VllmConfig.use_v2_model_runner`` (``vllm/config/vllm.py``):
  the variable when set, else V2 where Triton is present and the model uses nothing V2 lacks, else
  V1 (the CPU wheels have no Triton: V1);
* 0.34 removes the V1 runner (``VLLM_USE_V2_MODEL_RUNNER=0`` raises): every engine runs V2.

So a 0.33 -> 0.34 upgrade on a GPU moves the rollouts of any model 0.33 ran on V1 to V2.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

V1, V2 = "V1", "V2"
_V1_MODULE = "vllm.v1.worker.gpu_model_runner"
_V2_MODULE = "vllm.v1.worker.gpu.model_runner"
_TRUE = ("1", "true", "yes", "on")


def of_config(vllm_config: Any) -> str | None:
    """V1 or V2 as the live engine's config decides it; the release's rule where the config has no
    ``use_v2_model_runner`` (before 0.22, from 0.34); None where the config refuses to say."""
    if vllm_config is not None and hasattr(type(vllm_config), "use_v2_model_runner"):
        try:
            return V2 if vllm_config.use_v2_model_runner else V1
        except Exception:  # the property raises where the variable contradicts a feature
            return None
    return by_release()


def by_release(env: dict[str, str] | None = None, has_triton: bool | None = None) -> str | None:
    """The runner this release's modules and ``env`` leave to an engine whose config is out of reach
    (a server's): None where 0.22 .. 0.33 decide per model at start (Triton present, no variable)."""
    env = dict(os.environ) if env is None else env
    has_v1, has_v2 = _module_exists(_V1_MODULE), _module_exists(_V2_MODULE)
    if not has_v1:
        return V2 if has_v2 else None
    if not has_v2:
        return V1
    chosen = env.get("VLLM_USE_V2_MODEL_RUNNER")
    if chosen is not None and chosen.strip() != "":
        return V2 if chosen.strip().lower() in _TRUE else V1
    if not _decides_per_engine():
        return V1  # opt-in only (before 0.22)
    if has_triton is None:
        has_triton = triton_present()
    return V1 if has_triton is False else None


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package that is missing or fails to import
        return False


def _decides_per_engine() -> bool:
    try:
        from vllm.config import VllmConfig
    except ImportError:
        return False
    return hasattr(VllmConfig, "use_v2_model_runner")


def triton_present() -> bool | None:
    """Whether vLLM found Triton (the GPU top-k/top-p kernel, and V2's precondition); None before
    ``vllm.triton_utils``."""
    try:
        from vllm.triton_utils import HAS_TRITON
    except ImportError:
        return None
    return bool(HAS_TRITON)
