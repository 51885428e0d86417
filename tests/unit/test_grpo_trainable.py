"""grpo.trainable and grpo.optimizer: which parameters the mini GRPO trains, and what that keeps; the
run's sampling seeds, eval set and identical-group share (the paired design)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from gate.worker.trainable import (  # noqa: E402
    initial_values,
    make_optimizer,
    optimizer_state_bytes,
    optimizer_step,
    restored_state_dict,
    select_trainable,
    trainer_record,
    zero_grad,
)

LAYERS, HIDDEN, INTER, VOCAB = 3, 16, 32, 50


def _llama(tied: bool = False):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=LAYERS,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
        tie_word_embeddings=tied,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(cfg)


# Per decoder layer: q, k, v, o (HIDDEN x HIDDEN with as many kv heads as heads), gate/up/down, two norms.
LAYER_PARAMS = 4 * HIDDEN * HIDDEN + 3 * HIDDEN * INTER + 2 * HIDDEN


def _trained_names(model):
    return {n for n, p in model.named_parameters() if p.requires_grad}


def test_all_trains_every_parameter():
    model = _llama()
    trained = select_trainable(model, "all")
    assert trained.trainable_parameters == trained.total_parameters == model.num_parameters()
    assert _trained_names(model) == {n for n, _ in model.named_parameters()}


def test_lm_head_trains_the_projection_only():
    model = _llama()
    trained = select_trainable(model, "lm_head")
    assert _trained_names(model) == {"lm_head.weight"}
    assert trained.trainable_parameters == VOCAB * HIDDEN and not trained.tied_lm_head


def test_a_tied_lm_head_trains_the_shared_embedding_and_says_so():
    model = _llama(tied=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    trained = select_trainable(model, "lm_head")
    assert trained.tied_lm_head and trained.trainable_parameters == VOCAB * HIDDEN
    assert model.model.embed_tokens.weight.requires_grad
    assert trainer_record(trained, "adamw", 0)["tied_lm_head"] is True


def test_last_layers_trains_the_last_decoder_layers_only():
    model = _llama()
    trained = select_trainable(model, {"last_layers": 2})
    names = _trained_names(model)
    assert names and all(n.startswith(("model.layers.1.", "model.layers.2.")) for n in names)
    assert not any(n.startswith("model.layers.0.") for n in names)
    assert trained.trainable_parameters == 2 * LAYER_PARAMS
    with pytest.raises(
        ValueError, match=r"grpo\.trainable: last_layers 4, but the model has 3 decoder layers"
    ):
        select_trainable(_llama(), {"last_layers": 4})


def test_norms_trains_the_norm_weights_only():
    model = _llama()
    trained = select_trainable(model, "norms")
    names = _trained_names(model)
    assert names == {f"model.layers.{i}.{k}.weight" for i in range(LAYERS)
                     for k in ("input_layernorm", "post_attention_layernorm")} | {"model.norm.weight"}  # fmt: skip
    assert trained.trainable_parameters == (2 * LAYERS + 1) * HIDDEN


def _one_step(model, optimizer):
    ids = torch.tensor([[1, 2, 3, 4]])
    loss = model(input_ids=ids).logits.float().logsumexp(-1).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def test_a_step_moves_the_trained_parameters_and_no_other():
    model = _llama()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trained = select_trainable(model, {"last_layers": 1})
    _one_step(model, make_optimizer(trained, "sgd", lr=0.1))
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert moved and all(n.startswith("model.layers.2.") for n in moved)
    assert all(
        model.get_parameter(n).grad is None for n in before if not n.startswith("model.layers.2.")
    )


@pytest.mark.parametrize("spec", ["all", "lm_head", {"last_layers": 1}])
def test_adamw_keeps_two_fp32_moments_per_trained_element_and_sgd_nothing(spec):
    for name in ("adamw", "sgd"):
        model = _llama()
        trained = select_trainable(model, spec)
        optimizer = make_optimizer(trained, name, lr=1e-3)
        _one_step(model, optimizer)
        state = optimizer_state_bytes(optimizer)
        if name == "adamw":  # exp_avg and exp_avg_sq in fp32, plus one fp32 step count per tensor
            assert state == 2 * 4 * trained.trainable_parameters + 4 * len(trained.parameters)
        else:  # plain SGD, no momentum: no state at all
            assert state == 0
        record = trainer_record(trained, name, state)
        assert record["optimizer_state_bytes"] == state
        assert record["gradient_bytes"] == 4 * trained.trainable_parameters


def test_an_unknown_optimizer_is_refused():
    with pytest.raises(ValueError, match=r"grpo\.optimizer: 'adam' is not one of"):
        make_optimizer(select_trainable(_llama(), "all"), "adam", lr=1e-3)


class _FakeEngine:
    """Stands in for vllm.LLM: fixed tokens, logprob -1 each, half the group answering 4, half 3."""

    def __init__(self, completion: list[int]) -> None:
        self.completion = completion

    def generate(self, prompts, params, use_tqdm=False):
        from types import SimpleNamespace as NS

        def sample(i: int):
            entries = [{t: NS(logprob=-1.0)} for t in self.completion]
            return NS(token_ids=list(self.completion), logprobs=entries, text=f"so {4 - i % 2}")

        return [NS(outputs=[sample(i) for i in range(p["n"])]) for p in params]


def test_a_grpo_run_trains_the_subset_and_pushes_the_whole_state_dict(tmp_path, monkeypatch):
    from gate.contract.request import GrpoRequest
    from gate.worker import replay
    from gate.worker.grpo import run_grpo

    monkeypatch.setattr(replay, "_params", lambda **kwargs: kwargs)  # no vLLM here
    model = _llama()
    model.save_pretrained(tmp_path)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    pushed: list[dict] = []
    request = GrpoRequest(steps=2, prompts_per_step=2, group_size=2, max_tokens=4, temperature=1.0,
                          lr=0.05, clip_eps=0.2, seeds=[0], trainable="lm_head", optimizer="sgd")  # fmt: skip
    run = run_grpo(_FakeEngine([7, 8, 9]), str(tmp_path), [[1, 2], [1, 3], [1, 4]], ["4", "5", None],
                   request, lambda llm, sd: pushed.append({k: v.clone() for k, v in sd.items()}), lambda message: None)  # fmt: skip
    assert run.arrays["grpo_reward"].shape == (1, 2)
    # The checkpoint first, one push per step, the checkpoint again at the end: all whole.
    assert len(pushed) == 4 and all(set(sd) == set(initial) for sd in pushed)
    for after_step in pushed[1:3]:
        changed = {k for k, v in after_step.items() if not torch.equal(v, initial[k])}
        assert changed == {"lm_head.weight"}
    assert all(torch.equal(v, initial[k]) for k, v in pushed[3].items())
    assert run.trainer == {
        "trainable": "lm_head", "optimizer": "sgd", "trainable_parameters": VOCAB * HIDDEN,
        "parameters": model.num_parameters(), "tied_lm_head": False,
        "gradient_bytes": 4 * VOCAB * HIDDEN, "optimizer_state_bytes": 0,
        "loss": "grpo", "clip_band": [0.2, 0.2],  # a request without clip_eps_high clips symmetrically
    }  # fmt: skip


# --- memory layout: engine-dtype model, fp32 masters, initial copy of what trains only ------------


def _loss(model, seed: int):
    ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(seed))
    return model(input_ids=ids).logits.float().log_softmax(-1).mean()


def _train(model, spec, steps: int = 2):
    trained = select_trainable(model, spec)
    opt = make_optimizer(trained, "adamw", 1e-2)
    for step in range(steps):
        zero_grad(trained, opt)
        _loss(model, step).backward()
        optimizer_step(trained, opt)
    return trained, opt


def test_all_in_fp32_steps_exactly_as_a_plain_optimizer_over_the_parameters():
    ours, plain = _llama(), _llama()
    trained, _ = _train(ours, "all")
    assert all(m is p for m, p in zip(trained.masters, trained.parameters, strict=True))
    opt = torch.optim.AdamW(plain.parameters(), lr=1e-2, weight_decay=0.0)
    for step in range(2):
        opt.zero_grad()
        _loss(plain, step).backward()
        opt.step()
    theirs = dict(plain.named_parameters())
    for name, p in ours.named_parameters():
        assert torch.equal(p, theirs[name]), name


def test_frozen_parameters_keep_the_engine_dtype_and_trained_ones_step_in_fp32():
    model = _llama().to(torch.bfloat16)
    frozen_before = model.model.layers[0].mlp.up_proj.weight.detach().clone()
    trained, opt = _train(model, "norms")
    assert all(
        p.dtype == torch.bfloat16 for p in model.parameters()
    )  # the model runs as the engine
    assert all(m.dtype == torch.float32 and m is not p
               for m, p in zip(trained.masters, trained.parameters, strict=True))  # fmt: skip
    assert all(torch.equal(p, m.to(torch.bfloat16))
               for m, p in zip(trained.masters, trained.parameters, strict=True))  # fmt: skip
    assert torch.equal(model.model.layers[0].mlp.up_proj.weight, frozen_before)
    assert not any(p.grad is not None for p in trained.parameters)  # moved onto the masters
    record = trainer_record(trained, "adamw", optimizer_state_bytes(opt))
    assert record["gradient_bytes"] == 4 * trained.trainable_parameters  # fp32 master gradients


@pytest.mark.parametrize(
    ("spec", "tied"), [({"last_layers": 1}, False), ("lm_head", True), ("all", False)]
)
def test_the_initial_copy_holds_the_trained_tensors_only_and_restores_the_checkpoint(spec, tied):
    model = _llama(tied)
    checkpoint = {k: v.detach().clone() for k, v in model.state_dict().items()}
    trained = select_trainable(model, spec)
    initial = initial_values(trained)
    assert tuple(initial) == trained.names and len(initial) == len(_trained_names(model))
    assert sum(t.numel() for t in initial.values()) == trained.trainable_parameters
    opt = make_optimizer(trained, "adamw", 1e-2)
    zero_grad(trained, opt)
    _loss(model, 0).backward()
    optimizer_step(trained, opt)
    assert not all(torch.equal(v, checkpoint[k]) for k, v in model.state_dict().items())
    restored = restored_state_dict(model, trained, initial)
    assert restored.keys() == checkpoint.keys()
    assert all(torch.equal(restored[k], v) for k, v in checkpoint.items())


def test_step_standard_errors_count_sequences_and_prompts_as_the_units():
    """Hand-computed: a token mean's error from per-sequence residuals (a zero-length sequence is no
    unit), a reward's from the spread of the prompts' group means."""
    import math

    import numpy as np

    from gate.worker.grpo import group_mean_se, token_mean_se

    values, lengths = np.array([1.0, 2, 3, 4, 5, 6]), np.array([3, 0, 2, 1])
    mean = 3.5  # sums 6, 9, 6 over lengths 3, 2, 1: residuals -4.5, 2, 2.5
    expected = math.sqrt(3 / 2 * (4.5**2 + 2**2 + 2.5**2)) / 6
    assert token_mean_se(values, lengths) == pytest.approx(expected) and values.mean() == mean
    assert math.isnan(token_mean_se(np.array([1.0, 2.0]), np.array([2])))  # one unit: no error
    rewards = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])  # group means 0.5, 1, 0
    assert group_mean_se(rewards) == pytest.approx(0.5 / math.sqrt(3))


@pytest.mark.parametrize("tied", [False, True])
def test_trainer_logprobs_apply_the_head_only_where_completions_are_predicted(tied):
    """Same values, and gradients, as the full forward's logits at the completion positions."""
    from gate.worker.grpo import _trainer_logprobs

    model = _llama(tied)
    seqs, starts, temperature = [[1, 5, 7, 9, 2], [3, 4, 8]], [2, 1], 0.7
    lp, entropy = _trainer_logprobs(model, seqs, starts, temperature, "cpu")
    expected, expected_entropy = [], []
    for seq, start in zip(seqs, starts, strict=True):
        logits = model(input_ids=torch.tensor([seq])).logits[0].float() / temperature
        logp = torch.log_softmax(logits[start - 1 : len(seq) - 1], dim=-1)
        expected.append(logp.gather(-1, torch.tensor(seq[start:]).unsqueeze(-1)).squeeze(-1))
        expected_entropy.append(-(logp.exp() * logp).sum(-1))
    torch.testing.assert_close(lp, torch.cat(expected), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy, torch.cat(expected_entropy).detach(), atol=1e-5, rtol=1e-5)
    assert lp.requires_grad and not entropy.requires_grad


# --- the paired design's sampling seeds, eval set and identical groups -----------------------------


def test_sampling_seeds_never_share_a_child_across_prompts_streams_seeds_or_offsets():
    from gate.worker.grpo import EVAL, EVAL0, TRAIN, sampling_seed

    n = 8  # vLLM seeds an n-sample request's children seed .. seed + n - 1
    firsts = [
        sampling_seed(offset, seed, stream, slot, n)
        for offset in range(3)
        for seed in range(4)
        for stream in (TRAIN, EVAL, EVAL0)
        for slot in range(40)
    ]
    children = np.add.outer(np.asarray(firsts), np.arange(n)).ravel()
    assert len(np.unique(children)) == len(children)
    with pytest.raises(ValueError, match="leaves the seed stream"):
        sampling_seed(0, 0, TRAIN, 2**24, 8)


def test_identical_share_counts_groups_of_one_completion():
    from gate.worker.grpo import identical_share

    same = [([1, 2], [-1.0, -1.0], "a")] * 3
    mixed = [([1, 2], [-1.0, -1.0], "a"), ([1, 3], [-1.0, -1.0], "b"), ([1, 2], [-1.0, -1.0], "a")]
    assert identical_share([same, mixed, same, mixed]) == 0.5


class _RecordingEngine(_FakeEngine):
    """The fake engine, remembering each generate call's prompts and per-prompt seeds."""

    def __init__(self, completion: list[int]) -> None:
        super().__init__(completion)
        self.calls: list[tuple[list[list[int]], list[int], int]] = []

    def generate(self, prompts, params, use_tqdm=False):
        self.calls.append(
            ([p["prompt_token_ids"] for p in prompts], [p["seed"] for p in params], params[0]["n"])
        )
        return super().generate(prompts, params, use_tqdm)


def test_the_eval_set_is_held_out_sampled_at_the_checkpoint_and_after_each_seed(
    tmp_path, monkeypatch
):
    from gate.contract import keys
    from gate.contract.request import GrpoRequest
    from gate.worker import replay
    from gate.worker.grpo import run_grpo

    monkeypatch.setattr(replay, "_params", lambda **kwargs: kwargs)  # no vLLM here
    _llama().save_pretrained(tmp_path)
    prompts = [[1, 2], [1, 3], [1, 4], [1, 5]]
    request = GrpoRequest(steps=2, prompts_per_step=2, group_size=2, max_tokens=4, temperature=1.0,
                          lr=0.05, clip_eps=0.2, seeds=[0, 1], trainable="lm_head", optimizer="sgd",
                          eval_prompts=[0], eval_samples=3)  # fmt: skip
    engine = _RecordingEngine([7, 8, 9])
    run = run_grpo(engine, str(tmp_path), prompts, ["4", "5", "4", None], request,
                   lambda llm, sd: None, lambda message: None)  # fmt: skip
    evals = [c for c in engine.calls if c[2] == 3]
    training = [c for c in engine.calls if c[2] == 2]
    # the checkpoint once, then each seed's trained policy: three eval calls of the one prompt
    assert [c[0] for c in evals] == [[[1, 2]]] * 3 and len(training) == 2 * 2
    assert all([1, 2] not in c[0] and [1, 5] not in c[0] for c in training)  # held out; no answer
    # per prompt its own seed, spaced by the group so no two prompts share a child's seed
    seeds = [s for c in training for s in c[1]]
    assert len(set(seeds)) == len(seeds) and all(s % 2 == 0 for s in seeds)
    # the fake answers "so 4", "so 3", "so 4" to its 3 samples: 2 of 3 right for the answer 4
    np.testing.assert_allclose(run.arrays[keys.GRPO_EVAL0_SUCCESS], [2 / 3])
    np.testing.assert_allclose(run.arrays[keys.GRPO_EVAL_SUCCESS], [[2 / 3], [2 / 3]])
    assert run.arrays[keys.GRPO_EVAL_PROMPT_INDEX].tolist() == [0]
    # the fake gives every sample the same tokens: every group is one completion
    assert run.arrays[keys.grpo_key("identical_groups")].tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert run.eval_s > 0
