"""LoRA adapter pushes with known faults, for the LoRA-mode weight-sync tests (``lora.hook``).

Signature: ``fn(llm, version) -> LoRARequest``: the running vLLM engine and the adapter version gate
wrote (``version.number``, ``version.path``: a PEFT folder, ``version.previous``: the request the
engine served before); it returns the request generation uses from then on. Each reproduces a
mistake a stack's adapter push can make; gate/worker/lora.py holds the correct paths.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

POLICY = "policy"


def _request(name: str, lora_id: int, path: str):
    from vllm.lora.request import LoRARequest

    return LoRARequest(name, lora_id, path)


def reuse_id(llm, version):
    """Every version under id 1 with no remove_lora: the engine holds id 1 and never reads the rest."""
    request = _request(POLICY, 1, version.path)
    llm.llm_engine.add_lora(request)
    return request


def fixed_path_without_cache_reset(llm, version):
    """verl's shape (one id, name and folder; remove, then add) without reset_prefix_cache: prefix
    blocks are keyed by name and path, so version 2 reads KV computed under version 1."""
    fixed = Path(version.path).parent / "fixed"
    if fixed.exists():
        shutil.rmtree(fixed)
    shutil.copytree(version.path, fixed)
    if version.previous is not None:
        llm.llm_engine.remove_lora(version.previous.lora_int_id)
    request = _request(POLICY, 1, str(fixed))
    llm.llm_engine.add_lora(request)
    return request


def _new_id(llm, version):
    request = _request(f"{POLICY}-v{version.number}", version.number, version.path)
    llm.llm_engine.add_lora(request)
    return request


def rslora_dropped(llm, version):
    """The adapter_config.json the stack writes says use_rslora: false while the trainer's LoRA
    config has it on: the engine scales by alpha / r, the trainer by alpha / sqrt(r)."""
    config_path = Path(version.path) / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "use_rslora": False}))
    return _new_id(llm, version)


def v_proj_dropped(llm, version):
    """A conversion that loses one target module's tensors (here v_proj) before the push."""
    from safetensors.torch import load_file, save_file

    weights_path = Path(version.path) / "adapter_model.safetensors"
    tensors = {k: v for k, v in load_file(str(weights_path)).items() if ".v_proj." not in k}
    save_file(tensors, str(weights_path), metadata={"format": "pt"})
    return _new_id(llm, version)
