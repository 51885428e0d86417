"""Which model transformers loads beside vLLM: the same remote code and the same hub commit.

Imports huggingface_hub only when a hub id has to be resolved; a local folder needs nothing.
"""

from __future__ import annotations

import os
from typing import Any


def hf_load_kwargs(engine_args: dict[str, Any], for_tokenizer: bool = False) -> dict[str, Any]:
    """``from_pretrained`` keyword arguments matching the engine's remote code and pinned revisions,
    so the trainer-side reference, the tokenizer and the weight-sync trainer read the very model
    (code and revision) vLLM reads."""
    kwargs: dict[str, Any] = {}
    if engine_args.get("trust_remote_code"):
        kwargs["trust_remote_code"] = True
    revision = engine_args.get("tokenizer_revision" if for_tokenizer else "revision") or (
        engine_args.get("revision") if for_tokenizer else None
    )
    if revision:
        kwargs["revision"] = revision
    if engine_args.get("code_revision") and not for_tokenizer:
        kwargs["code_revision"] = engine_args["code_revision"]
    return kwargs


def resolve_model_revision(model: str, engine_args: dict[str, Any], say=print) -> str | None:
    """The commit a hub model id resolves to now (or its pinned ``revision``), resolved once per worker.

    vLLM, the tokenizer and the reference then all load that very commit, and engine.json records
    it: a hub model that moves between two runs is otherwise the same name with other weights.
    Offline (``HF_HUB_OFFLINE=1``) the local cache says which commit it holds. A local folder has
    no revision (its content fingerprint identifies it); an id that cannot be resolved at all keeps
    the requested revision, with a warning.
    """
    if os.path.isdir(model):
        return None
    requested = engine_args.get("revision")
    from huggingface_hub import HfApi, snapshot_download

    # Each huggingface_hub release raises its own errors for "offline", "unreachable" (httpx or
    # requests, by version), "gated" and "no such id": any of them only means "ask the cache".
    try:
        return HfApi().model_info(model, revision=requested).sha
    except Exception:
        pass
    try:
        return os.path.basename(snapshot_download(model, revision=requested, local_files_only=True))
    except Exception as exc:
        say(
            f"warning: the hub revision of {model} could not be resolved ({type(exc).__name__}); "
            f"loading {'revision ' + requested if requested else 'its default branch'} as vLLM finds it"
        )
        return requested
