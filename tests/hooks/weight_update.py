"""Weight-update hooks with known faults, for the weight-sync tests (``weight_update.hook``).

Signature: ``fn(llm, state_dict) -> None`` with the running vLLM engine and the full new state dict.
These run inside the engine environment (vllm and torch are importable there).
"""


def _reload(worker, state_dict):
    worker.reload_weights(weights_iterator=iter(state_dict.items()))


def correct(llm, state_dict):
    """What a trainer should do on vLLM V1: load in place, then drop cache entries of the old weights."""
    llm.collective_rpc(_reload, args=(state_dict,))
    llm.reset_prefix_cache()


def skip_load(llm, state_dict):
    """Stale weights: the update never reaches the engine."""


def load_without_cache_reset(llm, state_dict):
    """Loads, but prefix-cache entries computed with the old weights survive."""
    llm.collective_rpc(_reload, args=(state_dict,))


def load_first_layer_only(llm, state_dict):
    """Partial update: only the first decoder layer's tensors are loaded."""
    partial = {k: v for k, v in state_dict.items() if ".layers.0." in k}
    llm.collective_rpc(_reload, args=(partial,))
    llm.reset_prefix_cache()


def correct_in_checkpoint_order(llm, state_dict):
    """Correct: the tensors in name order, as a safetensors checkpoint stores them (``lm_head.*``
    before ``model.*``). For a tied model the engine keeps the name it loads last (the embedding
    here, the head in the trainer's own order), so a probe that perturbs the two names apart
    fails it where the trainer's order happens to agree with the engine's.
    """
    llm.collective_rpc(_reload, args=(dict(sorted(state_dict.items())),))
    llm.reset_prefix_cache()
