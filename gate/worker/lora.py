"""LoRA mode's adapters: made as a trainer makes them, written as PEFT saves them, loaded into the
engine as the stacks load them, and applied on the trainer's side as PEFT applies them.

An adapter version is, per target module, ``A`` [rank, in] and ``B`` [out, rank]; PEFT's forward
adds ``scaling * B @ A`` to the module's weight (``scaling`` = alpha / rank, or alpha / sqrt(rank)
with rsLoRA). The trainer-side copy here merges that product into the base weights in fp32 before
casting to the trainer's dtype, which is PEFT's ``merge_and_unload``; unmerged, PEFT computes
``x W^T + scaling (x A^T) B^T``, the same sum in another order (tests/unit/test_lora.py holds the two
together). The engine receives the version as a folder (``adapter_config.json`` +
``adapter_model.safetensors``) through a :class:`LoRARequest`, by one of the namings stacks use
(:data:`gate.contract.request.LORA_NAMINGS`) or the stack's own hook.

Imports torch and safetensors (a dependency of transformers) at module level: engine side only.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from gate.contract.request import LoraRequest

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."  # what PEFT's saved names put before the module's own path
# The integer id the "same-id" naming loads every version under (vLLM needs one > 0).
SAME_ID = 1
ADAPTER_NAME = "gate-policy"


@dataclass(frozen=True)
class AdapterVersion:
    """One version of the adapter, as a push receives it: written to ``path`` already."""

    number: int  # 1, 2, ...: the order the probe pushes them in
    path: str  # the folder holding adapter_config.json and adapter_model.safetensors
    previous: Any  # the LoRARequest the engine served before this push; None for the first


PushFn = Callable[[Any, AdapterVersion], Any]  # (llm, version) -> the LoRARequest to generate with


ALL_LINEAR = "all-linear"  # PEFT's shorthand: every linear module but the output head


def target_module_paths(model: torch.nn.Module, targets: list[str]) -> list[str]:
    """The full paths of the linear modules whose last name part is in ``targets`` (PEFT's match
    for a list of names), or of every linear module but the output head for ``["all-linear"]``
    (PEFT's shorthand). A target that matches no linear module is a config error: PEFT refuses it
    too, and an adapter without it would test less than the user's."""
    head = getattr(model, "get_output_embeddings", lambda: None)()
    linear = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and module is not head
    ]
    if list(targets) == [ALL_LINEAR]:
        return [name for name, _ in linear]
    paths = [name for name, _ in linear if name.rsplit(".", 1)[-1] in targets]
    found = {p.rsplit(".", 1)[-1] for p in paths}
    missing = [t for t in targets if t not in found]
    if missing:
        raise ValueError(
            f"lora.target_modules: {missing} match no linear module of the model "
            f"(its linear modules end in {sorted({n.rsplit('.', 1)[-1] for n, _ in linear})})"
        )
    return paths


def module_names(tensors: dict[str, torch.Tensor]) -> list[str]:
    """The adapted modules' own names (q_proj, ...), as adapter_config.json lists them."""
    return sorted({path.rsplit(".", 1)[-1] for path, _, _ in module_pairs(tensors)})


def adapter_tensors(
    model: torch.nn.Module, lora: LoraRequest, version: int, size: float, seed: int
) -> dict[str, torch.Tensor]:
    """A trained-looking adapter version in PEFT's saved names, fp32, seeded by (seed, version).

    ``A`` has Kaiming-like entries (std 1/sqrt(in)); ``B`` is sized so that the merged change of
    each weight has ``size`` times that weight's standard deviation: the same relative step the
    full-weight probe takes (``weight_sync.perturbation``), so old and new versions differ clearly.
    """
    generator = torch.Generator().manual_seed(seed * 1_000_003 + version)
    modules = dict(model.named_modules())
    tensors = {}
    for path in target_module_paths(model, lora.target_modules):
        weight = modules[path].weight.detach().float()
        out_features, in_features = weight.shape
        a_std = 1.0 / math.sqrt(in_features)
        # var(B @ A) = rank * a_std^2 * b_std^2; scaled by lora.scaling in the merge.
        b_std = size * float(weight.std()) / (lora.scaling * math.sqrt(lora.rank) * a_std)
        a = torch.randn(lora.rank, in_features, generator=generator) * a_std
        b = torch.randn(out_features, lora.rank, generator=generator) * b_std
        tensors[f"{PEFT_PREFIX}{path}.lora_A.weight"] = a
        tensors[f"{PEFT_PREFIX}{path}.lora_B.weight"] = b
    return tensors


def adapter_config(lora: LoraRequest, base_model: str, modules: list[str]) -> dict[str, Any]:
    """adapter_config.json as PEFT writes it for these settings (the fields vLLM's PEFTHelper
    reads); ``modules``: the adapted modules' names ("all-linear" resolved, as PEFT saves it)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "use_rslora": lora.use_rslora,
        "target_modules": modules,
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "use_dora": False,
    }


def write_adapter(
    folder: Path, tensors: dict[str, torch.Tensor], lora: LoraRequest, base_model: str
) -> None:
    """The version as PEFT's ``save_pretrained`` leaves it; a folder already there is replaced
    whole (the "same-id" naming rewrites one folder per version, as verl and AReaL do)."""
    from safetensors.torch import save_file

    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    save_file(
        {k: v.contiguous() for k, v in tensors.items()},
        str(folder / ADAPTER_WEIGHTS),
        metadata={"format": "pt"},
    )
    config = adapter_config(lora, base_model, module_names(tensors))
    (folder / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2))


def module_pairs(tensors: dict[str, torch.Tensor]) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(module path, A, B) per adapted module of a PEFT-named adapter."""
    return [
        (
            name.removeprefix(PEFT_PREFIX).removesuffix(".lora_A.weight"),
            a,
            tensors[name.replace(".lora_A.", ".lora_B.")],
        )
        for name, a in tensors.items()
        if name.endswith(".lora_A.weight")
    ]


def merged_weight(
    weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: float
) -> torch.Tensor:
    """PEFT's merge: ``weight + scaling * B @ A``, summed in fp32, in the weight's dtype and place."""
    delta = scaling * (b.float() @ a.float())
    return (weight.float() + delta.to(weight.device)).to(weight.dtype)


def merged(
    state_dict: dict[str, torch.Tensor],
    tensors: dict[str, torch.Tensor],
    scaling: float,
    skip: frozenset[str] = frozenset(),
) -> dict[str, torch.Tensor]:
    """``state_dict`` with the adapter merged into each adapted weight, except modules whose last
    name part is in ``skip``. Weights the adapter does not touch are shared, not copied."""
    out = dict(state_dict)
    for path, a, b in module_pairs(tensors):
        if path.rsplit(".", 1)[-1] not in skip:
            key = f"{path}.weight"
            out[key] = merged_weight(state_dict[key], a, b, scaling)
    return out


@dataclass(frozen=True)
class Alternative:
    """A way of applying the adapter other than the trainer's, for naming what the engine did."""

    name: str  # how the diagnosis names it
    scaling: float
    skip: frozenset[str] = frozenset()


def alternatives(lora: LoraRequest, modules: list[str]) -> list[Alternative]:
    """The usual ways an engine's adapter differs from the trainer's: the other scaling rule
    (rsLoRA honoured or ignored), and each adapted module (``modules``) left out."""
    other = dataclasses.replace(lora, use_rslora=not lora.use_rslora)
    rule = "alpha/sqrt(r) (rsLoRA)" if other.use_rslora else "alpha/r (rsLoRA ignored)"
    found = [Alternative(f"scaling {rule}", other.scaling)]
    found += [
        Alternative(f"{module} not applied", lora.scaling, frozenset({module}))
        for module in modules
    ]
    return found


# -- the pushes: how a new version reaches the running engine ----------------------------------------


def push_new_id(llm, version: AdapterVersion):
    """AReaL's disk mode and TRL's async GRPO: every version its own name (so its own id) and
    folder, added to the engine; the engine's LRU evicts older ones (``max_loras``), and the
    prefix cache keys blocks by name and path, so no block is shared across versions."""
    from vllm.lora.request import LoRARequest

    request = LoRARequest(f"{ADAPTER_NAME}-v{version.number}", version.number, version.path)
    llm.llm_engine.add_lora(request)
    return request


def push_same_id(llm, version: AdapterVersion):
    """verl's and AReaL's xccl path: remove the adapter, load the new version under the same id,
    name and folder. Prefix-cache blocks are keyed by the adapter's name and path (vLLM 0.31-0.34
    ``_gen_lora_extra_hash_keys``), which do not change, so the cache is reset after the load."""
    from vllm.lora.request import LoRARequest

    if version.previous is not None:
        llm.llm_engine.remove_lora(version.previous.lora_int_id)
    request = LoRARequest(ADAPTER_NAME, SAME_ID, version.path)
    llm.llm_engine.add_lora(request)
    llm.reset_prefix_cache()
    return request


def push_in_place(llm, version: AdapterVersion):
    """SkyRL's and prime-rl's path: the same name and id, reloaded with ``load_inplace`` (vLLM
    loads a request whose id it holds only when asked to: ``WorkerLoRAManager.add_adapter``), from
    one folder; the prefix cache is reset after the load, as SkyRL does with prefix caching on.
    The request generation then sends has ``load_inplace`` off again (SkyRL's order), or every
    request would reload the adapter."""
    from vllm.lora.request import LoRARequest

    request = LoRARequest(ADAPTER_NAME, SAME_ID, version.path, load_inplace=True)
    llm.llm_engine.add_lora(request)
    request.load_inplace = False
    llm.reset_prefix_cache()
    return request


BUILTIN_PUSHES: dict[str, PushFn] = {
    "new-id": push_new_id,
    "same-id": push_same_id,
    "in-place": push_in_place,
}


def version_folder(root: Path, lora: LoraRequest, number: int) -> Path:
    """Where version ``number`` is written: its own folder, or the one folder "same-id" and
    "in-place" rewrite."""
    return root / (f"v{number}" if lora.naming == "new-id" else "policy")


def push_path(lora: LoraRequest) -> tuple[str, PushFn]:
    """(the name engine.json records, the push) for the configured hook or naming."""
    if lora.hook:
        from gate.worker.weight_push import load_hook

        # load_hook finds any function by its spec; a LoRA hook's signature is PushFn's.
        return f"LoRA hook {lora.hook}", cast(PushFn, load_hook(lora.hook))
    return f"LoRA {lora.naming} (add_lora per version)", BUILTIN_PUSHES[lora.naming]


# -- the policy adapter of one engine run ------------------------------------------------------------


class PolicyAdapter:
    """LoRA mode's policy in a running engine: the adapter versions gate made (version 1, the
    policy every replay pass samples from; version 2, the update the weight-sync probe pushes),
    the folders it writes them to, the push that loads them, and what each push returned.

    Made once per engine, after the engine starts: version 1 is pushed at once, so the replay's
    passes generate through the adapter as a LoRA stack's rollouts do. :meth:`close` removes the
    folders (the engine has read them by then).
    """

    def __init__(self, lora: LoraRequest, model: torch.nn.Module, scratch_dir: Path) -> None:
        self.lora = lora
        self.versions = [
            adapter_tensors(model, lora, number, lora.size, lora.seed) for number in (1, 2)
        ]
        self.path_name, self._push = push_path(lora)
        self._root = Path(tempfile.mkdtemp(prefix="gate-lora-", dir=scratch_dir))
        self.pushed: list[Any] = []  # the LoRARequest each push returned, in order
        self.push_s: list[float] = []

    @property
    def current(self) -> Any:
        """The LoRARequest generation uses now (None before the first push)."""
        return self.pushed[-1] if self.pushed else None

    def push(self, llm, tensors: dict[str, torch.Tensor], base_model: str) -> Any:
        """Write ``tensors`` as the next version and load it through the configured path.

        Whatever the path raises comes back as :class:`PushFailed` naming it, as the full-weight
        pushes' failures do; a hook that returns something other than a LoRARequest is one too.
        """
        from gate.worker.weight_push import PushFailed

        number = len(self.pushed) + 1
        folder = version_folder(self._root, self.lora, number)
        write_adapter(folder, tensors, self.lora, base_model)
        start = time.perf_counter()
        try:
            request = self._push(llm, AdapterVersion(number, str(folder), self.current))
        except Exception as exc:
            raise PushFailed(self.path_name, exc) from exc
        if not isinstance(getattr(request, "lora_int_id", None), int):
            raise PushFailed(
                self.path_name,
                TypeError(
                    f"it returned {type(request).__name__}, not the LoRARequest to generate with"
                ),
            )
        self.push_s.append(time.perf_counter() - start)
        self.pushed.append(request)
        return request

    def record(self) -> dict[str, Any]:
        """engine.json's ``lora``: the settings, and the id and name each version was served by."""
        return {
            "rank": self.lora.rank,
            "alpha": self.lora.alpha,
            "use_rslora": self.lora.use_rslora,
            "scaling": self.lora.scaling,
            "target_modules": sorted(self.lora.target_modules),
            "modules": module_names(self.versions[0]),
            "modules_adapted": len(self.versions[0]) // 2,
            "path": self.path_name,
            "naming": None if self.lora.hook else self.lora.naming,
            "served_as": [
                {"name": getattr(r, "lora_name", None), "id": r.lora_int_id} for r in self.pushed
            ],
            "push_s": [round(s, 4) for s in self.push_s],
        }

    def close(self) -> None:
        shutil.rmtree(self._root, ignore_errors=True)


def apply_to(modules: torch.nn.Module, tensors: dict[str, torch.Tensor], scaling: float) -> int:
    """Merge the adapter into ``modules`` in place (the reference's trunk, or a whole model):
    ``weight += scaling * B @ A`` in fp32, on each weight's own device and in its dtype. A module
    is found by its path in the full model or with the first part dropped (a trunk is the full
    model's ``model``). Returns the number of modules merged; a path found nowhere raises."""
    named = dict(modules.named_modules())
    pairs = module_pairs(tensors)
    with torch.no_grad():
        for path, a, b in pairs:
            module = named.get(path) or named.get(path.split(".", 1)[-1])
            if module is None:
                raise ValueError(f"the reference has no module {path} to apply the adapter to")
            if module.weight.device.type == "meta":
                raise ValueError(
                    f"{path}: LoRA mode cannot merge the adapter into a weight the reference "
                    "offloads (reference.max_memory): give it room on a device"
                )
            module.weight.copy_(merged_weight(module.weight, a, b, scaling))
    return len(pairs)
